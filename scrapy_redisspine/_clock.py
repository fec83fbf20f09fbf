"""Time for the worker's parts: one clock to read and to schedule on, and timers
that never die.

Every part of a worker that waits (the outbox's flush timer, the idle poll, the
heartbeat, the sweep) takes a :class:`Clock` through its constructor, so tests drive
them with ``twisted.internet.task.Clock`` instead of sleeping. In a crawl the clock
is :class:`ReactorClock`: Twisted's reactor for scheduling, ``time.monotonic`` for
reading, so a wall-clock step (NTP) never stretches or cuts a back-off or a rest.

A :class:`Periodic` task logs and counts an exception and keeps running: a
``LoopingCall`` whose function raises stops for good, which for a heartbeat would
let the fleet take a live worker for dead.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Protocol

from twisted.internet import task

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


class ReactorClock:
    """The reactor's scheduling with a monotonic reading."""

    def seconds(self) -> float:
        return time.monotonic()

    def callLater(
        self, delay: float, callable: Callable[..., Any], *args: Any, **kw: Any
    ) -> DelayedCall:
        from twisted.internet import reactor

        twisted: Any = reactor  # its stubs do not describe the installed reactor
        return twisted.callLater(delay, callable, *args, **kw)  # type: ignore[no-any-return]


class Periodic:
    """Calls ``function`` every ``interval`` seconds on ``clock``, whatever it raises.

    An exception is logged in one line (the traceback at DEBUG) and counted in
    ``redisspine/errors/<name>``; the next tick comes as usual.
    """

    def __init__(
        self, name: str, function: Callable[[], object], interval: float, clock: Clock,
        stats: StatsCollector,
    ) -> None:
        self.name = name
        self.interval = interval
        self._function = function
        self._stats = stats
        self._loop = task.LoopingCall(self._tick)
        self._loop.clock = clock  # type: ignore[assignment]

    @property
    def running(self) -> bool:
        return bool(self._loop.running)

    def start(self) -> None:
        self._loop.start(self.interval, now=False)

    def stop(self) -> None:
        if self._loop.running:
            self._loop.stop()

    def _tick(self) -> None:
        try:
            self._function()
        except Exception as exc:
            self._stats.inc_value(f"redisspine/errors/{self.name}")
            logger.error("redisspine: %s failed (%s: %s); it runs again in %.1f s",
                         self.name, type(exc).__name__, exc, self.interval)
            logger.debug("redisspine: %s failure", self.name, exc_info=True)
