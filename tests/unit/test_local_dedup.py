"""The worker's memory of what Redis confirmed (``_seen``, REDISSPINE_LOCAL_DEDUP_CACHE).

A repeat of a request Redis queued or refused as a duplicate is dropped by the
worker, as Scrapy's own scheduler drops a duplicate, without a round trip; whatever
Redis may have lost (an error, a restart from an older snapshot, a takeover) makes the
worker forget, so a request whose write was lost goes to Redis again. The restart is
a real one: a redis-server killed and started again from a snapshot taken before the
request went in, which redis-py reconnects to without raising anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request
from scrapy import signals as scrapy_signals
from scrapy.utils.test import get_crawler

from scrapy_redisspine._seen import ConfirmedSeen
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.testing.redis_server import RedisServer
from tests.queue_view import queued_count
from tests.unit.conftest import SchedSpider, build_scheduler, drain

if TYPE_CHECKING:
    from collections.abc import Iterator

    from twisted.internet import task

    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import MakeScheduler

KEYS = CrawlKeys("redisspine", "test")


def _stat(scheduler: Scheduler, name: str) -> Any:
    return scheduler.stats.get_value(name)


def _sends(scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many requests each enqueue call of the frontier carried."""
    sizes: list[int] = []
    original = scheduler.frontier.enqueue

    def spy(requests: Any, *args: Any, **kwargs: Any) -> Any:
        sizes.append(len(requests))
        return original(requests, *args, **kwargs)

    monkeypatch.setattr(scheduler.frontier, "enqueue", spy)
    return sizes


# -- the memory itself -----------------------------------------------------------------


class TestConfirmedSeen:
    def test_keeps_at_most_its_size_and_the_latest(self) -> None:
        seen = ConfirmedSeen(4, lambda: 0)
        seen.confirm([b"%d" % i for i in range(10)], 0)
        assert len(seen) <= 4
        assert b"9" in seen
        assert b"8" in seen
        assert b"0" not in seen

    def test_a_new_era_forgets_everything(self) -> None:
        era = [0]
        seen = ConfirmedSeen(100, lambda: era[0])
        seen.confirm([b"a", b"b"], seen.era)
        assert b"a" in seen
        era[0] += 1
        assert b"a" not in seen
        assert len(seen) == 0

    def test_a_reply_to_a_send_of_an_earlier_era_is_not_trusted(self) -> None:
        era = [0]
        seen = ConfirmedSeen(100, lambda: era[0])
        stamped = seen.era
        era[0] += 1  # an error between the send and its reply
        seen.confirm([b"a"], stamped)
        assert b"a" not in seen
        seen.confirm([b"b"], seen.era)
        assert b"b" in seen

    def test_size_must_be_positive(self) -> None:
        with pytest.raises(ValueError, match="at least 1"):
            ConfirmedSeen(0, lambda: 0)


# -- the scheduler ------------------------------------------------------------------


def test_a_repeat_redis_confirmed_is_dropped_here(
    make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    crawler = get_crawler(SchedSpider)
    dropped: list[Request] = []
    crawler.signals.connect(lambda request, spider: dropped.append(request),
                            signal=scrapy_signals.request_dropped, weak=False)
    scheduler = make_scheduler(crawler=crawler)
    sends = _sends(scheduler, monkeypatch)
    assert scheduler.enqueue_request(Request("http://example.com/a"))
    assert scheduler.enqueue_request(Request("http://example.com/b"))
    assert scheduler.outbox.try_flush()
    assert scheduler.enqueue_request(Request("http://example.com/a")) is False
    assert len(scheduler.outbox) == 0, "not buffered for Redis"
    assert scheduler.outbox.try_flush()
    assert sends == [2], "the repeat made no round trip"
    assert _stat(scheduler, "dupefilter/filtered") == 1  # Scrapy's dupefilter stat
    assert _stat(scheduler, "redisspine/dedup/local_hits") == 1
    # Refused by the call, as Scrapy's scheduler does: its engine says request_dropped.
    assert dropped == []
    assert sorted(r.url for r in drain(scheduler)) == ["http://example.com/a",
                                                       "http://example.com/b"]


def test_a_duplicate_redis_refused_is_remembered_too(make_scheduler: MakeScheduler) -> None:
    first, second = make_scheduler("w1"), make_scheduler("w2")
    first.enqueue_request(Request("http://example.com/a"))
    assert first.outbox.try_flush()
    assert second.enqueue_request(Request("http://example.com/a")), "Redis decides"
    assert second.outbox.try_flush()
    assert _stat(second, "dupefilter/filtered") == 1
    assert second.enqueue_request(Request("http://example.com/a")) is False
    assert _stat(second, "dupefilter/filtered") == 2
    assert _stat(second, "redisspine/dedup/local_hits") == 1


def test_a_repeat_of_a_request_still_on_its_way_goes_to_redis(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler = make_scheduler()
    assert scheduler.enqueue_request(Request("http://example.com/a"))
    assert scheduler.enqueue_request(Request("http://example.com/a")), "not confirmed yet"
    assert scheduler.outbox.try_flush()
    assert _stat(scheduler, "dupefilter/filtered") == 1
    assert _stat(scheduler, "redisspine/dedup/local_hits") is None


def test_dont_filter_and_start_requests_always_go_to_redis(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = make_scheduler()
    assert scheduler.enqueue_request(Request("http://example.com/a"))
    assert scheduler.outbox.try_flush()
    assert scheduler.enqueue_request(Request("http://example.com/a", dont_filter=True))
    start = Request("http://example.com/a", meta={"is_start_request": True})
    assert scheduler.enqueue_request(start), "a start request follows its own rules"
    assert scheduler.outbox.try_flush()
    assert _stat(scheduler, "redisspine/dedup/local_hits") is None
    assert int(queued_count(client, KEYS)) == 2  # the first and the dont_filter one


def test_off_with_zero(make_scheduler: MakeScheduler) -> None:
    scheduler = make_scheduler(REDISSPINE_LOCAL_DEDUP_CACHE=0)
    assert scheduler.seen is None
    scheduler.enqueue_request(Request("http://example.com/a"))
    assert scheduler.outbox.try_flush()
    assert scheduler.enqueue_request(Request("http://example.com/a")), "Redis decides"
    assert scheduler.outbox.try_flush()
    assert _stat(scheduler, "dupefilter/filtered") == 1


def test_not_used_by_a_sharded_crawl(make_scheduler: MakeScheduler) -> None:
    assert make_scheduler(REDISSPINE_SHARDS=3).seen is None


def test_any_redis_error_forgets(make_scheduler: MakeScheduler, clock: task.Clock) -> None:
    scheduler = make_scheduler()
    scheduler.enqueue_request(Request("http://example.com/a"))
    assert scheduler.outbox.try_flush()
    scheduler.guard.failed("lease", redis.exceptions.ConnectionError("reset by peer"))
    assert scheduler.enqueue_request(Request("http://example.com/a")), "asked again"


# -- a real restart that lost the last writes ---------------------------------------


@pytest.fixture
def snapshot_server(tmp_path: Any) -> Iterator[RedisServer]:
    server = RedisServer(directory=tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def on_snapshot_server(snapshot_server: RedisServer, clock: task.Clock) -> Iterator[Scheduler]:
    """An opened scheduler on ``snapshot_server``, closed after the test."""
    scheduler = build_scheduler(snapshot_server.url, clock)
    scheduler.open(SchedSpider())
    yield scheduler
    scheduler.close("shutdown")


def test_a_restart_from_an_older_snapshot_forgets_and_the_request_goes_in_again(
    snapshot_server: RedisServer, on_snapshot_server: Scheduler
) -> None:
    scheduler = on_snapshot_server
    client = snapshot_server.client()
    client.save()  # the crawl's record, and nothing queued
    assert scheduler.enqueue_request(Request("http://example.com/a"))
    assert scheduler.outbox.try_flush()
    assert scheduler.enqueue_request(Request("http://example.com/a")) is False
    scheduler.fleet.heartbeat()  # learns the server's run id
    snapshot_server.kill()
    snapshot_server.start()  # from the snapshot: /a and its fingerprint are gone
    assert int(queued_count(client, KEYS)) == 0
    scheduler.fleet.heartbeat()  # redis-py reconnects without an error
    assert _stat(scheduler, "redisspine/redis/server_changes") == 1
    assert scheduler.guard.reconcile_needed
    assert scheduler.enqueue_request(Request("http://example.com/a")), "asked again"
    assert scheduler.outbox.try_flush()
    assert int(queued_count(client, KEYS)) == 1, "the lost request is queued again"
    assert [r.url for r in drain(scheduler)] == ["http://example.com/a"]
    client.close()


def test_heartbeats_of_the_same_server_keep_the_memory(on_snapshot_server: Scheduler) -> None:
    scheduler = on_snapshot_server
    assert scheduler.enqueue_request(Request("http://example.com/a"))
    assert scheduler.outbox.try_flush()
    for _ in range(3):
        scheduler.fleet.heartbeat()
    assert _stat(scheduler, "redisspine/redis/server_changes") is None
    assert scheduler.enqueue_request(Request("http://example.com/a")) is False
