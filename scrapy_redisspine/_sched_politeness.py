"""The scheduler's politeness hooks: delays, Retry-After, robots.txt Crawl-delay.

The fleet enforces a lane's rest in Redis (lib/hosts.lua); these hooks decide how
long that rest is (``DelayPolicy``) and carry what responses say about their host
(called by ``middleware.Politeness``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import redis

from scrapy_redisspine._sched_fleet import FleetMixin
from scrapy_redisspine._sched_state import logger

if TYPE_CHECKING:
    from scrapy import Request, Spider


class PolitenessMixin(FleetMixin):
    """The politeness part of ``scheduler.Scheduler``."""

    def _take_over_download_delay(self, spider: Spider) -> None:
        """The fleet enforces DOWNLOAD_DELAY per lane; Scrapy's per-process delay
        would add on top, so it is switched off for this spider."""
        own = getattr(spider, "download_delay", None)
        if own is not None:  # a spider attribute wins over the setting, as in Scrapy
            self.delays.default_seconds = float(own)
        if self.delays.default_seconds or self.delays.overrides:
            logger.info(
                "redisspine: download delay %.2f s (overrides: %d) enforced fleet-wide per %s, "
                "from the end of each fetch; Scrapy's per-process delay set to 0",
                self.delays.default_seconds, len(self.delays.overrides),
                self.config.politeness_key,
            )
        spider.download_delay = 0  # type: ignore[attr-defined]

    def block_host(self, request: Request, seconds: float) -> None:
        """A Retry-After answer: the lane rests this long after the request's ack."""
        handle = self._handed_out.get(request)
        if handle is not None:
            self._blocks[handle[0]] = int(seconds * 1000)
            self.stats.inc_value("redisspine/politeness/retry_after")

    def learn_crawl_delay(self, url: str, seconds: float) -> None:
        """A robots.txt Crawl-delay: used here at once, shared through Redis."""
        lane = self._lane(url)
        if not lane or self.delays.knows(lane):
            return
        kept = self.delays.learn(lane, seconds)
        self.stats.inc_value("redisspine/politeness/crawl_delays_learned")
        logger.info(
            "redisspine: %s asks for Crawl-delay %.1f s (kept: %.1f s)", lane, seconds, kept
        )
        if self.frontier is not None and self.health.available():
            try:
                self.frontier.set_crawl_delay(lane, kept)
            except redis.RedisError as exc:
                self._redis_failed("crawl_delay", exc)

    def _wake_when_due(self, wait_ms: int) -> None:
        """Sleep exactly until the next lane is due rather than a whole poll period."""
        if wait_ms < 0 or wait_ms / 1000 >= self.config.idle_poll_seconds:
            return
        if self._wake_call is not None and self._wake_call.active():
            return
        from twisted.internet import reactor

        self._wake_call = reactor.callLater(wait_ms / 1000, self.wake)  # type: ignore[attr-defined,arg-type,call-arg,unused-ignore]
