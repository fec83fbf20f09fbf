"""Scrapy scheduler over the shared Redis frontier.

Every ``scrapy crawl`` process using this scheduler is one worker of a fleet that
shares one crawl's keys. The scheduler is Scrapy's interface and the wiring of a
few parts, each owning its state (drawn side by side, none inherits from another):

- ``Outbox`` (``_outbox``): requests enqueued here and the acks of requests the
  engine is done with, on their way to Redis; the local request cache; the flush
  timer. A request's children always go in the same atomic step as its ack, or
  before it.
- ``LeaseBook`` (``_leasebook``): the leases this worker holds, ready or handed out,
  with their lanes and Retry-After blocks.
- ``Leaser`` (``_leasing``): fills the book in one round trip that also carries the
  outbox; backs off after an empty lease.
- ``FleetMember`` (``_fleet``): heartbeat, fleet orders (pause, drain), fencing, and
  the fleet's counts that decide when the crawl is finished.
- ``RedisGuard`` (``_guard``): the breaker for a down Redis, memory pressure for a
  full one, and whether leases must be reconciled after a failure.
- ``HostPolicy`` (``_host_policy``): politeness lanes and delays.

Scrapy's engine internals are reached only through an ``EnginePort``
(``_engine``), passed to the constructor; time only through a ``Clock``
(``_clock``). The extensions and the middleware get a ``signals.WorkerView``.

The crawl is finished when nothing is queued or in flight fleet-wide; a worker only
reports no pending requests when that holds and its own buffers are empty.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import redis
from scrapy.core.scheduler import BaseScheduler

from scrapy_redisspine import signals
from scrapy_redisspine._clock import Clock, Periodic, ReactorClock
from scrapy_redisspine._engine import EngineHooks, EnginePort
from scrapy_redisspine._fleet import FleetMember
from scrapy_redisspine._guard import RedisGuard
from scrapy_redisspine._host_policy import HostPolicy
from scrapy_redisspine._leasebook import LeaseBook
from scrapy_redisspine._leasing import Leaser
from scrapy_redisspine._outbox import Outbox
from scrapy_redisspine.dupefilter import RedisDupeFilter, fleet_dupefilter
from scrapy_redisspine.frontier import EnqueueResult, Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.request_codec import RequestCodec, RequestEncodeError
from scrapy_redisspine.serialization import get_serializer
from scrapy_redisspine.settings import SpineConfig, load_config
from scrapy_redisspine.worker import WorkerConnection, new_worker_id

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

_CLOSE_ATTEMPTS = 5


class Scheduler(BaseScheduler):
    """Distributed scheduler: Scrapy's interface over the parts listed in the module
    docstring. The parts exist from :meth:`open` on."""

    frontier: Frontier
    codec: RequestCodec
    connection: WorkerConnection
    outbox: Outbox
    leaser: Leaser
    fleet: FleetMember
    hosts: HostPolicy
    view: signals.WorkerView

    def __init__(
        self,
        config: SpineConfig,
        dupefilter: BaseDupeFilter,
        stats: StatsCollector,
        *,
        crawler: Crawler | None = None,
        engine: EnginePort | None = None,
        clock: Clock | None = None,
        worker_id: str | None = None,
    ) -> None:
        self.config = config
        self.df = dupefilter
        self.stats = stats
        self.crawler = crawler  # its signals and request fingerprinter (public API)
        self.engine = engine
        self.clock: Clock = clock or ReactorClock()
        self.worker_id = worker_id or new_worker_id()
        self.spider: Spider | None = None
        self.guard = RedisGuard(stats, self.clock.seconds)
        self.book = LeaseBook()
        self._remote_dedup = isinstance(dupefilter, RedisDupeFilter)
        self._idle_poll = Periodic(
            "idle poll", self._on_idle_poll, config.idle_poll_seconds, self.clock, stats
        )
        self._opened = False

    @classmethod
    def from_crawler(cls, crawler: Crawler, engine: EnginePort | None = None) -> Scheduler:
        """Scrapy's way in; ``engine`` replaces the crawler's engine (benchmarks)."""
        config = load_config(crawler.settings)
        dupefilter = fleet_dupefilter(crawler)
        return cls(config, dupefilter, crawler.stats, crawler=crawler,
                   engine=engine or EngineHooks(crawler))

    # -- lifecycle ---------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        self.spider = spider
        crawl_id = self.config.crawl_id or spider.name
        self.connection = WorkerConnection.open(self.config, crawl_id, self.worker_id)
        self.frontier = Frontier(
            self.connection.client, CrawlKeys(self.config.key_prefix, crawl_id),
            self.worker_id, self.config.queue_order,
            concurrency=self.config.host_concurrency, backlog_cap=self.config.host_backlog_cap,
        )
        self._assemble(spider)
        self.hosts.take_over_download_delay(spider)
        self.frontier.upkeep.check_key_types()
        flushed, alive = self.frontier.register(
            flush=self.config.flush_on_start,
            alive_ms=self.config.worker_timeout_ms,
        )
        self._log_open(crawl_id, flushed, alive)
        if isinstance(self.df, RedisDupeFilter):
            self.df.bind(self.frontier)
        self.df.open()
        self._opened = True
        if self.engine is not None:
            self.engine.attach(self._on_request_done)
        if self.crawler is not None:
            self.crawler.signals.send_catch_log(signals.worker_opened, worker=self.view)
        self.fleet.start()
        self._idle_poll.start()

    def _assemble(self, spider: Spider) -> None:
        """Build the parts that work on the frontier, each given what it uses."""
        config, stats, clock = self.config, self.stats, self.clock
        self.codec = RequestCodec(
            spider, get_serializer(config.serializer), config.allowed_request_classes
        )
        self.hosts = HostPolicy(config, self.frontier, self.guard, self.book, stats)
        self.outbox = Outbox(
            self.frontier, self.guard, stats, clock,
            batch_size=config.enqueue_batch_size, cache_size=config.local_request_cache,
            on_sent=self._on_sent, on_duplicate=lambda request: self.df.log(request, spider),
        )
        self.fleet = FleetMember(
            frontier=self.frontier, guard=self.guard, book=self.book, engine=self.engine,
            stats=stats, clock=clock, heartbeat_seconds=config.heartbeat_seconds,
            worker_timeout_ms=config.worker_timeout_ms, wake=self.wake,
            flush=self.outbox.try_flush,
        )
        self.leaser = Leaser(
            frontier=self.frontier, outbox=self.outbox, book=self.book, guard=self.guard,
            codec=self.codec, engine=self.engine, stats=stats, clock=clock,
            batch_size=config.lease_batch_size, idle_poll_seconds=config.idle_poll_seconds,
            counted=self.fleet.counted, crawl_delay_learned=self.hosts.learned_from_lease,
        )
        self.view = signals.WorkerView(
            self.worker_id, self.frontier.upkeep, self.guard, self.hosts, self.wake
        )

    def _log_open(self, crawl_id: str, flushed: bool, alive: int) -> None:
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
        if not self._opened:
            return  # open() failed: nothing was taken, nothing to hand back
        self._opened = False
        if self.crawler is not None:
            self.crawler.signals.send_catch_log(signals.worker_closing, worker=self.view)
        self.fleet.stop()
        self._idle_poll.stop()
        self.outbox.close()
        self.leaser.close()
        if self.engine is not None:
            self.engine.detach()
        self._hand_back(reason)
        self.df.close(reason)
        self.connection.close()

    @property
    def running(self) -> bool:
        """Whether any of the worker's timers still runs."""
        return self._idle_poll.running or (self._opened and self.fleet.running)

    def _hand_back(self, reason: str) -> None:
        """Send what is buffered, return unstarted leases, leave; retry a short outage."""
        for attempt in range(_CLOSE_ATTEMPTS):
            try:
                self.outbox.flush()
                self._release_unstarted()
                finished = reason == "finished" and not self.config.persist
                if finished and self.frontier.upkeep.purge_if_done():
                    logger.info("redisspine: crawl finished; its keys deleted (persist off)")
                self.frontier.leave()
                return
            except redis.RedisError as exc:
                self.guard.failed("close", exc)
                time.sleep(0.2 * 2**attempt)
        logger.error(
            "redisspine: Redis unreachable while closing: %d unsent request(s) of this "
            "worker are lost; its %d lease(s) stay in Redis and will be requeued by the "
            "other workers' sweeps", len(self.outbox), self.book.ready + self.book.handed_out,
        )

    def _release_unstarted(self) -> None:
        handles = self.book.take_all()
        if handles:
            released = self.frontier.release(handles)
            self.stats.inc_value("redisspine/scheduler/released", released)
            logger.info("redisspine: returned %d unstarted lease(s) to the queue", released)

    # -- Scrapy's scheduler interface ------------------------------------------

    def enqueue_request(self, request: Request) -> bool:
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
        if self.guard.memory_pressure and not (is_start or request.dont_filter):
            self.outbox.shed(request)
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
            lane=self.hosts.lane(request.url),
        )
        self.outbox.add(entry, request, self.config.enqueue_flush_seconds)
        return True

    def next_request(self) -> Request | None:
        orders = self.fleet.orders
        if orders.drain:
            return None  # unstarted leases go back at close
        if not self.book.ready and (orders.paused or not self.leaser.lease()):
            return None
        request = self.book.hand_out()
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
            self.stats.inc_value("scheduler/dequeued")
        return request

    def has_pending_requests(self) -> bool:
        if not self.outbox.empty or self.book.ready or self.config.keep_alive:
            return True
        if self.fleet.orders.stop_leasing:
            return True  # paused: wait for resume; draining: the heartbeat closes
        if self.guard.down:
            return True  # never finish while Redis cannot tell us the fleet is done
        if self.clock.seconds() - self.fleet.checked_at >= self.config.idle_poll_seconds:
            self.fleet.refresh_counts()
        return self.fleet.pending or self.guard.down

    def __len__(self) -> int:
        return len(self.outbox) + self.book.ready + (1 if self.fleet.pending else 0)

    # -- what the parts tell each other ------------------------------------------

    def wake(self) -> None:
        """New work may be in Redis (e.g. requeued by a sweep): lease soon."""
        self.leaser.wake()

    def _on_request_done(self, request: Request) -> None:
        """The engine is done with ``request``: its ack joins the outbox."""
        finished = self.book.finish(request)
        if finished is None:
            return  # not ours: e.g. robots.txt fetched through engine.download()
        self.outbox.add_ack(
            finished.handle, self.hosts.rest_ms(finished), self.config.ack_flush_seconds
        )

    def _on_sent(self, result: EnqueueResult) -> None:
        self.fleet.work_added()
        self.leaser.expect_work()
        if result.enqueued and self.engine is not None:
            self.engine.wake()

    def _on_idle_poll(self) -> None:
        if not self.outbox.empty:
            self.outbox.try_flush()
        if not self.book.ready and self.engine is not None:
            self.engine.wake()

    def _fingerprint(self, request: Request) -> bytes:
        if isinstance(self.df, RedisDupeFilter):
            return self.df.fingerprint(request)
        assert self.crawler is not None
        return bytes(self.crawler.request_fingerprinter.fingerprint(request))

