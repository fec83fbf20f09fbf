"""Scrapy scheduler over the shared Redis frontier.

Every ``scrapy crawl`` process using this scheduler is one worker of a fleet that
shares one crawl's keys. The scheduler is Scrapy's interface and the wiring of
parts that each own their state, drawn side by side (none inherits from another;
the docs' "How it works" page has the table): ``Outbox`` (``_outbox``), ``LeaseBook``
(``_leasebook``), ``Leaser`` (``_leasing``), ``FleetMember`` (``_fleet``),
``RedisGuard`` (``_guard``), ``HostPolicy`` (``_host_policy``), ``LocalQueue``
(``_local``), ``StartRegistry`` (``_starts``), ``Refusal`` (``_refusal``) and
``HandBack`` (``_closing``); joining the crawl is ``_joining``. Scrapy's engine
internals are reached only through an ``EnginePort`` (``_engine``), passed to the
constructor; time only through a ``Clock`` (``_clock``). The extensions and the
middlewares get a ``signals.WorkerView``.

The crawl is finished when nothing is queued or in flight fleet-wide, no live
worker still produces start requests, and it ever had work; a worker only reports
no pending requests when that holds and its own buffers are empty.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from typing import TYPE_CHECKING

import redis
from scrapy import signals as scrapy_signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.dupefilters import BaseDupeFilter

from scrapy_redisspine import signals
from scrapy_redisspine._clock import Clock, CrawlClock, Periodic
from scrapy_redisspine._closing import HandBack
from scrapy_redisspine._engine import EngineHooks, EnginePort
from scrapy_redisspine._fleet import FleetMember
from scrapy_redisspine._guard import RedisGuard
from scrapy_redisspine._host_policy import HostPolicy, scrapy_ip_lanes
from scrapy_redisspine._itembox import ItemBox
from scrapy_redisspine._items import ItemClasses
from scrapy_redisspine._joining import (
    REASON_CONFIG,
    REASON_CORRUPT,
    REASON_MEMORY,
    JoinRefused,
    eviction_refused,
    join,
    leave_quietly,
)
from scrapy_redisspine._leasebook import LeaseBook
from scrapy_redisspine._leasing import Leaser
from scrapy_redisspine._local import LocalQueue
from scrapy_redisspine._loop_io import LoopIO
from scrapy_redisspine._outbox import Outbox
from scrapy_redisspine._redis_io import InlineIO, RedisIO, ThreadIO
from scrapy_redisspine._refusal import Refusal
from scrapy_redisspine._seen import ConfirmedSeen
from scrapy_redisspine._settings_compat import notices
from scrapy_redisspine._starts import StartRegistry
from scrapy_redisspine.connection import is_cooperative
from scrapy_redisspine.dedup import DedupConfigError
from scrapy_redisspine.dupefilter import RedisDupeFilter, fleet_dupefilter
from scrapy_redisspine.fingerprints import same_fingerprinter
from scrapy_redisspine.frontier import (
    CorruptKeyError,
    EnqueueResult,
    Heartbeat,
    NewRequest,
)
from scrapy_redisspine.item_codec import ItemCodec
from scrapy_redisspine.request_codec import RequestCodec, RequestEncodeError
from scrapy_redisspine.serialization import get_serializer
from scrapy_redisspine.settings import ConfigError, SpineConfig, known_names, load_config
from scrapy_redisspine.worker import WorkerConnection, new_worker_id

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from scrapy.utils.request import RequestFingerprinterProtocol

    from scrapy_redisspine.sharded import AnyFrontier


#: Longest a scheduler waits for a lease reply from a near Redis (see next_request).
NEAR_WAIT_SECONDS = 0.05

logger = logging.getLogger(__name__)



class Scheduler(BaseScheduler):
    """Distributed scheduler: Scrapy's interface over the parts listed in the module
    docstring. The parts exist from :meth:`open` on."""

    frontier: AnyFrontier
    codec: RequestCodec
    connection: WorkerConnection
    outbox: Outbox
    leaser: Leaser
    fleet: FleetMember
    hosts: HostPolicy
    view: signals.WorkerView
    items: ItemBox | None

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
        self.clock: Clock = clock or CrawlClock()
        self.worker_id = worker_id or new_worker_id()
        self.spider: Spider | None = None
        self.guard = RedisGuard(stats, self.clock.seconds)
        self.book = LeaseBook()
        self.starts = StartRegistry()
        self._remote_dedup = isinstance(dupefilter, RedisDupeFilter)
        #: The crawler's fingerprinter, short-cut (fingerprints.py), with another
        #: DUPEFILTER_CLASS; made at the first request.
        self._fingerprinter: RequestFingerprinterProtocol | None = None
        self._idle_poll = Periodic(
            "idle poll", self._on_idle_poll, config.idle_poll_seconds, self.clock, stats
        )
        self._opened = False
        self.refusal = Refusal(engine, self.clock, stats)
        self._refused_at_open: JoinRefused | None = None

    @classmethod
    def from_crawler(
        cls, crawler: Crawler, engine: EnginePort | None = None, clock: Clock | None = None
    ) -> Scheduler:
        """Scrapy's way in; ``engine`` and ``clock`` replace the crawler's engine and
        the reactor (benchmarks, tests).

        A bad setting is not raised here (Scrapy would print tracebacks): the worker
        refuses to start with one line naming it (see :meth:`open`)."""
        engine = engine or EngineHooks(crawler)
        try:
            for warning, line in notices(crawler.settings, known_names()):
                (logger.warning if warning else logger.info)("redisspine: %s", line)
            config = load_config(crawler.settings)
            dupefilter = fleet_dupefilter(crawler)
        except ConfigError as exc:
            scheduler = cls(load_config({}), BaseDupeFilter(), crawler.stats,
                            crawler=crawler, engine=engine, clock=clock)
            scheduler._refused_at_open = JoinRefused(REASON_CONFIG, str(exc))
            return scheduler
        return cls(config, dupefilter, crawler.stats, crawler=crawler, engine=engine,
                   clock=clock)

    # -- lifecycle ---------------------------------------------------------------

    def open(self, spider: Spider) -> None:
        self.spider = spider
        try:
            if self._refused_at_open is not None:
                raise self._refused_at_open
            joined = join(self.config, self.config.crawl_id or spider.name, spider.name,
                          self.worker_id)
        except JoinRefused as refused:
            self.refusal.refuse(refused.reason, str(refused))
            return
        self.connection, self.frontier = joined.connection, joined.frontier
        self._assemble(spider)
        self.fleet.joined(joined.orders)
        self.hosts.take_over_download_delay(spider)
        try:
            self.hosts.share_lane_limits()
        except redis.RedisError as exc:
            self.guard.failed("lane_limits", exc)
        try:
            if isinstance(self.df, RedisDupeFilter):
                self.df.bind(self.frontier, self.upkeep_io)
            self.df.open()
        except (CorruptKeyError, DedupConfigError) as exc:
            self._refuse_after_join(REASON_CORRUPT if isinstance(exc, CorruptKeyError)
                                    else REASON_CONFIG, str(exc))
            return
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
        # A thread of its own needs the crawl's loop to hand replies back to: tests
        # that drive a scheduler with Twisted's task.Clock call inline.
        # With a plain client and an asyncio loop, the calls park on the loop itself
        # (greenlets: no second thread for a CPU-bound worker to pay for).
        self.io: RedisIO = InlineIO(stats)  # leases, the outbox, buries
        self.upkeep_io: RedisIO = self.io  # heartbeat, sweeps, totals, feed, dedup...
        how = "inline"
        if config.redis_thread and isinstance(clock, CrawlClock):
            loop = clock.asyncio_loop() if config.redis_greenlets else None
            if loop is not None and is_cooperative(self.connection.client):
                how = "greenlets"
                self.io = LoopIO(stats, loop, name="redisspine-redis")
                self.upkeep_io = LoopIO(stats, loop, name="redisspine-upkeep")
            else:
                how = "threads"
                self.io = ThreadIO(stats, clock.thread_caller(), name="redisspine-redis")
                self.upkeep_io = ThreadIO(stats, clock.thread_caller(),
                                          name="redisspine-upkeep")
        stats.set_value("redisspine/redis/calls", how)
        self.codec = RequestCodec(
            spider, get_serializer(config.serializer), config.allowed_request_classes,
            ItemClasses.for_spider(spider, config.allowed_item_classes),
        )
        self.hosts = HostPolicy(
            config, self.frontier, self.guard, self.book, stats,
            ip_lanes=scrapy_ip_lanes(stats) if config.politeness_key == "ip" else None,
            clock=clock, io=self.upkeep_io,
        )
        guard = self.guard
        # Not for a sharded crawl: its shards' servers may restart or fail over
        # unseen by the heartbeat, which asks the crawl-wide keys' server only.
        self.seen = (ConfirmedSeen(config.local_dedup_cache, lambda: guard.era)
                     if config.local_dedup_cache and self._remote_dedup and config.shards == 1
                     else None)
        self.outbox = Outbox(
            self.frontier, self.guard, stats, clock,
            batch_size=config.enqueue_batch_size, cache_size=config.local_request_cache,
            on_sent=self._on_sent, on_duplicate=lambda request: self.df.log(request, spider),
            on_dropped=self._dropped, io=self.io, seen=self.seen,
        )
        self.fleet = FleetMember(
            frontier=self.frontier, guard=self.guard, book=self.book, engine=self.engine,
            stats=stats, clock=clock, heartbeat_seconds=config.heartbeat_seconds,
            worker_timeout_ms=config.worker_timeout_ms, wake=self.wake,
            flush=self.outbox.try_flush, crawl_gone=self._crawl_gone,
            idle_close_ms=config.idle_close_ms,
            wait_for_first_request=config.wait_for_first_request, io=self.upkeep_io,
        )
        self.local = LocalQueue(self.worker_id, stats)
        self.leaser = Leaser(
            frontier=self.frontier, outbox=self.outbox, book=self.book, guard=self.guard,
            codec=self.codec, local=self.local, engine=self.engine, stats=stats, clock=clock,
            batch_size=config.lease_batch_size, idle_poll_seconds=config.idle_poll_seconds,
            counted=self.fleet.counted, crawl_delay_learned=self.hosts.learned_from_lease,
            close_ordered=self.fleet.close_ordered, io=self.io,
            # (a sharded crawl's lease settles its page budget one lease at a time)
            alongside_io=(self.upkeep_io if config.lease_alongside and config.shards == 1
                          and self.upkeep_io is not self.io else None),
        )
        self.hand_back = HandBack(
            frontier=self.frontier, outbox=self.outbox, book=self.book, local=self.local,
            guard=self.guard, stats=stats, config=config,
        )
        self.items = None
        if config.items:
            self.items = ItemBox(
                ItemCodec(self.codec.serializer, self.codec.items, self.codec), self.book,
                self.outbox, guard=self.guard, stats=stats, clock=clock,
                flush_seconds=config.ack_flush_seconds,
            )
        self.guard.on_crawl_gone = lambda status: self._crawl_gone(Heartbeat(status))
        self.guard.on_evicting = self._evicting
        self.view = signals.WorkerView(
            self.worker_id, self.frontier.upkeep, self.guard, self.hosts, self.wake,
            self.starts, self.items, self.fleet.close_ordered, self.upkeep_io,
        )

    def _refuse_after_join(self, reason: str, message: str) -> None:
        with contextlib.suppress(redis.RedisError):
            self.frontier.leave()
        leave_quietly(self.connection)
        self.refusal.refuse(reason, message)

    def _crawl_gone(self, heartbeat: Heartbeat) -> None:
        """The crawl this worker joined is not in Redis any more: nothing it holds can
        be handed back, and "finished" would be a lie."""
        self.fleet.gone = True
        self.refusal.crawl_gone(heartbeat.status, (
            f"this worker held {self.book.ready + self.book.handed_out} leased "
            f"request(s), {len(self.outbox)} request(s) and {self.outbox.acks} ack(s) not "
            f"yet sent"
        ))

    def _evicting(self, policy: str) -> None:
        """A server the crawl lives on may evict its keys (the memory watch: its policy
        was changed since this worker joined): stop, once, never as "finished". What
        this worker holds goes back at close: the crawl is in Redis."""
        if self.refusal.reason is None:
            self.refusal.refuse(REASON_CONFIG,
                                eviction_refused(self.connection.description, policy))
            self.refusal.close_soon()

    def close(self, reason: str) -> None:
        if not self._opened:
            return  # open() refused: nothing was taken, nothing to hand back
        self._opened = False
        if self.crawler is not None:
            self.crawler.signals.send_catch_log(signals.worker_closing, worker=self.view)
        self.fleet.stop()
        self._idle_poll.stop()
        deadline = self.clock.seconds() + 2 * self.config.redis_timeout_seconds + 1
        for io in (self.io, self.upkeep_io):
            if not io.drain(max(deadline - self.clock.seconds(), 0.0)):
                logger.warning("redisspine: Redis did not answer this worker's last calls "
                               "in time; what they carried is reconciled by the fleet's sweep")
                break
        self.io.close()
        self.upkeep_io.close()
        self.outbox.close()
        self.leaser.close()
        start_done = (self.engine is not None and not self.engine.starting()
                      and not self.fleet.start_noted)
        if self.engine is not None:
            self.engine.detach()
        if self.items is not None and (dropped := self.items.clear()):
            # their leases go back: whoever fetches them again produces them again
            self.stats.inc_value("redisspine/items/unacked_dropped", dropped)
        if self.refusal.reason in (None, REASON_MEMORY, REASON_CONFIG):  # the crawl is in Redis
            self.hand_back.hand_back(reason, start_done=start_done)
        else:  # the crawl is gone: any write would start an empty one
            logger.info("redisspine: nothing handed back: the crawl is not in Redis")
        self.df.close(reason)
        leave_quietly(self.connection)

    @property
    def running(self) -> bool:
        """Whether any of the worker's timers still runs."""
        return self._idle_poll.running or (self._opened and self.fleet.running)

    # -- Scrapy's scheduler interface ------------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        if self.refusal.reason is not None:
            return False
        if not self._remote_dedup and not request.dont_filter and self.df.request_seen(request):
            self.df.log(request, self.spider)  # type: ignore[arg-type]
            return False
        is_start = self.starts.is_start(request)
        fingerprint = b""
        if is_start or (self._remote_dedup and not request.dont_filter):
            fingerprint = self._fingerprint(request)
            if not is_start and self.seen is not None and fingerprint in self.seen:
                # Redis said so already: dropped here, as Scrapy's scheduler drops a
                # duplicate (its engine sends request_dropped).
                self.stats.inc_value("redisspine/dedup/local_hits")
                self.df.log(request, self.spider)  # type: ignore[arg-type]
                return False
        try:
            payload = self.codec.encode(request)
        except RequestEncodeError as exc:
            # Not dropped (Scrapy's own scheduler keeps such a request in memory too).
            self.stats.inc_value("redisspine/scheduler/unserializable")
            lane = self.hosts.lane_of(request)  # (by IP, not resolved yet: its name)
            self.local.add(request, self.hosts.lane(request.url) if lane is None else lane,
                           str(exc))
            self.wake()
            return True
        if self.guard.memory_pressure and not (is_start or request.dont_filter):
            self.outbox.shed(request)
            return False
        if is_start and (request.dont_filter or not self._remote_dedup):
            # identical start requests are all fetched (as in Scrapy), each once per crawl
            fingerprint = self.starts.start_key(fingerprint)
        lane = self.hosts.lane_of(request)
        entry = NewRequest(
            payload,
            fingerprint,
            request.priority,
            dont_filter=request.dont_filter or not self._remote_dedup,
            is_start=is_start,
            lane=lane or "",
        )
        if lane is not None:
            self.outbox.add(entry, request, self.config.enqueue_flush_seconds)
        else:
            self._enqueue_when_resolved(entry, request)
        return True

    def _enqueue_when_resolved(self, entry: NewRequest, request: Request) -> None:
        """Lanes by IP, a host not resolved yet: the request waits for its address,
        and acks wait with it (one may be its parent's, see Outbox.hold)."""
        self.outbox.hold()

        def resolved(lane: str) -> None:
            self.outbox.add(dataclasses.replace(entry, lane=lane), request,
                            self.config.enqueue_flush_seconds)
            self.outbox.release_hold()

        self.hosts.lane_later(request, resolved)

    def next_request(self) -> Request | None:
        if self.refusal.reason is not None:
            self.refusal.close_soon()
            return None
        orders = self.fleet.orders
        if orders.drain or orders.close_reason:
            if orders.fetch_leased:  # within the spent page budget: fetched, not returned
                return self._hand_out()
            return None  # unstarted leases go back at close
        self.leaser.asked()
        if not self.book.ready:
            if orders.paused:
                return None
            if (not self.leaser.lease() and self.leaser.in_flight and self.io.near
                    and self.engine is not None and self.engine.starting()):
                # While start requests are still being consumed, a None is taken for an
                # empty scheduler (Scrapy sends scheduler_empty, and a lazy start()
                # yields its next request out of order): wait for a near Redis, which
                # answers within a millisecond or two. After the start, a None costs
                # nothing (the reply wakes the engine) and waiting would hold the loop.
                self.io.drain(NEAR_WAIT_SECONDS)
            if not self.book.ready:
                return None
        request = self._hand_out()
        if (request is not None and self.leaser.background and not orders.paused
                and self.book.ready <= self.leaser.ahead):
            self.leaser.lease()  # the next batch is on its way before it is asked for
        return request

    def _hand_out(self) -> Request | None:
        request = self.book.hand_out()
        if request is not None:
            self.stats.inc_value("scheduler/dequeued/redis")
            self.stats.inc_value("scheduler/dequeued")
        return request

    def has_pending_requests(self) -> bool:
        if self.refusal.reason is not None:
            self.refusal.close_soon()
            return True  # until it closes with its reason, never as "finished"
        # (A lease on its way is no work of its own: whatever it may bring is queued
        # or in flight in Redis, which the count below sees.)
        if not self.outbox.empty or self.book.ready or self.config.keep_alive or len(self.local):
            return True
        if self.fleet.orders.stop_leasing:
            return True  # paused: wait for resume; draining: the heartbeat closes
        if self.guard.down:
            return True  # never finish while Redis cannot tell us the fleet is done
        if self.clock.seconds() - self.fleet.checked_at >= self.config.idle_poll_seconds:
            self.fleet.refresh_counts()
        if self.fleet.pending or self.guard.down:
            return True
        if self.fleet.shed:
            self.refusal.refuse(REASON_MEMORY, (
                f"the crawl ran out of work, but without {self.fleet.shed} newly discovered "
                f"request(s) that workers dropped because Redis had no memory for them "
                f"(redisspine/memory/shed): it is not finished. Raise Redis's maxmemory "
                f"or REDISSPINE_MEMORY_BUDGET_BYTES (or cap hosts with "
                f"REDISSPINE_HOST_BACKLOG_CAP) and crawl again with a fresh crawl id"))
            self.refusal.close_soon()
            return True
        return False

    def __len__(self) -> int:
        """Requests waiting: queued fleet-wide (as of the last heartbeat or lease),
        leased here but not started, and enqueued here but not yet sent."""
        if self.refusal.reason is not None or not self._opened:
            return 0
        return self.fleet.queued + self.book.ready + len(self.outbox) + len(self.local)

    # -- what the parts tell each other ------------------------------------------

    def wake(self) -> None:
        """New work may be in Redis (e.g. requeued by a sweep): lease soon."""
        self.leaser.wake()

    def _on_request_done(self, request: Request) -> None:
        """The engine is done with ``request``: its ack (and the items its callback
        produced) joins the outbox."""
        finished = self.book.finish(request)
        if finished is None:
            return  # not ours: e.g. robots.txt fetched through engine.download()
        self.local.keys.discard(finished.handle[0])
        self.outbox.add_ack(
            finished.handle, self.hosts.rest_ms(finished), self.config.ack_flush_seconds,
            self.items.take(request) if self.items is not None else (),
            sample=(finished.latency_ms, finished.status), ended=finished.received_at,
        )

    def _dropped(self, request: Request) -> None:
        """Redis did not queue a request ``enqueue_request()`` had taken: tell Scrapy,
        as its engine does for a request its scheduler refuses."""
        if self.crawler is not None:
            self.crawler.signals.send_catch_log(
                scrapy_signals.request_dropped, request=request, spider=self.spider
            )

    def _on_sent(self, result: EnqueueResult) -> None:
        if result.throttled:
            self.hosts.throttled(result.throttled)
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
        if self._fingerprinter is None:
            assert self.crawler is not None
            self._fingerprinter = same_fingerprinter(self.crawler.request_fingerprinter)
        return bytes(self._fingerprinter.fingerprint(request))

