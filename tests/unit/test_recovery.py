"""Crash recovery: the sweep, dead letters, fencing in the scheduler, Redis outages.

The frontier tests run on fakeredis and on the real redis-server (``client``);
heartbeats are made stale by writing an old score into ``workers`` directly, never
by sleeping. Tests where processes race or the server must die use a real
redis-server only: the concurrent sweepers share the session server, the outage
test spawns its own (the session server is shared by every test).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

import fakeredis
import pytest
import redis
from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler
from twisted.internet import task

# Private: StubWorker assembles a WorkerView as Scheduler.__init__ does (no public builder).
from scrapy_redisspine._frontier_upkeep import MemoryReading
from scrapy_redisspine._guard import RedisGuard
from scrapy_redisspine._host_policy import HostPolicy
from scrapy_redisspine._leasebook import LeaseBook
from scrapy_redisspine._starts import StartRegistry
from scrapy_redisspine.connection import evicting_policy
from scrapy_redisspine.extension import Recovery
from scrapy_redisspine.frontier import (
    Frontier,
    Lease,
    NewRequest,
    SweepResult,
    UnindexedResult,
    priority_key,
)
from scrapy_redisspine.health import RedisHealth
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.settings import ConfigError, load_config
from scrapy_redisspine.signals import WorkerView
from scrapy_redisspine.testing.redis_server import RedisServer
from tests.queue_view import queued, queued_count, queued_payloads
from tests.racing import run_at_once
from tests.unit.conftest import SchedSpider, build_scheduler, finish

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import FrontierFactory, MakeScheduler

TIMEOUT_MS = 30_000
KEYS = CrawlKeys("redisspine", "test")
#: A lane concurrency no test reaches: these tests lease several requests of one lane
#: at once (per-lane limits are tests/unit/test_politeness.py's business).
WIDE = 10_000


def _requests(*payloads: bytes, **kwargs: Any) -> list[NewRequest]:
    return [NewRequest(payload, b"fp-" + payload, **kwargs) for payload in payloads]


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _silence(client: redis.Redis, keys: CrawlKeys, worker_id: str) -> None:
    """The worker's last heartbeat was ten timeouts ago (server clock)."""
    client.zadd(keys.workers, {worker_id: _server_ms(client) - 10 * TIMEOUT_MS})


def _beat(client: redis.Redis, keys: CrawlKeys, worker_id: str) -> None:
    client.zadd(keys.workers, {worker_id: _server_ms(client)})


def _lease_and_die(frontier: Frontier, count: int) -> list[Lease]:
    """``frontier``'s worker leases up to ``count`` requests, then falls silent."""
    leases = frontier.lease(count).leases
    _silence(frontier.client, frontier.keys, frontier.worker_id)
    return leases


def _lease_and_stall(frontier: Frontier, count: int) -> list[Lease]:
    """``frontier``'s worker leases up to ``count`` requests and heartbeats on, but the
    leases are old (taken in 1970): past any lease ceiling."""
    leases = frontier.lease(count).leases
    _beat(frontier.client, frontier.keys, frontier.worker_id)
    _age_leases(frontier.client, frontier.keys, [lease.key for lease in leases])
    return leases


def _age_leases(client: redis.Redis, keys: CrawlKeys, lease_keys: list[str]) -> None:
    """Pretend these leases were taken in 1970."""
    client.zadd(keys.leases, dict.fromkeys(lease_keys, 1))


def _sweep(
    frontier: Frontier, *, ceiling_ms: int = 0, max_requeues: int = 5, limit: int = 1000
) -> SweepResult:
    return frontier.upkeep.requeue_stale(
        timeout_ms=TIMEOUT_MS, ceiling_ms=ceiling_ms, max_requeues=max_requeues, limit=limit
    )


def _stats(client: redis.Redis, keys: CrawlKeys) -> dict[str, int]:
    return {name.decode(): int(value) for name, value in client.hgetall(keys.stats).items()}


def _queue(client: redis.Redis, keys: CrawlKeys) -> list[tuple[bytes, float]]:
    return list(client.zrange(keys.queue, 0, -1, withscores=True))


def _queued_payloads(client: redis.Redis, keys: CrawlKeys) -> list[bytes]:
    return queued_payloads(client, keys)


def _queued_requests(client: redis.Redis, keys: CrawlKeys) -> list[tuple[str, str, bytes]]:
    """Every queued request as (lane, priority key, payload), sorted: the same before a
    lease and after a requeue, whether it waits in a list or as a member."""
    return sorted(request[:3] for request in queued(client, keys))


@pytest.fixture
def make_frontier(make_frontier: FrontierFactory) -> FrontierFactory:
    """The unit conftest's factory, with workers never held back by per-lane politeness."""

    def make(*args: Any, **kwargs: Any) -> Frontier:
        kwargs.setdefault("concurrency", WIDE)
        return make_frontier(*args, **kwargs)

    return make


# -- requeue_stale ------------------------------------------------------------------------


class TestRequeueStale:
    def test_requeues_the_leases_of_a_silent_worker_only(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        dead, live = make_frontier("dead"), make_frontier("live")
        dead.enqueue(_requests(b"d1", b"d2", b"d3", b"l1", b"l2"))
        dead_leases = dead.lease(3).leases
        live_leases = live.lease(2).leases
        _silence(client, crawl_keys, "dead")
        _beat(client, crawl_keys, "live")

        assert _sweep(live) == SweepResult(requeued=3, dead_lettered=0, workers_removed=1)
        assert _queued_payloads(client, crawl_keys) == [b"d1", b"d2", b"d3"]
        assert sorted(client.hkeys(crawl_keys.inflight)) == sorted(
            lease.key.encode() for lease in live_leases
        )
        assert sorted(client.zrange(crawl_keys.owned, 0, -1)) == sorted(
            f"live\n{lease.key}".encode() for lease in live_leases
        )
        assert client.zcard(crawl_keys.leases) == 2
        assert client.zscore(crawl_keys.workers, "dead") is None
        assert client.zscore(crawl_keys.workers, "live") is not None
        assert _stats(client, crawl_keys)["requeued"] == 3
        assert {lease.key for lease in dead_leases} == {
            lease.key for lease in live.lease(10).leases
        }

    def test_a_live_workers_old_leases_stay_without_a_ceiling(self, frontier: Frontier) -> None:
        frontier.enqueue(_requests(b"a", b"b"))
        leases = _lease_and_stall(frontier, 2)
        assert _sweep(frontier, ceiling_ms=0) == SweepResult(0, 0, 0)
        assert frontier.upkeep.counts() == (0, 2)
        assert frontier.ack([lease.handle for lease in leases]) == 2

    def test_a_live_workers_lease_past_the_ceiling_is_requeued(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue(_requests(b"stuck", b"fresh"))
        stuck, fresh = frontier.lease(2).leases
        _beat(client, crawl_keys, "w1")
        _age_leases(client, crawl_keys, [stuck.key])

        assert _sweep(frontier, ceiling_ms=60_000) == SweepResult(1, 0, 0)
        assert client.zscore(crawl_keys.workers, "w1") is not None, "the worker lives"
        assert frontier.upkeep.counts() == (1, 1)
        assert client.hget(crawl_keys.inflight, fresh.key) is not None
        assert frontier.ack([stuck.handle]) == 0, "the stuck lease's token is void"
        (again,) = frontier.lease(1).leases
        assert (again.key, again.payload, again.requeues) == (stuck.key, b"stuck", 1)

    def test_keeps_priority_order_key_and_payload(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        dead = make_frontier("dead")
        dead.enqueue(
            [
                NewRequest(b"low", b"1", priority=-3),
                NewRequest(b"mid\n\x00\xff", b"2"),
                NewRequest(b"high", b"3", priority=1_000_000),
                NewRequest(b"mid2", b"4"),
            ]
        )
        before = _queued_requests(client, crawl_keys)
        leased = _lease_and_die(dead, 4)
        assert _sweep(dead).requeued == 4
        assert _queued_requests(client, crawl_keys) == before
        again = make_frontier("w2").lease(4).leases
        assert [(lease.key, lease.payload) for lease in again] == [
            (lease.key, lease.payload) for lease in leased
        ]
        assert [lease.payload for lease in again] == [b"high", b"mid\n\x00\xff", b"mid2", b"low"]

    def test_requeue_count_is_visible_in_the_next_lease(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier("w1")
        frontier.enqueue(_requests(b"a"))
        for expected in (0, 1, 2):
            (lease,) = _lease_and_die(frontier, 1)
            assert lease.requeues == expected
            assert _sweep(frontier).requeued == 1
        assert client.hget(crawl_keys.requeues, lease.key) == b"3"
        (lease,) = frontier.lease(1).leases
        assert lease.requeues == 3

    def test_dead_letters_after_max_requeues(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([NewRequest(b"crasher", b"fp", priority=7, lane="h.example")])
        (first,) = _lease_and_die(frontier, 1)
        member = client.hget(crawl_keys.inflight, first.key).split(b"\n", 2)[2]
        assert _sweep(frontier, max_requeues=2) == SweepResult(1, 0, 1)
        for _ in range(1):
            _lease_and_die(frontier, 1)
            assert _sweep(frontier, max_requeues=2) == SweepResult(1, 0, 1)
        (lease,) = _lease_and_die(frontier, 1)
        assert lease.requeues == 2

        assert _sweep(frontier, max_requeues=2) == SweepResult(0, 1, 1)
        assert frontier.upkeep.counts() == (0, 0)
        assert not client.exists(crawl_keys.requeues)
        assert not client.exists(crawl_keys.owned)
        assert not client.exists(crawl_keys.leases)
        (letter,) = frontier.upkeep.dead_letters()
        assert letter.field == lease.key
        assert (letter.lane, letter.payload) == ("h.example", b"crasher")
        assert client.hget(crawl_keys.dead, lease.key) == f"{letter.reason}\n".encode() + member
        assert priority_key(7).encode() in member
        assert not client.exists(crawl_keys.busy), "the dead worker's slot is free"
        assert not client.exists(crawl_keys.backlog), "nothing of the lane is queued"
        assert not client.exists(crawl_keys.hosts)
        assert "requeued 2 times" in letter.reason
        assert "w1" in letter.reason
        assert "heartbeat" in letter.reason
        stats = _stats(client, crawl_keys)
        assert (stats["requeued"], stats["dead_lettered"]) == (2, 1)

    def test_max_requeues_zero_dead_letters_at_once(self, frontier: Frontier) -> None:
        frontier.enqueue(_requests(b"a"))
        _lease_and_die(frontier, 1)
        assert _sweep(frontier, max_requeues=0) == SweepResult(0, 1, 1)
        (letter,) = frontier.upkeep.dead_letters()
        assert "requeued 0 times" in letter.reason

    def test_ceiling_dead_letter_names_the_ceiling(self, frontier: Frontier) -> None:
        frontier.enqueue(_requests(b"a"))
        _lease_and_stall(frontier, 1)
        assert _sweep(frontier, ceiling_ms=60_000, max_requeues=0) == SweepResult(0, 1, 0)
        (letter,) = frontier.upkeep.dead_letters()
        assert "60000 ms" in letter.reason
        assert "requeued 0 times" in letter.reason

    def test_silent_worker_without_leases_is_removed(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        _silence(client, crawl_keys, "gone")
        _beat(client, crawl_keys, "w1")
        assert _sweep(frontier) == SweepResult(0, 0, 1)
        assert client.zrange(crawl_keys.workers, 0, -1) == [b"w1"]

    def test_limit_makes_partial_progress_and_the_next_call_finishes(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        dead = make_frontier("dead")
        dead.enqueue(_requests(*(f"r{i}".encode() for i in range(5))))
        _lease_and_die(dead, 5)

        assert _sweep(dead, limit=3) == SweepResult(3, 0, 0)
        assert dead.upkeep.counts() == (3, 2)
        assert client.zscore(crawl_keys.workers, "dead") is not None, "leases remain"
        assert client.zcard(crawl_keys.owned) == 2
        assert _sweep(dead, limit=3) == SweepResult(2, 0, 1)
        assert dead.upkeep.counts() == (5, 0)
        assert client.zscore(crawl_keys.workers, "dead") is None
        assert _stats(client, crawl_keys)["requeued"] == 5

    def test_limit_exactly_used_up_removes_the_worker_on_the_next_call(
        self, frontier: Frontier
    ) -> None:
        frontier.enqueue(_requests(b"a", b"b"))
        _lease_and_die(frontier, 2)
        assert _sweep(frontier, limit=2) == SweepResult(2, 0, 0)
        assert _sweep(frontier, limit=2) == SweepResult(0, 0, 1)

    def test_limit_bounds_the_ceiling_pass_too(self, frontier: Frontier) -> None:
        frontier.enqueue(_requests(b"a", b"b", b"c"))
        _lease_and_stall(frontier, 3)
        assert _sweep(frontier, ceiling_ms=60_000, limit=2).requeued == 2
        assert _sweep(frontier, ceiling_ms=60_000, limit=2).requeued == 1
        assert frontier.upkeep.counts() == (3, 0)

    def test_never_requeues_an_acked_or_released_lease(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue(_requests(b"acked", b"released", b"held"))
        acked, released, held = frontier.lease(3).leases
        assert frontier.ack([acked.handle]) == 1
        assert frontier.release([released.handle]) == 1
        _silence(client, crawl_keys, "w1")
        _age_leases(client, crawl_keys, [acked.key, released.key, held.key])

        assert _sweep(frontier, ceiling_ms=1).requeued == 1
        assert _queued_payloads(client, crawl_keys) == [b"held", b"released"]
        assert frontier.upkeep.counts() == (2, 0)
        assert not client.exists(crawl_keys.leases), "stray lease entries are cleaned up"

    def test_is_idempotent(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue(_requests(b"a", b"b"))
        _lease_and_die(frontier, 2)
        assert _sweep(frontier, ceiling_ms=1).requeued == 2
        queue = _queue(client, crawl_keys)
        stats = _stats(client, crawl_keys)
        requeues = client.hgetall(crawl_keys.requeues)
        for _ in range(3):
            assert _sweep(frontier, ceiling_ms=1) == SweepResult(0, 0, 0)
        assert _queue(client, crawl_keys) == queue
        assert _stats(client, crawl_keys) == stats
        assert client.hgetall(crawl_keys.requeues) == requeues

    def test_nothing_to_do_on_an_empty_crawl(self, frontier: Frontier) -> None:
        assert _sweep(frontier, ceiling_ms=1) == SweepResult(0, 0, 0)

    def test_worker_ids_sharing_a_prefix_are_not_confused(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        short, long = make_frontier("w1"), make_frontier("w10")
        short.enqueue(_requests(b"short", b"long"))
        short.lease(1)
        long.lease(1)
        _silence(client, crawl_keys, "w1")
        _beat(client, crawl_keys, "w10")
        assert _sweep(short) == SweepResult(1, 0, 1)
        (entry,) = client.hvals(crawl_keys.inflight)
        assert entry.startswith(b"w10\n")
        assert entry.endswith(b"long")


# -- dead letters ------------------------------------------------------------------------


class TestDeadLetters:
    def test_round_trip(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier("w1")
        frontier.enqueue([NewRequest(b"swept", b"1", priority=3), NewRequest(b"buried", b"2")])
        swept, buried = frontier.lease(2).leases
        before = {client.hget(crawl_keys.inflight, lease.key).split(b"\n", 2)[2]: 0.0
                  for lease in (swept, buried)}  # the members the leases gave them
        assert frontier.bury(buried.handle, "undecodable")
        frontier.release([swept.handle])
        (swept,) = _lease_and_die(frontier, 1)
        assert _sweep(frontier, max_requeues=0).dead_lettered == 1
        assert frontier.upkeep.counts() == (0, 0)

        letters = {letter.field: letter for letter in frontier.upkeep.dead_letters()}
        assert set(letters) == {swept.key, buried.key}
        assert (letters[buried.key].reason, letters[buried.key].payload) == (
            "undecodable", b"buried",
        )
        assert letters[swept.key].payload == b"swept"
        swept_member = client.hget(crawl_keys.dead, swept.key).split(b"\n", 1)[1]
        assert swept_member in before, "the dead letter keeps the whole queue member"

        assert frontier.upkeep.reinject_dead([swept.key, buried.key, "no-such-field"]) == 2
        assert not client.exists(crawl_keys.dead)
        assert dict(_queue(client, crawl_keys)) == before
        assert _stats(client, crawl_keys)["reinjected"] == 2
        again = make_frontier("w2").lease(10).leases
        assert [(lease.key, lease.payload, lease.requeues) for lease in again] == [
            (swept.key, b"swept", 0), (buried.key, b"buried", 0),
        ]

    def test_reinjected_request_gets_a_fresh_requeue_budget(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue(_requests(b"a"))
        _lease_and_die(frontier, 1)
        _sweep(frontier, max_requeues=1)
        _lease_and_die(frontier, 1)
        assert _sweep(frontier, max_requeues=1).dead_lettered == 1
        (letter,) = frontier.upkeep.dead_letters()
        assert frontier.upkeep.reinject_dead([letter.field]) == 1
        assert not client.exists(crawl_keys.requeues)
        _lease_and_die(frontier, 1)
        assert _sweep(frontier, max_requeues=1).requeued == 1

    def test_drop_removes_dead_letters_and_their_requeue_counts_for_good(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue(_requests(b"a", b"b", b"c"))
        (swept,) = _lease_and_die(frontier, 1)
        assert _sweep(frontier, max_requeues=0).dead_lettered == 1
        client.hset(crawl_keys.requeues, swept.key, 4)  # what an older bury may leave
        for lease in frontier.lease(2).leases:
            frontier.bury(lease.handle, "bad")
        names = sorted(frontier.upkeep.dead_letter_names(10))
        assert len(names) == 3
        assert frontier.upkeep.drop_dead([swept.key, "no-such-field"]) == 1
        assert not client.hexists(crawl_keys.requeues, swept.key)
        assert sorted(frontier.upkeep.dead_letter_names(10)) == [n for n in names
                                                                 if n != swept.key]
        assert frontier.upkeep.drop_dead(frontier.upkeep.dead_letter_names(10)) == 2
        assert not client.exists(crawl_keys.dead)
        assert _stats(client, crawl_keys)["dead_dropped"] == 3
        assert frontier.upkeep.counts() == (0, 0), "nothing went back to the queue"
        assert frontier.upkeep.drop_dead([]) == 0

    def test_reinject_nothing(self, frontier: Frontier) -> None:
        assert frontier.upkeep.reinject_dead([]) == 0
        assert frontier.upkeep.reinject_dead(["000000000000001"]) == 0

    def test_dead_letters_respects_its_limit(self, frontier: Frontier) -> None:
        frontier.enqueue(_requests(*(f"r{i}".encode() for i in range(5))))
        for lease in frontier.lease(5).leases:
            frontier.bury(lease.handle, "bad")
        assert len(frontier.upkeep.dead_letters(limit=2)) == 2
        assert len(frontier.upkeep.dead_letters()) == 5

    def test_a_dead_letter_written_by_hand_is_listed_not_a_crash(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.hset(crawl_keys.dead, "by-hand", b"no newline here")
        (letter,) = frontier.upkeep.dead_letters()
        assert (letter.field, letter.reason, letter.payload) == ("by-hand", "no newline here", b"")

    def test_malformed_member_is_listed_and_stays_dead_when_reinjected(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.zadd(crawl_keys.queue, {b"garbage": 0})
        assert frontier.lease(5).malformed == 1
        (letter,) = frontier.upkeep.dead_letters()
        assert letter.field.startswith("malformed:")
        assert letter.reason == "malformed queue member"
        assert letter.payload == b"garbage"
        assert frontier.upkeep.reinject_dead([letter.field]) == 0, "no lane: it stays dead"
        assert frontier.upkeep.dead_letters() == [letter]
        assert frontier.upkeep.counts() == (0, 0)
        assert frontier.lease(5).malformed == 0
        assert "reinjected" not in _stats(client, crawl_keys)


# -- heartbeat, fleet view ---------------------------------------------------------------


class TestHeartbeat:
    def test_swept_once_a_sweep_removed_the_worker(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker, sweeper = make_frontier("w1"), make_frontier("w2")
        worker.register(flush=False, alive_ms=TIMEOUT_MS)
        sweeper.register(flush=False, alive_ms=TIMEOUT_MS)
        assert worker.heartbeat().status == "ok"
        assert worker.heartbeat().status == "ok"
        _silence(client, crawl_keys, "w1")
        assert _sweep(sweeper).workers_removed == 1
        assert worker.heartbeat().status == "swept"
        assert worker.heartbeat().status == "ok", "known again after saying so once"

    def test_late_but_not_swept_is_not_presumed_dead(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # After an outage longer than the timeout every heartbeat is old, but sweeps
        # wait for live workers to beat again: nothing was taken from them.
        frontier.register(flush=False, alive_ms=TIMEOUT_MS)
        _silence(client, crawl_keys, "w1")
        beat = frontier.heartbeat()
        assert beat.status == "ok"
        assert beat.late_ms >= 9 * TIMEOUT_MS
        assert frontier.heartbeat().late_ms < TIMEOUT_MS
        assert _sweep(frontier) == SweepResult(0, 0, 0)


class TestStall:
    def test_a_sweeper_as_late_as_the_others_takes_nobody_for_dead(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # A frozen Redis (SIGSTOP, a long fork) raises nothing: when it comes back,
        # every heartbeat is old, the sweeper's own too. That is a stall, not deaths.
        worker, sweeper = make_frontier("w1"), make_frontier("w2")
        worker.enqueue(_requests(b"a"))
        assert len(worker.lease(1).leases) == 1
        _silence(client, crawl_keys, "w1")
        _silence(client, crawl_keys, "w2")
        stalled = sweeper.upkeep.requeue_stale(
            timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=3, as_worker=True
        )
        assert stalled == SweepResult(0, 0, 0)
        _beat(client, crawl_keys, "w2")
        swept = sweeper.upkeep.requeue_stale(
            timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=3, as_worker=True
        )
        assert swept == SweepResult(1, 0, 1), "once the sweeper beats again, w1 is dead"


class TestPartialSweep:
    @staticmethod
    def _swept_in_part(
        make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> tuple[Frontier, Frontier]:
        """w1 holds three leases and falls silent; w2 sweeps two of them (its limit)."""
        worker, sweeper = make_frontier("w1", concurrency=WIDE), make_frontier("w2")
        worker.register(flush=False, alive_ms=TIMEOUT_MS)
        worker.enqueue(_requests(b"a", b"b", b"c"))
        assert len(worker.lease(3).leases) == 3
        _silence(client, crawl_keys, "w1")
        assert _sweep(sweeper, limit=2) == SweepResult(2, 0, 0)
        return worker, sweeper

    def test_a_worker_swept_in_part_learns_it_and_the_rest_is_swept_next(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker, sweeper = self._swept_in_part(make_frontier, client, crawl_keys)
        assert client.zscore(crawl_keys.workers, "w1") == 0, "marked: swept in part"
        assert _sweep(sweeper, limit=2) == SweepResult(1, 0, 1), "the rest, next time"
        assert worker.heartbeat().status == "swept"

    def test_a_worker_swept_in_part_that_beats_first_is_told(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker, _ = self._swept_in_part(make_frontier, client, crawl_keys)
        assert worker.heartbeat().status == "swept", "some of its leases were taken"
        assert worker.heartbeat().status == "ok"


class TestReleaseOrphans:
    """A lease whose reply was lost must not stay in flight under a live worker."""

    def test_unknown_leases_go_back_known_ones_stay(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue(_requests(b"a", b"b", b"c"))
        kept, *lost = frontier.lease(3).leases
        assert frontier.release_orphans([kept.key]) == 2
        assert client.hlen(crawl_keys.inflight) == 1
        assert client.zcard(crawl_keys.owned) == 1
        assert client.zcard(crawl_keys.leases) == 1
        again = frontier.lease(5).leases
        assert sorted(lease.payload for lease in again) == sorted(x.payload for x in lost)
        assert frontier.ack([kept.handle]) == 1

    def test_other_workers_leases_are_untouched(
        self, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        mine = Frontier(client, crawl_keys, "w1", concurrency=WIDE)
        theirs = Frontier(client, crawl_keys, "w10", concurrency=WIDE)
        mine.enqueue(_requests(b"a", b"b"))
        theirs.lease(2)
        assert mine.release_orphans([]) == 0
        assert client.hlen(crawl_keys.inflight) == 2


class TestFleetView:
    def test_fleet_stats(self, frontier: Frontier) -> None:
        assert frontier.upkeep.fleet_stats() == {}
        frontier.enqueue(_requests(b"a", b"b", b"a"))
        frontier.ack([lease.handle for lease in frontier.lease(1).leases])
        assert frontier.upkeep.fleet_stats() == {
            "enqueued": 2, "filtered": 1, "leased": 1, "acked": 1,
        }

    def test_workers_alive_counts_recent_heartbeats(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        for name in ("a", "b"):
            make_frontier(name).register(flush=False, alive_ms=TIMEOUT_MS)
        _silence(client, crawl_keys, "old")
        assert make_frontier("a").upkeep.workers_alive(TIMEOUT_MS) == 2
        assert make_frontier("a").upkeep.workers_alive(100 * TIMEOUT_MS) == 3


# -- many sweepers at once (real server) -------------------------------------------------

N_STALE = 500


def _sweep_until_done(url: str, start: Any, results: Any) -> None:
    client = redis.Redis.from_url(url)
    try:
        frontier = Frontier(client, KEYS, "sweeper", concurrency=WIDE)
        start.wait(30)
        requeued = dead = removed = 0
        while True:
            result = frontier.upkeep.requeue_stale(
                timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=3, limit=3
            )
            requeued += result.requeued
            dead += result.dead_lettered
            removed += result.workers_removed
            if result == SweepResult(0, 0, 0) and client.zscore(KEYS.workers, "dead") is None:
                break
        results.put((requeued, dead, removed))
    finally:
        client.close()


def test_concurrent_sweepers_requeue_each_lease_exactly_once(
    real_redis: redis.Redis, redis_url: str
) -> None:
    frontier = Frontier(real_redis, KEYS, "dead", concurrency=WIDE)
    payloads = [f"request-{i}".encode() for i in range(N_STALE)]
    frontier.enqueue(
        [NewRequest(p, b"fp-" + p, lane=f"host-{i % 7}") for i, p in enumerate(payloads)]
    )
    assert len(frontier.lease(N_STALE).leases) == N_STALE
    queue_before_lease = set()  # each in-flight entry remembers its queue member
    for entry in real_redis.hvals(KEYS.inflight):
        _, _, member = entry.split(b"\n", 2)
        queue_before_lease.add((member, 0.0))
    _silence(real_redis, KEYS, "dead")

    totals = run_at_once([(_sweep_until_done, (redis_url,))] * 4, timeout=60)

    assert sum(requeued for requeued, _, _ in totals) == N_STALE
    assert sum(1 for requeued, _, _ in totals if requeued) > 1, "the sweeps did not overlap"
    assert sum(dead for _, dead, _ in totals) == 0
    assert sum(removed for _, _, removed in totals) == 1
    assert set(_queue(real_redis, KEYS)) == queue_before_lease
    assert queued_count(real_redis, KEYS) == N_STALE
    assert frontier.upkeep.counts() == (N_STALE, 0)
    assert _stats(real_redis, KEYS)["requeued"] == N_STALE
    assert set(real_redis.hvals(KEYS.requeues)) == {b"1"}
    assert not real_redis.exists(KEYS.owned)
    assert not real_redis.exists(KEYS.leases)
    assert not real_redis.exists(KEYS.busy)
    assert real_redis.hgetall(KEYS.backlog) == {
        f"host-{lane}".encode(): str(len(range(lane, N_STALE, 7))).encode() for lane in range(7)
    }


# -- RedisHealth ---------------------------------------------------------------------------


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def _health_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """What RedisHealth logged: caplog also takes what another test's leftover logs
    meanwhile (seen once under pytest-xdist: a crawl-gone ERROR of the scheduler's)."""
    return [record for record in caplog.records if record.name == "scrapy_redisspine.health"]


class TestRedisHealth:
    def test_healthy_from_the_start(self) -> None:
        clock = FakeClock()
        health = RedisHealth(clock=clock)
        assert not health.down
        assert health.available()
        clock.advance(12.5)
        assert health.healthy_for() == pytest.approx(12.5)

    def test_backoff_doubles_up_to_the_maximum(self) -> None:
        clock = FakeClock()
        errors: list[str] = []
        health = RedisHealth(max_delay=1.0, on_error=errors.append, clock=clock)
        for delay in (0.1, 0.2, 0.4, 0.8, 1.0, 1.0):
            health.failed("lease", redis.ConnectionError("refused"))
            assert not health.available()
            clock.advance(delay - 0.001)
            assert not health.available(), delay
            clock.advance(0.002)
            assert health.available(), delay
        assert errors == ["lease"] * 6
        assert health.down

    def test_not_available_during_backoff(self) -> None:
        clock = FakeClock()
        health = RedisHealth(clock=clock)
        health.failed("enqueue", redis.ConnectionError("refused"))
        health.failed("enqueue", redis.ConnectionError("refused"))  # delay 0.2
        clock.advance(0.19)
        assert not health.available()
        clock.advance(0.02)
        assert health.available()
        assert health.down, "available to retry, but not known to be back"
        assert health.healthy_for() == 0.0

    def test_error_is_logged_once_per_outage(self, caplog: pytest.LogCaptureFixture) -> None:
        health = RedisHealth(clock=FakeClock())
        with caplog.at_level(logging.ERROR, logger="scrapy_redisspine"):
            for _ in range(5):
                health.failed("heartbeat", redis.ConnectionError("refused"))
        (record,) = _health_records(caplog)
        assert "heartbeat" in record.getMessage()
        assert "ConnectionError" in record.getMessage()

    def test_success_resets_and_says_redis_is_back(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        clock = FakeClock()
        health = RedisHealth(max_delay=4.0, clock=clock)
        for _ in range(5):
            health.failed("lease", redis.ConnectionError("refused"))
        clock.advance(7.0)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
            health.succeeded()
        (record,) = _health_records(caplog)
        assert "back" in record.getMessage()
        assert "7.0 s" in record.getMessage()
        assert not health.down
        assert health.available()
        assert health.healthy_for() == 0.0
        clock.advance(3.0)
        assert health.healthy_for() == pytest.approx(3.0)
        health.failed("lease", redis.ConnectionError("refused"))
        clock.advance(0.1)
        assert health.available(), "the backoff starts again from its first delay"

    def test_success_while_healthy_logs_nothing(self, caplog: pytest.LogCaptureFixture) -> None:
        clock = FakeClock()
        health = RedisHealth(clock=clock)
        clock.advance(5)
        with caplog.at_level(logging.DEBUG, logger="scrapy_redisspine"):
            health.succeeded()
        assert not _health_records(caplog)
        assert health.healthy_for() == pytest.approx(5)


# -- the scheduler --------------------------------------------------------------------------


def _stat(scheduler: Scheduler, name: str) -> Any:
    return scheduler.stats.get_value(name)


def _start(url: str) -> Request:
    return Request(url, dont_filter=True, meta={"is_start_request": True})


def _open_on(url: str, clock: task.Clock, **settings: Any) -> Scheduler:
    """A scheduler on a server of the test's own (not the session's)."""
    scheduler = build_scheduler(url, clock, "w1", **settings)
    scheduler.open(SchedSpider())
    return scheduler


def _wait(clock: task.Clock, seconds: float = 0.05) -> None:
    """Let real time pass (a server restarts) and the worker's clock with it."""
    time.sleep(seconds)
    clock.advance(seconds)


class TestMemoryPressure:
    def test_sheds_discovered_requests_only(
        self, make_scheduler: MakeScheduler, client: redis.Redis,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        # all on one host: three may be in flight at once
        scheduler = make_scheduler(REDISSPINE_HOST_CONCURRENCY=3)
        scheduler.guard.memory_pressure = True
        with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
            assert scheduler.enqueue_request(Request("http://example.com/new1")) is False
            assert scheduler.enqueue_request(Request("http://example.com/new2")) is False
            assert scheduler.enqueue_request(_start("http://example.com/start"))
            assert scheduler.enqueue_request(
                Request("http://example.com/retry", dont_filter=True)
            )
        assert scheduler.outbox.try_flush()
        assert queued_count(client, KEYS) == 2
        assert _stat(scheduler, "redisspine/memory/shed") == 2
        assert _stat(scheduler, "scheduler/enqueued") == 2
        warnings = [r.getMessage() for r in caplog.records if "memory" in r.getMessage()]
        assert len(warnings) == 1, "the shed warning is rate-limited"
        assert not client.exists(KEYS.seen), "shed requests are not marked seen"

        scheduler.guard.memory_pressure = False
        assert scheduler.enqueue_request(Request("http://example.com/new1"))
        assert scheduler.outbox.try_flush()
        urls = {request.url for request in iter(scheduler.next_request, None)}
        assert urls == {
            "http://example.com/start", "http://example.com/retry", "http://example.com/new1",
        }


class TestFullRedisWhileLeasing:
    def test_refused_discoveries_are_shed_and_the_lease_still_taken(
        self, redis_url: str, redis_server: RedisServer, clock: task.Clock,
    ) -> None:
        # The outbox goes in the same round trip as the lease: a full Redis refuses
        # the enqueue (new requests) but the lease runs and its leases are kept.
        scheduler = _open_on(redis_url, clock, REDISSPINE_LEASE_BATCH_SIZE=1)
        client = redis_server.client()
        try:
            for url in ("http://a.example/", "http://b.example/"):
                scheduler.enqueue_request(Request(url))
            first = scheduler.next_request()
            assert first is not None
            client.config_set("maxmemory", 1)
            assert scheduler.enqueue_request(Request("http://c.example/new"))
            second = scheduler.next_request()
            assert second is not None, "leased although the enqueue was refused"
            assert {first.url, second.url} == {"http://a.example/", "http://b.example/"}
            assert scheduler.guard.memory_pressure
            assert _stat(scheduler, "redisspine/memory/shed") == 1
            assert _stat(scheduler, "redisspine/memory/oom/enqueue") == 1
            assert len(scheduler.outbox) == 0, "the discovery was shed"
            assert scheduler.outbox.try_flush(), "its count goes in on a full Redis"
            assert client.hget(scheduler.frontier.keys.stats, "shed") == b"1"
            assert not scheduler.guard.down, "a full Redis is not a down one"
        finally:
            client.config_set("maxmemory", 0)
            client.close()
            scheduler.close("shutdown")


class TestFullRedisAtClose:
    def test_unstarted_leases_go_back_and_the_worker_leaves_on_a_full_redis(
        self, redis_url: str, redis_server: RedisServer, clock: task.Clock,
    ) -> None:
        # Closing frees as much as it takes: a full Redis must not keep a closing
        # worker's unstarted leases from the queue, nor the worker in the fleet.
        scheduler = _open_on(redis_url, clock, REDISSPINE_LEASE_BATCH_SIZE=2)
        client = redis_server.client()
        keys = scheduler.frontier.keys
        try:
            for url in ("http://a.example/", "http://b.example/"):
                scheduler.enqueue_request(Request(url))
            assert scheduler.next_request() is not None  # the other lease waits
            client.config_set("maxmemory", 1)
            scheduler.close("shutdown")  # neither was fetched: both go back
            assert queued_count(client, keys) == 2, "the unstarted leases went back"
            assert client.hlen(keys.inflight) == 0
            assert client.zscore(keys.workers, scheduler.frontier.worker_id) is None
        finally:
            client.config_set("maxmemory", 0)
            client.close()


class TestFullRedisAfterEnqueue:
    def test_a_shed_request_is_reported_dropped(
        self, redis_url: str, redis_server: RedisServer, clock: task.Clock,
    ) -> None:
        # enqueue_request() said yes; Redis, full, refused the batch later: the shed
        # request was not queued, and Scrapy hears so (request_dropped).
        from scrapy import signals as scrapy_signals
        from scrapy.utils.test import get_crawler

        crawler = get_crawler(SchedSpider)
        dropped: list[str] = []
        crawler.signals.connect(lambda request, spider: dropped.append(request.url),
                                signal=scrapy_signals.request_dropped, weak=False)
        scheduler = build_scheduler(redis_url, clock, "w1", crawler=crawler)
        scheduler.open(SchedSpider())
        client = redis_server.client()
        try:
            assert scheduler.enqueue_request(Request("http://a.example/new"))
            client.config_set("maxmemory", 1)
            scheduler.outbox.try_flush()
            assert scheduler.guard.memory_pressure
            assert _stat(scheduler, "redisspine/memory/shed") == 1
            assert dropped == ["http://a.example/new"]
        finally:
            client.config_set("maxmemory", 0)
            client.close()
            scheduler.close("shutdown")


class TestFencedScheduler:
    def test_fenced_drops_ready_leases_and_the_stale_ack_is_refused(
        self, make_scheduler: MakeScheduler, client: redis.Redis
    ) -> None:
        scheduler = make_scheduler(
            "w1", REDISSPINE_LEASE_BATCH_SIZE=4, REDISSPINE_HOST_CONCURRENCY=4, free_slots=4
        )
        for i in range(4):
            scheduler.enqueue_request(Request(f"http://example.com/{i}"))
        started = scheduler.next_request()
        assert started is not None
        assert scheduler.book.ready == 3

        _silence(client, KEYS, "w1")
        sweeper = Frontier(client, KEYS, "sweeper", concurrency=4)
        assert _sweep(sweeper) == SweepResult(4, 0, 1)

        scheduler.fleet.heartbeat()
        assert not scheduler.book.ready
        assert _stat(scheduler, "redisspine/scheduler/presumed_dead") == 1
        finish(scheduler, started)
        scheduler.outbox.try_flush()
        assert _stat(scheduler, "redisspine/scheduler/ack_refused") == 1
        assert (queued_count(client, KEYS), client.hlen(KEYS.inflight)) == (4, 0)

        scheduler.fleet.heartbeat()
        assert _stat(scheduler, "redisspine/scheduler/presumed_dead") == 1
        assert len(Frontier(client, KEYS, "w2", concurrency=4).lease(10).leases) == 4

    def test_fenced_does_not_strand_leases_taken_after_the_sweep(
        self, make_scheduler: MakeScheduler, client: redis.Redis
    ) -> None:
        # A worker cut off from Redis (or paused) past the timeout is swept while it
        # holds nothing. When it comes back, the engine asks for work before the next
        # heartbeat: it leases a batch under its id, although it is no longer in
        # `workers`. The heartbeat then says "you were presumed dead", and those
        # fresh, valid leases must not be dropped: nothing else would ever requeue
        # them (the worker is alive again), so the crawl could never finish.
        scheduler = make_scheduler(
            "w1", REDISSPINE_LEASE_BATCH_SIZE=4, REDISSPINE_HOST_CONCURRENCY=4, free_slots=4
        )
        _silence(client, KEYS, "w1")
        assert _sweep(Frontier(client, KEYS, "sweeper", concurrency=4)).workers_removed == 1

        for i in range(3):
            scheduler.enqueue_request(Request(f"http://example.com/{i}"))
        started = scheduler.next_request()
        assert started is not None
        assert scheduler.book.ready == 2, "a whole batch was leased after the sweep"
        scheduler.fleet.heartbeat()  # False: presumed dead
        assert _stat(scheduler, "redisspine/scheduler/presumed_dead") == 1
        finish(scheduler, started)
        assert scheduler.outbox.try_flush()
        assert _stat(scheduler, "redisspine/scheduler/acked") == 1, "its token is valid"

        scheduler.close("shutdown")  # returns every lease it still knows of
        queued, inflight = queued_count(client, KEYS), client.hlen(KEYS.inflight)
        assert (queued, inflight) == (2, 0), (
            f"{inflight} valid lease(s) forgotten by the worker but left in flight under "
            f"its id: only the lease ceiling would ever requeue them"
        )


class TestRequeuedLeaseInTheScheduler:
    def test_meta_counts_the_requeues(
        self, make_scheduler: MakeScheduler, client: redis.Redis
    ) -> None:
        scheduler = make_scheduler("w1")
        scheduler.enqueue_request(Request("http://example.com/twice"))
        scheduler.enqueue_request(Request("http://example.com/fresh", priority=-1))
        assert scheduler.outbox.try_flush()
        dead = Frontier(client, KEYS, "dead")
        assert len(dead.lease(1).leases) == 1
        _silence(client, KEYS, "dead")
        assert _sweep(dead).requeued == 1

        first = scheduler.next_request()
        assert first is not None
        assert first.url == "http://example.com/twice"
        assert first.meta["redisspine_requeues"] == 1
        assert _stat(scheduler, "redisspine/scheduler/leased_requeued") == 1
        finish(scheduler, first)  # frees the host's one slot
        second = scheduler.next_request() or scheduler.next_request()
        assert second is not None
        assert "redisspine_requeues" not in second.meta


@contextlib.contextmanager
def _scheduler_on(server: RedisServer, clock: task.Clock, **settings: Any) -> Iterator[Scheduler]:
    """Start ``server`` (the test's own, which it may kill) and open a scheduler on it;
    close the scheduler (if the server still runs) and stop the server however the
    block ends."""
    server.start()
    scheduler: Scheduler | None = None
    try:
        scheduler = _open_on(server.url, clock, **settings)
        yield scheduler
    finally:
        if scheduler is not None and server.running:
            scheduler.close("shutdown")
        server.stop()


class TestSchedulerDuringAnOutage:
    def test_requests_and_acks_wait_for_redis_and_nothing_is_lost(
        self, tmp_path: Any, clock: task.Clock
    ) -> None:
        server = RedisServer(
            appendonly=True, directory=tmp_path / "redis", extra_args=["--appendfsync", "always"]
        )
        with _scheduler_on(server, clock, REDISSPINE_ENQUEUE_BATCH_SIZE=2) as scheduler:
            scheduler.enqueue_request(Request("http://example.com/parent"))
            parent = scheduler.next_request()
            assert parent is not None

            server.kill()
            children = [f"http://example.com/child{i}" for i in range(3)]
            for url in children:
                assert scheduler.enqueue_request(Request(url))
            finish(scheduler, parent)
            assert not scheduler.outbox.try_flush()
            assert scheduler.guard.down
            assert len(scheduler.outbox) == 3
            assert scheduler.outbox.acks == 1
            assert scheduler.has_pending_requests()
            assert scheduler.next_request() is None
            scheduler.fleet.heartbeat()
            assert scheduler.has_pending_requests()
            assert _stat(scheduler, "redisspine/redis_errors/enqueue") >= 1

            server.restart()
            deadline = time.monotonic() + 10
            while not scheduler.outbox.try_flush():
                assert time.monotonic() < deadline, "never flushed after Redis came back"
                _wait(clock)
            assert not scheduler.guard.down
            assert scheduler.outbox.empty
            assert not scheduler.outbox.acks
            assert _stat(scheduler, "redisspine/scheduler/acked") == 1

            got = []
            deadline = time.monotonic() + 5
            while len(got) < 3 and time.monotonic() < deadline:
                request = scheduler.next_request()
                if request is None:
                    _wait(clock, 0.02)
                    continue
                got.append(request)
                finish(scheduler, request)
            assert sorted(request.url for request in got) == children
            assert scheduler.outbox.try_flush()  # the last ack
            check = server.client()
            try:
                assert (queued_count(check, KEYS), check.hlen(KEYS.inflight)) == (0, 0)
                assert int(check.hget(KEYS.stats, "acked")) == 4
            finally:
                check.close()
            _wait(clock, 0.02)
            assert not scheduler.has_pending_requests()

    def test_not_pending_is_never_claimed_while_redis_is_down(
        self, tmp_path: Any, clock: task.Clock
    ) -> None:
        # Nothing buffered, the fleet was empty at the last count: the first count
        # that fails must not answer from that stale cache (the engine would close
        # the spider as "finished" while Redis cannot say whether work remains).
        # AOF on: Redis comes back with the crawl (an empty one is lost state,
        # tests/unit/test_crawl_record.py).
        server = RedisServer(appendonly=True, directory=tmp_path / "redis",
                             extra_args=["--appendfsync", "always"])
        with _scheduler_on(server, clock) as scheduler:
            scheduler.enqueue_request(Request("http://example.com/a"))
            request = scheduler.next_request()
            assert request is not None
            finish(scheduler, request)
            assert scheduler.outbox.try_flush()
            _wait(clock, 0.02)
            assert not scheduler.has_pending_requests()
            server.kill()
            _wait(clock, 0.02)
            assert scheduler.has_pending_requests(), "answered from a stale count"
            assert scheduler.guard.down
            _wait(clock, 0.3)
            assert scheduler.has_pending_requests()

            server.restart()
            deadline = time.monotonic() + 10
            while scheduler.guard.down:  # the engine keeps asking for requests
                assert time.monotonic() < deadline, "never noticed Redis is back"
                assert scheduler.next_request() is None
                _wait(clock)
            _wait(clock, 0.02)
            assert not scheduler.has_pending_requests()


# -- the Recovery extension --------------------------------------------------------------


class StubUpkeep:
    """The frontier's upkeep calls, as the extension sees them (no Redis)."""

    def __init__(self) -> None:
        self.memory_info: dict[str, Any] = {"used_memory": 10, "maxmemory": 0}
        self.error: Exception | None = None
        self.sweeps: list[dict[str, int]] = []
        self.unindexed: list[str] = []
        self.result = SweepResult(0, 0, 0)
        self.stats = {"enqueued": 5, "acked": 2}
        self.progress: list[tuple[int, int]] = []
        self.others: dict[str, StubUpkeep | None] = {}  # the group's other crawls
        self.keys = CrawlKeys("redisspine", "mine")

    def memory(self) -> MemoryReading:
        if self.error is not None:
            raise self.error
        return MemoryReading(self.memory_info["used_memory"], self.memory_info["maxmemory"],
                             evicting_policy(self.memory_info))

    def requeue_stale(self, **kwargs: int) -> SweepResult:
        self.sweeps.append(kwargs)
        return self.result

    def group_crawls(self, limit: int) -> list[str]:
        return sorted(self.others)[:limit]

    def of_crawl(self, crawl_id: str) -> StubUpkeep | None:
        return self.others[crawl_id]

    def repair_unindexed(self, cursor: str, limit: int, **kwargs: Any) -> UnindexedResult:
        self.unindexed.append(cursor)
        return UnindexedResult("0", 0, 0, 0, 0)

    def read_fleet_stats(self) -> tuple[dict[str, int], list[str]]:
        return dict(self.stats), []

    def workers_alive(self, timeout_ms: int) -> int:
        return 3

    def record_progress(self, worker_acks: int, fleet_acks: int) -> None:
        self.progress.append((worker_acks, fleet_acks))


class StubWorker:
    """A worker's view (``signals.WorkerView``) over a stub or a real upkeep."""

    def __init__(
        self, clock: FakeClock, recovery: Recovery, upkeep: Any = None, delay: float = 0.0
    ) -> None:
        self.upkeep = upkeep if upkeep is not None else StubUpkeep()
        self.wakes = 0
        self.guard = RedisGuard(recovery.stats, clock)
        config = load_config({"DOWNLOAD_DELAY": delay, "DOWNLOAD_DELAY_JITTER": 0})
        frontier = Frontier(fakeredis.FakeRedis(), KEYS, "w1")
        hosts = HostPolicy(config, frontier, self.guard, LeaseBook(), recovery.stats)
        self.view = WorkerView("w1", self.upkeep, self.guard, hosts, self._wake,
                               StartRegistry())
        recovery.worker = self.view

    def _wake(self) -> None:
        self.wakes += 1


def _recovery(**settings: Any) -> tuple[Recovery, MemoryStatsCollector]:
    config = load_config({"REDISSPINE_WORKER_TIMEOUT_SECONDS": 30, **settings})
    stats = MemoryStatsCollector(get_crawler(SchedSpider))
    return Recovery(config, stats, clock=task.Clock()), stats


class TestRecoveryExtension:
    def test_waits_one_timeout_of_health_before_sweeping(self) -> None:
        clock = FakeClock()
        recovery, _ = _recovery()
        worker = StubWorker(clock, recovery)
        recovery.sweep()
        clock.advance(29)
        recovery.sweep()
        assert worker.upkeep.sweeps == []
        clock.advance(1)
        recovery.sweep()
        assert worker.upkeep.sweeps == [
            {
                "timeout_ms": 30_000, "ceiling_ms": 3_600_000, "max_requeues": 3, "limit": 1000,
                "rest_ms": 0,
                "lane_rests": {}, "as_worker": True,
            }
        ]

    def test_sweeps_the_groups_other_crawls_for_long_dead_workers(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        clock = FakeClock()
        recovery, stats = _recovery()
        worker = StubWorker(clock, recovery)
        dead, gone = StubUpkeep(), None
        dead.result = SweepResult(2, 0, 1)
        worker.upkeep.others = {"other": dead, "purged": gone}
        clock.advance(30)
        with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
            recovery.sweep()
        # Three timeouts of this worker's, no ceiling: the other crawl's own workers
        # sweep by their own settings first.
        assert dead.sweeps == [{
            "timeout_ms": 90_000, "ceiling_ms": 0, "max_requeues": 3, "limit": 1000,
            "rest_ms": 0, "lane_rests": {},
        }]
        assert stats.get_value("redisspine/recovery/group_requeued") == 2
        assert "crawl 'other' of politeness group 'default' had 1 dead worker(s)" in caplog.text

    def test_after_an_outage_waits_one_timeout_again(self) -> None:
        clock = FakeClock()
        recovery, _ = _recovery()
        worker = StubWorker(clock, recovery)
        clock.advance(60)
        worker.guard.failed("lease", redis.ConnectionError("down"))
        clock.advance(10)
        recovery.sweep()
        worker.guard.succeeded()
        clock.advance(29)
        recovery.sweep()
        assert worker.upkeep.sweeps == []
        clock.advance(1)
        recovery.sweep()
        assert len(worker.upkeep.sweeps) == 1

    def test_uses_the_settings(self) -> None:
        clock = FakeClock()
        recovery, _ = _recovery(
            REDISSPINE_WORKER_TIMEOUT_SECONDS=10, REDISSPINE_HEARTBEAT_SECONDS=1,
            REDISSPINE_LEASE_CEILING_SECONDS=0, REDISSPINE_MAX_REQUEUES=7,
        )
        worker = StubWorker(clock, recovery)
        clock.advance(10)
        recovery.sweep()
        assert worker.upkeep.sweeps == [
            {"timeout_ms": 10_000, "ceiling_ms": 0, "max_requeues": 7, "limit": 1000, "rest_ms": 0,
             "lane_rests": {}, "as_worker": True}
        ]

    def test_requeued_lanes_rest_the_default_delay(self) -> None:
        # The dead worker may have been fetching from the lane when it died.
        clock = FakeClock()
        recovery, _ = _recovery()
        worker = StubWorker(clock, recovery, delay=2.5)
        clock.advance(30)
        recovery.sweep()
        (sweep,) = worker.upkeep.sweeps
        assert sweep["rest_ms"] == 2_500

    def test_requeued_lanes_with_a_delay_of_their_own_rest_it(self) -> None:
        clock = FakeClock()
        recovery, _ = _recovery()
        worker = StubWorker(clock, recovery, delay=2.5)
        worker.view.hosts.delays.overrides = {"slow.example": 20.0, "fast.example": 0.0}
        clock.advance(30)
        recovery.sweep()
        (sweep,) = worker.upkeep.sweeps
        assert sweep["lane_rests"] == {"slow.example": 20_000, "fast.example": 0}

    def test_sets_fleet_stats_and_wakes_the_scheduler_after_requeuing(self) -> None:
        clock = FakeClock()
        recovery, stats = _recovery()
        worker = StubWorker(clock, recovery)
        clock.advance(30)
        recovery.sweep()
        assert worker.wakes == 0
        assert stats.get_value("redisspine/fleet/enqueued") == 5
        assert stats.get_value("redisspine/fleet/acked") == 2
        assert stats.get_value("redisspine/fleet/workers_alive") == 3
        worker.upkeep.result = SweepResult(4, 1, 2)
        recovery.sweep()
        assert worker.wakes == 1
        assert stats.get_value("redisspine/recovery/requeued") == 4
        assert stats.get_value("redisspine/recovery/dead_lettered") == 1

    @pytest.mark.parametrize(
        ("memory", "budget", "pressure"),
        [
            ({"used_memory": 95, "maxmemory": 100}, 0, True),
            ({"used_memory": 90, "maxmemory": 100}, 0, True),
            ({"used_memory": 89, "maxmemory": 100}, 0, False),
            ({"used_memory": 950, "maxmemory": 0}, 1000, True),
            ({"used_memory": 950, "maxmemory": 10_000}, 1000, True),
            ({"used_memory": 950, "maxmemory": 1000}, 10_000, True),
            ({"used_memory": 950, "maxmemory": 10_000}, 100_000, False),
            ({"used_memory": 10**12, "maxmemory": 0}, 0, False),
        ],
    )
    def test_memory_pressure_thresholds(
        self, memory: dict[str, int], budget: int, pressure: bool
    ) -> None:
        clock = FakeClock()
        recovery, _ = _recovery(REDISSPINE_MEMORY_BUDGET_BYTES=budget)
        worker = StubWorker(clock, recovery)
        worker.upkeep.memory_info = memory
        clock.advance(30)
        recovery.sweep()
        assert worker.guard.memory_pressure is pressure

    def test_memory_pressure_has_hysteresis(self) -> None:
        clock = FakeClock()
        recovery, stats = _recovery()
        worker = StubWorker(clock, recovery)
        upkeep = worker.upkeep
        clock.advance(30)
        for used, expected in [(50, False), (91, True), (85, True), (80, True), (79, False),
                               (85, False), (90, True)]:
            upkeep.memory_info = {"used_memory": used, "maxmemory": 100}
            recovery.sweep()
            assert worker.guard.memory_pressure is expected, used
        assert stats.get_value("redisspine/memory/over_budget") == 1
        assert stats.get_value("redisspine/memory/used_share") == 0.9

    @pytest.mark.parametrize(
        ("policy", "maxmemory", "evicting"),
        [
            ("allkeys-lru", 1000, "allkeys-lru"),
            ("allkeys-lfu", 1000, "allkeys-lfu"),
            ("allkeys-random", 1000, "allkeys-random"),
            ("allkeys-lru", 0, ""),  # no limit: nothing is evicted
            ("volatile-lru", 1000, ""),  # the crawl's keys never expire
            ("volatile-ttl", 1000, ""),
            ("noeviction", 1000, ""),
            (None, 1000, ""),  # a reply without the field
        ],
    )
    def test_the_memory_watch_tells_the_worker_of_a_server_that_may_evict(
        self, policy: str | None, maxmemory: int, evicting: str
    ) -> None:
        clock = FakeClock()
        recovery, stats = _recovery()
        worker = StubWorker(clock, recovery)
        told: list[str] = []
        worker.guard.on_evicting = told.append
        worker.upkeep.memory_info = {"used_memory": 10, "maxmemory": maxmemory}
        if policy is not None:
            worker.upkeep.memory_info["maxmemory_policy"] = policy
        clock.advance(30)
        recovery.sweep()
        assert told == ([evicting] if evicting else [])
        assert stats.get_value("redisspine/memory/evicting_policy") == (evicting or None)

    def test_a_redis_error_marks_redis_down_and_does_not_raise(self) -> None:
        clock = FakeClock()
        recovery, stats = _recovery()
        worker = StubWorker(clock, recovery)
        worker.upkeep.error = redis.ConnectionError("gone")
        clock.advance(30)
        recovery.sweep()
        assert worker.guard.down
        assert not worker.guard.available()
        assert stats.get_value("redisspine/redis_errors/memory") == 1
        assert stats.get_value("redisspine/fleet/workers_alive") == 3, "read before the error"

    def test_does_nothing_before_the_worker_opened(self) -> None:
        recovery, _ = _recovery()
        recovery.sweep()

    def test_sweep_seconds_zero_disables_the_extension(self) -> None:
        crawler = get_crawler(SchedSpider, {"REDISSPINE_SWEEP_SECONDS": 0})
        with pytest.raises(NotConfigured):
            Recovery.from_crawler(crawler)

    def test_heartbeat_over_half_the_timeout_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="REDISSPINE_HEARTBEAT_SECONDS"):
            load_config(
                {"REDISSPINE_HEARTBEAT_SECONDS": 16, "REDISSPINE_WORKER_TIMEOUT_SECONDS": 30}
            )
        load_config({"REDISSPINE_HEARTBEAT_SECONDS": 15, "REDISSPINE_WORKER_TIMEOUT_SECONDS": 30})

    def test_real_sweep_on_a_real_server(self, real_redis: redis.Redis, redis_url: str) -> None:
        dead = Frontier(real_redis, KEYS, "dead")
        dead.enqueue(_requests(b"a", lane="a.example") + _requests(b"b", lane="b.example"))
        assert len(dead.lease(2).leases) == 2
        _silence(real_redis, KEYS, "dead")
        _beat(real_redis, KEYS, "w1")
        clock = FakeClock()
        recovery, stats = _recovery()
        worker = StubWorker(clock, recovery, Frontier(real_redis, KEYS, "w1").upkeep)
        clock.advance(30)
        recovery.sweep()
        assert not worker.guard.down
        assert dead.upkeep.counts() == (2, 0)
        assert worker.wakes == 1
        assert stats.get_value("redisspine/recovery/requeued") == 2
        assert stats.get_value("redisspine/fleet/requeued") == 2
        assert stats.get_value("redisspine/fleet/workers_alive") == 1
        assert worker.guard.memory_pressure is False
        assert not real_redis.exists(KEYS.busy)
        assert sorted(real_redis.zrange(KEYS.hosts, 0, -1)) == [b"a.example", b"b.example"]


class TestFullRedisAtStart:
    def test_start_requests_go_in_on_a_full_redis_so_a_late_worker_finishes(
        self, redis_url: str, redis_server: RedisServer, clock: task.Clock,
    ) -> None:
        # A worker that joins late, when Redis is full and stays full (the crawl's dedup
        # SET outgrew the budget): its start requests are work, not discoveries. The
        # ones the crawl had all along are skipped, a new one goes in all the same:
        # waiting for room would keep the worker from finishing for good.
        first = _open_on(redis_url, clock)
        late = build_scheduler(redis_url, clock, "w2")
        late.open(SchedSpider())
        client = redis_server.client()
        try:
            first.enqueue_request(_start("http://example.com/start"))
            assert first.outbox.try_flush()
            client.config_set("maxmemory", 1)
            late.enqueue_request(_start("http://example.com/start"))
            late.enqueue_request(_start("http://example.com/other-start"))
            assert late.outbox.try_flush(), "no room is needed for start requests"
            assert late.outbox.empty
            assert _stat(late, "redisspine/scheduler/start_requests_skipped") == 1
            assert _stat(late, "redisspine/memory/shed") is None
            members = _queued_payloads(client, late.frontier.keys)
            assert len(members) == 2
            assert any(b"other-start" in m for m in members)
        finally:
            client.config_set("maxmemory", 0)
            client.close()
            first.close("shutdown")
            late.close("shutdown")

    def test_a_refused_batch_sheds_discoveries_and_its_start_goes_in_on_the_retry(
        self, redis_url: str, redis_server: RedisServer, clock: task.Clock,
    ) -> None:
        # A batch of a start request and a discovery, no ack: a full Redis refuses
        # it whole. The discovery is shed (counted, logged); the start request is
        # kept and goes in on the next try although Redis is still full.
        scheduler = _open_on(redis_url, clock)
        client = redis_server.client()
        try:
            client.config_set("maxmemory", 1)
            scheduler.enqueue_request(_start("http://example.com/start"))
            scheduler.enqueue_request(Request("http://example.com/found"))
            assert not scheduler.outbox.try_flush()
            assert _stat(scheduler, "redisspine/memory/shed") == 1
            assert len(scheduler.outbox) == 1
            assert scheduler.outbox.try_flush(), "the kept start request needs no room"
            members = _queued_payloads(client, scheduler.frontier.keys)
            assert len(members) == 1
            assert b"/start" in members[0]
        finally:
            client.config_set("maxmemory", 0)
            client.close()
            scheduler.close("shutdown")
