"""Redis calls off the crawl's loop: one thread of the worker's own makes them, in order.

A synchronous Redis call on Twisted's reactor thread (or asyncio's loop, reactorless)
stops the whole worker for its round trip: no download progresses, no callback runs.
With Redis 5-20 ms away (another zone, a managed service) that costs most of a crawl's
speed, and a frozen Redis freezes every download for the whole call timeout.

:class:`ThreadIO` runs each call on a single thread of its own and hands its result
back to the loop, where everything else of the worker happens; nothing of the
worker's state is touched on that thread, only the call itself runs there. Why a
thread rather than redis-py's asyncio client:

- it works under every reactor Scrapy offers and in its reactorless mode, with the
  same client (plain, TLS, Cluster, Sentinel), the same scripts and the same errors,
  so the breaker and the reconciliation of lost replies stay as they are;
- one thread runs calls in the order they were submitted, which is the ordering the
  frontier needs (a request's children before or with its parent's ack; acks, which
  free a lane, before the lease that looks for due lanes). A worker has two: one for
  the crawl's hot path (leases with the outbox, buries), one for its upkeep
  (heartbeat, sweeps, totals, the fleet log, limits, the feed, dedup maintenance),
  which needs no order with the leases, so a sweep never holds a lease up by a
  round trip (with Redis 20 ms away one thread makes at most ~50 calls a second);
- redis-py (with hiredis) releases the GIL while it waits on the socket, so the loop
  runs on while a call is in the air.

:class:`InlineIO` runs each call at once on the caller's thread: tests driven by
``twisted.internet.task.Clock``, and ``REDISSPINE_REDIS_THREAD = False``.

A call slower than ``slow_seconds`` is counted (``redisspine/redis/slow_calls``) and
said in one line at most once a minute, with its measured time.

Scrapy-free: results come back through a ``deliver`` function (the loop's
``callFromThread``), see :meth:`scrapy_redisspine._clock.CrawlClock.call_from_thread`.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from scrapy_redisspine._guard import CALL_ERRORS

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._guard import RedisGuard

logger = logging.getLogger("scrapy_redisspine.scheduler")

T = TypeVar("T")

#: A Redis call slower than this is counted, and said once a minute.
SLOW_CALL_SECONDS = 0.5
#: Redis counts as near while its calls take less than this (a moving average):
#: then the scheduler may wait for a lease reply rather than tell Scrapy it has none.
NEAR_SECONDS = 0.005
#: ... and while none of the calls on their way is older than this (a Redis that just
#: froze is not near).
OVERDUE_SECONDS = 0.05
_SLOW_LOG_INTERVAL_SECONDS = 60.0


class RedisIO(Protocol):
    """Where a worker's Redis calls run, and how their results come back."""

    @property
    def background(self) -> bool:
        """True when calls run off the caller's thread (results come later)."""
        ...

    @property
    def busy(self) -> bool:
        """Calls submitted whose results were not delivered yet."""
        ...

    @property
    def near(self) -> bool:
        """Do calls come back within a few milliseconds (a moving average)?"""
        ...

    def submit(
        self, name: str, call: Callable[[], T], done: Callable[[T], object],
        failed: Callable[[Exception], object],
    ) -> None:
        """Run ``call()``; then ``done(result)`` or ``failed(exception)`` on the loop."""
        ...

    def drain(self, timeout: float) -> bool:
        """Wait (blocking the caller) until every submitted call ran and its result
        was delivered; False if ``timeout`` seconds passed first."""
        ...

    def close(self) -> None: ...


def _deliver(
    name: str, stats: StatsCollector, outcome: tuple[bool, Any],
    done: Callable[[Any], object], failed: Callable[[Exception], object],
) -> None:
    """Hand one outcome to its callback; a callback that raises is logged and counted
    (the worker's loop must not die of it, and nothing is swallowed silently)."""
    ok, value = outcome
    try:
        if ok:
            done(value)
        else:
            failed(value)
    except Exception as exc:
        stats.inc_value(f"redisspine/errors/{name}")
        logger.error("redisspine: handling the reply of %s failed (%s: %s)", name,
                     type(exc).__name__, exc)
        logger.debug("redisspine: %s reply handling", name, exc_info=True)


def reported(
    guard: RedisGuard, operation: str, after: Callable[[], object] = lambda: None
) -> Callable[[Exception], None]:
    """The usual ``failed`` of a submitted call: ``after()`` (e.g. clear the part's
    call-on-its-way flag), then a Redis error goes to the guard (breaker, back-off,
    reconciliation) and anything else is raised, for :func:`_deliver` to log and count."""

    def failed(exc: Exception) -> None:
        after()
        if not isinstance(exc, CALL_ERRORS):
            raise exc
        guard.failed(operation, exc)

    return failed


def call_now(
    name: str, stats: StatsCollector, call: Callable[[], T], done: Callable[[T], object],
    failed: Callable[[Exception], object],
) -> None:
    """Run ``call`` here and hand its outcome over at once (inline, or after close)."""
    try:
        outcome: tuple[bool, Any] = (True, call())
    except Exception as exc:
        outcome = (False, exc)
    _deliver(name, stats, outcome, done, failed)


class CallTimes:
    """What a background RedisIO knows of its calls' times (loop thread only): how many
    are pending and since when, how long they took lately, and the slow ones, counted
    and said at most once a minute. One per ThreadIO or LoopIO."""

    def __init__(self, stats: StatsCollector, slow_seconds: float) -> None:
        self._stats = stats
        self._slow_seconds = slow_seconds
        self._submitted: collections.deque[float] = collections.deque()  # pending, in order
        self._recent = 0.0  # moving average of the calls' times
        self._slow_logged = float("-inf")

    @property
    def pending(self) -> int:
        return len(self._submitted)

    @property
    def near(self) -> bool:
        """Do calls come back fast (Redis on loopback or next door), and is none of
        those on its way already overdue (a Redis that just froze is not near)?"""
        if self._recent >= NEAR_SECONDS:
            return False
        return not self._submitted or time.monotonic() - self._submitted[0] < OVERDUE_SECONDS

    def submitted(self) -> None:
        self._submitted.append(time.monotonic())

    def delivered(self, name: str, took: float) -> None:
        """The oldest pending call (``name``, which took ``took`` s) is delivered."""
        if self._submitted:
            self._submitted.popleft()
        self._recent += (took - self._recent) / 8
        if took >= self._slow_seconds:
            self._slow(name, took)

    def _slow(self, name: str, took: float) -> None:
        self._stats.inc_value("redisspine/redis/slow_calls")
        self._stats.max_value("redisspine/redis/slowest_call_ms", int(took * 1000))
        now = time.monotonic()
        if now - self._slow_logged >= _SLOW_LOG_INTERVAL_SECONDS:
            self._slow_logged = now
            logger.warning(
                "redisspine: Redis is slow: %s took %.0f ms (downloads and callbacks go "
                "on meanwhile; see redisspine/redis/slow_calls)", name, took * 1000,
            )


class InlineIO:
    """Each call at once, on the caller's thread (the behaviour before ThreadIO)."""

    background = False
    busy = False
    near = True

    def __init__(self, stats: StatsCollector) -> None:
        self._stats = stats

    def submit(
        self, name: str, call: Callable[[], T], done: Callable[[T], object],
        failed: Callable[[Exception], object],
    ) -> None:
        call_now(name, self._stats, call, done, failed)

    def drain(self, timeout: float) -> bool:
        return True

    def close(self) -> None:
        return None


class ThreadIO:
    """Calls on one thread of the worker's own, results delivered on the loop, in
    submission order.

    Invariant kept: results are delivered in the order their calls were submitted,
    each exactly once, on the loop's thread (or inline by :meth:`drain`)."""

    background = True

    def __init__(
        self, stats: StatsCollector, deliver: Callable[[Callable[[], object]], object],
        *, slow_seconds: float = SLOW_CALL_SECONDS, name: str = "redisspine-redis",
    ) -> None:
        """``deliver(function)`` runs ``function`` soon on the loop's thread and is
        safe to call from any thread (``reactor.callFromThread``)."""
        self._stats = stats
        self._deliver_soon = deliver
        self._times = CallTimes(stats, slow_seconds)
        self._calls: queue.SimpleQueue[tuple[str, Callable[[], Any], Callable[[Any], object],
                                             Callable[[Exception], object]] | None]
        self._calls = queue.SimpleQueue()
        self._results: collections.deque[tuple[str, tuple[bool, Any], float,
                                               Callable[[Any], object],
                                               Callable[[Exception], object]]]
        self._results = collections.deque()
        self._ran = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        return self._times.pending > 0

    @property
    def near(self) -> bool:
        return self._times.near

    def submit(
        self, name: str, call: Callable[[], T], done: Callable[[T], object],
        failed: Callable[[Exception], object],
    ) -> None:
        if self._closed:  # a timer's last tick after the scheduler closed: at once
            call_now(name, self._stats, call, done, failed)
            return
        self._times.submitted()
        self._calls.put((name, call, done, failed))

    def _run(self) -> None:
        while True:
            job = self._calls.get()
            if job is None:
                return
            name, call, done, failed = job
            started = time.monotonic()
            try:
                outcome: tuple[bool, Any] = (True, call())
            except Exception as exc:  # delivered to ``failed`` on the loop
                outcome = (False, exc)
            took = time.monotonic() - started
            with self._ran:
                self._results.append((name, outcome, took, done, failed))
                self._ran.notify_all()
            try:
                self._deliver_soon(self._deliver_ready)
            except Exception:  # the loop stopped: drain() or close() delivers
                logger.debug("redisspine: no loop to deliver %s's reply to", name,
                             exc_info=True)

    def _deliver_ready(self) -> None:
        """Deliver every result that is in (loop thread)."""
        while True:
            with self._ran:
                if not self._results:
                    return
                name, outcome, took, done, failed = self._results.popleft()
            self._times.delivered(name, took)
            _deliver(name, self._stats, outcome, done, failed)

    def drain(self, timeout: float) -> bool:
        """Wait for the calls submitted so far and deliver their results here (the
        loop's thread: at close, or before a call that must follow them)."""
        deadline = time.monotonic() + timeout
        while self._times.pending:
            with self._ran:
                while not self._results:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._ran.wait(left)
            self._deliver_ready()
        return True

    def close(self) -> None:
        """Stop the thread once the calls queued so far ran (their results are
        delivered by a last :meth:`drain`, or dropped with the loop)."""
        if not self._closed:
            self._closed = True
            self._calls.put(None)
