"""Fleet orders (pause, drain) in the scheduler, fleet stats and rate samples."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import fakeredis
import pytest
from scrapy import Request

from scrapy_redisspine.connection import client_from_url
from scrapy_redisspine.control import (
    DRAIN,
    PAUSED,
    Orders,
    StatsPusher,
    give_order,
    read_orders,
    record_progress,
)
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.status import Sample, read_status
from tests.queue_view import queued_count
from tests.unit.conftest import engine_of, finish, next_request, pending

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import MakeScheduler

KEYS = CrawlKeys("redisspine", "test")


def _open(make: MakeScheduler) -> Scheduler:
    scheduler = make()
    for n in range(3):
        scheduler.enqueue_request(Request(f"http://a{n}.test/"))
    scheduler.outbox.flush()
    return scheduler


def test_paused_worker_leases_nothing_and_does_not_finish(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = _open(make_scheduler)
    give_order(client, KEYS, PAUSED, True)
    scheduler.fleet.heartbeat()
    assert scheduler.fleet.orders.paused
    assert next_request(scheduler) is None
    assert client.hlen(KEYS.inflight) == 0
    assert pending(scheduler)
    give_order(client, KEYS, PAUSED, False)
    scheduler.fleet.heartbeat()
    assert next_request(scheduler) is not None


@pytest.mark.parametrize("order", [PAUSED, DRAIN])
def test_worker_joining_a_paused_or_draining_crawl_leases_nothing_before_its_heartbeat(
    make_scheduler: MakeScheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture,
    *, order: str,
) -> None:
    """The orders in force when a worker joins hold from its first call to next_request,
    not from its first heartbeat (REDISSPINE_HEARTBEAT_SECONDS later): a worker started
    on a paused crawl used to lease and fetch for that long."""
    seeder = _open(make_scheduler)
    seeder.close("shutdown")
    give_order(client, KEYS, order, True)
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        scheduler = make_scheduler("w2")
    assert scheduler.fleet.orders == read_orders(client, KEYS)
    assert scheduler.fleet.orders.stop_leasing
    assert next_request(scheduler) is None
    assert client.hlen(KEYS.inflight) == 0, "nothing leased before the first heartbeat"
    assert queued_count(client, KEYS) == 3
    said = "paused" if order == PAUSED else "draining"
    assert f"fleet orders at join: {said}" in caplog.text
    assert pending(scheduler)
    scheduler.fleet.heartbeat()
    if order == PAUSED:
        assert engine_of(scheduler).closed == []
        give_order(client, KEYS, PAUSED, False)
        scheduler.fleet.heartbeat()
        assert next_request(scheduler) is not None, "resumed: it leases"
    else:
        assert engine_of(scheduler).closed == ["drained"], "nothing in progress: it closes"
        scheduler.close("drained")
        assert queued_count(client, KEYS) == 3


def test_worker_joining_a_running_crawl_says_no_orders(
    make_scheduler: MakeScheduler, caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        scheduler = _open(make_scheduler)
    assert not scheduler.fleet.orders.stop_leasing
    assert "fleet orders at join" not in caplog.text
    assert next_request(scheduler) is not None


def test_draining_worker_stops_leasing_and_stays_pending(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = _open(make_scheduler)
    request = next_request(scheduler)
    assert request is not None
    give_order(client, KEYS, DRAIN, True)
    scheduler.fleet.heartbeat()
    assert scheduler.next_request() is None
    assert pending(scheduler)
    assert engine_of(scheduler).closed == [], "a request is still in progress"
    finish(scheduler, request)
    scheduler.fleet.heartbeat()
    assert engine_of(scheduler).closed == ["drained"], "nothing in progress: it closes"
    scheduler.fleet.heartbeat()
    assert engine_of(scheduler).closed == ["drained"], "asked once"
    scheduler.close("drained")
    assert client.hlen(KEYS.inflight) == 0
    assert queued_count(client, KEYS) == 2


def test_orders_default_to_running() -> None:
    client = fakeredis.FakeRedis()
    orders = read_orders(client, KEYS)
    assert not orders.stop_leasing


def test_stats_pusher_adds_only_growth() -> None:
    client = fakeredis.FakeRedis()
    keys = CrawlKeys("redisspine", "c")
    first, second = StatsPusher(client, keys), StatsPusher(client, keys)
    assert first.push({"pages": 2, "start_time": "x", "flag": True, "mem": 1.5}) == 2
    assert first.push({"pages": 2, "mem": 1.5}) == 0
    first.push({"pages": 5, "mem": 2.0})
    second.push({"pages": 1})
    fleet = client.hgetall(keys.fleet_stats)
    assert fleet[b"pages"] == b"6"
    assert float(fleet[b"mem"]) == 2.0
    assert b"flag" not in fleet


def test_progress_samples_give_rates() -> None:
    client = fakeredis.FakeRedis()
    keys = CrawlKeys("redisspine", "c")
    record_progress(client, keys, "w:1", 10, 100)
    (member,) = client.zrange(keys.progress, 0, -1)
    sample = Sample.parse(member)
    assert sample is not None
    assert (sample.worker, sample.worker_acks, sample.fleet_acks) == ("w:1", 10, 100)
    old = sample.ms - 30_000
    client.zadd(keys.progress, {f"{old}:w:1:0:40": old})
    client.hset(keys.stats, "acked", 100)
    client.zadd(keys.queue, {"x": 0})
    client.zadd(keys.workers, {"w:1": sample.ms})  # a live worker: an ETA is due
    status = read_status(client, keys)
    assert 100 <= status["rate_per_minute"] <= 121
    assert status["eta_seconds"] == 0 or status["eta_seconds"] == 1
    assert status["eta_bound"] == "rate"
    assert Sample.parse(b"garbage") is None


@pytest.mark.parametrize(
    ("orders", "words"),
    [(Orders(paused=True), "paused"), (Orders(drain=True), "draining"),
     (Orders(paused=True, drain=True), "paused and draining"), (Orders(), "resumed")],
)
def test_orders_read_as_words_in_the_log(orders: Orders, words: str) -> None:
    assert orders.describe() == words


def test_a_worker_logs_its_new_orders_in_words(
    make_scheduler: MakeScheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = _open(make_scheduler)
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        give_order(client, KEYS, PAUSED, True)
        scheduler.fleet.heartbeat()
        give_order(client, KEYS, PAUSED, False)
        scheduler.fleet.heartbeat()
    lines = [r.getMessage() for r in caplog.records if "fleet orders" in r.getMessage()]
    assert lines == ["redisspine: fleet orders now paused", "redisspine: fleet orders now resumed"]


@pytest.fixture
def redis_logger_level() -> Iterator[logging.Logger]:
    """The ``redis`` logger with no level of its own, under a root at DEBUG (Scrapy's
    default LOG_LEVEL); both levels are put back after the test."""
    redis_logger, root = logging.getLogger("redis"), logging.getLogger()
    saved = redis_logger.level, root.level
    redis_logger.setLevel(logging.NOTSET)
    root.setLevel(logging.DEBUG)
    yield redis_logger
    redis_logger.setLevel(saved[0])
    root.setLevel(saved[1])


def test_redis_py_debug_lines_stay_out_of_a_worker_log_at_scrapys_default_level(
    redis_logger_level: logging.Logger,
) -> None:
    assert logging.getLogger("redis.client").isEnabledFor(logging.DEBUG)
    client_from_url("redis://127.0.0.1:1/0").close()  # builds a client, connects nowhere
    assert not logging.getLogger("redis.client").isEnabledFor(logging.DEBUG)
    assert logging.getLogger("redis.connection").isEnabledFor(logging.INFO)


def test_a_level_set_on_the_redis_logger_is_kept(redis_logger_level: logging.Logger) -> None:
    redis_logger_level.setLevel(logging.DEBUG)
    client_from_url("redis://127.0.0.1:1/0").close()
    assert redis_logger_level.level == logging.DEBUG
