"""Filling the ready list: one round trip leases a batch and carries the outbox.

``Frontier.enqueue_and_lease`` sends the buffered requests and acks and leases up
to as many requests as the downloader has free slots, in one round trip (the acks
free their lanes before the lease looks for due lanes). A payload that cannot be
rebuilt goes to the dead letters; a lease reply lost in an outage is reconciled
before the next lease.

An empty lease backs off until the idle poll; a lane due sooner than that wakes the
engine exactly when it is due.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from scrapy_redisspine._guard import CALL_ERRORS
from scrapy_redisspine._local import marker_reason
from scrapy_redisspine.request_codec import RequestDecodeError

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._clock import Clock, DelayedCall
    from scrapy_redisspine._engine import EnginePort
    from scrapy_redisspine._guard import RedisGuard
    from scrapy_redisspine._leasebook import LeaseBook
    from scrapy_redisspine._local import LocalQueue
    from scrapy_redisspine._outbox import Outbox
    from scrapy_redisspine.frontier import Frontier, Lease, LeaseBatch
    from scrapy_redisspine.request_codec import RequestCodec

logger = logging.getLogger("scrapy_redisspine.scheduler")


class Leaser:
    """Owns the lease back-off (when the last lease came back empty) and the
    wake-up timer for the next due lane; fills the lease book.

    Invariant kept: a leased request is either in the book or buried (dead letters);
    a lease this worker does not know of is returned before the next lease.
    """

    def __init__(
        self,
        *,
        frontier: Frontier,
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
    ) -> None:
        """``counted(queued, inflight)`` receives the fleet's counts of each lease
        reply; ``crawl_delay_learned(lane, seconds)`` each lease's Crawl-delay;
        ``close_ordered(reason)`` a fleet-wide limit a lease reply reports."""
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
        self._wake_call: DelayedCall | None = None
        self._wake_due = float("inf")  # when the wake-up timer fires (this clock)

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

    def lease(self) -> bool:
        """Fill the ready list in one round trip (which also carries the outbox and
        the acks); False if nothing was leased."""
        now = self._clock.seconds()
        # Engine wake-ups (each enqueue, each finished download) may come far more
        # often than work appears; after an empty lease, wait for the idle poll,
        # unless there is something to send (an ack frees a lane, a request fills one).
        if not self._sending() and now - self._last_empty_lease < self._idle_poll_seconds / 2:
            return False
        free = self._engine.free_download_slots() if self._engine else 1
        count = max(1, min(free, self._batch_size))
        while not self._book.ready and self._guard.available("lease"):
            try:
                if self._guard.reconcile_needed:
                    self._release_orphans()
                batch, sent = self._send_and_lease(count)
            except CALL_ERRORS as exc:
                self._guard.failed("lease", exc)
                return False
            if batch is None:
                return self._lease_local()
            self._guard.succeeded("lease")
            if sent:  # else the outbox keeps its back-off; the leases are ours
                self._guard.succeeded("enqueue")
            self._counted(batch.queued, batch.inflight)
            if batch.close_reason:
                self._close_ordered(batch.close_reason)
            self.wake_when_due(batch.wait_ms)
            self._report_malformed(batch.malformed)
            self._guard.repaired("lease", batch.repairs)
            if batch.page_limited:
                self._stats.inc_value("redisspine/scheduler/host_page_limited",
                                      batch.page_limited)
            if not batch.leases and not batch.malformed:
                self._last_empty_lease = now
                return self._lease_local()
            self._stats.inc_value("redisspine/scheduler/leased", len(batch.leases))
            for lease in batch.leases:
                self._accept(lease)
            # Loop only when everything leased was dead-lettered and work remains.
            if not batch.queued:
                break
        return bool(self._book.ready) or self._lease_local()

    def _lease_local(self) -> bool:
        """Take lane slots for requests kept in this worker's memory (they are not
        in the queue): one script call per lane that has any, at most a batch."""
        if not len(self._local) or not self._guard.available("take_slot"):
            return bool(self._book.ready)
        for lane in self._local.lanes()[: self._batch_size]:
            request, payload = self._local.first(lane)
            try:
                lease, wait_ms, repairs = self._frontier.take_slot(
                    lane, request.priority, payload
                )
            except CALL_ERRORS as exc:
                self._guard.failed("take_slot", exc)
                break
            self._guard.repaired("take_slot", repairs)
            if lease is None:
                self.wake_when_due(wait_ms or int(self._idle_poll_seconds * 1000))
                continue
            self._book.add(self._local.taken(lane, lease.key), lease.handle, lane)
            self._stats.inc_value("redisspine/scheduler/leased_local")
        return bool(self._book.ready)

    def _sending(self) -> bool:
        """Is there something to send, and may it be sent now?"""
        return self._outbox.sendable and self._guard.available("enqueue")

    def _send_and_lease(self, count: int) -> tuple[LeaseBatch | None, bool]:
        """Lease, sending the outbox and acks first in the same round trip.

        Returns the batch (None when the send failed and nothing was leased; the
        buffers are kept) and whether Redis took the send (a full Redis that refused
        new requests did answer: that counts). While the send backs off after an
        error, the lease goes alone."""
        if not self._sending():
            return self._frontier.lease(count), False
        self._outbox.report_shed()  # before the acks: raises as the lease would
        sending = self._outbox.sending()
        sent, batch = self._frontier.enqueue_and_lease(
            sending.entries, sending.ack_args, count, sending.items, sending.loose
        )
        if not isinstance(sent, redis.RedisError):
            self._outbox.sent(sending, sent)
            return batch, True
        self._outbox.send_failed(sent)
        answered = isinstance(sent, redis.exceptions.OutOfMemoryError)
        if not batch.leases and not batch.malformed:
            return None, answered
        return batch, answered

    def _release_orphans(self) -> None:
        known = self._book.known_keys() + self._outbox.ack_keys()
        released = self._frontier.release_orphans(known)
        self._guard.reconciled()
        self._guard.repaired("release_orphans", released.repairs)
        if released:
            logger.warning(
                "redisspine: returned %d lease(s) this worker did not hold (a lease reply "
                "or an ack lost in the outage)", released,
            )

    def _report_malformed(self, malformed: int) -> None:
        if malformed:
            logger.error(
                "redisspine: %d malformed member(s) of %s (not written by this plugin) "
                "moved to dead letters in %s", malformed, self._frontier.keys.queue,
                self._frontier.keys.dead,
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
            try:
                buried = self._frontier.bury(handle, reason)
                self._guard.repaired("bury", buried.repairs)
            except CALL_ERRORS as exc:  # the lease stays in flight: a sweep returns it
                self._guard.failed("bury", exc)
            return
        if lease.requeues:
            request.meta["redisspine_requeues"] = lease.requeues
            self._stats.inc_value("redisspine/scheduler/leased_requeued")
        self._crawl_delay_learned(lease.lane, lease.crawl_delay)
        self._book.add(request, handle, lease.lane)
