"""One worker's life in the fleet: heartbeat, orders, fencing, the fleet's counts.

The heartbeat keeps the worker known to the fleet (a worker silent past
``REDISSPINE_WORKER_TIMEOUT_SECONDS`` is swept: its leases go back to the queue);
it also reads the fleet's pause/drain orders and learns when a sweep took this
worker for dead (fencing), so it hands back what it still holds.

The fleet's counts (queued, in flight, fleet-wide) arrive with every lease reply
and, when the worker is idle, from a count of their own: they decide whether the
crawl is finished.

On ``redis+sentinel://`` each heartbeat and each count also asks the sentinels which
server is the primary (:func:`~scrapy_redisspine.connection.sentinel_primary`):
after a failover the old primary takes writes until Sentinel demotes it, seconds
later, and those are lost; a count read there may say "done" of a crawl the new
primary still has work for. A new primary moves every connection to it, has the
worker reconcile its leases, and no count taken across the change finishes the crawl.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

import redis

from scrapy_redisspine._clock import Periodic
from scrapy_redisspine._guard import CALL_ERRORS
from scrapy_redisspine._redis_io import InlineIO, reported
from scrapy_redisspine.connection import sentinel_primary
from scrapy_redisspine.control import Orders, read_orders
from scrapy_redisspine.frontier import Heartbeat

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._clock import Clock
    from scrapy_redisspine._engine import EnginePort
    from scrapy_redisspine._guard import RedisGuard
    from scrapy_redisspine._leasebook import LeaseBook
    from scrapy_redisspine._redis_io import RedisIO
    from scrapy_redisspine.sharded import AnyFrontier

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
        frontier: AnyFrontier,
        guard: RedisGuard,
        book: LeaseBook,
        engine: EnginePort | None,
        stats: StatsCollector,
        clock: Clock,
        heartbeat_seconds: float,
        worker_timeout_ms: int,
        wake: Callable[[], None],
        flush: Callable[[], bool],
        crawl_gone: Callable[[Heartbeat], None],
        idle_close_ms: int = 0,
        wait_for_first_request: bool = True,
        io: RedisIO | None = None,
    ) -> None:
        """``wake()`` asks for a lease soon; ``flush()`` sends what the worker holds
        for Redis (False: it could not), before a count; ``crawl_gone(heartbeat)``
        is told when the crawl this worker joined is not in Redis any more.
        ``idle_close_ms`` (REDISSPINE_IDLE_CLOSE_SECONDS, with keep-alive): an idle
        worker counts at each heartbeat, so the fleet's idle time is measured.
        ``wait_for_first_request`` (REDISSPINE_WAIT_FOR_FIRST_REQUEST): False lets a
        crawl that never had a request close like Scrapy's, once nobody is starting.
        ``io`` runs the heartbeat's calls (off the crawl's loop with a thread)."""
        self._frontier = frontier
        self._io: RedisIO = io or InlineIO(stats)
        self._beating = False  # a heartbeat on its way: the next tick skips
        self._guard = guard
        self._book = book
        self._flush = flush
        self._crawl_gone = crawl_gone
        self.gone = False
        self._said_waiting = False
        self._said_cut_short = False
        self._start_noted = False
        self._engine = engine
        self._stats = stats
        self._clock = clock
        self._timeout_ms = worker_timeout_ms
        self._idle_close_ms = idle_close_ms
        self._wait_for_first = wait_for_first_request
        self._wake = wake
        self.orders = Orders()  # fleet-wide pause/drain, read once per heartbeat
        self.drain_closing = False
        self.pending = True  # work queued or in flight fleet-wide, as last seen
        self.queued = 0
        self.inflight = 0
        self.shed = 0  # requests dropped fleet-wide for lack of Redis memory
        self.checked_at = float("-inf")  # clock time of the last count
        self._primary: tuple[str, int] | None = None  # Sentinel's primary, last seen
        self._server = ""  # the server's run id, as the last heartbeat said
        self._sentinel_failing = False  # a heartbeat's question to the sentinels failed
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
        """A lease reply's counts. Work left is news enough; none left is not: only a
        full count (:meth:`refresh_counts`) may say the crawl is done."""
        self.queued, self.inflight = queued, inflight
        if queued + inflight > 0:
            self.pending = True
            self.checked_at = self._clock.seconds()

    def work_added(self) -> None:
        """This worker's send went in: the crawl is not done, whatever was counted."""
        self.pending = True

    def refresh_counts(self) -> None:
        """Count again (acks and requests waiting here go first, so the count holds):
        the crawl is done when nothing is queued or in flight, no live worker is
        still producing start requests, and it ever had work; and it is the crawl
        this worker joined."""
        if self.gone or not self._flush() or not self._guard.available("count"):
            return
        client = self._frontier.client
        try:
            self._note_start_done()
            before = sentinel_primary(client)  # and the count goes there
            counts = self._frontier.fleet_counts(self._timeout_ms, self._idle_close_ms)
            after = sentinel_primary(client)
        except CALL_ERRORS as exc:
            self._guard.failed("count", exc)
            return
        self._guard.succeeded("count")
        if counts.status != "ok":
            self._gone(Heartbeat(counts.status))
            return
        # (both, in this order: each may be the news of a change)
        moved = self._primary_seen(before)
        moved = self._primary_seen(after) or moved
        self.queued, self.inflight = counts.queued, counts.inflight
        self.pending = moved or (counts.pending if self._wait_for_first else counts.has_work)
        if not self.pending:
            self._check_eviction()
        self.shed = counts.shed
        self.checked_at = self._clock.seconds()
        if counts.close_reason:
            self.close_ordered(counts.close_reason)
        if counts.cut_short and not self.pending and not self._said_cut_short:
            self._said_cut_short = True
            self._stats.set_value("redisspine/fleet/starts_cut_short", counts.cut_short)
            logger.warning(
                "redisspine: crawl %r is out of work, and %d worker(s) stopped without "
                "noting their start requests done (killed, or stopped mid-start): any "
                "they had not queued are not in the crawl. If their spiders' start() "
                "yields requests no other worker's does, run them again",
                self._frontier.keys.crawl_id, counts.cut_short,
            )
        if not counts.ever and not self._said_waiting and self._wait_for_first:
            self._said_waiting = True
            logger.info(
                "redisspine: crawl %r has had no request queued yet: waiting for its "
                "first one (start requests of a worker, or `redisspine seed`; "
                "REDISSPINE_WAIT_FOR_FIRST_REQUEST = False closes it instead)",
                self._frontier.keys.crawl_id,
            )
        elif not counts.ever and not self.pending and not self._said_waiting:
            self._said_waiting = True
            logger.info(
                "redisspine: crawl %r never had a request queued and no worker is "
                "starting: nothing to do (REDISSPINE_WAIT_FOR_FIRST_REQUEST = False)",
                self._frontier.keys.crawl_id,
            )

    def _check_eviction(self) -> None:
        """A count says the crawl is done: unless a server it lives on may evict its
        keys, which may have taken work without a word since the memory watch last
        looked (a policy set under the crawl between two sweeps). Then it is not
        done, and the worker stops (the guard's ``on_evicting``)."""
        try:
            evicting = self._frontier.upkeep.memory().evicting
        except redis.exceptions.ResponseError:
            return  # INFO refused (an ACL): the memory watch reports it at each sweep
        except CALL_ERRORS as exc:
            self._guard.failed("count", exc)
            self.pending = True  # not "done" on a count that could not be checked
            return
        if evicting:
            self.pending = True
            self._guard.server_evicts(evicting)

    @property
    def start_noted(self) -> bool:
        """Redis knows this worker's start requests are all in (its "starting" entry
        is gone): closing need not say it again."""
        return self._start_noted

    def _starting(self) -> bool:
        return self._engine is not None and self._engine.starting()

    def _note_start_done(self) -> None:
        """Once this worker's start requests are all in, stop holding the fleet open."""
        if self._start_noted or self._starting():
            return
        self._frontier.done_starting()
        self._start_noted = True

    def _gone(self, beat: Heartbeat) -> None:
        self.gone = True
        self._crawl_gone(beat)

    def _primary_seen(self, primary: tuple[str, int] | None) -> bool:
        """The sentinels named ``primary`` (None: no Sentinel). True when it is not
        the one they named before: the guard has the leases reconciled, the crawl
        is not done on this word, and a lease comes soon (it reconciles first)."""
        if primary is None:
            return False
        old, self._primary = self._primary, primary
        if old is None or old == primary:
            return False
        self._guard.primary_changed(old, primary)
        self.pending = True
        self._wake()
        return True

    def _server_seen(self, server: str) -> None:
        """The heartbeat's server run id ("" : none given). A new one: the guard has
        the leases reconciled, and a lease comes soon (it reconciles first)."""
        if not server:
            return
        old, self._server = self._server, server
        if old and old != server:
            self._guard.server_changed(old, server)
            self.pending = True
            self._wake()

    def _asked_sentinels(self, primary: tuple[str, int] | Exception | None) -> None:
        """A heartbeat's answer from the sentinels: a failure is logged once until they
        answer again, and counted; it stops nothing (the primary may be fine, and a
        count asks them again before the crawl may finish)."""
        if not isinstance(primary, Exception):
            if self._sentinel_failing:
                logger.info("redisspine: the sentinels answer again")
            self._sentinel_failing = False
            self._primary_seen(primary)
            return
        self._stats.inc_value("redisspine/redis_errors/sentinel")
        if not self._sentinel_failing:
            self._sentinel_failing = True
            logger.warning("redisspine: no sentinel named the primary (%s: %s); asking "
                           "again at each heartbeat (see redisspine/redis_errors/sentinel)",
                           type(primary).__name__, primary)

    # -- heartbeat, orders, fencing -------------------------------------------------------

    def heartbeat(self) -> None:
        """Beat and read the fleet's orders in one call through ``io``; the reply is
        handled on the crawl's loop. A beat still on its way (a slow Redis) is not
        joined by a second one."""
        if self.gone or self._beating or not self._guard.available("heartbeat"):
            return
        starting = self._starting()
        frontier = self._frontier

        def call() -> tuple[tuple[str, int] | Exception | None, Heartbeat, Orders | Exception]:
            try:  # first: after a failover, the beat goes to the new primary
                primary: tuple[str, int] | Exception | None = sentinel_primary(frontier.client)
            except CALL_ERRORS as exc:
                primary = exc
            beat = frontier.heartbeat(starting)
            try:
                orders: Orders | Exception = read_orders(frontier.client, frontier.keys)
            except CALL_ERRORS as exc:
                orders = exc
            return primary, beat, orders

        self._beating = True
        self._io.submit("heartbeat", call, lambda reply: self._beaten(starting, *reply),
                        reported(self._guard, "heartbeat",
                                 lambda: setattr(self, "_beating", False)))

    def _beaten(self, starting: bool, primary: tuple[str, int] | Exception | None,
                beat: Heartbeat, orders: Orders | Exception) -> None:
        self._beating = False
        self._guard.succeeded("heartbeat")
        self._asked_sentinels(primary)
        if beat.crawl_gone:
            self._gone(beat)
            return
        self._start_noted = not starting
        self.queued = beat.queued
        self._server_seen(beat.server)
        if beat.status == "swept":
            self._fenced()
        elif beat.late_ms > self._timeout_ms:
            logger.info(
                "redisspine: this worker's heartbeat came %.0f s late (over the %.0f s "
                "timeout), but no sweep took its leases", beat.late_ms / 1000,
                self._timeout_ms / 1000,
            )
            # Redis (or this worker) stalled: the others' heartbeats are as late.
            # Give them one timeout to beat again before sweeping anyone.
            self._guard.stalled()
        if self._idle_close_ms and not (self._book.ready or self._book.handed_out):
            # A keep-alive worker is never asked whether the crawl is done: count here.
            self.refresh_counts()
            if self.gone:
                return
        if isinstance(orders, Exception):
            self._guard.failed("control", orders)
            return
        self._follow_orders(orders)

    def _follow_orders(self, orders: Orders) -> None:
        if self.orders.close_reason and not orders.close_reason:
            orders = replace(orders, close_reason=self.orders.close_reason)  # final
        if orders != self.orders:
            logger.info("redisspine: fleet orders now %s", orders.describe())
            if not orders.stop_leasing:
                self._wake()
        self.orders = orders
        self.close_if_idle()

    def joined(self, orders: Orders) -> None:
        """The orders read at join: in force before the first heartbeat, so that a
        worker started on a paused or draining crawl leases nothing."""
        if orders.stop_leasing:
            logger.info("redisspine: fleet orders at join: %s", orders.describe())
        self.orders = orders

    def close_ordered(self, reason: str) -> None:
        """A fleet-wide limit was reached (a lease reply or the limits check said so):
        lease no more, close once nothing is in progress."""
        if self.orders.close_reason:
            return
        logger.info("redisspine: fleet limit reached: closing (%s)", reason)
        self.orders = replace(self.orders, close_reason=reason)
        self.close_if_idle()

    def close_if_idle(self) -> None:
        """Under a drain or close order, close once nothing is in progress (the
        unstarted leases go back at close)."""
        reason = self.orders.closing_reason
        idle = (not self._book.handed_out and not self.drain_closing
                and not (self.orders.fetch_leased and self._book.ready))
        if reason and idle and self._engine is not None:
            self.drain_closing = True
            logger.info("redisspine: %s: nothing in progress, closing",
                        "draining" if reason == "drained" else reason)
            self._engine.close_spider(reason)

    def _fenced(self) -> None:
        """Another worker's sweep took this one for dead and requeued its leases."""
        self._stats.inc_value("redisspine/scheduler/presumed_dead")
        logger.warning(
            "redisspine: this worker was presumed dead (no heartbeat for over %.0f s): a "
            "sweep requeued its leases; dropping %d unstarted lease(s), acks of the "
            "requests in progress will be refused", self._timeout_ms / 1000, self._book.ready,
        )
        # Leases taken after the sweep are still valid: hand them back (release is
        # fenced, so the ones the sweep already requeued are refused).
        handles = self._book.drop_ready()
        if handles:
            frontier, guard = self._frontier, self._guard

            self._io.submit("release", lambda: frontier.release(handles),
                            lambda released: guard.repaired("release", released.repairs),
                            reported(guard, "release"))
