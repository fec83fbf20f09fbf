"""The feed drain: every worker takes what users push into the crawl's feed key.

scrapy-redis users feed a crawl with ``redis-cli lpush myspider:start_urls URL``;
this extension keeps that working (``REDISSPINE_FEED_KEY``, LIST or ZSET) without
scrapy-redis's idle-poll delay: once as the worker opens, then every
``REDISSPINE_FEED_SECONDS`` (and up to ten
batches in a row while full ones come) each worker reads a batch of up to
``REDISSPINE_FEED_BATCH_SIZE`` entries, builds a request from each (a URL or a JSON
object, ``feed_entries``; a callback must be a method of the spider), enqueues the
good ones through the crawl's dedup as ``redisspine seed`` does (``push``), and
only then removes them from the feed and dead-letters the bad ones with their
reasons, in one script (``_feed_store``: why read-then-remove loses nothing).

Entries a full host backlog refused (``REDISSPINE_HOST_BACKLOG_CAP``) stay in the
feed for a later batch. Runs through the ``signals.WorkerView`` of ``worker_opened``.

Keys touched (``FeedStore``, ``Frontier.push``): the feed key, dead, stats, record,
and the enqueue script's keys.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy import signals as scrapy_signals
from scrapy.exceptions import NotConfigured

from scrapy_redisspine import signals
from scrapy_redisspine._clock import Clock, CrawlClock, Periodic
from scrapy_redisspine._components import component_config
from scrapy_redisspine._feed_store import FeedBatch, FeedStore, FeedTypeError
from scrapy_redisspine._guard import CALL_ERRORS
from scrapy_redisspine._redis_io import InlineIO
from scrapy_redisspine.connection import same_slot
from scrapy_redisspine.feed_entries import BadEntry, parse_entry
from scrapy_redisspine.keys import feed_key
from scrapy_redisspine.pushing import EntryEncoder, PushOptions, push_frontier
from scrapy_redisspine.request_codec import RequestEncodeError

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol

    from scrapy_redisspine._redis_io import RedisIO
    from scrapy_redisspine._results import EnqueueResult
    from scrapy_redisspine.frontier import NewRequest
    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.settings import SpineConfig
    from scrapy_redisspine.sharded import AnyFrontier

logger = logging.getLogger(__name__)

#: Batches one tick takes at most while each comes back full.
BATCHES_PER_TICK = 10


@dataclass(frozen=True)
class _Plan:
    """A batch read from the feed, sorted: what to enqueue, what to bury."""

    batch: FeedBatch
    good: list[bytes]
    requests: list[NewRequest]
    bad: list[tuple[str, bytes]]


class FeedDrain:
    """Owns the worker's feed store and the timer that drains it."""

    def __init__(
        self, config: SpineConfig, stats: StatsCollector,
        fingerprinter: RequestFingerprinterProtocol | None = None, clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.stats = stats
        self.fingerprinter = fingerprinter
        self.options = PushOptions.from_config(config)
        self._encoder = EntryEncoder(self.options, fingerprinter)
        self.worker: signals.WorkerView | None = None
        self.spider: Spider | None = None
        self.store: FeedStore | None = None
        self._frontier: AnyFrontier | None = None
        self._type_warned = False
        self._slot_warned = False
        self._draining = False  # a drain on its way (a slow Redis): the next tick skips
        self.crawler: Crawler | None = None
        self._timer = Periodic("feed", self.drain, config.feed_seconds,
                               clock or CrawlClock(), stats)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FeedDrain:
        config = component_config(crawler)
        if not config.feed_key:
            raise NotConfigured("REDISSPINE_FEED_KEY is empty: no feed key is drained")
        extension = cls(config, crawler.stats, crawler.request_fingerprinter)
        extension.crawler = crawler
        crawler.signals.connect(extension.crawl_worker_opened, signal=signals.worker_opened)
        crawler.signals.connect(extension.stop, signal=signals.worker_closing)
        crawler.signals.connect(extension.stop, signal=scrapy_signals.spider_closed)
        return extension

    def crawl_worker_opened(self, worker: signals.WorkerView) -> None:
        """``worker_opened`` in a crawl: the scheduler sends it before Scrapy sends
        ``spider_opened``, so the spider comes from the crawler."""
        spider = self.crawler.spider if self.crawler is not None else None
        if spider is None:
            logger.error("redisspine: the feed drain found no spider; %s is not drained",
                         self.config.feed_key)
            return
        self.worker_opened(worker, spider)

    def worker_opened(self, worker: signals.WorkerView, spider: Spider) -> None:
        """Start draining; callbacks are checked against ``spider``."""
        self.spider = spider
        self.worker = worker
        upkeep = worker.upkeep
        # A sharded crawl's feed ends its batches on shard 0's keys (its bad entries
        # join that shard's dead letters, where `redisspine dead-letters` finds them);
        # its requests go to their lanes' shards (push_frontier).
        self.store = FeedStore(upkeep.client, self._store_keys(upkeep.keys),
                               feed_key(self.config.feed_key, self.spider.name))
        self.store.epoch = upkeep.epoch
        self._frontier = push_frontier(upkeep.client, upkeep.keys, self.options,
                                       worker.worker_id)
        self._frontier.epoch = upkeep.epoch
        # Once now, while the scheduler opens: a spider fed only through its feed key
        # (scrapy-redis's way, no start requests) finds the entries queued before its
        # first lease, instead of finding the crawl empty and closing (so on the
        # loop's thread, done before the scheduler's first lease).
        self._next_batch(InlineIO(self.stats), BATCHES_PER_TICK)
        self._timer.start()

    @staticmethod
    def _store_keys(keys: CrawlKeys) -> CrawlKeys:
        return keys.shard_view(0) if keys.shards > 1 else keys

    @property
    def running(self) -> bool:
        return self._timer.running

    def stop(self, *_: Any, **__: Any) -> None:
        self._timer.stop()

    def drain(self) -> None:
        """Up to ``BATCHES_PER_TICK`` batches, while each is full. Through the worker's
        ``io``: the feed is read and written off the crawl's loop, its entries are
        parsed on it (their callbacks are the spider's); one drain at a time."""
        worker = self.worker
        if worker is None or worker.guard.crawl_gone or self._draining:
            return  # a crawl that is gone takes nothing from the feed
        self._next_batch(worker.io or InlineIO(self.stats), BATCHES_PER_TICK)

    def _next_batch(self, io: RedisIO, left: int) -> None:
        worker, store = self.worker, self.store
        if worker is None or store is None or not worker.guard.available("feed"):
            return
        size = self.config.feed_batch_size
        self._draining = True
        io.submit("feed", lambda: store.read(size), lambda batch: self._read(io, left, batch),
                  self._failed)

    def _read(self, io: RedisIO, left: int, batch: FeedBatch) -> None:
        plan = self._plan(batch)
        if plan is None:
            self._batch_done(io, left, 0)
            return
        io.submit("feed", lambda: self._write(plan),
                  lambda reply: self._batch_done(io, left, self._record(plan, reply)),
                  self._failed)

    def _batch_done(self, io: RedisIO, left: int, taken: int) -> None:
        self._draining = False
        if self.worker is not None:
            self.worker.guard.succeeded("feed")
        if taken >= self.config.feed_batch_size and left > 1:
            self._next_batch(io, left - 1)

    def _failed(self, exc: Exception) -> None:
        self._draining = False
        if isinstance(exc, FeedTypeError):
            if not self._type_warned:
                self._type_warned = True
                logger.warning("redisspine: %s", exc)
            return
        if not isinstance(exc, CALL_ERRORS):
            raise exc
        if self.worker is not None:
            self.worker.guard.failed("feed", exc)

    def take_batch(self) -> int:
        """One batch, on the caller's thread: read, enqueue the good entries, then end
        it. How many were read."""
        store = self.store
        if store is None:
            return 0
        plan = self._plan(store.read(self.config.feed_batch_size))
        return 0 if plan is None else self._record(plan, self._write(plan))

    def _plan(self, batch: FeedBatch) -> _Plan | None:
        """What to write for a batch read (None: nothing, or a feed key that cannot
        be drained here)."""
        store = self.store
        if store is None or self._frontier is None or not batch.entries or self._cross_slot(
                store):
            return None
        good, requests, bad = self._sort(batch)
        return _Plan(batch, good, requests, bad)

    def _write(self, plan: _Plan) -> tuple[EnqueueResult | None, Any]:
        """Redis calls only (off the loop): enqueue the good entries, then end the batch."""
        store, frontier = self.store, self._frontier
        assert store is not None
        assert frontier is not None
        enqueued: list[bytes] = []
        result = None
        if plan.requests:
            result = frontier.push(plan.requests)
            # "c": a full host backlog refused it; it stays in the feed for later
            enqueued = [raw for raw, status in zip(plan.good, result.statuses, strict=False)
                        if status != "c"]
        return result, store.done(plan.batch.kind, plan.bad, enqueued)

    def _record(self, plan: _Plan, reply: tuple[EnqueueResult | None, Any]) -> int:
        """Count and say what a batch did; how many entries it read."""
        result, done = reply
        if result is not None:
            if result.enqueued and self.worker is not None:
                self.worker.wake()
            self.stats.inc_value("redisspine/feed/enqueued", result.enqueued)
        self.stats.inc_value("redisspine/feed/taken", done.removed)
        if done.buried:
            store_key = self.store.feed_key if self.store is not None else "the feed"
            self.stats.inc_value("redisspine/feed/dead_lettered", done.buried)
            logger.warning("redisspine: %d bad feed entr%s of %s went to the dead letters "
                           "(see `redisspine dead-letters`); first: %s", done.buried,
                           "y" if done.buried == 1 else "ies", store_key, plan.bad[0][0])
        return len(plan.batch.entries)

    def _cross_slot(self, store: FeedStore) -> bool:
        """On Redis Cluster a feed key without the crawl's hash tag cannot be drained
        (``feed_done`` must touch it and the crawl's keys in one script): its entries
        stay where they are, counted, with one error line per worker. Checked only
        when the feed holds entries, so the default key, unused, costs no error."""
        worker = self.worker
        if worker is None:
            return False
        keys = self._store_keys(worker.upkeep.keys)
        if same_slot(worker.upkeep.client, store.feed_key, keys.record):
            return False
        self.stats.inc_value("redisspine/feed/cross_slot")
        if not self._slot_warned:
            self._slot_warned = True
            logger.error(
                "redisspine: the feed %s is not drained: on Redis Cluster its name must "
                "carry the hash tag of the crawl's slot, e.g. REDISSPINE_FEED_KEY = "
                "'{%s}:start_urls'",
                store.feed_key, keys.tag())
        return True

    def _sort(
        self, batch: FeedBatch
    ) -> tuple[list[bytes], list[NewRequest], list[tuple[str, bytes]]]:
        """The good entries (as read, and as requests) and the bad ones (reason, entry)."""
        good: list[bytes] = []
        requests: list[NewRequest] = []
        bad: list[tuple[str, bytes]] = []
        for raw in batch.entries:
            try:
                entry = parse_entry(raw, is_callback=self._is_callback)
                requests.append(self._encoder.encode(entry))
            except (BadEntry, RequestEncodeError) as exc:
                bad.append((f"bad feed entry: {exc}", raw))
            else:
                good.append(raw)
        return good, requests, bad

    def _is_callback(self, name: str) -> bool:
        return callable(getattr(self.spider, name, None))
