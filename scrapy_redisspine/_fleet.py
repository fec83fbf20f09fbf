"""One worker's life in the fleet: heartbeat, orders, fencing, the fleet's counts.

The heartbeat keeps the worker known to the fleet (a worker silent past
``REDISSPINE_WORKER_TIMEOUT_SECONDS`` is swept: its leases go back to the queue);
it also reads the fleet's pause/drain orders and learns when a sweep took this
worker for dead (fencing), so it hands back what it still holds.

The fleet's counts (queued, in flight, fleet-wide) arrive with every lease reply
and, when the worker is idle, from a count of their own: they decide whether the
crawl is finished.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from scrapy_redisspine._clock import Periodic
from scrapy_redisspine.control import Orders, read_orders

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._clock import Clock
    from scrapy_redisspine._engine import EnginePort
    from scrapy_redisspine._guard import RedisGuard
    from scrapy_redisspine._leasebook import LeaseBook
    from scrapy_redisspine.frontier import Frontier

logger = logging.getLogger("scrapy_redisspine.scheduler")


class FleetMember:
    """Owns the heartbeat timer, the fleet's orders, the drain state and the fleet
    counts this worker last saw.

    Invariant kept: ``pending`` is True unless Redis said, after this worker's last
    send, that nothing is queued or in flight fleet-wide.
    """

    def __init__(
        self,
        *,
        frontier: Frontier,
        guard: RedisGuard,
        book: LeaseBook,
        engine: EnginePort | None,
        stats: StatsCollector,
        clock: Clock,
        heartbeat_seconds: float,
        worker_timeout_ms: int,
        wake: Callable[[], None],
        flush: Callable[[], bool],
    ) -> None:
        """``wake()`` asks for a lease soon; ``flush()`` sends what the worker holds
        for Redis (False: it could not), before a count."""
        self._frontier = frontier
        self._guard = guard
        self._book = book
        self._flush = flush
        self._engine = engine
        self._stats = stats
        self._clock = clock
        self._timeout_ms = worker_timeout_ms
        self._wake = wake
        self.orders = Orders()  # fleet-wide pause/drain, read once per heartbeat
        self.drain_closing = False
        self.pending = True  # work queued or in flight fleet-wide, as last seen
        self.queued = 0
        self.inflight = 0
        self.checked_at = float("-inf")  # clock time of the last count
        self._heartbeat = Periodic("heartbeat", self.heartbeat, heartbeat_seconds, clock, stats)

    def start(self) -> None:
        self._heartbeat.start()

    def stop(self) -> None:
        self._heartbeat.stop()

    @property
    def running(self) -> bool:
        return self._heartbeat.running

    # -- the fleet's counts -------------------------------------------------------------

    def counted(self, queued: int, inflight: int) -> None:
        """Redis just reported these counts (a lease reply or a count)."""
        self.queued, self.inflight = queued, inflight
        self.pending = queued + inflight > 0
        self.checked_at = self._clock.seconds()

    def work_added(self) -> None:
        """This worker's send went in: the crawl is not done, whatever was counted."""
        self.pending = True

    def refresh_counts(self) -> None:
        """Count again (acks and requests waiting here go first, so the count holds)."""
        if not self._flush() or not self._guard.available("count"):
            return
        try:
            queued, inflight = self._frontier.upkeep.counts()
        except redis.RedisError as exc:
            self._guard.failed("count", exc)
            return
        self._guard.succeeded("count")
        self.counted(queued, inflight)

    # -- heartbeat, orders, fencing -------------------------------------------------------

    def heartbeat(self) -> None:
        if not self._guard.available("heartbeat"):
            return
        try:
            known = self._frontier.heartbeat(self._timeout_ms)
        except redis.RedisError as exc:
            self._guard.failed("heartbeat", exc)
            return
        self._guard.succeeded("heartbeat")
        if not known:
            self._fenced()
        self._follow_orders()

    def _follow_orders(self) -> None:
        try:
            orders = read_orders(self._frontier.client, self._frontier.keys)
        except redis.RedisError as exc:
            self._guard.failed("control", exc)
            return
        if orders != self.orders:
            logger.info("redisspine: fleet orders now %s", orders)
            if not orders.stop_leasing:
                self._wake()
        self.orders = orders
        idle = not self._book.handed_out and not self.drain_closing
        if orders.drain and idle and self._engine is not None:
            self.drain_closing = True
            logger.info("redisspine: draining: nothing in progress, closing")
            self._engine.close_spider("drained")

    def _fenced(self) -> None:
        """Another worker's sweep took this one for dead and requeued its leases."""
        self._stats.inc_value("redisspine/scheduler/presumed_dead")
        logger.warning(
            "redisspine: this worker was presumed dead (no heartbeat for over %.0f s) and "
            "its leases were requeued; dropping %d unstarted lease(s), acks of the "
            "requests in progress will be refused", self._timeout_ms / 1000, self._book.ready,
        )
        # Leases taken after the sweep are still valid: hand them back (release is
        # fenced, so the ones the sweep already requeued are refused).
        handles = self._book.drop_ready()
        if handles:
            try:
                self._frontier.release(handles)
            except redis.RedisError as exc:
                self._guard.failed("release", exc)
