"""A crawl's identity in Redis: workers never take lost, purged or someone else's
state for their own, and never say "finished" over it.

Each scheduler test runs on fakeredis and on the real redis-server; a worker that
refuses must say why in one ERROR line (no traceback), close with its reason and
make the process exit non-zero (``FakeEngine.failed``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest
from scrapy import Request, Spider
from scrapy.utils.test import get_crawler

from scrapy_redisspine.frontier import Frontier
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.scheduler import Scheduler
from tests.unit.conftest import SchedSpider, clock_of, engine_of, finish, next_request

if TYPE_CHECKING:
    import redis
    from twisted.internet import task

    from tests.unit.conftest import MakeScheduler

KEYS = CrawlKeys("redisspine", "test")


class OtherSpider(Spider):
    name = "other"

    def parse(self, response: Any) -> None:
        pass


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    assert not any(record.exc_info for record in caplog.records), "no traceback"
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def _assert_refused(scheduler: Scheduler, reason: str) -> None:
    engine = engine_of(scheduler)
    assert engine.failed, "the process will exit non-zero"
    assert scheduler.has_pending_requests(), "never idle: never closed as 'finished'"
    assert scheduler.next_request() is None
    clock_of(scheduler).advance(0)  # the close is asked from the reactor's next turn
    assert engine.closed == [reason]


def _crawl_keys_left(client: redis.Redis) -> list[str]:
    return [key for key in KEYS.all_crawl_keys() if client.exists(key)]


# -- two spiders, one crawl id ------------------------------------------------------


def test_a_worker_of_another_spider_refuses_to_join(
    make_scheduler: MakeScheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    owner = make_scheduler("w1")
    owner.enqueue_request(Request("http://example.com/a", callback=owner.spider.parse))  # type: ignore[union-attr]
    owner.outbox.flush()
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        intruder = make_scheduler("w2", spider=OtherSpider())
    (line,) = _errors(caplog)
    assert "'sched'" in line
    assert "'other'" in line
    assert "REDISSPINE_CRAWL_ID" in line
    _assert_refused(intruder, "redisspine_crawl_conflict")
    assert client.zscore(KEYS.workers, "w2") is None, "it wrote nothing"
    assert client.hget(KEYS.record, "spider") == b"sched"
    assert next_request(owner) is not None, "the owner's request is still there"


def test_flush_on_start_gives_a_crawl_id_to_another_spider_when_nobody_works_on_it(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    first = make_scheduler("w1")
    first.close("shutdown")
    second = make_scheduler("w2", spider=OtherSpider(), REDISSPINE_FLUSH_ON_START=True)
    assert client.hget(KEYS.record, "spider") == b"other"
    assert client.hget(KEYS.record, "epoch") == second.frontier.epoch.encode()
    assert second.frontier.epoch != first.frontier.epoch, "a new crawl"
    assert not engine_of(second).failed


# -- finished before ----------------------------------------------------------------


def test_running_a_finished_crawl_again_says_so(
    make_scheduler: MakeScheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_scheduler("w1")
    first.enqueue_request(Request("http://example.com/a"))
    finish(first, next_request(first))
    first.close("finished")
    assert client.hget(KEYS.record, "finished_ms") is not None
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
        make_scheduler("w2")
    (line,) = [r.getMessage() for r in caplog.records if "already finished" in r.getMessage()]
    assert "1 request(s) done" in line
    assert "REDISSPINE_FLUSH_ON_START" in line
    assert "redisspine purge test" in line


def test_a_crawl_stopped_early_is_not_called_finished(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    first = make_scheduler("w1")
    first.enqueue_request(Request("http://example.com/a"))
    first.close("shutdown")
    assert client.hget(KEYS.record, "finished_ms") is None


# -- the crawl's state vanishes under a running worker ----------------------------------


def _lose_everything(client: redis.Redis) -> None:
    client.delete(*KEYS.all_crawl_keys())


def _purge_with_tombstone(client: redis.Redis) -> None:
    client.delete(*KEYS.all_crawl_keys())
    client.hset(KEYS.record, "purged_ms", 1)


def _start_afresh(client: redis.Redis) -> None:
    client.delete(*KEYS.all_crawl_keys())
    Frontier(client, KEYS, "newcomer").register(flush=False, alive_ms=30_000, spider="sched")


@pytest.mark.parametrize(
    "case",
    [
        pytest.param((_lose_everything, "redisspine_state_lost", "state in Redis is gone"),
                     id="lost"),
        pytest.param((_purge_with_tombstone, "redisspine_purged", "was purged"), id="purged"),
        pytest.param((_start_afresh, "redisspine_state_lost", "not the one this worker joined"),
                     id="started-afresh"),
    ],
)
def test_a_worker_whose_crawl_vanished_stops_loudly_and_writes_nothing(
    make_scheduler: MakeScheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture,
    case: tuple[Any, str, str],
) -> None:
    fault, reason, said = case
    scheduler = make_scheduler("w1", REDISSPINE_HOST_CONCURRENCY=2, free_slots=2)
    for url in ("http://example.com/a", "http://example.com/b"):
        scheduler.enqueue_request(Request(url))
    taken = next_request(scheduler)
    assert taken is not None
    scheduler.enqueue_request(Request("http://example.com/child"))
    fault(client)
    left_by_fault = _crawl_keys_left(client)
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        scheduler.fleet.heartbeat()
    (line,) = _errors(caplog)
    assert said in line
    assert "2 leased request(s)" in line
    assert "1 request(s)" in line
    assert reason in line
    _assert_refused(scheduler, reason)
    finish(scheduler, taken)  # the engine still finishes what it downloads
    scheduler.close(reason)
    assert _crawl_keys_left(client) == left_by_fault, "no key was written again"
    assert scheduler.stats.get_value("redisspine/refused") == reason


def test_a_heartbeat_after_the_crawl_vanished_writes_nothing(
    make_scheduler: MakeScheduler, client: redis.Redis, clock: task.Clock
) -> None:
    scheduler = make_scheduler("w1", REDISSPINE_HEARTBEAT_SECONDS=1)
    _lose_everything(client)
    clock.advance(1.01)
    clock.advance(0)
    assert engine_of(scheduler).closed == ["redisspine_state_lost"]
    clock.advance(2)
    assert _crawl_keys_left(client) == []


# -- configuration and connection errors -----------------------------------------------


@pytest.mark.parametrize(
    ("settings", "said"),
    [
        pytest.param({"REDISSPINE_REDIS_URL": "http://user:secret@example.com/"},
                     "is no Redis URL", id="scheme"),
        pytest.param({"REDISSPINE_LEASE_BATCH_SIZE": 0}, "REDISSPINE_LEASE_BATCH_SIZE",
                     id="bad-number"),
        pytest.param({"REDIS_URL": "localhost:6379"}, "REDIS_URL", id="fallback-url"),
    ],
)
def test_a_bad_setting_is_one_line_and_a_failed_exit(
    settings: dict[str, Any], said: str, caplog: pytest.LogCaptureFixture, clock: task.Clock
) -> None:
    from tests.unit.conftest import FakeEngine

    crawler = get_crawler(SchedSpider, settings)
    scheduler = Scheduler.from_crawler(crawler, engine=FakeEngine(), clock=clock)
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        scheduler.open(SchedSpider())
    (line,) = _errors(caplog)
    assert said in line
    assert "secret" not in line
    _assert_refused(scheduler, "redisspine_config_error")
    scheduler.close("redisspine_config_error")


def test_an_unreachable_redis_is_one_line_with_the_masked_url(
    caplog: pytest.LogCaptureFixture, unused_port: int, clock: task.Clock
) -> None:
    from tests.unit.conftest import FakeEngine

    url = f"redis://:secret@127.0.0.1:{unused_port}/0"
    crawler = get_crawler(SchedSpider, {"REDISSPINE_REDIS_URL": url})
    scheduler = Scheduler.from_crawler(crawler, engine=FakeEngine(), clock=clock)
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        scheduler.open(SchedSpider())
    (line,) = _errors(caplog)
    assert f"127.0.0.1:{unused_port}" in line
    assert "***" in line
    assert "secret" not in line
    assert "ConnectionError" in line
    _assert_refused(scheduler, "redisspine_redis_unreachable")
    scheduler.close("redisspine_redis_unreachable")


@pytest.fixture
def unused_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("call", ["lease", "send"])
def test_a_write_into_a_vanished_crawl_is_refused_before_any_heartbeat(
    make_scheduler: MakeScheduler, client: redis.Redis, call: str
) -> None:
    # Between the loss and the next heartbeat a worker still leases and sends: the
    # scripts refuse (the crawl record is gone), so nothing is written into the
    # empty Redis, and the worker stops at once.
    scheduler = make_scheduler("w1")
    scheduler.enqueue_request(Request("http://example.com/a"))
    finish(scheduler, next_request(scheduler))
    scheduler.enqueue_request(Request("http://example.com/child"))
    _lose_everything(client)
    if call == "lease":
        assert scheduler.next_request() is None
    else:
        assert not scheduler.outbox.try_flush()
    assert _crawl_keys_left(client) == []
    assert scheduler.guard.crawl_gone == "lost"
    _assert_refused(scheduler, "redisspine_state_lost")
    scheduler.close("redisspine_state_lost")
    assert _crawl_keys_left(client) == []


# -- work dropped for lack of memory ---------------------------------------------------


def test_a_crawl_done_without_requests_shed_for_memory_is_not_finished(
    make_scheduler: MakeScheduler, client: redis.Redis, clock: task.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # One worker drops a discovery for lack of memory; another, which never shed a
    # thing, finds the crawl out of work. Neither may say "finished".
    shedder = make_scheduler("w1")
    other = make_scheduler("w2")
    shedder.enqueue_request(Request("http://example.com/a"))
    parent = next_request(shedder)
    assert parent is not None
    shedder.guard.memory_pressure = True
    assert not shedder.enqueue_request(Request("http://example.com/found"))
    finish(shedder, parent)  # its ack goes after the count
    assert shedder.outbox.try_flush()
    assert client.hget(KEYS.stats, "shed") == b"1"
    for scheduler in (shedder, other):
        scheduler.fleet.refresh_counts()  # each notes that its start requests are in
    clock.advance(1)
    with caplog.at_level(logging.ERROR, logger="scrapy_redisspine"):
        for scheduler in (other, shedder):
            assert scheduler.has_pending_requests(), "out of work, and not finished"
            _assert_refused(scheduler, "redisspine_memory_exceeded")
    assert "without 1 newly discovered request(s)" in caplog.text


def test_an_unreadable_shed_count_is_not_taken_for_none(
    make_scheduler: MakeScheduler, client: redis.Redis, clock: task.Clock
) -> None:
    scheduler = make_scheduler("w1")
    scheduler.enqueue_request(Request("http://example.com/a"))
    finish(scheduler, next_request(scheduler))
    assert scheduler.outbox.try_flush()
    client.hset(KEYS.stats, "shed", "garbage")
    clock.advance(1)
    assert scheduler.has_pending_requests()
    _assert_refused(scheduler, "redisspine_memory_exceeded")
