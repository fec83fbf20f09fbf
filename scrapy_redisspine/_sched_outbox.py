"""The scheduler's outbox: new requests and acks on their way to Redis.

A request's children always reach Redis in the same atomic step as its ack, or
before it: both wait here and go in one ``enqueue`` call, usually in the same round
trip as the next lease (``Scheduler._lease``), else when the buffer is full or its
timer fires. Requests that went in are kept as objects for a while
(``REDISSPINE_LOCAL_REQUEST_CACHE``), so that leasing them back skips decoding.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import redis

from scrapy_redisspine._sched_state import PendingAck, SchedulerState, logger

if TYPE_CHECKING:
    from scrapy import Request

    from scrapy_redisspine.frontier import Ack, EnqueueResult, NewRequest

_SHED_LOG_INTERVAL_SECONDS = 60.0


class OutboxMixin(SchedulerState):
    """The outbox part of ``scheduler.Scheduler``."""

    def _shed(self, request: Request) -> None:
        self.stats.inc_value("redisspine/memory/shed")
        now = time.monotonic()
        if now - self._last_shed_log > _SHED_LOG_INTERVAL_SECONDS:
            self._last_shed_log = now
            logger.warning(
                "redisspine: Redis is near its memory budget: not queueing newly discovered "
                "requests such as %s (start requests, retries and redirects still go in); "
                "see redisspine/memory/shed", request,
            )

    def _flush_soon(self, within: float) -> None:
        """Send the buffers now if full, else within ``within`` seconds at the latest
        (the next lease usually carries them sooner)."""
        if len(self._outbox) + len(self._acks) >= self.config.enqueue_batch_size or within <= 0:
            self._try_flush()
            return
        due = time.monotonic() + within
        call = self._flush_call
        if call is not None and call.active():
            if self._flush_due <= due:
                return  # called per request: this check must stay cheap
            call.cancel()
        from twisted.internet import reactor

        clock: Any = reactor
        self._flush_due = due
        self._flush_call = clock.callLater(within, self._try_flush)

    def _try_flush(self) -> bool:
        if not self._outbox and not self._acks:
            return True
        if not self.health.available():
            return False
        try:
            self._flush()
        except redis.RedisError as exc:
            self._send_failed(exc)
            return False
        self.health.succeeded()
        return True

    def _send_failed(self, exc: redis.RedisError) -> None:
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            self._shed_outbox()
        self._redis_failed("enqueue", exc)

    def _shed_outbox(self) -> None:
        """Redis refused writes (OOM): keep work in progress, drop new discoveries."""
        kept: list[tuple[NewRequest, Request]] = []
        for entry, request in self._outbox:
            if entry.is_start or request.dont_filter:
                kept.append((entry, request))
            else:
                self._shed(request)
        self._outbox = kept

    def _flush(self) -> None:
        """Send the outbox and pending acks in one atomic round trip."""
        if not self._outbox and not self._acks:
            return
        assert self.frontier is not None
        outbox, acks = self._outbox, self._acks
        result = self.frontier.enqueue(*outgoing(outbox, acks))
        self._sent(outbox, len(acks), result)

    def _sent(
        self, outbox: list[tuple[NewRequest, Request]], acks: int, result: EnqueueResult
    ) -> None:
        """Redis took the outbox and ``acks`` acks: empty the buffers, count."""
        self._outbox = self._outbox[len(outbox):]  # new lists: `outbox` is read below
        self._acks = self._acks[acks:]
        self._record_enqueued(outbox, result.statuses, result.acked, acks)
        self._fleet_pending = True
        self._last_empty_lease = 0.0
        if result.enqueued and self._hooks is not None:
            self._hooks.wake()

    def _record_enqueued(
        self, outbox: list[tuple[NewRequest, Request]], statuses: str, acked: int, sent: int
    ) -> None:
        stats = self.stats
        cache = self.config.local_request_cache
        enqueued = statuses.count("+")
        if enqueued:
            stats.inc_value("scheduler/enqueued/redis", enqueued)
            stats.inc_value("scheduler/enqueued", enqueued)
        for (entry, request), status in zip(outbox, statuses, strict=False):
            if status == "+":
                if cache:
                    self._keep_local(entry.payload, request, cache)
            elif status == "d":
                self.df.log(request, self.spider)  # type: ignore[arg-type]
            elif status == "c":
                stats.inc_value("redisspine/scheduler/backlog_capped")
            else:
                stats.inc_value("redisspine/scheduler/start_requests_skipped")
        if sent:
            stats.inc_value("redisspine/scheduler/acked", acked)
        if acked < sent:
            stats.inc_value("redisspine/scheduler/ack_refused", sent - acked)
            logger.warning("redisspine: %d ack(s) refused: lease no longer ours", sent - acked)

    def _keep_local(self, payload: bytes, request: Request, cache: int) -> None:
        local = self._local
        local[payload] = request
        if len(local) > cache:
            del local[next(iter(local))]  # the oldest


def outgoing(
    outbox: list[tuple[NewRequest, Request]], acks: list[PendingAck]
) -> tuple[list[NewRequest], list[Ack]]:
    """What ``Frontier.enqueue`` takes from the buffers."""
    return [entry for entry, _ in outbox], ack_args(acks)


def ack_args(acks: list[PendingAck], now: float | None = None) -> list[Ack]:
    """Acks as sent: a lane's rest counts from the end of its fetch, so the time an
    ack waited in the buffer comes off it (less 1 ms, what Redis's ms clock may
    lose to rounding: a rest is never cut short)."""
    now = time.monotonic() if now is None else now
    return [
        (key, token, rest_ms - min(rest_ms, max(0, int((now - done) * 1000) - 1)))
        for key, token, rest_ms, done in acks
    ]
