"""Test-only crash points that need Scrapy's signals, not a spider callback."""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any

from scrapy import signals
from scrapy.exceptions import NotConfigured

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


class KillAfterItem:
    """``LINKS_KILL_AFTER_ITEM=/p/4``: SIGKILL the worker right after the item of that
    page passed every item pipeline and the plugin heard of it (its ``item_scraped``
    handler is connected first), while the page's ack is not yet sent.

    With ``LINKS_KILL_ONCE_FILE`` only the first worker of a fleet to get there dies:
    it creates that file first, and a worker that finds it lives on."""

    def __init__(self, page: str, once_file: str | None = None) -> None:
        self.page = page
        self.once_file = once_file

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> KillAfterItem:
        page = crawler.settings.get("LINKS_KILL_AFTER_ITEM")
        if not page:
            raise NotConfigured
        extension = cls(page, crawler.settings.get("LINKS_KILL_ONCE_FILE"))
        crawler.signals.connect(extension.item_scraped, signal=signals.item_scraped)
        return extension

    def item_scraped(self, item: Any, response: Any = None, **_: Any) -> None:
        if not str(getattr(response, "url", "")).endswith(self.page):
            return
        if self.once_file:
            try:
                os.close(os.open(self.once_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                return  # another worker died here already
        os.kill(os.getpid(), signal.SIGKILL)


class RedisNearUnderLoad:
    """``TESTPROJECT_REDIS_NEAR=1``: the worker takes its Redis for near (the lease
    alongside's precondition) however slowly a loaded test machine's loop delivers
    the replies. For the tests of what a lease alongside does, which must see one; when
    Redis counts as near is unit-tested (``tests/unit/test_redis_io.py``)."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisNearUnderLoad:
        if not crawler.settings.getbool("TESTPROJECT_REDIS_NEAR"):
            raise NotConfigured
        near_under_load()
        return cls()


def near_under_load() -> None:
    """Redis counts as near unless a call takes seconds (see RedisNearUnderLoad)."""
    from scrapy_redisspine import _redis_io

    _redis_io.NEAR_SECONDS = _redis_io.OVERDUE_SECONDS = 5.0


class ReportLoop:
    """Logs, as the spider closes, whether Twisted's reactor was ever imported in the
    worker: the reactorless tests read it to know a crawl really ran on a bare
    asyncio loop (Scrapy's early "Using reactor" line comes before the log file)."""

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> ReportLoop:
        extension = cls()
        crawler.signals.connect(extension.spider_closed, signal=signals.spider_closed)
        return extension

    def spider_closed(self, spider: Any, reason: str) -> None:
        import logging
        import sys

        installed = "twisted.internet.reactor" in sys.modules
        logging.getLogger("testproject").info(
            "testproject: Twisted reactor imported: %s", "yes" if installed else "no"
        )


class LoopLag:
    """With ``LINKS_REPORT_LOOP_LAG``: logs each response as it reaches the engine,
    with its wall-clock time, and, as the spider closes, the longest the crawl's loop
    went without running a 50 ms timer (what a synchronous Redis call on the loop
    costs every download and callback). The Redis-thread tests read both."""

    def __init__(self, crawler: Crawler) -> None:
        from scrapy_redisspine._clock import CrawlClock

        self._clock = CrawlClock()
        self._last = 0.0
        self.worst = 0.0
        self._running = False
        crawler.signals.connect(self.spider_opened, signal=signals.spider_opened)
        crawler.signals.connect(self.response_received, signal=signals.response_received)
        crawler.signals.connect(self.spider_closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> LoopLag:
        if not crawler.settings.getbool("LINKS_REPORT_LOOP_LAG"):
            raise NotConfigured
        return cls(crawler)

    def spider_opened(self, spider: Any) -> None:
        import time

        self._running = True
        self._last = time.monotonic()
        self._clock.callLater(0.05, self._tick)

    def _tick(self) -> None:
        import time

        now = time.monotonic()
        self.worst = max(self.worst, now - self._last - 0.05)
        self._last = now
        if self._running:
            self._clock.callLater(0.05, self._tick)

    def response_received(self, response: Any, request: Any, spider: Any) -> None:
        import logging
        import time

        logging.getLogger("testproject").info(
            "testproject: response %s received at %.3f", response.url, time.time())

    def spider_closed(self, spider: Any, reason: str) -> None:
        import logging

        self._running = False
        logging.getLogger("testproject").info("testproject: loop lag max %.3f s", self.worst)
