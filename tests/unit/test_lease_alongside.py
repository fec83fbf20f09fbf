"""A lease alongside: while a lease carrying the outbox is on its way, a second one
that carries nothing may go on another connection, so that Redis leases the next
batch while the worker hands out the last (``REDISSPINE_LEASE_ALONGSIDE``).

What must hold: it goes only when the last lease came back full, the engine wants at
least half a batch beyond what is ready and on its way, Redis is near and start
requests are not being consumed; its leases join the book like any others; and no
reconciliation (which returns the worker's leases the book does not know) ever runs
while one is on its way, nor does one go while a reconciliation is on its way, or
either would return the other's fresh leases as orphans. A reply lost on the way is
reconciled as any lease's.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock

from scrapy_redisspine._guard import RedisGuard
from scrapy_redisspine._leasebook import LeaseBook
from scrapy_redisspine._leasing import Leaser
from scrapy_redisspine._local import LocalQueue
from scrapy_redisspine._outbox import Outbox
from scrapy_redisspine._results import Count

from .test_lease_ahead import Codec, Engine, QueueFrontier
from .test_redis_io import ManualIO

BATCH = 16


class NearIO(ManualIO):
    """A ManualIO whose Redis answers within a few ms (or not: ``near``)."""

    def __init__(self, near: bool = True) -> None:
        super().__init__()
        self.near = near


class ReconcilingFrontier(QueueFrontier):
    """Records the keys each reconciliation was told the worker knows; a lease may be
    made to fail after Redis applied it (its reply lost)."""

    def __init__(self, queued: int) -> None:
        super().__init__(queued)
        self.reconciled: list[list[str]] = []
        self.lose_next_reply = False

    def lease(self, count: int) -> Any:
        batch = super().lease(count)
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise redis.ConnectionError("reply lost")
        return batch

    def release_orphans(self, known: list[str]) -> Count:
        self.reconciled.append(sorted(known))
        return Count(0)


class Worker:
    """A Leaser with a hot queue ``io`` and a second one ``other``, both answered by
    the test, over a frontier with plenty queued."""

    def __init__(self, stats: MemoryStatsCollector, *, free: int = BATCH, near: bool = True,
                 alongside: bool = True) -> None:
        self.io, self.other = NearIO(near), NearIO(near)
        self.frontier = ReconcilingFrontier(10_000)
        self.engine = Engine(free=free)
        self.stats = stats
        self.clock = clock = Clock()
        self.guard = RedisGuard(stats, clock.seconds)
        outbox = Outbox(self.frontier, self.guard, stats, clock,  # type: ignore[arg-type]
                        batch_size=100, cache_size=0, on_sent=lambda result: None,
                        on_duplicate=lambda request: None, on_dropped=lambda request: None,
                        io=self.io)
        self.book = LeaseBook()
        self.leaser = Leaser(
            frontier=self.frontier, outbox=outbox, book=self.book,  # type: ignore[arg-type]
            guard=self.guard, codec=Codec(), local=LocalQueue("w", stats),  # type: ignore[arg-type]
            engine=self.engine, stats=stats, clock=clock,  # type: ignore[arg-type]
            batch_size=BATCH, idle_poll_seconds=1.0, counted=lambda queued, inflight: None,
            crawl_delay_learned=lambda lane, delay: None, io=self.io,
            alongside_io=self.other if alongside else None,
        )

    def hand_out_all(self) -> int:
        taken = 0
        while self.book.hand_out() is not None:
            taken += 1
        return taken

    def full_round(self) -> None:
        """A lease out and back full, all of it handed out."""
        assert self.leaser.lease() is False
        assert self.leaser.in_flight
        self.io.answer()
        assert self.hand_out_all() == self.frontier.asked[-1]

    def warm(self) -> None:
        """Full rounds until the lease-ahead is learnt (the free slots the engine
        kept idle while each lease was on its way): the next may go alongside."""
        for _ in range(12):
            self.full_round()
        assert self.leaser.ahead == BATCH

    def both_out(self) -> None:
        """After the warm-up: a lease on its way, then one alongside it."""
        self.warm()
        self.leaser.lease()
        self.leaser.lease()
        assert len(self.io.waiting) == 1
        assert len(self.other.waiting) == 1

    def alongside(self) -> int:
        return int(self.stats.get_value("redisspine/scheduler/leases_alongside", 0))


@pytest.fixture
def stats() -> MemoryStatsCollector:
    return MemoryStatsCollector(get_crawler())


def test_a_second_lease_goes_alongside_and_its_leases_join_the_book(
    stats: MemoryStatsCollector,
) -> None:
    worker = Worker(stats)
    worker.warm()
    worker.leaser.lease()  # the hot lease is on its way
    assert len(worker.io.waiting) == 1
    assert not worker.other.waiting
    worker.leaser.lease()  # the engine asks again meanwhile: one goes alongside
    assert len(worker.other.waiting) == 1
    assert worker.alongside() == 1
    worker.leaser.lease()
    assert len(worker.other.waiting) == 1  # one alongside at a time
    worker.other.answer()  # the second reply may come first: on another connection
    assert worker.book.ready == BATCH  # what the free slots want beyond what is asked
    worker.io.answer()
    assert worker.book.ready == 2 * BATCH
    keys = set()
    while (request := worker.book.hand_out()) is not None:
        keys.add(request.url)
    assert len(keys) == 2 * BATCH  # every lease of both replies, each once


def test_none_alongside_when_the_last_lease_came_back_short(
    stats: MemoryStatsCollector,
) -> None:
    worker = Worker(stats)
    worker.warm()
    worker.frontier.queued = BATCH // 2  # fewer due than asked for
    worker.leaser.lease()
    worker.io.answer()
    worker.hand_out_all()
    worker.frontier.queued = 10_000
    worker.leaser.lease()
    worker.leaser.lease()
    assert not worker.other.waiting
    assert worker.alongside() == 0


def test_none_alongside_for_less_than_half_a_batch(stats: MemoryStatsCollector) -> None:
    worker = Worker(stats, free=BATCH)
    worker.warm()
    worker.leaser.lease()  # a batch on its way; free slots and lease-ahead want 2
    worker.engine.free = BATCH // 2 - 1  # now 7 more are wanted than is on its way
    worker.leaser.lease()
    assert not worker.other.waiting
    worker.engine.free = BATCH // 2  # 8: half a batch
    worker.leaser.lease()
    assert len(worker.other.waiting) == 1
    worker.other.answer()
    assert worker.frontier.asked[-1] == BATCH // 2


@pytest.mark.parametrize("why", ["starting", "far", "off"])
def test_none_alongside_while_starting_with_a_far_redis_or_switched_off(
    stats: MemoryStatsCollector, why: str,
) -> None:
    worker = Worker(stats, near=why != "far", alongside=why != "off")
    worker.warm()
    worker.engine.start_left = why == "starting"
    worker.leaser.lease()
    worker.leaser.lease()
    assert len(worker.io.waiting) == 1
    assert not worker.other.waiting
    assert worker.alongside() == 0


def test_no_reconciliation_while_a_lease_alongside_is_on_its_way(
    stats: MemoryStatsCollector,
) -> None:
    worker = Worker(stats)
    worker.both_out()
    worker.io.answer()  # the hot lease is back; the alongside one is still out
    worker.hand_out_all()
    worker.guard.reconcile_needed = True
    worker.leaser.lease()  # the next hot lease: it must not reconcile now
    worker.io.answer()
    assert worker.frontier.reconciled == []
    worker.other.answer()  # the alongside leases are in the book now
    worker.hand_out_all()
    worker.leaser.lease()  # this one reconciles
    worker.leaser.lease()  # none alongside it
    assert not worker.other.waiting
    worker.io.answer()
    [known] = worker.frontier.reconciled
    assert len(known) == worker.frontier.taken - BATCH  # all but the reconciling lease's
    assert not worker.guard.reconcile_needed


def test_none_alongside_a_reconciliation_on_its_way(stats: MemoryStatsCollector) -> None:
    worker = Worker(stats)
    worker.warm()
    worker.guard.reconcile_needed = True
    worker.leaser.lease()  # carries the reconciliation
    worker.guard.reconcile_needed = False  # (another part's call set it back meanwhile)
    worker.leaser.lease()
    assert not worker.other.waiting
    worker.io.answer()
    assert len(worker.frontier.reconciled) == 1
    worker.hand_out_all()
    worker.leaser.lease()
    worker.leaser.lease()
    assert len(worker.other.waiting) == 1  # the reconciliation is back: alongside again


def test_a_lost_alongside_reply_is_reconciled_by_the_next_lease(
    stats: MemoryStatsCollector,
) -> None:
    worker = Worker(stats)
    worker.both_out()
    worker.frontier.lose_next_reply = True
    worker.other.answer()  # Redis leased them; the reply never came
    assert worker.guard.reconcile_needed
    lost = {f"k{i}" for i in range(worker.frontier.taken - BATCH, worker.frontier.taken)}
    worker.io.answer()  # the hot lease, queued first, came back
    worker.hand_out_all()
    assert not lost & set(worker.book.known_keys())
    worker.clock.advance(60)  # the breaker's back-off
    worker.leaser.lease()
    worker.leaser.lease()
    assert not worker.other.waiting  # none alongside the reconciliation
    worker.io.answer()
    [known] = worker.frontier.reconciled
    assert not lost & set(known)  # so the reconciliation returns the lost leases
    assert len(known) == worker.frontier.taken - 2 * BATCH  # and knows all the rest
