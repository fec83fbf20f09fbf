"""Redis availability as one worker sees it: back off while it is down, say so once.

A worker must survive a Redis restart, failover or network blip: every call that
fails leaves its data in the worker's buffers, and the next attempt waits for a
growing delay (0.1 s doubling to ``max_delay``), so a down Redis costs neither a
busy loop nor a reactor blocked on one connect timeout after another.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)

_FIRST_DELAY_SECONDS = 0.1


class RedisHealth:
    """Circuit breaker over one worker's Redis calls."""

    def __init__(
        self,
        max_delay: float = 5.0,
        on_error: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_delay = max_delay
        self._on_error = on_error
        self._clock = clock
        self._delay = 0.0
        self._retry_at = 0.0
        self._down_since: float | None = None
        self._healthy_since = clock()

    @property
    def down(self) -> bool:
        return self._down_since is not None

    def available(self) -> bool:
        """May a call be tried now?"""
        return self._clock() >= self._retry_at

    def healthy_for(self) -> float:
        """Seconds since Redis last answered after an outage (or since start)."""
        return 0.0 if self.down else self._clock() - self._healthy_since

    def restart_healthy_clock(self) -> None:
        """Count :meth:`healthy_for` from now (Redis stalled without failing)."""
        if self._down_since is None:
            self._healthy_since = self._clock()

    def failed(self, operation: str, exc: Exception) -> None:
        now = self._clock()
        if self._down_since is None:
            self._down_since = now
            logger.error(
                "redisspine: Redis %s failed (%s: %s); keeping this worker's requests and "
                "acks in memory and retrying with backoff", operation, type(exc).__name__, exc,
            )
        self._delay = min(max(self._delay * 2, _FIRST_DELAY_SECONDS), self.max_delay)
        self._retry_at = now + self._delay
        if self._on_error is not None:
            self._on_error(operation)

    def succeeded(self) -> None:
        if self._down_since is not None:
            now = self._clock()
            logger.warning(
                "redisspine: Redis is back after %.1f s; resuming", now - self._down_since
            )
            self._down_since = None
            self._healthy_since = now
        self._delay = 0.0
        self._retry_at = 0.0
