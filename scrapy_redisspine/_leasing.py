"""Filling the ready list: one round trip leases a batch and carries the outbox.

``Frontier.enqueue_and_lease`` sends the buffered requests and acks and leases up
to as many requests as the downloader has free slots, in one round trip (the acks
free their lanes before the lease looks for due lanes). A payload that cannot be
rebuilt goes to the dead letters; a lease reply lost in an outage is reconciled
before the next lease.

Besides after a failure, a lease reconciles at least every :data:`RECONCILE_SECONDS`:
a failover that raised nothing in this worker (a Redis Cluster's redirections, a
Sentinel's new primary between two heartbeats) may have lost acks it sent, leaving
leases in Redis that hold their lanes' slots for a worker that is done with them.

An empty lease backs off until the idle poll; a lane due sooner than that wakes the
engine exactly when it is due.

The round trip runs through the worker's :class:`~scrapy_redisspine._redis_io.RedisIO`:
with its own thread (``REDISSPINE_REDIS_THREAD``) the lease is asked for and its reply
fills the ready list later, waking the engine. One lease is on its way at a time (it
carries the outbox, whose acks must not overtake the children sent before them), so
each lease asks for what the downloader can take now plus what it will take while the
next round trip is in the air: the *lease-ahead*, learnt as the number of requests the
engine asked for (handed one or found none) while the last lease was on its way. The
next lease is asked for when the ready list is down to that many, so with work queued
the downloader does not wait for Redis however far away it is. With Redis on loopback
the lease-ahead stays at about nothing, and leasing is as before.

A lease *alongside* (``REDISSPINE_LEASE_ALONGSIDE``): with Redis near, the round trip
of a lease is mostly Redis's own work, and the worker waits through it after handing
out the last batch, as Redis waits while the worker hands it out. So while a lease is
on its way, a second one that carries nothing (no acks, no requests: no order to keep
with the outbox) may go on the upkeep queue, another connection, when the last lease
came back full (more lanes are due) and the downloader will want at least half a
batch beyond what is ready and asked for. Its leases join the book like any others.
A reconciliation (which returns this worker's leases that the book does not know)
never runs while a lease alongside is on its way, nor does one go while a
reconciliation is on its way: either would take the other's fresh leases for orphans.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import redis

from scrapy_redisspine._guard import CALL_ERRORS
from scrapy_redisspine._local import marker_reason
from scrapy_redisspine._redis_io import InlineIO, reported
from scrapy_redisspine.request_codec import RequestDecodeError

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._clock import Clock, DelayedCall
    from scrapy_redisspine._engine import EnginePort
    from scrapy_redisspine._guard import RedisGuard
    from scrapy_redisspine._leasebook import LeaseBook
    from scrapy_redisspine._local import LocalQueue
    from scrapy_redisspine._outbox import Outbox, Sending
    from scrapy_redisspine._redis_io import RedisIO
    from scrapy_redisspine._results import Repairs
    from scrapy_redisspine.frontier import Count, EnqueueResult, Lease, LeaseBatch
    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.request_codec import RequestCodec
    from scrapy_redisspine.sharded import AnyFrontier

    #: A lane slot's lease for a request kept in memory (Frontier.take_slot).
    SlotTaken = tuple[Lease | None, int, Repairs]

logger = logging.getLogger("scrapy_redisspine.scheduler")

#: How often a lease also returns this worker's leases that it does not hold, with
#: no failure seen (the module docstring): one release_orphans call per shard.
RECONCILE_SECONDS = 60.0


class Leaser:
    """Owns the lease back-off (when the last lease came back empty) and the
    wake-up timer for the next due lane; fills the lease book.

    Invariant kept: a leased request is either in the book or buried (dead letters);
    a lease this worker does not know of is returned before the next lease.
    """

    def __init__(
        self,
        *,
        frontier: AnyFrontier,
        outbox: Outbox,
        book: LeaseBook,
        guard: RedisGuard,
        codec: RequestCodec,
        local: LocalQueue,
        engine: EnginePort | None,
        stats: StatsCollector,
        clock: Clock,
        batch_size: int,
        idle_poll_seconds: float,
        counted: Callable[[int, int], None],
        crawl_delay_learned: Callable[[str, float | None], None],
        close_ordered: Callable[[str], None] = lambda reason: None,
        io: RedisIO | None = None,
        alongside_io: RedisIO | None = None,
    ) -> None:
        """``counted(queued, inflight)`` receives the fleet's counts of each lease
        reply; ``crawl_delay_learned(lane, seconds)`` each lease's Crawl-delay;
        ``close_ordered(reason)`` a fleet-wide limit a lease reply reports;
        ``alongside_io``, another connection's queue than ``io``'s: leases alongside
        go there (None: none)."""
        self._frontier = frontier
        self._outbox = outbox
        self._book = book
        self._guard = guard
        self._counted = counted
        self._crawl_delay_learned = crawl_delay_learned
        self._close_ordered = close_ordered
        self._codec = codec
        self._local = local
        self._engine = engine
        self._stats = stats
        self._clock = clock
        self._batch_size = batch_size
        self._idle_poll_seconds = idle_poll_seconds
        self._last_empty_lease = float("-inf")
        self._reconciled_at = clock.seconds()
        self._wake_call: DelayedCall | None = None
        self._wake_due = float("inf")  # when the wake-up timer fires (this clock)
        self._io: RedisIO = io or InlineIO(stats)
        self._in_flight = 0  # requests the lease on its way asked for (0: none on its way)
        self._local_in_flight = False  # slots for requests kept in memory, on their way
        self._ahead = 0.0  # requests asked for per lease round trip (moving average)
        self._asked_in_flight = 0  # asked for since the lease on its way was submitted
        self._alongside_io = alongside_io
        self._reconciling = False  # the lease on its way returns orphans first
        self._alongside_in_flight = False  # a lease alongside on its way
        self._last_full = False  # the last lease reply brought all it asked for

    # -- waking -------------------------------------------------------------------

    def wake(self) -> None:
        """New work may be in Redis (e.g. requeued by a sweep): lease soon."""
        self.expect_work()
        if self._engine is not None:
            self._engine.wake()

    def expect_work(self) -> None:
        """Forget the back-off of an empty lease: the next call leases."""
        self._last_empty_lease = float("-inf")

    def wake_when_due(self, wait_ms: int) -> None:
        """Sleep exactly until the next lane is due rather than a whole poll period.

        A lane due sooner than the timer already set (an ack just rested it for less
        than the wait of the lane the timer is for) moves the timer: one timer, at
        the earliest due time this worker has heard of."""
        if wait_ms < 0 or wait_ms / 1000 >= self._idle_poll_seconds:
            return
        due = self._clock.seconds() + wait_ms / 1000
        if self._wake_call is not None and self._wake_call.active():
            if self._wake_due <= due:
                return
            self._wake_call.cancel()
        self._wake_due = due
        self._wake_call = self._clock.callLater(wait_ms / 1000, self.wake)

    def close(self) -> None:
        if self._wake_call is not None and self._wake_call.active():
            self._wake_call.cancel()

    # -- leasing ---------------------------------------------------------------------

    @property
    def in_flight(self) -> bool:
        """A lease is on its way: its reply may bring requests."""
        return self._in_flight > 0

    @property
    def ahead(self) -> int:
        """Requests the engine takes while a lease is on its way (learnt): the ready
        list's low-water mark, and what a lease asks for beyond the free slots."""
        return min(math.ceil(self._ahead), self._batch_size)

    def asked(self) -> None:
        """The engine asked for a request (next_request), whether one was ready or
        not: what it asks for while a lease is on its way is the lease-ahead.

        Not while start requests are still being consumed: then Scrapy asks again
        after each None (a lazy start() yields one request per scheduler_empty), and
        a request leased ahead could go before a start or callback request of higher
        priority that Scrapy's own scheduler would have sent first."""
        if self._in_flight and not self._starting():
            self._asked_in_flight += 1

    def _learn_ahead(self) -> None:
        """A lease reply is in: what the engine wanted while it was on its way. Its
        asks coalesce (one per turn of its loop), so the download slots left idle
        waiting for this reply count too."""
        if not self._io.background:
            return
        idle = self._engine.free_download_slots() if self._engine is not None else 0
        sample = max(self._asked_in_flight, 0 if self._starting() else idle)
        self._ahead += (sample - self._ahead) / 4

    def _starting(self) -> bool:
        return self._engine is not None and self._engine.starting()

    @property
    def background(self) -> bool:
        """Leases are answered later, off the crawl's loop (``REDISSPINE_REDIS_THREAD``)."""
        return self._io.background

    def lease(self) -> bool:
        """Fill the ready list in one round trip (which also carries the outbox and
        the acks); True if requests are ready now. Through a background ``io`` the
        reply comes later: it fills the ready list and wakes the engine."""
        if self._in_flight:
            self._lease_alongside()
            return bool(self._book.ready)
        now = self._clock.seconds()
        # Engine wake-ups (each enqueue, each finished download) may come far more
        # often than work appears; after an empty lease, wait for the idle poll,
        # unless there is something to send (an ack frees a lane, a request fills one).
        if not self._sending() and now - self._last_empty_lease < self._idle_poll_seconds / 2:
            return bool(self._book.ready)
        ready = self._book.ready
        if ready > self.ahead or not self._guard.available("lease"):
            return bool(ready) or self._lease_local()
        free = self._engine.free_download_slots() if self._engine else 1
        self._submit(max(1, min(free + self.ahead - ready, self._batch_size)), now)
        return bool(self._book.ready)

    def _submit(self, count: int, now: float) -> None:
        """Ask for a lease (sending the outbox and acks first in the same round trip;
        while the send backs off after an error, or one is on its way, the lease
        goes alone), reconciling first if a reply was lost."""
        frontier = self._frontier
        if now - self._reconciled_at >= RECONCILE_SECONDS:
            self._guard.reconcile_needed = True
        # (not while lane slots for requests in memory are on their way: their leases
        # are not known here yet, and would be taken for orphans; the next lease does it)
        known = (self._book.known_keys() + self._outbox.ack_keys()
                 if self._guard.reconcile_needed and not self._local_in_flight
                 and not self._alongside_in_flight else None)
        sending = self._outbox.begin_send() if self._sending() else None

        def call() -> tuple[Count | None, EnqueueResult | redis.RedisError | None, LeaseBatch]:
            released = frontier.release_orphans(known) if known is not None else None
            if sending is None:
                return released, None, frontier.lease(count)
            if sending.shed:  # before the acks: no worker finds the crawl done unaware
                frontier.add_shed(sending.shed)
            if not sending.carries:
                return released, None, frontier.lease(count)
            sent, batch = frontier.enqueue_and_lease(
                sending.entries, sending.ack_args, count, sending.items, sending.loose
            )
            return released, sent, batch

        def failed(exc: Exception) -> None:
            self._in_flight, self._reconciling = 0, False
            if sending is not None:
                self._outbox.abort_send(sending)
            if not isinstance(exc, CALL_ERRORS):
                raise exc
            self._guard.failed("lease", exc)

        self._in_flight = count
        self._reconciling = known is not None
        self._asked_in_flight = 0
        self._io.submit("lease", call, lambda reply: self._leased(reply, sending, count, now),
                        failed)

    def _lease_alongside(self) -> None:
        """A lease is on its way: send a second one, carrying nothing, on the other
        connection if the engine will want at least half a batch more than is
        ready or asked for, and the last lease came back full (module docstring)."""
        io = self._alongside_io
        if (io is None or self._alongside_in_flight or not self._last_full
                or self._reconciling or self._guard.reconcile_needed or self._starting()
                or not self._io.near or not self._guard.available("lease")):
            return
        free = self._engine.free_download_slots() if self._engine is not None else 0
        count = min(free + self.ahead - self._book.ready - self._in_flight,
                    self._batch_size)
        if count < max(1, self._batch_size // 2):
            return
        frontier, now = self._frontier, self._clock.seconds()
        self._alongside_in_flight = True
        self._stats.inc_value("redisspine/scheduler/leases_alongside")
        io.submit("lease", lambda: frontier.lease(count),
                  lambda batch: self._leased_alongside(batch, count, now),
                  reported(self._guard, "lease",
                           lambda: setattr(self, "_alongside_in_flight", False)))

    def _leased_alongside(self, batch: LeaseBatch, count: int, now: float) -> None:
        """A lease alongside is in (the crawl's loop): as any lease reply, without a
        send's outcome, and never leasing again from here (the lease on its way, or
        the engine's next ask, does)."""
        self._alongside_in_flight = False
        self._guard.succeeded("lease")
        self._take(batch, count, now, again=False)

    def _leased(
        self,
        reply: tuple[Count | None, EnqueueResult | redis.RedisError | None, LeaseBatch],
        sending: Sending | None, count: int, now: float,
    ) -> None:
        """A lease reply is in (the crawl's loop): take the send's outcome, count,
        accept the leases, wake the engine if any is ready."""
        self._in_flight, self._reconciling = 0, False
        self._learn_ahead()
        released, sent, batch = reply
        if released is not None:
            self._reconciled(released)
        answered = True  # a send's outcome, when there was one
        if sending is not None:
            if sent is None:
                self._outbox.sent_shed_only(sending)
            elif isinstance(sent, redis.RedisError):
                self._outbox.send_failed(sent)
                answered = isinstance(sent, redis.exceptions.OutOfMemoryError)
                if not batch.leases and not batch.malformed:
                    self._after_lease()
                    return
            else:
                self._outbox.sent(sending, sent)
        self._guard.succeeded("lease")
        if sending is not None and answered:  # else the outbox keeps its back-off
            self._guard.succeeded("enqueue")
        self._take(batch, count, now, again=True)

    def _take(self, batch: LeaseBatch, count: int, now: float, *, again: bool) -> None:
        """Count, accept the leases, wake the engine if any is ready; ``again``: lease
        again at once if all that came was dead-lettered and work remains."""
        self._last_full = len(batch.leases) >= count
        self._counted(batch.queued, batch.inflight)
        if batch.close_reason:
            self._close_ordered(batch.close_reason)
        self.wake_when_due(batch.wait_ms)
        self._report_malformed(batch.malformed)
        self._guard.repaired("lease", batch.repairs)
        if batch.page_limited:
            self._stats.inc_value("redisspine/scheduler/host_page_limited", batch.page_limited)
        if not batch.leases and not batch.malformed:
            self._last_empty_lease = now
            self._after_lease()
            return
        self._stats.inc_value("redisspine/scheduler/leased", len(batch.leases))
        for lease in batch.leases:
            self._accept(lease)
        if again and not self._book.ready and batch.queued and self._guard.available("lease"):
            # everything leased was dead-lettered and work remains: lease again
            self._submit(count, now)
            return
        self._after_lease()

    def _after_lease(self) -> None:
        """Requests kept in memory take their slots too; a background reply wakes
        the engine for what is ready (an inline one is handed out by the caller)."""
        self._lease_local()
        if self._io.background and self._book.ready and self._engine is not None:
            self._engine.wake()

    def _lease_local(self) -> bool:
        """Take lane slots for requests kept in this worker's memory (they are not
        in the queue): one script call per lane that has any, at most a batch, all in
        one job of ``io``; one such job on its way at a time."""
        if (not len(self._local) or self._local_in_flight
                or not self._guard.available("take_slot")):
            return bool(self._book.ready)
        wanted = [(lane, *self._local.first(lane))
                  for lane in self._local.lanes()[: self._batch_size]]
        frontier = self._frontier

        def call() -> list[tuple[str, SlotTaken | Exception]]:
            taken: list[tuple[str, SlotTaken | Exception]] = []
            for lane, request, payload in wanted:
                try:
                    taken.append((lane, frontier.take_slot(lane, request.priority, payload)))
                except CALL_ERRORS as exc:
                    taken.append((lane, exc))
                    break
            return taken

        self._local_in_flight = True
        self._io.submit("take_slot", call, self._slots_taken,
                        reported(self._guard, "take_slot",
                                 lambda: setattr(self, "_local_in_flight", False)))
        return bool(self._book.ready)

    def _slots_taken(self, taken: list[tuple[str, SlotTaken | Exception]]) -> None:
        self._local_in_flight = False
        for lane, outcome in taken:
            if isinstance(outcome, Exception):
                self._guard.failed("take_slot", outcome)
                break
            lease, wait_ms, repairs = outcome
            self._guard.repaired("take_slot", repairs)
            if lease is None:
                self.wake_when_due(wait_ms or int(self._idle_poll_seconds * 1000))
                continue
            if lane not in self._local.lanes():  # lost at close meanwhile: a sweep
                continue  # returns the lease
            self._book.add(self._local.taken(lane, lease.key), lease.handle, lane)
            self._stats.inc_value("redisspine/scheduler/leased_local")
        if self._io.background and self._book.ready and self._engine is not None:
            self._engine.wake()

    def _sending(self) -> bool:
        """Is there something to send, and may it be sent now?"""
        return self._outbox.sendable and self._guard.available("enqueue")

    def _reconciled(self, released: Count) -> None:
        self._reconciled_at = self._clock.seconds()
        self._guard.reconciled()
        self._guard.repaired("release_orphans", released.repairs)
        if released:
            logger.warning(
                "redisspine: returned %d lease(s) this worker did not hold (a lease reply "
                "or an ack lost in an outage or a failover)", released,
            )

    def _report_malformed(self, malformed: int) -> None:
        if malformed:
            keys = self._frontier.keys
            logger.error(
                "redisspine: %d malformed member(s) of %s (not written by this plugin) "
                "moved to dead letters in %s", malformed, _named(keys, "queue"),
                _named(keys, "dead"),
            )
            self._stats.inc_value("redisspine/scheduler/malformed", malformed)

    def _accept(self, lease: Lease) -> None:
        handle = lease.handle
        try:
            lost = marker_reason(lease.payload)
            if lost is not None:
                raise RequestDecodeError(lost)
            request = self._outbox.cached(lease.payload)
            if request is None:
                request = self._codec.decode(lease.payload)
        except Exception as exc:  # RequestDecodeError, or anything a bad payload triggers
            reason = f"undecodable request: {exc}"
            logger.error("redisspine: lease %s moved to dead letters: %s", handle[0], reason)
            self._stats.inc_value("redisspine/scheduler/undecodable")
            frontier, guard = self._frontier, self._guard

            # failing, the lease stays in flight: a sweep returns it
            self._io.submit("bury", lambda: frontier.bury(handle, reason),
                            lambda buried: guard.repaired("bury", buried.repairs),
                            reported(guard, "bury"))
            return
        if lease.requeues:
            request.meta["redisspine_requeues"] = lease.requeues
            self._stats.inc_value("redisspine/scheduler/leased_requeued")
        self._crawl_delay_learned(lease.lane, lease.crawl_delay)
        self._book.add(request, handle, lease.lane)


def _named(keys: CrawlKeys, name: str) -> str:
    """A frontier key's name for a log line: of a sharded crawl, its shards' names
    (``P:{C/*}:queue``), the crawl-wide one being unused."""
    if keys.shards == 1:
        return str(getattr(keys, name))
    first_shard = keys.shard_view(0)
    first = str(getattr(first_shard, name))
    every = first_shard.tag().removesuffix("/0") + "/*"
    return first.replace(f"{{{first_shard.tag()}}}", f"{{{every}}}", 1)
