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
