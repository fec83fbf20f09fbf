"""Fleet totals: each worker adds the growth of its Scrapy stats to the crawl's sums.

Pushed every ``LOGSTATS_INTERVAL`` or every ``REDISSPINE_SWEEP_SECONDS``, whichever
is shorter (so the totals ``redisspine status`` shows lag the crawl by one interval
at most, and a worker killed with SIGKILL loses at most one interval of them), and
once more as the worker closes. It is an extension of its own, not a part of the
sweep: a worker that does not sweep (``REDISSPINE_SWEEP_SECONDS = 0``) still counts.

Each push also keeps the worker's own running totals (pages, items, errors, acks)
in ``worker_stats``, at Redis time, marked ``closed`` by the last push at close: a
worker that died keeps its last pushed totals there, and ``status`` says so.

Keys touched (through ``StatsPusher``): fleet_stats, worker_stats, record.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals as scrapy_signals

from scrapy_redisspine import signals
from scrapy_redisspine._clock import Clock, CrawlClock, Periodic
from scrapy_redisspine._components import component_config
from scrapy_redisspine._redis_io import InlineIO, reported
from scrapy_redisspine.control import StatsPusher

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

#: The interval when neither LOGSTATS_INTERVAL nor the sweep gives one (both 0).
FALLBACK_INTERVAL_SECONDS = 60.0


def push_interval(logstats_interval: float, sweep_seconds: float) -> float:
    """The shorter of the two that are switched on (> 0)."""
    intervals = [value for value in (logstats_interval, sweep_seconds) if value > 0]
    return min(intervals, default=FALLBACK_INTERVAL_SECONDS)


class FleetTotals:
    """Owns the worker's one :class:`StatsPusher` (two pushers would count twice)."""

    def __init__(
        self, stats: StatsCollector, interval: float, clock: Clock | None = None
    ) -> None:
        self.stats = stats
        self.interval = interval
        self.worker: signals.WorkerView | None = None
        self._pusher: StatsPusher | None = None
        self._pushing = False  # a push on its way (a slow Redis): the next tick skips
        self._skips: list[str] = []  # fields a push skipped, to count on the loop
        self._timer = Periodic("fleet totals", self.push, interval, clock or CrawlClock(),
                               stats)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetTotals:
        config = component_config(crawler)
        interval = push_interval(crawler.settings.getfloat("LOGSTATS_INTERVAL"),
                                 config.sweep_seconds)
        extension = cls(crawler.stats, interval)
        crawler.signals.connect(extension.worker_opened, signal=signals.worker_opened)
        crawler.signals.connect(extension.spider_closed, signal=scrapy_signals.spider_closed)
        crawler.signals.connect(extension.worker_closing, signal=signals.worker_closing)
        return extension

    def worker_opened(self, worker: signals.WorkerView) -> None:
        self.worker = worker
        self._pusher = StatsPusher(
            worker.upkeep.client, worker.upkeep.keys,
            on_skip=self._skips.append,  # (io's thread: counted back on the loop)
            epoch=worker.upkeep.epoch, worker_id=worker.worker_id,
        )
        self._timer.start()

    @property
    def running(self) -> bool:
        return self._timer.running

    def spider_closed(self, *_: Any, **__: Any) -> None:
        self._timer.stop()

    def worker_closing(self, worker: signals.WorkerView) -> None:
        """Last push while the worker's connection is still open: its totals are
        final (``closed``)."""
        self._timer.stop()
        self.push(final=True)

    def push(self, final: bool = False) -> None:
        """Push the growth of this worker's stats through the worker's ``io`` (the
        pusher's own state is touched by its pushes only, one after the other); the
        final one is never skipped, it follows one on its way."""
        worker, pusher = self.worker, self._pusher
        if worker is None or pusher is None or worker.guard.crawl_gone:
            return  # a crawl that is gone gets no write: it would start afresh
        if (self._pushing and not final) or not worker.guard.available("fleet_stats"):
            return
        snapshot = dict(self.stats.get_stats())

        def pushed(_: object) -> None:
            self._pushing = False
            while self._skips:
                self._skips.pop()
                self.stats.inc_value("redisspine/fleet_stats/skipped")
            worker.guard.succeeded("fleet_stats")

        self._pushing = True
        (worker.io or InlineIO(self.stats)).submit(
            "fleet totals", lambda: pusher.push(snapshot, final=final), pushed,
            reported(worker.guard, "fleet_stats", lambda: setattr(self, "_pushing", False)))
