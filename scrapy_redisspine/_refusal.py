"""A worker that must stop without saying "finished": why, once, and how it closes.

A worker refuses to work when it cannot start (see ``_joining``) or when the crawl
it joined vanished from Redis (lost, purged, started afresh). Either way it logs one
ERROR line with the cause, asks the engine to close the spider with a reason of its
own (from the reactor's next turn: asked from inside an engine call, the engine
could close the scheduler in the middle of it), and makes the process exit non-zero.
Until the engine closes, the scheduler reports pending work, so the spider is never
closed as ``finished``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy_redisspine._joining import REASON_LOST, REASON_PURGED

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._clock import Clock
    from scrapy_redisspine._engine import EnginePort

logger = logging.getLogger("scrapy_redisspine.scheduler")

_GONE = {
    "lost": "the crawl's state in Redis is gone (Redis restarted without persistence, "
            "was flushed, or failed over to an empty replica)",
    "purged": "the crawl was purged (`redisspine purge`) while this worker was running",
    "changed": "the crawl in Redis is not the one this worker joined (it was lost or "
               "purged, and another worker started it afresh)",
}


class Refusal:
    """Owns the close reason of a worker that refused, and whether the engine was
    asked to close."""

    def __init__(
        self, engine: EnginePort | None, clock: Clock, stats: StatsCollector
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._stats = stats
        self.reason: str | None = None
        self._closing = False

    def refuse(self, reason: str, message: str) -> None:
        """Say why in one line; the engine is asked to close at its next call."""
        logger.error("redisspine: %s. This worker stops (close reason %r).",
                     message.rstrip("."), reason)
        self._stats.set_value("redisspine/refused", reason)
        self.reason = reason
        if self._engine is not None:
            self._engine.mark_failed()

    def crawl_gone(self, status: str, holding: str) -> None:
        """The crawl is not in Redis any more (``status`` as ``Heartbeat.status``);
        ``holding`` says what this worker held that is gone with it. Said once."""
        if self.reason is not None:
            return
        what = _GONE.get(status, _GONE["lost"])
        self.refuse(REASON_PURGED if status == "purged" else REASON_LOST,
                    f"{what}; {holding}: they are not in Redis any more, and the crawl is "
                    f"not done")
        self.close_soon()

    def close_soon(self) -> None:
        """Ask the engine to close, once, from the reactor's next turn."""
        if self.reason is not None and not self._closing and self._engine is not None:
            self._closing = True
            self._clock.callLater(0, self._engine.close_spider, self.reason)
