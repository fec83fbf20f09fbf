"""Fleet-wide crawl limits: Scrapy's CLOSESPIDER_* settings count for the whole crawl.

With the add-on on (and ``REDISSPINE_CLOSESPIDER_PER_PROCESS`` off), Scrapy's own
``CLOSESPIDER_PAGECOUNT``, ``CLOSESPIDER_ITEMCOUNT``, ``CLOSESPIDER_ERRORCOUNT`` and
``CLOSESPIDER_TIMEOUT`` count fleet-wide, and every worker closes with Scrapy's own
reason (``closespider_pagecount`` ...) when the fleet reaches one:

- pages: the lease script leases at most what is left of the budget (the crawl's
  ``leased`` counter: every fetch), so the fleet fetches at most the budget, plus the
  requests that are fetched again after their worker died (each counts again, as
  each is another response to Scrapy);
- items and spider errors: each worker adds what it counted (Scrapy's
  ``item_scraped`` and ``spider_error`` signals, as Scrapy's ``CloseSpider`` counts)
  every ``REDISSPINE_LIMITS_CHECK_SECONDS`` (``scripts/count_limits.lua``);
- the timeout runs from the crawl's first start (its record's ``created_ms``).

The limit reached becomes the fleet's close order in the ``control`` HASH: every lease
is refused from then on, each worker learns it at its next lease or heartbeat, stops
starting the requests it leased (they go back to the queue at close), finishes what
is in progress and closes with that reason. So the overshoot is at most what each
worker had in progress, about one lease batch. Scrapy's own ``CloseSpider``
extension stays on: its per-process counts never exceed the fleet's, so it never
closes a worker before the fleet's limit would.

Keys touched: stats, control, record (through the worker's ``FrontierUpkeep``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals as scrapy_signals
from scrapy.exceptions import NotConfigured

from scrapy_redisspine import signals
from scrapy_redisspine._clock import Clock, CrawlClock, Periodic
from scrapy_redisspine._components import component_config
from scrapy_redisspine._redis_io import InlineIO, reported

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine.settings import SpineConfig

logger = logging.getLogger(__name__)


class FleetLimits:
    """Counts this worker's items and spider errors and checks the fleet's item, error
    and time limits periodically (the page budget needs no extension: lease.lua)."""

    def __init__(self, config: SpineConfig, stats: StatsCollector,
                 clock: Clock | None = None) -> None:
        self.config = config
        self.stats = stats
        self.clock: Clock = clock or CrawlClock()
        self.worker: signals.WorkerView | None = None
        self.items = 0  # counted here, not yet added to the fleet's counts
        self.errors = 0
        self._checking = False  # a check on its way (a slow Redis): the next tick skips
        self._timer = Periodic("limits", self.check, config.limits_check_seconds, self.clock,
                               stats)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetLimits:
        config = component_config(crawler)
        if config.closespider_per_process:
            raise NotConfigured  # REDISSPINE_CLOSESPIDER_PER_PROCESS: Scrapy's own limits
        if not (config.closespider_itemcount or config.closespider_errorcount
                or config.closespider_timeout):
            raise NotConfigured  # no fleet-wide item, error or time limit
        extension = cls(config, crawler.stats)
        connect = crawler.signals.connect
        connect(extension.worker_opened, signal=signals.worker_opened)
        connect(extension.item_scraped, signal=scrapy_signals.item_scraped)
        connect(extension.spider_error, signal=scrapy_signals.spider_error)
        connect(extension.spider_closed, signal=scrapy_signals.spider_closed)
        return extension

    def worker_opened(self, worker: signals.WorkerView) -> None:
        self.worker = worker
        self._timer.start()

    def item_scraped(self, *_: Any, **__: Any) -> None:
        self.items += 1

    def spider_error(self, *_: Any, **__: Any) -> None:
        self.errors += 1

    def spider_closed(self, *_: Any, **__: Any) -> None:
        self._timer.stop()

    @property
    def running(self) -> bool:
        return self._timer.running

    def check(self) -> None:
        """Add the counts, learn whether the fleet reached a limit; a failed call keeps
        the counts for the next one."""
        worker = self.worker
        if (worker is None or worker.guard.crawl_gone or self._checking
                or not worker.guard.available("limits")):
            return
        items, errors = self.items, self.errors
        config, upkeep = self.config, worker.upkeep

        def counted(reason: str | None) -> None:
            self._checking = False
            worker.guard.succeeded("limits")
            self.items -= items
            self.errors -= errors
            if reason and worker.close_ordered is not None:
                self._timer.stop()
                worker.close_ordered(reason)

        self._checking = True
        (worker.io or InlineIO(self.stats)).submit("limits", lambda: upkeep.count_limits(
            items, errors, item_limit=config.closespider_itemcount,
            error_limit=config.closespider_errorcount,
            timeout_ms=int(config.closespider_timeout * 1000),
        ), counted, reported(worker.guard, "limits", lambda: setattr(self, "_checking", False)))
