"""Fleet-wide duplicate filter: one record of seen fingerprints in Redis.

With this package's scheduler the seen-check does not happen here: the scheduler
sends each request's fingerprint with it, and the enqueue script decides with SADD in
the same atomic step that queues the request, so K workers discovering one URL at
once enqueue it once. Used with another scheduler, ``request_seen`` does the SADD
itself (still atomic, one round trip per request).

Keys touched: ``seen`` (SET of raw 20-byte fingerprints).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.request import referer_str

from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.settings import SpineConfig, load_config
from scrapy_redisspine.worker import WorkerConnection, new_worker_id

if TYPE_CHECKING:
    import redis
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol

    from scrapy_redisspine.frontier import Frontier

logger = logging.getLogger(__name__)


class RedisDupeFilter(BaseDupeFilter):
    """Shares the crawl's ``seen`` SET with every worker."""

    def __init__(
        self,
        fingerprinter: RequestFingerprinterProtocol,
        config: SpineConfig,
        stats: StatsCollector | None = None,
        debug: bool = False,
        crawler: Crawler | None = None,
    ) -> None:
        self.fingerprinter = fingerprinter
        self.config = config
        self.stats = stats
        self.debug = debug
        self.crawler = crawler
        self.logdupes = True
        self._client: redis.Redis | None = None
        self._seen_key: str | None = None
        self._own_connection: WorkerConnection | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisDupeFilter:
        return cls(
            crawler.request_fingerprinter,
            load_config(crawler.settings),
            stats=crawler.stats,
            debug=crawler.settings.getbool("DUPEFILTER_DEBUG"),
            crawler=crawler,
        )

    def bind(self, frontier: Frontier) -> None:
        """Share the scheduler's connection and crawl keys."""
        self._client = frontier.client
        self._seen_key = frontier.keys.seen

    def open(self) -> None:
        if self._client is not None:
            return
        spider = self.crawler.spider if self.crawler is not None else None
        crawl_id = self.config.crawl_id or (spider.name if spider is not None else None)
        if not crawl_id:
            raise RuntimeError("RedisDupeFilter needs REDISSPINE_CRAWL_ID or a spider name")
        self._own_connection = WorkerConnection.open(self.config, crawl_id, new_worker_id())
        self._client = self._own_connection.client
        self._seen_key = CrawlKeys(self.config.key_prefix, crawl_id).seen

    def close(self, reason: str) -> None:
        if self._own_connection is not None:
            self._own_connection.close()
            self._own_connection = None

    def fingerprint(self, request: Request) -> bytes:
        return bytes(self.fingerprinter.fingerprint(request))

    def request_seen(self, request: Request) -> bool:
        if self._client is None or self._seen_key is None:
            raise RuntimeError("RedisDupeFilter.request_seen() called before open()")
        return self._client.sadd(self._seen_key, self.fingerprint(request)) == 0

    def log(self, request: Request, spider: Spider | None) -> None:
        if self.debug:
            logger.debug(
                "Filtered duplicate request: %(request)s (referer: %(referer)s)",
                {"request": request, "referer": referer_str(request)},
                extra={"spider": spider},
            )
        elif self.logdupes:
            logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
                extra={"spider": spider},
            )
            self.logdupes = False
        if self.stats is not None:
            self.stats.inc_value("dupefilter/filtered")
