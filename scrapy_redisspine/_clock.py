"""Time for the worker's parts: one clock to read and to schedule on, and timers
that never die.

Every part of a worker that waits (the outbox's flush timer, the idle poll, the
heartbeat, the sweep) takes a :class:`Clock` through its constructor, so tests drive
them with ``twisted.internet.task.Clock`` instead of sleeping. In a crawl the clock
is :class:`CrawlClock`: the crawl's loop (Twisted's reactor, or asyncio's when Scrapy
runs reactorless) for scheduling, ``time.monotonic`` for reading, so a wall-clock
step (NTP) never stretches or cuts a back-off or a rest.

A :class:`Periodic` task logs and counts an exception and keeps running: a
``LoopingCall`` whose function raises stops for good, which for a heartbeat would
let the fleet take a live worker for dead.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger("scrapy_redisspine")


class DelayedCall(Protocol):
    """What ``callLater`` returns (Twisted's ``IDelayedCall``), as far as we use it."""

    def active(self) -> bool: ...

    def cancel(self) -> None: ...


class Clock(Protocol):
    """Twisted's ``IReactorTime`` as far as the worker uses it."""

    def seconds(self) -> float: ...

    def callLater(  # Twisted's name
        self, delay: float, callable: Callable[..., Any], *args: Any, **kw: Any
    ) -> DelayedCall: ...


class CrawlClock:
    """The crawl's own loop for scheduling, with a monotonic reading.

    Twisted's reactor when one is installed (Scrapy's default, the asyncio reactor
    included); otherwise the running asyncio loop: in Scrapy's reactorless mode
    (``TWISTED_REACTOR_ENABLED = False``) importing ``twisted.internet.reactor`` is
    forbidden, and would install a reactor nobody runs."""

    def seconds(self) -> float:
        return time.monotonic()

    def callLater(
        self, delay: float, callable: Callable[..., Any], *args: Any, **kw: Any
    ) -> DelayedCall:
        if "twisted.internet.reactor" in sys.modules:
            from twisted.internet import reactor

            twisted: Any = reactor  # its stubs do not describe the installed reactor
            return twisted.callLater(delay, callable, *args, **kw)  # type: ignore[no-any-return]
        return _AsyncioCall(_running_loop(), delay, functools.partial(callable, *args, **kw))

    def thread_caller(self) -> Callable[[Callable[[], object]], object]:
        """A function that any thread may call to run a function soon on the crawl's
        loop (Twisted's ``callFromThread``, asyncio's ``call_soon_threadsafe``).
        Asked on the loop's thread: asyncio's loop is the one running there."""
        if "twisted.internet.reactor" in sys.modules:
            from twisted.internet import reactor

            twisted: Any = reactor
            return twisted.callFromThread  # type: ignore[no-any-return]
        return _running_loop().call_soon_threadsafe

    def asyncio_loop(self) -> asyncio.AbstractEventLoop | None:
        """The asyncio loop the crawl runs on (Scrapy's asyncio reactor, or its
        reactorless mode); None under another Twisted reactor. Asked on the loop's
        thread."""
        if "twisted.internet.reactor" in sys.modules:
            from twisted.internet import reactor

            loop = getattr(reactor, "_asyncioEventloop", None)
            return loop if isinstance(loop, asyncio.AbstractEventLoop) else None
        return _running_loop()


def _running_loop() -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # asked from outside a callback (set-up code): the thread's loop
        return asyncio.get_event_loop_policy().get_event_loop()


class _AsyncioCall:
    """``loop.call_later`` with Twisted's ``active()``, which asyncio's handle lacks."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, delay: float, function: Callable[[], object]
    ) -> None:
        self._function = function
        self._done = False
        self._handle = loop.call_later(max(0.0, delay), self._fire)

    def _fire(self) -> None:
        self._done = True
        self._function()

    def active(self) -> bool:
        return not self._done and not self._handle.cancelled()

    def cancel(self) -> None:
        self._handle.cancel()


class Periodic:
    """Calls ``function`` every ``interval`` seconds on ``clock``, whatever it raises.

    An exception is logged in one line (the traceback at DEBUG) and counted in
    ``redisspine/errors/<name>``; the next tick comes as usual. Each tick is
    scheduled after the last with ``clock.callLater``, not with Twisted's
    ``LoopingCall``, which reaches for the reactor and so cannot run reactorless.
    """

    def __init__(
        self, name: str, function: Callable[[], object], interval: float, clock: Clock,
        stats: StatsCollector,
    ) -> None:
        self.name = name
        self.interval = interval
        self._function = function
        self._stats = stats
        self._clock = clock
        self._next: DelayedCall | None = None

    @property
    def running(self) -> bool:
        return self._next is not None

    def start(self) -> None:
        if self._next is None:
            self._next = self._clock.callLater(self.interval, self._tick)

    def stop(self) -> None:
        if self._next is not None:
            if self._next.active():
                self._next.cancel()
            self._next = None

    def _tick(self) -> None:
        this_call = self._next
        try:
            self._function()
        except Exception as exc:
            self._stats.inc_value(f"redisspine/errors/{self.name}")
            logger.error("redisspine: %s failed (%s: %s); it runs again in %.1f s",
                         self.name, type(exc).__name__, exc, self.interval)
            logger.debug("redisspine: %s failure", self.name, exc_info=True)
        if self._next is this_call and this_call is not None:  # not stopped (or restarted) by it
            self._next = self._clock.callLater(self.interval, self._tick)
