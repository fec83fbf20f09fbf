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
below 80 %; and a server that may evict the crawl's keys (an ``allkeys-*``
``maxmemory-policy``, set since the worker joined) stops the worker (the guard's
``on_evicting``) rather than let the crawl lose work without a word.

The growth of the worker's Scrapy stats goes to the crawl's ``fleet_stats`` HASH
from an extension of its own (``fleet_totals.FleetTotals``), so that it does not
depend on the sweep.

``FleetLog`` logs, every ``LOGSTATS_INTERVAL``, the fleet's totals beside this
worker's own, so that any one worker's log tells the whole crawl's progress.

Both talk to the worker through the ``signals.WorkerView`` sent with
``worker_opened``, never through the scheduler.

Keys touched: workers, owned, inflight, leases, queue, dead, requeues, stats,
progress.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import signals as scrapy_signals
from scrapy.exceptions import NotConfigured

from scrapy_redisspine import signals
from scrapy_redisspine._clock import Clock, CrawlClock, Periodic
from scrapy_redisspine._components import component_config
from scrapy_redisspine._guard import CALL_ERRORS
from scrapy_redisspine._redis_io import InlineIO, reported

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._frontier_upkeep import MemoryReading
    from scrapy_redisspine.settings import SpineConfig

logger = logging.getLogger(__name__)

#: One part of a sweep: its Redis calls (run off the crawl's loop) and what handles
#: their reply (on the loop).
Step = tuple["Callable[[], Any]", "Callable[[Any], object]"]

_SWEEP_LIMIT = 1000
_UNINDEXED_STEP = 200  # in-flight entries looked at per sweep (HSCAN COUNT)
#: Another crawl of the politeness group is swept only for workers silent this many
#: times this worker's own REDISSPINE_WORKER_TIMEOUT_SECONDS: that crawl's workers may
#: heartbeat more slowly, and its own live workers sweep it first.
OTHER_CRAWL_TIMEOUT_FACTOR = 3
#: Other crawls of the group looked at per sweep (a random few, if there are more).
_OTHER_CRAWLS_PER_SWEEP = 20


class Recovery:
    """Periodic sweep of stale leases, the fleet's counters and the memory watch."""

    def __init__(
        self, config: SpineConfig, stats: StatsCollector, clock: Clock | None = None
    ) -> None:
        self.config = config
        self.stats = stats
        self.clock: Clock = clock or CrawlClock()
        self.worker: signals.WorkerView | None = None
        self._timer = Periodic("sweep", self.sweep, config.sweep_seconds, self.clock, stats)
        self._bad_counters: set[str] = set()
        self._unindexed_cursor = "0"
        self._sweeping = False  # a sweep on its way (a slow Redis): the next tick skips

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Recovery:
        config = component_config(crawler)
        if config.sweep_seconds <= 0:
            raise NotConfigured("REDISSPINE_SWEEP_SECONDS is 0: this worker does not sweep")
        extension = cls(config, crawler.stats)
        crawler.signals.connect(extension.worker_opened, signal=signals.worker_opened)
        crawler.signals.connect(extension.spider_closed, signal=scrapy_signals.spider_closed)
        return extension

    def worker_opened(self, worker: signals.WorkerView) -> None:
        self.worker = worker
        self._timer.start()

    @property
    def running(self) -> bool:
        """Whether the sweep timer runs."""
        return self._timer.running

    def spider_closed(self, *_: Any, **__: Any) -> None:
        self._timer.stop()

    def sweep(self) -> None:
        """Recovery first: nothing else a sweep does (reading the fleet's counters,
        the memory watch) can hold it back, and each part fails on its own.

        Its Redis calls run as one job through the worker's ``io`` (off the crawl's
        loop); each part's reply is handled back on the loop."""
        worker = self.worker
        if worker is None or worker.guard.crawl_gone or self._sweeping:
            return  # a crawl that is gone is not swept: any write would start it afresh
        steps: list[tuple[str, Step]] = []
        # After an outage every heartbeat is old; give live workers one timeout to
        # beat again before taking anyone for dead.
        if worker.guard.available("sweep") and (
            worker.guard.healthy_for() >= self.config.worker_timeout_seconds
        ):
            steps.append(("sweep", self._sweep_leases(worker)))
            steps.append(("group_sweep", self._sweep_group(worker)))
            steps.append(("unindexed", self._repair_unindexed(worker)))
        steps.append(("fleet_read", self._read_fleet(worker)))
        steps.append(("memory", self._watch_memory(worker)))
        steps = [step for step in steps if worker.guard.available(step[0])]
        if not steps:
            return

        def call() -> list[Any]:
            replies: list[Any] = []
            for _, (redis_part, _handle) in steps:
                try:
                    replies.append(redis_part())
                except CALL_ERRORS as exc:  # each part fails on its own
                    replies.append(exc)
            return replies

        def done(replies: list[Any]) -> None:
            self._sweeping = False
            for (operation, (_, handle)), reply in zip(steps, replies, strict=True):
                if isinstance(reply, Exception):
                    worker.guard.failed(operation, reply)
                    continue
                if handle(reply) is not False:  # False: it reported a failure itself
                    worker.guard.succeeded(operation)

        def failed(exc: Exception) -> None:
            self._sweeping = False
            raise exc

        self._sweeping = True
        (worker.io or InlineIO(self.stats)).submit("sweep", call, done, failed)

    def _rests(self, worker: signals.WorkerView) -> dict[str, Any]:
        """How long a requeued request's lane rests: the dead worker may have been
        fetching from it."""
        delays = worker.hosts.delays
        return {
            "rest_ms": int(delays.default_seconds * 1000),
            "lane_rests": {lane: int(seconds * 1000)
                           for lane, seconds in delays.overrides.items()},
        }

    def _sweep_leases(self, worker: signals.WorkerView) -> Step:
        rests = self._rests(worker)
        return lambda: worker.upkeep.requeue_stale(
            timeout_ms=self.config.worker_timeout_ms,
            ceiling_ms=self.config.lease_ceiling_ms,
            max_requeues=self.config.max_requeues,
            limit=_SWEEP_LIMIT,
            as_worker=True,
            **rests,
        ), lambda result: self._swept_leases(worker, result)

    def _swept_leases(self, worker: signals.WorkerView, result: Any) -> None:
        worker.guard.repaired("sweep", result.repairs)
        if result.requeued or result.dead_lettered:
            self.stats.inc_value("redisspine/recovery/requeued", result.requeued)
            self.stats.inc_value("redisspine/recovery/dead_lettered", result.dead_lettered)
            logger.warning(
                "redisspine: requeued %d lease(s) of %d dead worker(s); %d request(s) "
                "requeued too often went to the dead letters",
                result.requeued, result.workers_removed, result.dead_lettered,
            )
            worker.wake()

    def _sweep_group(self, worker: signals.WorkerView) -> Step:
        """Sweep the other crawls of the politeness group for workers long dead.

        Their leases hold the group's lane slots, which this crawl's lanes share: a
        crawl whose workers all died would keep them until one of its own workers
        started again, and every other crawl of the group would wait on those lanes.
        The leases go back to their own crawl's queue, as its own sweep would put
        them; that crawl's epoch is checked, so a purged crawl is left alone."""
        rests = self._rests(worker)

        def redis_part() -> list[tuple[str, Any]]:
            results = []
            for crawl_id in worker.upkeep.group_crawls(_OTHER_CRAWLS_PER_SWEEP):
                other = worker.upkeep.of_crawl(crawl_id)
                if other is None:
                    continue
                results.append((crawl_id, other.requeue_stale(
                    timeout_ms=OTHER_CRAWL_TIMEOUT_FACTOR * self.config.worker_timeout_ms,
                    ceiling_ms=0,  # that crawl's own ceiling is its workers' business
                    max_requeues=self.config.max_requeues,
                    limit=_SWEEP_LIMIT,
                    **rests,
                )))
            return results

        return redis_part, lambda results: self._swept_group(worker, results)

    def _swept_group(self, worker: signals.WorkerView, results: list[tuple[str, Any]]) -> None:
        for crawl_id, result in results:
            worker.guard.repaired("group_sweep", result.repairs)
            if result.requeued or result.dead_lettered:
                self.stats.inc_value("redisspine/recovery/group_requeued", result.requeued)
                self.stats.inc_value("redisspine/recovery/group_dead_lettered",
                                     result.dead_lettered)
                logger.warning(
                    "redisspine: crawl %r of politeness group %r had %d dead worker(s) "
                    "holding the group's lane slots: requeued %d lease(s) into its queue "
                    "(%d to its dead letters)", crawl_id, worker.upkeep.keys.group,
                    result.workers_removed, result.requeued, result.dead_lettered,
                )
                worker.wake()

    def _repair_unindexed(self, worker: signals.WorkerView) -> Step:
        """One bounded step through the in-flight entries that no index points to
        (no sweep finds those; left alone, they keep the crawl from finishing)."""
        cursor, rests = self._unindexed_cursor, self._rests(worker)
        return lambda: worker.upkeep.repair_unindexed(
            cursor, _UNINDEXED_STEP, timeout_ms=self.config.worker_timeout_ms,
            max_requeues=self.config.max_requeues, **rests,
        ), lambda result: self._repaired_unindexed(worker, result)

    def _repaired_unindexed(self, worker: signals.WorkerView, result: Any) -> None:
        self._unindexed_cursor = result.cursor
        worker.guard.repaired("unindexed", result.repairs)
        fixed = result.requeued + result.dead_lettered + result.reindexed + result.removed
        if fixed:
            self.stats.inc_value("redisspine/recovery/unindexed", fixed)
            logger.warning(
                "redisspine: in-flight entries no index pointed to: %d requeued, %d "
                "dead-lettered, %d indexed again (their worker is alive); %d stale index "
                "entries removed", result.requeued, result.dead_lettered, result.reindexed,
                result.removed,
            )
            if result.requeued:
                worker.wake()

    def _read_fleet(self, worker: signals.WorkerView) -> Step:
        acked = int(self.stats.get_value("redisspine/scheduler/acked", 0))
        upkeep, timeout_ms = worker.upkeep, self.config.worker_timeout_ms

        def redis_part() -> tuple[Any, list[str], int, Exception | None]:
            counters, bad = upkeep.read_fleet_stats()
            alive = upkeep.workers_alive(timeout_ms)
            # last: the one write here, which a full Redis refuses (the reads stand)
            try:
                upkeep.record_progress(acked, counters.get("acked", 0))
            except CALL_ERRORS as exc:
                return counters, bad, alive, exc
            return counters, bad, alive, None

        return redis_part, lambda reply: self._fleet_read(worker, *reply)

    def _fleet_read(
        self, worker: signals.WorkerView, counters: Any, bad: list[str], alive: int,
        progress_failed: Exception | None,
    ) -> bool:
        for name in bad:
            if name not in self._bad_counters:
                self._bad_counters.add(name)
                self.stats.inc_value("redisspine/fleet/bad_counters")
                logger.warning("redisspine: counter %r of %s holds no integer: skipped",
                               name, worker.upkeep.keys.stats)
        for name, value in counters.items():
            self.stats.set_value(f"redisspine/fleet/{name}", value)
        self.stats.set_value("redisspine/fleet/workers_alive", alive)
        if progress_failed is not None:
            worker.guard.failed("fleet_read", progress_failed)
            return False
        return True

    def _watch_memory(self, worker: signals.WorkerView) -> Step:
        return worker.upkeep.memory, lambda reading: self._memory_read(worker, reading)

    def _memory_read(self, worker: signals.WorkerView, reading: MemoryReading) -> None:
        limits = [reading.maxmemory, self.config.memory_budget_bytes]
        worker.guard.observe_memory(reading.used,
                                    min((value for value in limits if value > 0), default=0),
                                    reading.evicting)


class FleetLog:
    """Every ``LOGSTATS_INTERVAL``: the fleet's queued, in flight and live workers,
    beside this worker's own pages and items (one extra round trip per interval)."""

    def __init__(
        self, config: SpineConfig, stats: StatsCollector, interval: float,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.stats = stats
        self.interval = interval
        self.worker: signals.WorkerView | None = None
        self._reading = False  # a read on its way (a slow Redis): the next tick skips
        self._timer = Periodic("fleet log", self.log, interval, clock or CrawlClock(), stats)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetLog:
        interval = crawler.settings.getfloat("LOGSTATS_INTERVAL")
        if interval <= 0:
            raise NotConfigured  # LOGSTATS_INTERVAL is 0, as Scrapy's LogStats
        extension = cls(component_config(crawler), crawler.stats, interval)
        crawler.signals.connect(extension.worker_opened, signal=signals.worker_opened)
        crawler.signals.connect(extension.worker_closing, signal=signals.worker_closing)
        return extension

    def worker_opened(self, worker: signals.WorkerView) -> None:
        self.worker = worker
        self._timer.start()

    def worker_closing(self, *_: Any, **__: Any) -> None:
        self._timer.stop()

    def log(self) -> None:
        worker = self.worker
        if (worker is None or worker.guard.crawl_gone or self._reading
                or not worker.guard.available()):
            return
        upkeep, timeout_ms = worker.upkeep, self.config.worker_timeout_ms

        self._reading = True
        (worker.io or InlineIO(self.stats)).submit(
            "fleet log", lambda: (*upkeep.counts(), upkeep.workers_alive(timeout_ms)),
            lambda reply: self._said(*reply),
            reported(worker.guard, "fleet_log", lambda: setattr(self, "_reading", False)))

    def _said(self, queued: int, inflight: int, alive: int) -> None:
        self._reading = False
        logger.info(
            "redisspine fleet: %d queued, %d in flight, %d worker(s); this worker: "
            "%d page(s), %d item(s)", queued, inflight, alive,
            self.stats.get_value("response_received_count", 0),
            self.stats.get_value("item_scraped_count", 0),
        )
