"""Fleet-wide duplicate filter: one record of seen fingerprints in Redis.

With this package's scheduler the seen-check does not happen here: the scheduler
sends each request's fingerprint with it, and the enqueue script decides (through
``scripts/lib/dedup.lua``) in the same atomic step that queues the request, so K
workers discovering one URL at once enqueue it once. Used with another scheduler,
``request_seen`` runs the same Lua library itself (one round trip per request).

The record starts as an exact SET and switches to a Bloom filter when it grows
past ``REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS`` (see ``dedup.py``). This filter keeps
that switch moving: while it is open, a timer on the reactor checks the SET every
``REDISSPINE_DEDUP_CHECK_SECONDS`` and, during a switch, moves it into the filter in
chunks of a few milliseconds each, leaving the reactor in between.

Keys touched: ``seen`` (SET), ``dedup`` (HASH), ``bloom`` (Bloom filter).
"""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING

import redis
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.misc import build_from_crawler, load_object
from scrapy.utils.request import referer_str

from scrapy_redisspine._clock import Clock, CrawlClock, DelayedCall
from scrapy_redisspine.dedup import IMPL_BITMAP, MODE_SET, Dedup, DedupParams, MaintenanceStep
from scrapy_redisspine.fingerprints import same_fingerprinter
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.placement import locate
from scrapy_redisspine.settings import SpineConfig, load_config
from scrapy_redisspine.tracking import TrackingParams, canonical_url, tracking_params
from scrapy_redisspine.worker import WorkerConnection, new_worker_id

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol

    from scrapy_redisspine._redis_io import RedisIO
    from scrapy_redisspine.sharded import AnyFrontier

logger = logging.getLogger(__name__)

FINGERPRINT_BYTES = 20  # Scrapy's (SHA1); other lengths are hashed down to it
#: Longest a maintenance tick holds the reactor while it migrates the SET.
MIGRATION_BUDGET_SECONDS = 0.02
#: Pause between migration ticks, so the worker keeps crawling meanwhile.
MIGRATION_PAUSE_SECONDS = 0.02


def fingerprint_request(
    fingerprinter: RequestFingerprinterProtocol,
    request: Request,
    tracking: TrackingParams | None = None,
) -> bytes:
    """The fingerprint every path into the frontier uses (workers and pushes alike)."""
    if tracking is not None:
        url = canonical_url(request.url, tracking)
        if url != request.url:
            request = request.replace(url=url)
    fingerprint = bytes(fingerprinter.fingerprint(request))
    if len(fingerprint) != FINGERPRINT_BYTES:
        # A custom fingerprinter: keep the record compact and its bytes uniform
        # (the Bloom filter's bit positions come straight from them).
        fingerprint = hashlib.sha1(fingerprint).digest()
    return fingerprint


class RedisDupeFilter(BaseDupeFilter):
    """Shares the crawl's dedup record (SET, then Bloom filter) with every worker.

    ``clock`` (the crawl's loop under Scrapy, :class:`CrawlClock`) runs the
    maintenance timer; without one, call :meth:`maintain` yourself.
    """

    def __init__(
        self,
        fingerprinter: RequestFingerprinterProtocol,
        config: SpineConfig,
        *,
        stats: StatsCollector | None = None,
        debug: bool = False,
        crawler: Crawler | None = None,
        clock: Clock | None = None,
    ) -> None:
        #: Scrapy's fingerprints, short-cut for plain URLs (``fingerprints.py``).
        self.fingerprinter = same_fingerprinter(fingerprinter)
        self.config = config
        self.stats = stats
        self.debug = debug
        self.crawler = crawler
        self.clock = clock
        self.logdupes = True
        self.dedup: Dedup | None = None  # the one maintained next (of ``dedups``)
        #: One per shard of the crawl (REDISSPINE_SHARDS): a URL's dedup lives in its
        #: lane's shard; maintenance takes them in turn.
        self.dedups: list[Dedup] = []
        self._tracking = (
            tracking_params(config.dedup_extra_tracking_params)
            if config.dedup_strip_tracking_params else None
        )
        self._client: redis.Redis | None = None
        self._keys: CrawlKeys | None = None
        self._views: list[CrawlKeys] = []  # each shard's keys, once bound
        self._own_connection: WorkerConnection | None = None
        self._timer: DelayedCall | None = None
        self._io: RedisIO | None = None  # the scheduler's, once bound
        self._warned_full = False
        self._failing = False

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> RedisDupeFilter:
        return cls(
            crawler.request_fingerprinter,
            load_config(crawler.settings),
            stats=crawler.stats,
            debug=crawler.settings.getbool("DUPEFILTER_DEBUG"),
            crawler=crawler,
            clock=CrawlClock(),
        )

    def bind(self, frontier: AnyFrontier, io: RedisIO | None = None) -> None:
        """Share the scheduler's connection and crawl keys, and where its Redis calls
        run (``io``: the maintenance steps then run off the crawl's loop)."""
        self._client = frontier.client
        self._keys = frontier.keys
        self._io = io
        self._views = (list(frontier.keys.shard_views()) if frontier.keys.shards > 1
                       else [frontier.keys])

    # -- lifecycle -------------------------------------------------------------------

    def open(self) -> None:
        if self._client is None or self._keys is None:
            spider = self.crawler.spider if self.crawler is not None else None
            crawl_id = self.config.crawl_id or (spider.name if spider is not None else None)
            if not crawl_id:
                raise RuntimeError("RedisDupeFilter needs REDISSPINE_CRAWL_ID or a spider name")
            self._own_connection = WorkerConnection.open(self.config, crawl_id, new_worker_id())
            self._client = self._own_connection.client
            self._keys = locate(self._client, CrawlKeys(
                self.config.key_prefix, crawl_id, self.config.politeness_group), claim=True)
        params = DedupParams.from_config(self.config)
        self.dedups = [Dedup(self._client, view, params) for view in self._views or [self._keys]]
        self.dedup = self.dedups[0]
        for dedup in self.dedups:
            state = dedup.open()
            if state.mode != MODE_SET:
                logger.info(
                    "redisspine: dedup record %s of crawl %r is a %s Bloom filter (%s)",
                    dedup.keys.dedup, self._keys.crawl_id, state.impl, state.mode,
                )
        if self.clock is not None:
            self._timer = self.clock.callLater(0, self._tick)

    def close(self, reason: str) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        if self._own_connection is not None:
            self._own_connection.close()
            self._own_connection = None

    # -- fingerprints ----------------------------------------------------------------

    def fingerprint(self, request: Request) -> bytes:
        """Scrapy's fingerprint of the request (of its cleaned URL with the tracking
        option), as 20 raw bytes."""
        return fingerprint_request(self.fingerprinter, request, self._tracking)

    def request_seen(self, request: Request) -> bool:
        if self.dedup is None:
            raise RuntimeError("RedisDupeFilter.request_seen() called before open()")
        if len(self.dedups) > 1:
            raise RuntimeError("RedisDupeFilter.request_seen() cannot check a sharded "
                               "crawl (a URL's record is in its lane's shard): the "
                               "scheduler checks in its enqueue")
        return not self.dedup.add([self.fingerprint(request)])[0]

    # -- the SET-to-Bloom switch ----------------------------------------------------------

    def maintain(self) -> MaintenanceStep | None:
        """One maintenance step (switch if due, migrate a little); None on a Redis error."""
        assert self.dedup is not None
        try:
            step = self.dedup.maintain(MIGRATION_BUDGET_SECONDS)
        except redis.RedisError as exc:
            self._maintenance_failed(exc)
            return None
        return self._maintained(step)

    def _maintained(self, step: MaintenanceStep) -> MaintenanceStep | None:
        try:
            if step.mode != MODE_SET and not self._warned_full:
                self._warn_if_full()
        except redis.RedisError as exc:
            self._maintenance_failed(exc)
            return None
        self._failing = False
        self._report(step)
        return step

    def _maintenance_failed(self, exc: redis.RedisError) -> None:
        if not self._failing:
            logger.warning("redisspine: dedup maintenance failed (%s); will retry", exc)
        self._failing = True
        self._inc("redisspine/redis_errors/dedup")

    def _tick(self) -> None:
        io = self._io
        if io is None or not io.background:
            self._next_tick(self.maintain())
            return
        dedup = self.dedup
        assert dedup is not None

        def failed(exc: Exception) -> None:
            if not isinstance(exc, redis.RedisError):
                self._next_tick(None)
                raise exc
            self._maintenance_failed(exc)
            self._next_tick(None)

        # the step's Redis calls off the loop (one step at a time: the next tick is
        # scheduled once it is done); what it found is handled back on the loop
        io.submit("dedup", lambda: dedup.maintain(MIGRATION_BUDGET_SECONDS),
                  lambda step: self._next_tick(self._maintained(step)), failed)

    def _next_tick(self, step: MaintenanceStep | None) -> None:
        more = step is not None and step.more
        if not more and len(self.dedups) > 1 and self.dedup is not None:
            # the next shard's record (a migration is finished before moving on)
            turn = (self.dedups.index(self.dedup) + 1) % len(self.dedups)
            self.dedup = self.dedups[turn]
        delay = MIGRATION_PAUSE_SECONDS if more else self.config.dedup_check_seconds
        if self.clock is not None and self._timer is not None:
            self._timer = self.clock.callLater(delay, self._tick)

    def _report(self, step: MaintenanceStep) -> None:
        assert self._keys is not None
        assert self.dedup is not None
        if step.switched:
            logger.info(
                "redisspine: dedup SET %s passed %d fingerprints: switching crawl %r to a "
                "%s Bloom filter (capacity %d, error rate %g) without stopping",
                self.dedup.keys.seen, self.config.dedup_set_max_fingerprints,
                self._keys.crawl_id,
                self.dedup.impl, self.config.bloom_capacity, self.config.bloom_error_rate,
            )
            self._inc("redisspine/dedup/switched")
        if step.moved:
            self._inc("redisspine/dedup/migrated", step.moved)
        if step.finished:
            logger.info("redisspine: dedup switch done: the SET is gone, %s holds the "
                        "record", self.dedup.keys.bloom)

    def _warn_if_full(self) -> None:
        assert self.dedup is not None
        state = self.dedup.state()
        if state.impl != IMPL_BITMAP:
            self._warned_full = True  # only a bitmap fills up: nothing to check again
            return
        if state.full:
            self._warned_full = True
            logger.warning(
                "redisspine: the dedup Bloom filter %s is full (%d fingerprints, its largest "
                "size): its false-positive rate now climbs. Start a new crawl with a larger "
                "REDISSPINE_BLOOM_CAPACITY.", self.dedup.keys.bloom, state.filter_count,
            )

    def _inc(self, name: str, count: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(name, count)

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


def fleet_dupefilter(crawler: Crawler) -> BaseDupeFilter:
    """The project's DUPEFILTER_CLASS for the scheduler; Scrapy's default in-memory
    one would dedup per process, so it is replaced by ours."""
    path = crawler.settings.get("DUPEFILTER_CLASS") or "scrapy.dupefilters.RFPDupeFilter"
    cls = load_object(path)
    if cls is load_object("scrapy.dupefilters.RFPDupeFilter"):
        logger.info(
            "redisspine: DUPEFILTER_CLASS is Scrapy's per-process RFPDupeFilter; using the "
            "fleet-wide scrapy_redisspine.dupefilter.RedisDupeFilter instead"
        )
        cls = RedisDupeFilter
    elif not issubclass(cls, RedisDupeFilter) and cls is not BaseDupeFilter:
        logger.warning(
            "redisspine: DUPEFILTER_CLASS %s keeps its record in this process only; "
            "other workers will not see what it filtered", path,
        )
    return build_from_crawler(cls, crawler)  # type: ignore[no-any-return]
