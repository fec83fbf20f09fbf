"""Crash recovery and fleet health: the sweep that requeues the work of dead workers.

Every worker with this extension sweeps periodically (``REDISSPINE_SWEEP_SECONDS``);
the sweep script makes concurrent sweeps safe, so no worker has to be elected. A
sweep requeues the leases of workers whose heartbeat is older than
``REDISSPINE_WORKER_TIMEOUT_SECONDS`` and leases older than
``REDISSPINE_LEASE_CEILING_SECONDS``; a request requeued more than
``REDISSPINE_MAX_REQUEUES`` times becomes a dead letter.

The heartbeat itself stays with the scheduler, which owns the leases: a worker that
runs the scheduler without this extension still keeps its leases, it just does not
sweep for others.

Each sweep also reads Redis memory: past 90 % of ``maxmemory`` (or of
``REDISSPINE_MEMORY_BUDGET_BYTES``) the scheduler stops queueing newly discovered
requests (start requests, retries and redirects still go in) until memory falls
below 80 %.

Each sweep, and once more as the worker closes, adds the growth of the worker's
numeric Scrapy stats to the crawl's ``fleet_stats`` HASH (see ``control.py``).

``FleetLog`` logs, every ``LOGSTATS_INTERVAL``, the fleet's totals beside this
worker's own, so that any one worker's log tells the whole crawl's progress.

Keys touched: workers, owned, inflight, leases, queue, dead, requeues, stats,
fleet_stats.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis
from scrapy import signals as scrapy_signals
from scrapy.exceptions import NotConfigured
from twisted.internet import task

from scrapy_redisspine import signals
from scrapy_redisspine.control import StatsPusher
from scrapy_redisspine.settings import SpineConfig, load_config

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine.scheduler import Scheduler

logger = logging.getLogger(__name__)

_HIGH_WATER = 0.9
_LOW_WATER = 0.8
_SWEEP_LIMIT = 1000


class Recovery:
    """Periodic sweep of stale leases, fleet stats and the memory watch."""

    def __init__(self, config: SpineConfig, stats: StatsCollector) -> None:
        self.config = config
        self.stats = stats
        self.scheduler: Scheduler | None = None
        self._timer: task.LoopingCall | None = None
        self._pusher: StatsPusher | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Recovery:
        config = load_config(crawler.settings)
        if config.sweep_seconds <= 0:
            raise NotConfigured("REDISSPINE_SWEEP_SECONDS is 0: this worker does not sweep")
        extension = cls(config, crawler.stats)
        crawler.signals.connect(extension.worker_opened, signal=signals.worker_opened)
        crawler.signals.connect(extension.spider_closed, signal=scrapy_signals.spider_closed)
        crawler.signals.connect(extension.worker_closing, signal=signals.worker_closing)
        return extension

    def worker_opened(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        if scheduler.frontier is not None:
            self._pusher = StatsPusher(scheduler.frontier.client, scheduler.frontier.keys)
        self._timer = task.LoopingCall(self.sweep)
        self._timer.start(self.config.sweep_seconds, now=False)

    def spider_closed(self, *_: Any, **__: Any) -> None:
        if self._timer is not None and self._timer.running:
            self._timer.stop()

    def worker_closing(self, scheduler: Scheduler) -> None:
        """Last push of this worker's stats while its connection is still open."""
        if self._pusher is None or not scheduler.health.available():
            return
        try:
            self._pusher.push(self.stats.get_stats())
        except redis.RedisError as exc:
            scheduler.health.failed("fleet_stats", exc)

    def sweep(self) -> None:
        scheduler = self.scheduler
        if scheduler is None or scheduler.frontier is None:
            return
        if not scheduler.health.available():
            return
        try:
            if self._pusher is not None:
                self._pusher.push(self.stats.get_stats())
        except redis.RedisError as exc:
            scheduler.health.failed("fleet_stats", exc)
            return
        # After an outage every heartbeat is old; give live workers one timeout to
        # beat again before taking anyone for dead.
        if scheduler.health.healthy_for() < self.config.worker_timeout_seconds:
            return
        try:
            self._sweep_leases(scheduler)
            self._read_fleet(scheduler)
            self._watch_memory(scheduler)
        except redis.RedisError as exc:
            scheduler.health.failed("sweep", exc)

    def _sweep_leases(self, scheduler: Scheduler) -> None:
        assert scheduler.frontier is not None
        result = scheduler.frontier.requeue_stale(
            timeout_ms=int(self.config.worker_timeout_seconds * 1000),
            ceiling_ms=int(self.config.lease_ceiling_seconds * 1000),
            max_requeues=self.config.max_requeues,
            limit=_SWEEP_LIMIT,
            # the dead worker may have been fetching: its lanes rest their delay
            rest_ms=int(scheduler.delays.default_seconds * 1000),
            lane_rests={lane: int(seconds * 1000)
                        for lane, seconds in scheduler.delays.overrides.items()},
        )
        if result.requeued or result.dead_lettered:
            self.stats.inc_value("redisspine/recovery/requeued", result.requeued)
            self.stats.inc_value("redisspine/recovery/dead_lettered", result.dead_lettered)
            logger.warning(
                "redisspine: requeued %d lease(s) of %d dead worker(s); %d request(s) "
                "requeued too often went to the dead letters",
                result.requeued, result.workers_removed, result.dead_lettered,
            )
            scheduler.wake()

    def _read_fleet(self, scheduler: Scheduler) -> None:
        assert scheduler.frontier is not None
        counters = scheduler.frontier.fleet_stats()
        for name, value in counters.items():
            self.stats.set_value(f"redisspine/fleet/{name}", value)
        scheduler.frontier.record_progress(
            int(self.stats.get_value("redisspine/scheduler/acked", 0)), counters.get("acked", 0)
        )
        alive = scheduler.frontier.workers_alive(int(self.config.worker_timeout_seconds * 1000))
        self.stats.set_value("redisspine/fleet/workers_alive", alive)

    def _watch_memory(self, scheduler: Scheduler) -> None:
        assert scheduler.frontier is not None
        info = scheduler.frontier.client.info("memory")
        used = int(info.get("used_memory", 0))
        limits = [int(info.get("maxmemory", 0)), self.config.memory_budget_bytes]
        limit = min((value for value in limits if value > 0), default=0)
        if not limit:
            return
        share = used / limit
        self.stats.set_value("redisspine/memory/used_share", round(share, 3))
        if not scheduler.memory_pressure and share >= _HIGH_WATER:
            scheduler.memory_pressure = True
            self.stats.set_value("redisspine/memory/over_budget", 1)
            logger.warning(
                "redisspine: Redis uses %d of %d bytes (%.0f %%): no longer queueing newly "
                "discovered requests until it falls below %.0f %%",
                used, limit, share * 100, _LOW_WATER * 100,
            )
        elif scheduler.memory_pressure and share < _LOW_WATER:
            scheduler.memory_pressure = False
            self.stats.set_value("redisspine/memory/over_budget", 0)
            logger.info("redisspine: Redis memory back to %.0f %%: queueing again", share * 100)


class FleetLog:
    """Every ``LOGSTATS_INTERVAL``: the fleet's queued, in flight and live workers,
    beside this worker's own pages and items (one extra round trip per interval)."""

    def __init__(self, config: SpineConfig, stats: StatsCollector, interval: float) -> None:
        self.config = config
        self.stats = stats
        self.interval = interval
        self.scheduler: Scheduler | None = None
        self._timer: task.LoopingCall | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetLog:
        interval = crawler.settings.getfloat("LOGSTATS_INTERVAL")
        if interval <= 0:
            raise NotConfigured("LOGSTATS_INTERVAL is 0")
        extension = cls(load_config(crawler.settings), crawler.stats, interval)
        crawler.signals.connect(extension.worker_opened, signal=signals.worker_opened)
        crawler.signals.connect(extension.worker_closing, signal=signals.worker_closing)
        return extension

    def worker_opened(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._timer = task.LoopingCall(self.log)
        self._timer.start(self.interval, now=False)

    def worker_closing(self, *_: Any, **__: Any) -> None:
        if self._timer is not None and self._timer.running:
            self._timer.stop()

    def log(self) -> None:
        scheduler = self.scheduler
        if scheduler is None or scheduler.frontier is None or not scheduler.health.available():
            return
        try:
            queued, inflight = scheduler.frontier.counts()
            alive = scheduler.frontier.workers_alive(
                int(self.config.worker_timeout_seconds * 1000)
            )
        except redis.RedisError as exc:
            scheduler.health.failed("fleet_log", exc)
            return
        logger.info(
            "redisspine fleet: %d queued, %d in flight, %d worker(s); this worker: "
            "%d page(s), %d item(s)", queued, inflight, alive,
            self.stats.get_value("response_received_count", 0),
            self.stats.get_value("item_scraped_count", 0),
        )
