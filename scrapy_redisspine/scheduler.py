"""Scrapy scheduler over the shared Redis frontier.

Every ``scrapy crawl`` process using this scheduler is one worker of a fleet that
shares one crawl's keys. The scheduler keeps three small local buffers and nothing
else:

- the outbox: requests enqueued here, sent to Redis in one round trip (at the ack of
  the request whose processing yielded them, when the batch is full, or after
  ``REDISSPINE_ENQUEUE_FLUSH_SECONDS``);
- the ready list: requests leased in one round trip, handed out one per
  ``next_request()``; they stay in Redis's in-flight HASH, owned by this worker;
- handed-out leases: acked when the engine is done with the request (see
  ``_engine``), together with the requests it yielded, atomically.

The crawl is finished when nothing is queued or in flight fleet-wide; a worker only
reports no pending requests when that holds and its own buffers are empty.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import redis
from scrapy.core.scheduler import BaseScheduler
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.misc import build_from_crawler, load_object
from twisted.internet import task

from scrapy_redisspine._engine import EngineHooks
from scrapy_redisspine.dupefilter import RedisDupeFilter
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.request_codec import RequestCodec, RequestEncodeError
from scrapy_redisspine.serialization import get_serializer
from scrapy_redisspine.settings import SpineConfig, load_config
from scrapy_redisspine.worker import WorkerConnection, new_worker_id

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

_ERROR_LOG_INTERVAL_SECONDS = 10.0


class Scheduler(BaseScheduler):
    """Distributed scheduler; see the module docstring for the buffers it keeps."""

    def __init__(
        self,
        config: SpineConfig,
        dupefilter: BaseDupeFilter,
        stats: StatsCollector,
        crawler: Crawler | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.config = config
        self.df = dupefilter
        self.stats = stats
        self.crawler = crawler
        self.worker_id = worker_id or new_worker_id()
        self.spider: Spider | None = None
        self.connection: WorkerConnection | None = None
        self.frontier: Frontier | None = None
        self.codec: RequestCodec | None = None
        self._hooks: EngineHooks | None = None
        self._remote_dedup = isinstance(dupefilter, RedisDupeFilter)
        self._outbox: list[tuple[NewRequest, Request]] = []
        self._acks: list[str] = []
        self._ready: deque[tuple[Request, str]] = deque()
        self._handed_out: dict[Request, str] = {}
        self._fleet_pending = True
        self._fleet_checked_at = 0.0
        self._last_empty_lease = 0.0
        self._last_error_log = 0.0
        self._redis_ok = True
        self._flush_call: Any = None  # twisted IDelayedCall
        self._timers: list[task.LoopingCall] = []

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Scheduler:
        config = load_config(crawler.settings)
        dupefilter = _build_dupefilter(crawler)
        return cls(config, dupefilter, crawler.stats, crawler=crawler)

    # -- lifecycle ---------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        self.spider = spider
        crawl_id = self.config.crawl_id or spider.name
        self.connection = WorkerConnection.open(self.config, crawl_id, self.worker_id)
        self.frontier = Frontier(
            self.connection.client,
            CrawlKeys(self.config.key_prefix, crawl_id),
            self.worker_id,
            self.config.queue_order,
        )
        self.frontier.check_key_types()
        flushed, alive = self.frontier.register(
            flush=self.config.flush_on_start,
            alive_ms=int(self.config.worker_timeout_seconds * 1000),
        )
        self._log_open(crawl_id, flushed, alive)
        self.codec = RequestCodec(
            spider, get_serializer(self.config.serializer), self.config.allowed_request_classes
        )
        if isinstance(self.df, RedisDupeFilter):
            self.df.bind(self.frontier)
        self.df.open()
        if self.crawler is not None:
            self._hooks = EngineHooks(self.crawler)
            self._hooks.on_request_done(self._on_request_done)
        self._start_timer(self._on_heartbeat, self.config.heartbeat_seconds)
        self._start_timer(self._on_idle_poll, self.config.idle_poll_seconds)

    def _log_open(self, crawl_id: str, flushed: bool, alive: int) -> None:
        assert self.connection is not None
        logger.info(
            "redisspine: worker %s joined crawl %r on %s (%d other worker(s) alive)",
            self.worker_id, crawl_id, self.connection.description, alive,
        )
        if flushed:
            logger.info("redisspine: flushed crawl %r on start", crawl_id)
        elif self.config.flush_on_start:
            logger.warning(
                "redisspine: not flushing crawl %r: %d other worker(s) are working on it",
                crawl_id, alive,
            )

    def close(self, reason: str) -> None:
        for timer in self._timers:
            if timer.running:
                timer.stop()
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        if self._hooks is not None:
            self._hooks.uninstall()
        assert self.frontier is not None
        assert self.connection is not None
        try:
            self._flush()
            self._release_unstarted()
            if reason == "finished" and not self.config.persist and self.frontier.purge_if_done():
                logger.info("redisspine: crawl finished; its keys deleted (persist off)")
            self.frontier.leave()
        except redis.RedisError as exc:
            logger.error(
                "redisspine: could not hand back this worker's state on close (%s); "
                "%d unsent request(s) lost from this process, leases stay in Redis",
                exc, len(self._outbox),
            )
        self.df.close(reason)
        self.connection.close()

    def _release_unstarted(self) -> None:
        assert self.frontier is not None
        keys = [key for _, key in self._ready] + list(self._handed_out.values())
        if keys:
            released = self.frontier.release(keys)
            self.stats.inc_value("redisspine/scheduler/released", released)
            logger.info("redisspine: returned %d unstarted lease(s) to the queue", released)
        self._ready.clear()
        self._handed_out.clear()

    # -- Scrapy's scheduler interface ------------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        assert self.codec is not None
        if not self._remote_dedup and not request.dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)  # type: ignore[arg-type]
            return False
        try:
            payload = self.codec.encode(request)
        except RequestEncodeError as exc:
            logger.error("redisspine: %s", exc, extra={"spider": self.spider})
            self.stats.inc_value("redisspine/scheduler/unserializable")
            return False
        is_start = bool(request.meta.get("is_start_request"))
        fingerprint = b""
        if is_start or (self._remote_dedup and not request.dont_filter):
            fingerprint = self._fingerprint(request)
        entry = NewRequest(
            payload,
            fingerprint,
            request.priority,
            dont_filter=request.dont_filter or not self._remote_dedup,
            is_start=is_start,
        )
        self._outbox.append((entry, request))
        if len(self._outbox) >= self.config.enqueue_batch_size:
            self._try_flush()
        else:
            self._schedule_flush()
        return True

    def next_request(self) -> Request | None:
        if not self._ready and not self._lease():
            return None
        request, key = self._ready.popleft()
        self._handed_out[request] = key
        self.stats.inc_value("scheduler/dequeued/redis")
        self.stats.inc_value("scheduler/dequeued")
        return request

    def has_pending_requests(self) -> bool:
        if self._outbox or self._ready or self._acks or self.config.keep_alive:
            return True
        if time.monotonic() - self._fleet_checked_at >= self.config.idle_poll_seconds:
            self._refresh_fleet_counts()
        return self._fleet_pending

    def __len__(self) -> int:
        return len(self._outbox) + len(self._ready) + (1 if self._fleet_pending else 0)

    # -- internals ---------------------------------------------------------------

    def _fingerprint(self, request: Request) -> bytes:
        if isinstance(self.df, RedisDupeFilter):
            return self.df.fingerprint(request)
        assert self.crawler is not None
        return bytes(self.crawler.request_fingerprinter.fingerprint(request))

    def _lease(self) -> bool:
        """Fill the ready list in one round trip; False if nothing was leased."""
        assert self.frontier is not None
        now = time.monotonic()
        if self._outbox and not self._try_flush():
            return False
        # Engine wake-ups (each enqueue, each finished download) may come far more
        # often than work appears; after an empty lease, wait for the idle poll.
        if now - self._last_empty_lease < self.config.idle_poll_seconds / 2:
            return False
        free = self._hooks.free_download_slots() if self._hooks else 1
        count = max(1, min(free, self.config.lease_batch_size))
        while not self._ready:
            try:
                batch = self.frontier.lease(count)
            except redis.RedisError as exc:
                self._redis_error("lease", exc)
                return False
            self._set_fleet_counts(batch.queued, batch.inflight, now)
            self._report_malformed(batch.malformed)
            if not batch.leases and not batch.malformed:
                self._last_empty_lease = now
                return False
            self.stats.inc_value("redisspine/scheduler/leased", len(batch.leases))
            for lease in batch.leases:
                self._accept(lease.key, lease.payload)
            # Loop only when everything leased was dead-lettered and work remains.
            if not batch.queued:
                break
        return bool(self._ready)

    def _report_malformed(self, malformed: int) -> None:
        if malformed:
            assert self.frontier is not None
            logger.error(
                "redisspine: %d malformed member(s) of %s (not written by this plugin) "
                "moved to dead letters in %s", malformed, self.frontier.keys.queue,
                self.frontier.keys.dead,
            )
            self.stats.inc_value("redisspine/scheduler/malformed", malformed)

    def _accept(self, key: str, payload: bytes) -> None:
        assert self.codec is not None
        assert self.frontier is not None
        try:
            self._ready.append((self.codec.decode(payload), key))
        except Exception as exc:  # RequestDecodeError, or anything a bad payload triggers
            reason = f"undecodable request: {exc}"
            logger.error("redisspine: lease %s moved to dead letters: %s", key, reason)
            self.stats.inc_value("redisspine/scheduler/undecodable")
            self.frontier.bury(key, reason)

    def _on_request_done(self, request: Request) -> None:
        key = self._handed_out.pop(request, None)
        if key is None:
            return  # not ours: e.g. robots.txt fetched through engine.download()
        self._acks.append(key)
        self._try_flush()

    def _schedule_flush(self) -> None:
        if self._flush_call is None or not self._flush_call.active():
            from twisted.internet import reactor

            delay = self.config.enqueue_flush_seconds
            self._flush_call = reactor.callLater(delay, self._try_flush)  # type: ignore[attr-defined,arg-type,call-arg,unused-ignore]

    def _try_flush(self) -> bool:
        try:
            self._flush()
        except redis.RedisError as exc:
            self._redis_error("enqueue", exc)
            return False
        return True

    def _flush(self) -> None:
        """Send the outbox and pending acks in one atomic round trip."""
        if not self._outbox and not self._acks:
            return
        assert self.frontier is not None
        outbox, acks = self._outbox, self._acks
        result = self.frontier.enqueue([entry for entry, _ in outbox], acks)
        self._outbox, self._acks = [], []
        self._redis_ok = True
        self._record_enqueued(outbox, result.statuses, result.acked, len(acks))
        self._fleet_pending = True
        self._last_empty_lease = 0.0
        if result.enqueued and self._hooks is not None:
            self._hooks.wake()

    def _record_enqueued(
        self, outbox: list[tuple[NewRequest, Request]], statuses: str, acked: int, sent: int
    ) -> None:
        stats = self.stats
        for (_, request), status in zip(outbox, statuses, strict=False):
            if status == "+":
                stats.inc_value("scheduler/enqueued/redis")
                stats.inc_value("scheduler/enqueued")
            elif status == "d":
                self.df.log(request, self.spider)  # type: ignore[arg-type]
            else:
                stats.inc_value("redisspine/scheduler/start_requests_skipped")
        if sent:
            stats.inc_value("redisspine/scheduler/acked", acked)
        if acked < sent:
            stats.inc_value("redisspine/scheduler/ack_refused", sent - acked)
            logger.warning("redisspine: %d ack(s) refused: lease no longer ours", sent - acked)

    def _refresh_fleet_counts(self) -> None:
        assert self.frontier is not None
        if self._outbox or self._acks:
            self._try_flush()
        try:
            queued, inflight = self.frontier.counts()
        except redis.RedisError as exc:
            self._redis_error("count", exc)
            self._fleet_pending = True  # never finish while Redis cannot tell us
            return
        self._set_fleet_counts(queued, inflight, time.monotonic())

    def _set_fleet_counts(self, queued: int, inflight: int, now: float) -> None:
        self._fleet_pending = queued + inflight > 0
        self._fleet_checked_at = now

    def _redis_error(self, operation: str, exc: Exception) -> None:
        self.stats.inc_value(f"redisspine/redis_errors/{operation}")
        now = time.monotonic()
        if self._redis_ok or now - self._last_error_log > _ERROR_LOG_INTERVAL_SECONDS:
            logger.error(
                "redisspine: Redis %s failed (%s: %s); keeping local state and retrying",
                operation, type(exc).__name__, exc,
            )
            self._last_error_log = now
        self._redis_ok = False

    def _start_timer(self, function: Any, interval: float) -> None:
        timer = task.LoopingCall(function)
        timer.start(interval, now=False)
        self._timers.append(timer)

    def _on_heartbeat(self) -> None:
        assert self.frontier is not None
        try:
            self.frontier.heartbeat()
        except redis.RedisError as exc:
            self._redis_error("heartbeat", exc)

    def _on_idle_poll(self) -> None:
        if self._outbox or self._acks:
            self._try_flush()
        if not self._ready and self._hooks is not None:
            self._hooks.wake()


def _build_dupefilter(crawler: Crawler) -> BaseDupeFilter:
    """Scrapy's default in-memory dupefilter would dedup per process: use ours."""
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
