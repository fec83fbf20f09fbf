"""Fleet orders (pause, drain) in the scheduler, fleet stats and rate samples."""

from __future__ import annotations

from typing import TYPE_CHECKING

import fakeredis
from scrapy import Request

from scrapy_redisspine.control import (
    DRAIN,
    PAUSED,
    StatsPusher,
    give_order,
    read_orders,
    record_progress,
)
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.status import Sample, read_status
from tests.unit import test_scheduler
from tests.unit.test_scheduler import KEYS, Backend, MakeScheduler, _next, _pending

if TYPE_CHECKING:
    from scrapy_redisspine.scheduler import Scheduler

# The scheduler tests' fixtures: a scheduler opened on fakeredis and on the real server.
make_scheduler = test_scheduler.make_scheduler
redis_backend = test_scheduler.redis_backend


def _open(make: MakeScheduler) -> Scheduler:
    scheduler = make()
    for n in range(3):
        scheduler.enqueue_request(Request(f"http://a{n}.test/"))
    scheduler._flush()
    return scheduler


def test_paused_worker_leases_nothing_and_does_not_finish(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = _open(make_scheduler)
    give_order(redis_backend.client, KEYS, PAUSED, True)
    scheduler._on_heartbeat()
    assert scheduler.orders.paused
    assert _next(scheduler) is None
    assert redis_backend.client.hlen(KEYS.inflight) == 0
    assert _pending(scheduler)
    give_order(redis_backend.client, KEYS, PAUSED, False)
    scheduler._on_heartbeat()
    assert _next(scheduler) is not None


def test_draining_worker_stops_leasing_and_stays_pending(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = _open(make_scheduler)
    request = _next(scheduler)
    assert request is not None
    give_order(redis_backend.client, KEYS, DRAIN, True)
    scheduler._on_heartbeat()
    assert scheduler.next_request() is None
    assert _pending(scheduler)
    scheduler._on_request_done(request)
    scheduler.close("drained")
    assert redis_backend.client.hlen(KEYS.inflight) == 0
    assert redis_backend.client.zcard(KEYS.queue) == 2


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
    status = read_status(client, keys)
    assert 100 <= status["rate_per_minute"] <= 121
    assert status["eta_seconds"] == 0 or status["eta_seconds"] == 1
    assert Sample.parse(b"garbage") is None
