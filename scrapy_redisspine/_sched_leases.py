"""The scheduler's leases: the ready list, handed-out requests and their acks.

One round trip fills the ready list (``Frontier.enqueue_and_lease``), carrying the
outbox and the acks with it; each ``next_request()`` hands one out; the engine's
"done" (see ``_engine``) turns it into an ack in the outbox.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import redis

from scrapy_redisspine._sched_outbox import outgoing
from scrapy_redisspine._sched_politeness import PolitenessMixin
from scrapy_redisspine._sched_state import logger

if TYPE_CHECKING:
    from scrapy import Request

    from scrapy_redisspine.frontier import Lease, LeaseBatch


class LeasesMixin(PolitenessMixin):
    """The leasing part of ``scheduler.Scheduler``; the mixins form one chain:
    state, outbox, fleet, politeness, leases."""

    def _lease(self) -> bool:
        """Fill the ready list in one round trip (which also carries the outbox and
        the acks); False if nothing was leased."""
        assert self.frontier is not None
        now = time.monotonic()
        # Engine wake-ups (each enqueue, each finished download) may come far more
        # often than work appears; after an empty lease, wait for the idle poll,
        # unless there is something to send (an ack frees a lane, a request fills one).
        sending = bool(self._outbox or self._acks)
        if not sending and now - self._last_empty_lease < self.config.idle_poll_seconds / 2:
            return False
        free = self._hooks.free_download_slots() if self._hooks else 1
        count = max(1, min(free, self.config.lease_batch_size))
        while not self._ready and self.health.available():
            try:
                if self._reconcile_leases:
                    self._release_orphans()
                batch, sent = self._send_and_lease(count)
            except redis.RedisError as exc:
                self._redis_failed("lease", exc)
                return False
            if batch is None:
                return False
            if sent:  # else the breaker stays open for the outbox; the leases are ours
                self.health.succeeded()
            self._set_fleet_counts(batch.queued, batch.inflight, now)
            self._wake_when_due(batch.wait_ms)
            self._report_malformed(batch.malformed)
            if not batch.leases and not batch.malformed:
                self._last_empty_lease = now
                return False
            self.stats.inc_value("redisspine/scheduler/leased", len(batch.leases))
            for lease in batch.leases:
                self._accept(lease)
            # Loop only when everything leased was dead-lettered and work remains.
            if not batch.queued:
                break
        return bool(self._ready)

    def _send_and_lease(self, count: int) -> tuple[LeaseBatch | None, bool]:
        """Lease, sending the outbox and acks first in the same round trip.

        Returns the batch (None when the send failed and nothing was leased; the
        buffers are kept) and whether Redis took the send (a full Redis that refused
        new requests did answer: that counts)."""
        assert self.frontier is not None
        if not self._outbox and not self._acks:
            return self.frontier.lease(count), True
        outbox, acks = self._outbox, self._acks
        sent, batch = self.frontier.enqueue_and_lease(*outgoing(outbox, acks), count)
        if not isinstance(sent, redis.RedisError):
            self._sent(outbox, len(acks), sent)
            return batch, True
        self._send_failed(sent)
        answered = isinstance(sent, redis.exceptions.OutOfMemoryError)
        if not batch.leases and not batch.malformed:
            return None, answered
        return batch, answered

    def _report_malformed(self, malformed: int) -> None:
        if malformed:
            assert self.frontier is not None
            logger.error(
                "redisspine: %d malformed member(s) of %s (not written by this plugin) "
                "moved to dead letters in %s", malformed, self.frontier.keys.queue,
                self.frontier.keys.dead,
            )
            self.stats.inc_value("redisspine/scheduler/malformed", malformed)

    def _accept(self, lease: Lease) -> None:
        assert self.codec is not None
        assert self.frontier is not None
        handle = lease.handle
        try:
            request = self._local.pop(lease.payload, None)
            if request is None:
                request = self.codec.decode(lease.payload)
        except Exception as exc:  # RequestDecodeError, or anything a bad payload triggers
            reason = f"undecodable request: {exc}"
            logger.error("redisspine: lease %s moved to dead letters: %s", handle[0], reason)
            self.stats.inc_value("redisspine/scheduler/undecodable")
            try:
                self.frontier.bury(handle, reason)
            except redis.RedisError as exc:  # the lease stays in flight: a sweep returns it
                self._redis_failed("bury", exc)
            return
        if lease.requeues:
            request.meta["redisspine_requeues"] = lease.requeues
            self.stats.inc_value("redisspine/scheduler/leased_requeued")
        if lease.crawl_delay is not None and not self.delays.knows(lease.lane):
            self.delays.learn(lease.lane, lease.crawl_delay)
        self._lanes[lease.key] = lease.lane
        self._ready.append((request, handle))

    def _on_request_done(self, request: Request) -> None:
        handle = self._handed_out.pop(request, None)
        if handle is None:
            return  # not ours: e.g. robots.txt fetched through engine.download()
        key, token = handle
        lane = self._lanes.pop(key, "")
        rest_ms = max(self.delays.next_delay_ms(lane), self._blocks.pop(key, 0))
        self._acks.append((key, token, rest_ms, time.monotonic()))
        self._flush_soon(self.config.ack_flush_seconds)
