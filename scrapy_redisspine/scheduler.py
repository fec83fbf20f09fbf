"""Scrapy scheduler over the shared Redis frontier.

Every ``scrapy crawl`` process using this scheduler is one worker of a fleet that
shares one crawl's keys. The scheduler keeps three small local buffers and nothing
else:

- the outbox: requests enqueued here, and the acks of requests the engine is done
  with (see ``_engine``). A request's children always go in the same atomic step as
  its ack, or before it. Both are sent with the next lease, in the same round trip,
  or when the buffer is full, or after ``REDISSPINE_ENQUEUE_FLUSH_SECONDS`` (new
  requests) or ``REDISSPINE_ACK_FLUSH_SECONDS`` (acks), whichever comes first;
- the ready list: requests leased in one round trip, handed out one per
  ``next_request()``; they stay in Redis's in-flight HASH, owned by this worker;
- handed-out leases, until their ack.

Requests this worker queued are also kept as objects for a while
(``REDISSPINE_LOCAL_REQUEST_CACHE``), so that leasing them back costs no decoding.

This module holds the lifecycle and Scrapy's scheduler interface; the rest is in
``_sched_*`` modules (see ``_sched_state``).

The crawl is finished when nothing is queued or in flight fleet-wide; a worker only
reports no pending requests when that holds and its own buffers are empty.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING, Any

import redis
from scrapy.core.scheduler import BaseScheduler
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_redisspine import signals
from scrapy_redisspine._engine import EngineHooks
from scrapy_redisspine._sched_leases import LeasesMixin
from scrapy_redisspine._sched_state import PendingAck, logger
from scrapy_redisspine.control import Orders
from scrapy_redisspine.dupefilter import RedisDupeFilter
from scrapy_redisspine.frontier import (
    Frontier,
    LeaseHandle,
    NewRequest,
)
from scrapy_redisspine.health import RedisHealth
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.politeness import DelayPolicy, make_lane_function
from scrapy_redisspine.request_codec import RequestCodec, RequestEncodeError
from scrapy_redisspine.serialization import get_serializer
from scrapy_redisspine.settings import SpineConfig, load_config
from scrapy_redisspine.worker import WorkerConnection, new_worker_id

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from twisted.internet import task

_CLOSE_ATTEMPTS = 5


class Scheduler(LeasesMixin, BaseScheduler):
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
        self._acks: list[PendingAck] = []
        self._local: dict[bytes, Request] = {}  # payload -> the request it encodes
        self._lanes: dict[str, str] = {}  # order key -> politeness lane, while leased
        self._blocks: dict[str, int] = {}  # order key -> Retry-After block (ms)
        self._lane = make_lane_function(config.politeness_key)
        self.delays = DelayPolicy(
            config.download_delay, dict(config.host_delays), config.download_delay_jitter,
            config.max_crawl_delay_seconds,
        )
        self._wake_call: Any = None  # twisted IDelayedCall
        self._ready: deque[tuple[Request, LeaseHandle]] = deque()
        self._handed_out: dict[Request, LeaseHandle] = {}
        self._fleet_pending = True
        self._fleet_checked_at = 0.0
        self._last_empty_lease = 0.0
        self.health = RedisHealth(
            on_error=lambda op: self.stats.inc_value(f"redisspine/redis_errors/{op}")
        )
        self.memory_pressure = False
        self._reconcile_leases = False
        self._last_shed_log = 0.0
        self._flush_call: Any = None  # twisted IDelayedCall
        self._flush_due = 0.0  # when it fires (time.monotonic())
        self._timers: list[task.LoopingCall] = []
        self.orders = Orders()  # fleet-wide pause/drain, read once per heartbeat
        self._drain_closing = False

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
            concurrency=self.config.host_concurrency,
            backlog_cap=self.config.host_backlog_cap,
        )
        self._take_over_download_delay(spider)
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
            self.crawler.signals.send_catch_log(signals.worker_opened, scheduler=self)
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
        if self.crawler is not None:
            self.crawler.signals.send_catch_log(signals.worker_closing, scheduler=self)
        for timer in self._timers:
            if timer.running:
                timer.stop()
        for call in (self._flush_call, self._wake_call):
            if call is not None and call.active():
                call.cancel()
        if self._hooks is not None:
            self._hooks.uninstall()
        assert self.frontier is not None
        assert self.connection is not None
        self._hand_back(reason)
        self.df.close(reason)
        self.connection.close()

    def _hand_back(self, reason: str) -> None:
        """Send what is buffered, return unstarted leases, leave; retry a short outage."""
        assert self.frontier is not None
        for attempt in range(_CLOSE_ATTEMPTS):
            try:
                self._flush()
                self._release_unstarted()
                finished = reason == "finished" and not self.config.persist
                if finished and self.frontier.purge_if_done():
                    logger.info("redisspine: crawl finished; its keys deleted (persist off)")
                self.frontier.leave()
                return
            except redis.RedisError as exc:
                self._redis_failed("close", exc)
                time.sleep(0.2 * 2**attempt)
        logger.error(
            "redisspine: Redis unreachable while closing: %d unsent request(s) of this "
            "worker are lost; its %d lease(s) stay in Redis and will be requeued by the "
            "other workers' sweeps", len(self._outbox), len(self._ready) + len(self._handed_out),
        )

    def _release_unstarted(self) -> None:
        assert self.frontier is not None
        handles = [handle for _, handle in self._ready] + list(self._handed_out.values())
        if handles:
            released = self.frontier.release(handles)
            self.stats.inc_value("redisspine/scheduler/released", released)
            logger.info("redisspine: returned %d unstarted lease(s) to the queue", released)
        self._ready.clear()
        self._handed_out.clear()
        self._lanes.clear()
        self._local.clear()

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
        if self.memory_pressure and not (is_start or request.dont_filter):
            self._shed(request)
            return False
        fingerprint = b""
        if is_start or (self._remote_dedup and not request.dont_filter):
            fingerprint = self._fingerprint(request)
        entry = NewRequest(
            payload,
            fingerprint,
            request.priority,
            dont_filter=request.dont_filter or not self._remote_dedup,
            is_start=is_start,
            lane=self._lane(request.url),
        )
        self._outbox.append((entry, request))
        self._flush_soon(self.config.enqueue_flush_seconds)
        return True

    def next_request(self) -> Request | None:
        if self.orders.drain:
            return None  # unstarted leases go back at close
        if not self._ready and (self.orders.paused or not self._lease()):
            return None
        request, handle = self._ready.popleft()
        self._handed_out[request] = handle
        self.stats.inc_value("scheduler/dequeued/redis")
        self.stats.inc_value("scheduler/dequeued")
        return request

    def has_pending_requests(self) -> bool:
        if self._outbox or self._ready or self._acks or self.config.keep_alive:
            return True
        if self.orders.stop_leasing:
            return True  # paused: wait for resume; draining: the heartbeat closes
        if self.health.down:
            return True  # never finish while Redis cannot tell us the fleet is done
        if time.monotonic() - self._fleet_checked_at >= self.config.idle_poll_seconds:
            self._refresh_fleet_counts()
        return self._fleet_pending or self.health.down

    def __len__(self) -> int:
        return len(self._outbox) + len(self._ready) + (1 if self._fleet_pending else 0)

    # -- internals ---------------------------------------------------------------

    def _fingerprint(self, request: Request) -> bytes:
        if isinstance(self.df, RedisDupeFilter):
            return self.df.fingerprint(request)
        assert self.crawler is not None
        return bytes(self.crawler.request_fingerprinter.fingerprint(request))


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
