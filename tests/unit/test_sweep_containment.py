"""One bad value in a crawl key never switches crash recovery off.

A real worker (scheduler, its view, the Recovery extension on the test clock) sweeps
for a dead worker's leases while garbage sits in the crawl's counters or Redis is
full: the dead worker's requests must be requeued all the same, the bad value
reported, and the sweep timer must keep running. Each test runs on fakeredis and on
the real redis-server.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine.control import StatsPusher
from scrapy_redisspine.extension import Recovery
from scrapy_redisspine.fleet_totals import FleetTotals
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from tests.unit.conftest import SchedSpider, build_scheduler, clock_of

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    import redis
    from twisted.internet import task

    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import MakeScheduler

KEYS = CrawlKeys("redisspine", "test")
SETTINGS = {
    "REDISSPINE_WORKER_TIMEOUT_SECONDS": 2, "REDISSPINE_HEARTBEAT_SECONDS": 1,
    "REDISSPINE_SWEEP_SECONDS": 1,
}


def _dead_worker_holding(client: redis.Redis, count: int, name: str = "dead") -> None:
    """A worker that leased ``count`` requests and stopped heartbeating long ago."""
    dead = Frontier(client, KEYS, name, concurrency=count)
    dead.enqueue([NewRequest(f"{name}{i}".encode(), f"fp-{name}{i}".encode(),
                             lane=f"{name}{i}.example") for i in range(count)])
    assert len(dead.lease(count).leases) == count
    seconds, micros = client.time()
    client.zadd(KEYS.workers, {name: seconds * 1000 + micros // 1000 - 60_000})


@pytest.fixture
def start_recovery(clock: task.Clock) -> Iterator[Callable[[Scheduler], Recovery]]:
    """Start a Recovery extension on a worker, and the fleet totals beside it (as the
    add-on does), on the test clock; stopped after."""
    started: list[Recovery | FleetTotals] = []

    def start(scheduler: Scheduler) -> Recovery:
        recovery = Recovery(scheduler.config, scheduler.stats, clock=clock)
        recovery.worker_opened(scheduler.view)
        totals = FleetTotals(scheduler.stats, 1, clock=clock)
        totals.worker_opened(scheduler.view)
        started.extend([recovery, totals])
        return recovery

    yield start
    for extension in started:
        extension.spider_closed()


def _run_sweeps(clock: task.Clock, seconds: int = 4) -> None:
    for _ in range(seconds):
        clock.advance(1)


@pytest.fixture
def worker(make_scheduler: MakeScheduler) -> Scheduler:
    return make_scheduler("w1", **SETTINGS)


@pytest.mark.parametrize("key", ["stats", "fleet_stats"])
def test_a_garbage_counter_does_not_stop_recovery(
    worker: Scheduler, client: redis.Redis, key: str, caplog: pytest.LogCaptureFixture,
    start_recovery: Callable[[Scheduler], Recovery],
) -> None:
    _dead_worker_holding(client, 3)
    client.hset(getattr(KEYS, key), "response_received_count", "garbage")
    recovery = start_recovery(worker)
    worker.stats.set_value("response_received_count", 5)
    worker.stats.set_value("item_scraped_count", 2)
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
        _run_sweeps(clock_of(worker))
    assert worker.frontier.upkeep.counts() == (3, 0), "the dead worker's leases are back"
    assert worker.stats.get_value("redisspine/recovery/requeued") == 3
    assert worker.stats.get_value("redisspine/errors/sweep") is None, "no sweep failed"
    assert recovery.running, "the sweep timer is alive"
    _dead_worker_holding(client, 2, "dead-later")
    _run_sweeps(clock_of(worker), 2)
    assert worker.frontier.upkeep.counts() == (5, 0), "a worker that died later too"
    warned = [r.getMessage() for r in caplog.records if "response_received_count" in r.getMessage()]
    assert len(warned) == 1, "reported once, not at every sweep"
    if key == "fleet_stats":
        assert worker.stats.get_value("redisspine/fleet_stats/skipped") == 1
        assert client.hget(KEYS.fleet_stats, "item_scraped_count") == b"2", "added once"
        assert client.hget(KEYS.fleet_stats, "response_received_count") == b"garbage"
    else:
        assert worker.stats.get_value("redisspine/fleet/bad_counters") == 1
        assert worker.stats.get_value("redisspine/fleet/requeued") == 5


def test_a_push_is_all_or_nothing_and_never_counts_twice(client: redis.Redis) -> None:
    pusher = StatsPusher(client, KEYS)
    client.hset(KEYS.fleet_stats, mapping={"bad": "x", "mem": "1.5"})
    assert pusher.push({"pages": 2, "bad": 1, "mem": 1.0, "rate": 0.25}) == 3
    assert pusher.push({"pages": 2, "bad": 1, "mem": 1.0, "rate": 0.25}) == 0, "nothing grew"
    client.hdel(KEYS.fleet_stats, "bad")  # repaired: the growth held back goes in
    assert pusher.push({"pages": 3, "bad": 1, "mem": 1.0, "rate": 0.25}) == 2
    fleet = client.hgetall(KEYS.fleet_stats)
    assert fleet[b"pages"] == b"3"
    assert fleet[b"bad"] == b"1"
    assert float(fleet[b"mem"]) == 2.5
    assert float(fleet[b"rate"]) == 0.25


def test_a_full_redis_refuses_the_stats_push_but_not_recovery(
    real_redis: redis.Redis, redis_url: str, clock: task.Clock,
    start_recovery: Callable[[Scheduler], Recovery],
) -> None:
    _dead_worker_holding(real_redis, 2)
    worker = build_scheduler(redis_url, clock, "w1", **SETTINGS)
    worker.open(SchedSpider())
    try:
        start_recovery(worker)
        worker.stats.set_value("response_received_count", 5)
        real_redis.config_set("maxmemory", 1)
        _run_sweeps(clock)
        assert Frontier(real_redis, KEYS, "check").upkeep.counts() == (2, 0)
        assert worker.stats.get_value("redisspine/recovery/requeued") == 2
        assert worker.stats.get_value("redisspine/memory/oom/fleet_stats") >= 1
        assert not worker.guard.down, "a full Redis is not a down one"
        assert not real_redis.exists(KEYS.fleet_stats)
    finally:
        real_redis.config_set("maxmemory", 0)
        worker.close("shutdown")


def test_an_in_flight_entry_no_index_points_to_is_found_and_requeued(
    worker: Scheduler, client: redis.Redis, start_recovery: Callable[[Scheduler], Recovery],
) -> None:
    _dead_worker_holding(client, 2)
    # garbage of another kind: the indexes of the dead worker's leases are gone, so
    # no sweep by worker or by age would ever find them
    client.delete(KEYS.owned, KEYS.leases)
    recovery = start_recovery(worker)
    _run_sweeps(clock_of(worker))
    assert recovery.running
    assert worker.frontier.upkeep.counts() == (2, 0)
    assert worker.stats.get_value("redisspine/recovery/unindexed") == 2
