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

from scrapy_redisspine import signals
from scrapy_redisspine._engine import EngineHooks
from scrapy_redisspine.control import Orders, close_spider, read_orders
from scrapy_redisspine.dupefilter import RedisDupeFilter
from scrapy_redisspine.frontier import (
    Ack,
    EnqueueResult,
    Frontier,
    Lease,
    LeaseBatch,
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

logger = logging.getLogger(__name__)

_CLOSE_ATTEMPTS = 5
#: (order key, token, rest of its lane in ms, time.monotonic() when the request was done)
_PendingAck = tuple[str, str, int, float]
_SHED_LOG_INTERVAL_SECONDS = 60.0


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
        self._acks: list[_PendingAck] = []
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

    def _take_over_download_delay(self, spider: Spider) -> None:
        """The fleet enforces DOWNLOAD_DELAY per lane; Scrapy's per-process delay
        would add on top, so it is switched off for this spider."""
        own = getattr(spider, "download_delay", None)
        if own is not None:  # a spider attribute wins over the setting, as in Scrapy
            self.delays.default_seconds = float(own)
        if self.delays.default_seconds or self.delays.overrides:
            logger.info(
                "redisspine: download delay %.2f s (overrides: %d) enforced fleet-wide per %s, "
                "from the end of each fetch; Scrapy's per-process delay set to 0",
                self.delays.default_seconds, len(self.delays.overrides),
                self.config.politeness_key,
            )
        spider.download_delay = 0  # type: ignore[attr-defined]

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

    def _lease(self) -> bool:
        """Fill the ready list in one round trip (which also carries the outbox and
        the acks); False if nothing was leased."""
        assert self.frontier is not None
        now = time.monotonic()
        # Engine wake-ups (each enqueue, each finished download) may come far more
        # often than work appears; after an empty lease, wait for the idle poll,
        # unless there is something to send (an ack frees a lane, a request fills one).
        sending = bool(self._outbox or self._acks)
        if not sending and now - self._last_empty_lease < self.config.idle_poll_seconds / 2:
            return False
        free = self._hooks.free_download_slots() if self._hooks else 1
        count = max(1, min(free, self.config.lease_batch_size))
        while not self._ready and self.health.available():
            try:
                if self._reconcile_leases:
                    self._release_orphans()
                batch = self._send_and_lease(count)
            except redis.RedisError as exc:
                self._redis_failed("lease", exc)
                return False
            if batch is None:
                return False
            self.health.succeeded()
            self._set_fleet_counts(batch.queued, batch.inflight, now)
            self._wake_when_due(batch.wait_ms)
            self._report_malformed(batch.malformed)
            if not batch.leases and not batch.malformed:
                self._last_empty_lease = now
                return False
            self.stats.inc_value("redisspine/scheduler/leased", len(batch.leases))
            for lease in batch.leases:
                self._accept(lease)
            # Loop only when everything leased was dead-lettered and work remains.
            if not batch.queued:
                break
        return bool(self._ready)

    def _send_and_lease(self, count: int) -> LeaseBatch | None:
        """Lease, sending the outbox and acks first in the same round trip.

        None when the send failed and nothing was leased (the buffers are kept)."""
        assert self.frontier is not None
        if not self._outbox and not self._acks:
            return self.frontier.lease(count)
        outbox, acks = self._outbox, self._acks
        sent, batch = self.frontier.enqueue_and_lease(
            [entry for entry, _ in outbox], _ack_args(acks), count
        )
        if isinstance(sent, redis.RedisError):
            self._send_failed(sent)
            if not batch.leases and not batch.malformed:
                return None
        else:
            self._sent(outbox, len(acks), sent)
        return batch

    def _release_orphans(self) -> None:
        assert self.frontier is not None
        known = [key for _, (key, _) in self._ready]
        known += [key for key, _ in self._handed_out.values()]
        known += [ack[0] for ack in self._acks]
        released = self.frontier.release_orphans(known)
        self._reconcile_leases = False
        if released:
            logger.warning(
                "redisspine: returned %d lease(s) this worker did not hold (a lease reply "
                "or an ack lost in the outage)",
                released,
            )

    def _report_malformed(self, malformed: int) -> None:
        if malformed:
            assert self.frontier is not None
            logger.error(
                "redisspine: %d malformed member(s) of %s (not written by this plugin) "
                "moved to dead letters in %s", malformed, self.frontier.keys.queue,
                self.frontier.keys.dead,
            )
            self.stats.inc_value("redisspine/scheduler/malformed", malformed)

    def _accept(self, lease: Lease) -> None:
        assert self.codec is not None
        assert self.frontier is not None
        handle = lease.handle
        try:
            request = self._local.pop(lease.payload, None)
            if request is None:
                request = self.codec.decode(lease.payload)
        except Exception as exc:  # RequestDecodeError, or anything a bad payload triggers
            reason = f"undecodable request: {exc}"
            logger.error("redisspine: lease %s moved to dead letters: %s", handle[0], reason)
            self.stats.inc_value("redisspine/scheduler/undecodable")
            try:
                self.frontier.bury(handle, reason)
            except redis.RedisError as exc:  # the lease stays in flight: a sweep returns it
                self._redis_failed("bury", exc)
            return
        if lease.requeues:
            request.meta["redisspine_requeues"] = lease.requeues
            self.stats.inc_value("redisspine/scheduler/leased_requeued")
        if lease.crawl_delay is not None and not self.delays.knows(lease.lane):
            self.delays.learn(lease.lane, lease.crawl_delay)
        self._lanes[lease.key] = lease.lane
        self._ready.append((request, handle))

    def _on_request_done(self, request: Request) -> None:
        handle = self._handed_out.pop(request, None)
        if handle is None:
            return  # not ours: e.g. robots.txt fetched through engine.download()
        key, token = handle
        lane = self._lanes.pop(key, "")
        rest_ms = max(self.delays.next_delay_ms(lane), self._blocks.pop(key, 0))
        self._acks.append((key, token, rest_ms, time.monotonic()))
        self._flush_soon(self.config.ack_flush_seconds)

    def block_host(self, request: Request, seconds: float) -> None:
        """A Retry-After answer: the lane rests this long after the request's ack."""
        handle = self._handed_out.get(request)
        if handle is not None:
            self._blocks[handle[0]] = int(seconds * 1000)
            self.stats.inc_value("redisspine/politeness/retry_after")

    def learn_crawl_delay(self, url: str, seconds: float) -> None:
        """A robots.txt Crawl-delay: used here at once, shared through Redis."""
        lane = self._lane(url)
        if not lane or self.delays.knows(lane):
            return
        kept = self.delays.learn(lane, seconds)
        self.stats.inc_value("redisspine/politeness/crawl_delays_learned")
        logger.info(
            "redisspine: %s asks for Crawl-delay %.1f s (kept: %.1f s)", lane, seconds, kept
        )
        if self.frontier is not None and self.health.available():
            try:
                self.frontier.set_crawl_delay(lane, kept)
            except redis.RedisError as exc:
                self._redis_failed("crawl_delay", exc)

    def _wake_when_due(self, wait_ms: int) -> None:
        """Sleep exactly until the next lane is due rather than a whole poll period."""
        if wait_ms < 0 or wait_ms / 1000 >= self.config.idle_poll_seconds:
            return
        if self._wake_call is not None and self._wake_call.active():
            return
        from twisted.internet import reactor

        self._wake_call = reactor.callLater(wait_ms / 1000, self.wake)  # type: ignore[attr-defined,arg-type,call-arg,unused-ignore]

    def _shed(self, request: Request) -> None:
        self.stats.inc_value("redisspine/memory/shed")
        now = time.monotonic()
        if now - self._last_shed_log > _SHED_LOG_INTERVAL_SECONDS:
            self._last_shed_log = now
            logger.warning(
                "redisspine: Redis is near its memory budget: not queueing newly discovered "
                "requests such as %s (start requests, retries and redirects still go in); "
                "see redisspine/memory/shed", request,
            )

    def _flush_soon(self, within: float) -> None:
        """Send the buffers now if full, else within ``within`` seconds at the latest
        (the next lease usually carries them sooner)."""
        if len(self._outbox) + len(self._acks) >= self.config.enqueue_batch_size or within <= 0:
            self._try_flush()
            return
        due = time.monotonic() + within
        call = self._flush_call
        if call is not None and call.active():
            if self._flush_due <= due:
                return  # called per request: this check must stay cheap
            call.cancel()
        from twisted.internet import reactor

        clock: Any = reactor
        self._flush_due = due
        self._flush_call = clock.callLater(within, self._try_flush)

    def _try_flush(self) -> bool:
        if not self._outbox and not self._acks:
            return True
        if not self.health.available():
            return False
        try:
            self._flush()
        except redis.RedisError as exc:
            self._send_failed(exc)
            return False
        self.health.succeeded()
        return True

    def _send_failed(self, exc: redis.RedisError) -> None:
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            self._shed_outbox()
        self._redis_failed("enqueue", exc)

    def _redis_failed(self, operation: str, exc: Exception) -> None:
        """A full Redis is not a down Redis: shed load, but keep calling it."""
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            self.stats.inc_value(f"redisspine/memory/oom/{operation}")
            if not self.memory_pressure:
                logger.warning(
                    "redisspine: Redis refused a write for lack of memory (%s): no longer "
                    "queueing newly discovered requests until it has room again", operation,
                )
            self.memory_pressure = True  # the recovery sweep clears it below 80 %
            return
        # After any failure, Redis and this worker may disagree on its leases: a reply
        # lost after Redis ran a lease, or a restart that lost the last writes (acks
        # included). The next lease first returns leases this worker does not hold.
        self._reconcile_leases = True
        self.health.failed(operation, exc)

    def _shed_outbox(self) -> None:
        """Redis refused writes (OOM): keep work in progress, drop new discoveries."""
        kept: list[tuple[NewRequest, Request]] = []
        for entry, request in self._outbox:
            if entry.is_start or request.dont_filter:
                kept.append((entry, request))
            else:
                self._shed(request)
        self._outbox = kept

    def _flush(self) -> None:
        """Send the outbox and pending acks in one atomic round trip."""
        if not self._outbox and not self._acks:
            return
        assert self.frontier is not None
        outbox, acks = self._outbox, self._acks
        result = self.frontier.enqueue([entry for entry, _ in outbox], _ack_args(acks))
        self._sent(outbox, len(acks), result)

    def _sent(
        self, outbox: list[tuple[NewRequest, Request]], acks: int, result: EnqueueResult
    ) -> None:
        """Redis took the outbox and ``acks`` acks: empty the buffers, count."""
        self._outbox = self._outbox[len(outbox):]  # new lists: `outbox` is read below
        self._acks = self._acks[acks:]
        self._record_enqueued(outbox, result.statuses, result.acked, acks)
        self._fleet_pending = True
        self._last_empty_lease = 0.0
        if result.enqueued and self._hooks is not None:
            self._hooks.wake()

    def _record_enqueued(
        self, outbox: list[tuple[NewRequest, Request]], statuses: str, acked: int, sent: int
    ) -> None:
        stats = self.stats
        cache = self.config.local_request_cache
        for (entry, request), status in zip(outbox, statuses, strict=False):
            if status == "+":
                stats.inc_value("scheduler/enqueued/redis")
                stats.inc_value("scheduler/enqueued")
                if cache:
                    self._keep_local(entry.payload, request, cache)
            elif status == "d":
                self.df.log(request, self.spider)  # type: ignore[arg-type]
            elif status == "c":
                stats.inc_value("redisspine/scheduler/backlog_capped")
            else:
                stats.inc_value("redisspine/scheduler/start_requests_skipped")
        if sent:
            stats.inc_value("redisspine/scheduler/acked", acked)
        if acked < sent:
            stats.inc_value("redisspine/scheduler/ack_refused", sent - acked)
            logger.warning("redisspine: %d ack(s) refused: lease no longer ours", sent - acked)

    def _keep_local(self, payload: bytes, request: Request, cache: int) -> None:
        local = self._local
        local[payload] = request
        if len(local) > cache:
            del local[next(iter(local))]  # the oldest

    def _refresh_fleet_counts(self) -> None:
        assert self.frontier is not None
        if (self._outbox or self._acks) and not self._try_flush():
            return
        if not self.health.available():
            return
        try:
            queued, inflight = self.frontier.counts()
        except redis.RedisError as exc:
            self._redis_failed("count", exc)
            return
        self.health.succeeded()
        self._set_fleet_counts(queued, inflight, time.monotonic())

    def _set_fleet_counts(self, queued: int, inflight: int, now: float) -> None:
        self._fleet_pending = queued + inflight > 0
        self._fleet_checked_at = now

    def _start_timer(self, function: Any, interval: float) -> None:
        timer = task.LoopingCall(function)
        timer.start(interval, now=False)
        self._timers.append(timer)

    def _on_heartbeat(self) -> None:
        assert self.frontier is not None
        if not self.health.available():
            return
        try:
            known = self.frontier.heartbeat(int(self.config.worker_timeout_seconds * 1000))
        except redis.RedisError as exc:
            self._redis_failed("heartbeat", exc)
            return
        self.health.succeeded()
        if not known:
            self._fenced()
        self._follow_orders()

    def _follow_orders(self) -> None:
        assert self.frontier is not None
        try:
            orders = read_orders(self.frontier.client, self.frontier.keys)
        except redis.RedisError as exc:
            self._redis_failed("control", exc)
            return
        if orders != self.orders:
            logger.info("redisspine: fleet orders now %s", orders)
            if not orders.stop_leasing:
                self.wake()
        self.orders = orders
        idle = not self._handed_out and not self._drain_closing
        if orders.drain and idle and self.crawler is not None:
            self._drain_closing = True
            logger.info("redisspine: draining: nothing in progress, closing")
            close_spider(self.crawler, "drained")

    def _fenced(self) -> None:
        """Another worker's sweep took this one for dead and requeued its leases."""
        self.stats.inc_value("redisspine/scheduler/presumed_dead")
        logger.warning(
            "redisspine: this worker was presumed dead (no heartbeat for over %.0f s) and "
            "its leases were requeued; dropping %d unstarted lease(s), acks of the "
            "requests in progress will be refused", self.config.worker_timeout_seconds,
            len(self._ready),
        )
        # Leases taken after the sweep are still valid: hand them back (release is
        # fenced, so the ones the sweep already requeued are refused).
        handles = [handle for _, handle in self._ready]
        self._ready.clear()
        for key, _ in handles:
            self._lanes.pop(key, None)
        if handles and self.frontier is not None:
            try:
                self.frontier.release(handles)
            except redis.RedisError as exc:
                self._redis_failed("release", exc)

    def wake(self) -> None:
        """New work may be in Redis (e.g. requeued by a sweep): lease soon."""
        self._last_empty_lease = 0.0
        if self._hooks is not None:
            self._hooks.wake()

    def _on_idle_poll(self) -> None:
        if self._outbox or self._acks:
            self._try_flush()
        if not self._ready and self._hooks is not None:
            self._hooks.wake()


def _ack_args(acks: list[_PendingAck], now: float | None = None) -> list[Ack]:
    """Acks as sent: a lane's rest counts from the end of its fetch, so the time an
    ack waited in the buffer comes off it (less 1 ms, what Redis's ms clock may
    lose to rounding: a rest is never cut short)."""
    now = time.monotonic() if now is None else now
    return [
        (key, token, rest_ms - min(rest_ms, max(0, int((now - done) * 1000) - 1)))
        for key, token, rest_ms, done in acks
    ]


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
