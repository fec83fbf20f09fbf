"""Leasing ahead: with a lease on its way, a lease asks for what the engine will ask for
during the next round trip too, and is asked for before the ready list runs dry."""

from __future__ import annotations

from typing import Any

import pytest
from scrapy import Request
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock

from scrapy_redisspine._guard import RedisGuard
from scrapy_redisspine._leasebook import LeaseBook
from scrapy_redisspine._leasing import Leaser
from scrapy_redisspine._local import LocalQueue
from scrapy_redisspine._outbox import Outbox
from scrapy_redisspine._redis_io import InlineIO
from scrapy_redisspine._results import EnqueueResult, Lease, LeaseBatch

from .test_redis_io import ManualIO


class QueueFrontier:
    """A frontier with ``queued`` requests: a lease takes up to ``count`` of them and
    records how many it was asked for."""

    def __init__(self, queued: int) -> None:
        self.queued = queued
        self.asked: list[int] = []
        self.taken = 0

    def lease(self, count: int) -> LeaseBatch:
        self.asked.append(count)
        n = min(count, self.queued)
        self.queued -= n
        leases = [Lease(f"k{self.taken + i}", "t", f"http://a.test/{self.taken + i}".encode(),
                        lane="a.test") for i in range(n)]
        self.taken += n
        return LeaseBatch(leases, queued=self.queued, inflight=self.taken)

    def enqueue(self, *args: Any, **kwargs: Any) -> EnqueueResult:
        return EnqueueResult("", 0)

    def add_shed(self, shed: int) -> None:
        return None


class Codec:
    def decode(self, payload: bytes) -> Request:
        return Request(payload.decode())


class Engine:
    def __init__(self, free: int) -> None:
        self.free = free
        self.wakes = 0
        self.start_left = False

    def free_download_slots(self) -> int:
        return self.free

    def starting(self) -> bool:
        return self.start_left


    def wake(self) -> None:
        self.wakes += 1


@pytest.fixture
def stats() -> MemoryStatsCollector:
    return MemoryStatsCollector(get_crawler())


def _leaser(io: Any, frontier: QueueFrontier, engine: Engine,
            stats: MemoryStatsCollector) -> tuple[Leaser, LeaseBook]:
    clock = Clock()
    guard = RedisGuard(stats, clock.seconds)
    outbox = Outbox(frontier, guard, stats, clock, batch_size=100,  # type: ignore[arg-type]
                    cache_size=0, on_sent=lambda result: None,
                    on_duplicate=lambda request: None, on_dropped=lambda request: None, io=io)
    book = LeaseBook()
    leaser = Leaser(
        frontier=frontier, outbox=outbox, book=book, guard=guard,  # type: ignore[arg-type]
        codec=Codec(), local=LocalQueue("w", stats), engine=engine,  # type: ignore[arg-type]
        stats=stats, clock=clock, batch_size=20, idle_poll_seconds=1.0,
        counted=lambda queued, inflight: None, crawl_delay_learned=lambda lane, delay: None,
        io=io,
    )
    return leaser, book


def _rounds(leaser: Leaser, io: ManualIO, book: LeaseBook, times: int, asks: int) -> None:
    """``times`` round trips, the engine taking every ready request before each."""
    for _ in range(times):
        while book.ready:
            book.hand_out()
        _round(leaser, io, asks)


def _round(leaser: Leaser, io: ManualIO, asks: int) -> None:
    """One round trip: a lease goes out, the engine asks ``asks`` times meanwhile."""
    leaser.lease()
    assert leaser.in_flight
    for _ in range(asks):
        leaser.asked()
    io.answer()
    assert not leaser.in_flight


def test_a_lease_asks_for_what_the_engine_asks_for_while_one_is_on_its_way(
    stats: MemoryStatsCollector,
) -> None:
    io, frontier, engine = ManualIO(), QueueFrontier(1000), Engine(free=2)
    leaser, book = _leaser(io, frontier, engine, stats)
    assert leaser.ahead == 0
    _round(leaser, io, asks=0)
    assert frontier.asked == [2]  # nothing learnt yet: the free slots
    _rounds(leaser, io, book, 12, asks=4)
    assert leaser.ahead == 4
    assert frontier.asked[-1] == 2 + 4  # the free slots and the lease-ahead


def test_the_next_lease_goes_out_before_the_ready_list_runs_dry(
    stats: MemoryStatsCollector,
) -> None:
    io, frontier, engine = ManualIO(), QueueFrontier(1000), Engine(free=2)
    leaser, book = _leaser(io, frontier, engine, stats)
    _rounds(leaser, io, book, 12, asks=3)
    assert leaser.ahead == 3
    assert book.ready == 5  # the 2 free slots and the 3 of the lease-ahead
    book.hand_out()
    leaser.lease()
    assert not leaser.in_flight  # 4 ready, more than the lease-ahead: no lease yet
    book.hand_out()
    leaser.lease()
    assert leaser.in_flight  # 3 ready: the next lease is on its way
    io.answer()
    # the free slots and the lease-ahead, less the 3 still ready
    assert frontier.asked[-1] == 2
    assert book.ready == 5


def test_asks_during_no_round_trip_teach_nothing(stats: MemoryStatsCollector) -> None:
    """Inline calls (Redis on the loop, tests) are never on their way: no lease-ahead,
    a lease asks for the free slots as before."""
    frontier, engine = QueueFrontier(1000), Engine(free=3)
    leaser, book = _leaser(InlineIO(stats), frontier, engine, stats)
    for _ in range(10):
        leaser.asked()
        assert leaser.lease()
        while book.ready:
            book.hand_out()
            leaser.asked()
    assert leaser.ahead == 0
    assert set(frontier.asked) == {3}


def test_the_lease_ahead_never_exceeds_a_batch(stats: MemoryStatsCollector) -> None:
    io, frontier, engine = ManualIO(), QueueFrontier(10_000), Engine(free=0)
    leaser, book = _leaser(io, frontier, engine, stats)
    _rounds(leaser, io, book, 20, asks=500)
    assert leaser.ahead == 20
    assert max(frontier.asked) == 20


def test_nothing_is_learnt_while_start_requests_are_consumed(
    stats: MemoryStatsCollector,
) -> None:
    """Scrapy asks again after each None while its start is lazy: those asks are no
    demand, and a request leased ahead could pass a start request of higher priority."""
    io, frontier, engine = ManualIO(), QueueFrontier(1000), Engine(free=1)
    leaser, book = _leaser(io, frontier, engine, stats)
    engine.start_left = True
    _rounds(leaser, io, book, 8, asks=5)
    assert leaser.ahead == 0
    assert set(frontier.asked) == {1}


def test_download_slots_left_idle_by_a_reply_count_as_asked_for(
    stats: MemoryStatsCollector,
) -> None:
    """The engine asks once per turn of its loop however many slots freed meanwhile:
    the slots still free when a reply comes in are demand it did not say."""
    io, frontier, engine = ManualIO(), QueueFrontier(10_000), Engine(free=6)
    leaser, book = _leaser(io, frontier, engine, stats)
    _rounds(leaser, io, book, 16, asks=1)
    assert leaser.ahead == 6
    assert frontier.asked[-1] == 6 + 6
