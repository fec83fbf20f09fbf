"""REDISSPINE_IDLE_CLOSE_SECONDS: a kept-alive fleet closes (reason ``idle``) once the
crawl had no work for that long, measured in Redis (fleet_counts.lua keeps when the
crawl was first seen idle, in its record).

Scripts run on fakeredis and on a real redis-server; schedulers with a FakeEngine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine.control import CLOSE
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.settings import load_config
from tests.unit.conftest import engine_of

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.keys import CrawlKeys
    from tests.unit.conftest import FrontierFactory, MakeScheduler

ALIVE_MS = 30_000
IDLE_MS = 5_000


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _idle_long_ago(client: redis.Redis, keys: CrawlKeys) -> None:
    """Move the crawl's first idle sighting back past the idle close."""
    client.hset(keys.record, "idle_since_ms", _redis_ms(client) - 2 * IDLE_MS)


@pytest.fixture
def worker(make_frontier: FrontierFactory) -> Frontier:
    frontier = make_frontier("w1")
    frontier.register(flush=False, alive_ms=ALIVE_MS, spider="sched")
    frontier.done_starting()
    return frontier


def _one_request(frontier: Frontier, n: int = 0) -> None:
    frontier.enqueue([NewRequest(f"r{n}".encode(), f"fp{n}".encode(), lane="a")])


class TestCount:
    def test_a_crawl_idle_long_enough_gets_the_close_order_idle(
        self, worker: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        first = worker.fleet_counts(ALIVE_MS, IDLE_MS)
        assert (first.idle_ms, first.close_reason) == (0, ""), "idle from now on"
        assert client.hexists(crawl_keys.record, "idle_since_ms")
        _idle_long_ago(client, crawl_keys)
        counts = worker.fleet_counts(ALIVE_MS, IDLE_MS)
        assert counts.idle_ms >= IDLE_MS
        assert counts.close_reason == "idle"
        assert client.hget(crawl_keys.control, CLOSE) == b"idle"

    def test_work_queued_or_in_flight_resets_the_idle_time(
        self, worker: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker.fleet_counts(ALIVE_MS, IDLE_MS)
        _idle_long_ago(client, crawl_keys)
        _one_request(worker)
        assert worker.fleet_counts(ALIVE_MS, IDLE_MS).idle_ms == -1, "queued"
        assert not client.hexists(crawl_keys.record, "idle_since_ms")
        (lease,) = worker.lease(1).leases
        counts = worker.fleet_counts(ALIVE_MS, IDLE_MS)
        assert (counts.idle_ms, counts.close_reason) == (-1, ""), "in flight"
        assert worker.ack([(lease.key, lease.token, 0)]) == 1
        assert worker.fleet_counts(ALIVE_MS, IDLE_MS).idle_ms == 0, "idle again, from now"
        assert not client.hexists(crawl_keys.control, CLOSE)

    def test_work_that_came_and_went_between_two_counts_resets_it_too(
        self, worker: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker.fleet_counts(ALIVE_MS, IDLE_MS)
        _idle_long_ago(client, crawl_keys)
        _one_request(worker)
        (lease,) = worker.lease(1).leases
        worker.ack([(lease.key, lease.token, 0)])
        counts = worker.fleet_counts(ALIVE_MS, IDLE_MS)
        assert (counts.idle_ms, counts.close_reason) == (0, "")

    def test_a_worker_joining_an_idle_crawl_does_not_reset_it(
        self, worker: Frontier, make_frontier: FrontierFactory, client: redis.Redis,
        crawl_keys: CrawlKeys,
    ) -> None:
        worker.fleet_counts(ALIVE_MS, IDLE_MS)
        _idle_long_ago(client, crawl_keys)
        joining = make_frontier("w2")
        joining.register(flush=False, alive_ms=ALIVE_MS, spider="sched")
        joining.done_starting()
        assert joining.fleet_counts(ALIVE_MS, IDLE_MS).close_reason == "idle"

    def test_a_worker_still_producing_start_requests_holds_the_close_off(
        self, worker: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker.fleet_counts(ALIVE_MS, IDLE_MS)
        _idle_long_ago(client, crawl_keys)
        worker.heartbeat(starting=True)
        counts = worker.fleet_counts(ALIVE_MS, IDLE_MS)
        assert counts.idle_ms >= IDLE_MS, "idle all the same: no work arrived"
        assert counts.close_reason == ""
        worker.done_starting()
        assert worker.fleet_counts(ALIVE_MS, IDLE_MS).close_reason == "idle"

    def test_another_close_order_is_kept(
        self, worker: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.hset(crawl_keys.control, CLOSE, "closespider_timeout")
        worker.fleet_counts(ALIVE_MS, IDLE_MS)
        _idle_long_ago(client, crawl_keys)
        assert worker.fleet_counts(ALIVE_MS, IDLE_MS).close_reason == "closespider_timeout"
        assert client.hget(crawl_keys.control, CLOSE) == b"closespider_timeout"

    def test_without_an_idle_close_the_count_writes_nothing(
        self, worker: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        before = client.hgetall(crawl_keys.record)
        counts = worker.fleet_counts(ALIVE_MS)
        assert (counts.idle_ms, counts.close_reason) == (-1, "")
        assert client.hgetall(crawl_keys.record) == before
        assert not client.exists(crawl_keys.control)


class TestScheduler:
    def test_every_kept_alive_worker_closes_idle_within_a_heartbeat(
        self, make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        settings = {"REDISSPINE_KEEP_ALIVE": True, "REDISSPINE_IDLE_CLOSE_SECONDS": 5}
        first, second = make_scheduler("w1", **settings), make_scheduler("w2", **settings)
        first.fleet.heartbeat()
        assert client.hexists(crawl_keys.record, "idle_since_ms"), "an idle worker counts"
        second.fleet.heartbeat()  # (its start requests are all in: it stops holding off)
        assert engine_of(first).closed == []
        assert first.has_pending_requests(), "kept alive"
        _idle_long_ago(client, crawl_keys)
        first.fleet.heartbeat()
        assert engine_of(first).closed == ["idle"]
        second.fleet.heartbeat()
        assert engine_of(second).closed == ["idle"], "the whole fleet, not just one"

    def test_the_setting_needs_keep_alive(self) -> None:
        assert load_config({"REDISSPINE_IDLE_CLOSE_SECONDS": 5}).idle_close_ms == 0
        assert load_config({"REDISSPINE_IDLE_CLOSE_SECONDS": 5,
                            "REDISSPINE_KEEP_ALIVE": True}).idle_close_ms == 5000


def test_a_count_on_a_replica_is_refused_never_done() -> None:
    # A demoted primary (a Sentinel failover, with a pooled connection still on it)
    # answers reads: its count must not tell a worker the crawl is done.
    import time

    import redis as redis_py

    from scrapy_redisspine.keys import CrawlKeys as Keys
    from scrapy_redisspine.testing.redis_server import RedisServer

    keys = Keys("redisspine", "replica-count")
    with RedisServer() as primary, RedisServer() as replica:
        writer = Frontier(primary.client(), keys, "w1", "fifo")
        writer.register(flush=False, alive_ms=ALIVE_MS, spider="s")
        replica_client = replica.client()
        replica_client.replicaof("127.0.0.1", primary.port)
        deadline = time.monotonic() + 20
        while replica_client.hget(keys.record, "epoch") is None:
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.05)
        reader = Frontier(replica_client, keys, "w1", "fifo")
        reader.epoch = writer.epoch
        with pytest.raises(redis_py.exceptions.ReadOnlyError):
            reader.fleet_counts(ALIVE_MS)
        counts = writer.fleet_counts(ALIVE_MS)  # the primary counts as before
        assert counts.status == "ok"
