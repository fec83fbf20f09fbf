"""What one worker knows about its hosts' politeness: lanes, delays, blocks.

The fleet enforces a lane's rest in Redis (``scripts/lib/lanes.lua``); this policy
decides which lane a request is in and how long its lane rests after it
(``DelayPolicy``), and carries what responses say about their host (called by
``middleware.Politeness`` through the worker's view): a Retry-After block travels
with the ack of the request that got it, a robots.txt Crawl-delay is used here at
once and shared through Redis.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy_redisspine._clock import CrawlClock
from scrapy_redisspine._redis_io import InlineIO, reported
from scrapy_redisspine.politeness import DelayPolicy, make_lane_function

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy import Request, Spider
    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._clock import Clock
    from scrapy_redisspine._guard import RedisGuard
    from scrapy_redisspine._leasebook import Finished, LeaseBook
    from scrapy_redisspine._redis_io import RedisIO
    from scrapy_redisspine._results import Throttled
    from scrapy_redisspine.ip_lanes import IpLanes
    from scrapy_redisspine.settings import SpineConfig
    from scrapy_redisspine.sharded import AnyFrontier

logger = logging.getLogger("scrapy_redisspine.scheduler")


class HostPolicy:
    """Owns the lane function and the delay policy (defaults, overrides, learned
    Crawl-delays); writes Retry-After blocks into the lease book."""

    def __init__(
        self,
        config: SpineConfig,
        frontier: AnyFrontier,
        guard: RedisGuard,
        book: LeaseBook,
        stats: StatsCollector,
        *,
        ip_lanes: IpLanes | None = None,
        clock: Clock | None = None,
        io: RedisIO | None = None,
    ) -> None:
        """``ip_lanes`` (with ``REDISSPINE_POLITENESS_KEY = "ip"``) maps hostnames to
        their addresses without blocking; without it "ip" resolves as tools do.
        ``clock``: the outbox's (a response's arrival is compared with its ack's
        send time); a :class:`CrawlClock` if none. ``io``: where the Crawl-delay
        writes run (the worker's upkeep thread; at once if none)."""
        self._clock: Clock = clock if clock is not None else CrawlClock()
        self._io: RedisIO = io or InlineIO(stats)
        self.politeness_key = config.politeness_key
        by_address = config.politeness_key == "ip" and ip_lanes is not None
        self._ip_lanes = ip_lanes if by_address else None
        self.lane = make_lane_function("host" if by_address else config.politeness_key)
        # Scrapy's DOWNLOAD_SLOTS name lanes (hosts, or meta["download_slot"] values);
        # REDISSPINE_HOST_DELAYS wins where both give a lane's delay.
        slot_delays = {slot: delay for slot, _, delay in config.download_slots if delay >= 0}
        self.delays = DelayPolicy(
            config.download_delay, {**slot_delays, **dict(config.host_delays)},
            config.download_delay_jitter, config.max_crawl_delay_seconds,
        )
        self.lane_limits = {slot: limit for slot, limit, _ in config.download_slots if limit}
        self.throttle_debug = config.autothrottle is not None and config.autothrottle.debug
        self._frontier = frontier
        self._guard = guard
        self._book = book
        self._stats = stats

    def lane_of(self, request: Request) -> str | None:
        """A request's politeness lane: its ``meta["download_slot"]`` if it has one
        (Scrapy's own way to share a slot), else its host (or domain, or address).
        None: its host's address is not known yet (:meth:`lane_later`)."""
        slot = request.meta.get("download_slot")
        if isinstance(slot, str) and slot:
            return slot.replace("\0", "?")  # NUL ends a lane in a queue member
        return self._url_lane(request.url)

    def _url_lane(self, url: str) -> str | None:
        lane = self.lane(url)
        if self._ip_lanes is None or not lane:
            return lane
        return self._ip_lanes.lane(lane)

    def lane_later(self, request: Request, done: Callable[[str], None]) -> None:
        """``done(lane)`` once the request's host is resolved (lanes by IP)."""
        assert self._ip_lanes is not None, "only lanes by IP wait for a lane"
        self._ip_lanes.later(self.lane(request.url), done)


    def share_lane_limits(self) -> None:
        """Tell the fleet the lanes that have a concurrency of their own."""
        if self.lane_limits:
            self._frontier.set_lane_limits(self.lane_limits)

    def take_over_download_delay(self, spider: Spider) -> None:
        """The fleet enforces DOWNLOAD_DELAY per lane; Scrapy's per-process delay
        would add on top, so it is switched off for this spider."""
        own = getattr(spider, "download_delay", None)
        if own is not None:  # a spider attribute wins over the setting, as in Scrapy
            self.delays.default_seconds = float(own)
        if self.delays.default_seconds or self.delays.overrides:
            logger.info(
                "redisspine: download delay %.2f s (overrides: %d) enforced fleet-wide per %s, "
                "from the end of each fetch; Scrapy's per-process delay set to 0",
                self.delays.default_seconds, len(self.delays.overrides), self.politeness_key,
            )
        spider.download_delay = 0  # type: ignore[attr-defined]

    def rest_ms(self, finished: Finished) -> int:
        """How long a finished request's lane rests: its delay, or its block."""
        return max(self.delays.next_delay_ms(finished.lane), finished.block_ms)

    def block_host(self, request: Request, seconds: float) -> None:
        """A Retry-After answer: the lane rests this long after the request's ack."""
        if self._book.block(request, int(seconds * 1000)):
            self._stats.inc_value("redisspine/politeness/retry_after")

    def received(self, request: Request) -> None:
        """A response came in: the fetch ended now, and its lane's rest counts from
        here, not from the ack that follows the callback (scripts/enqueue.lua)."""
        self._book.received(request, self._clock.seconds())

    def observe(self, request: Request, latency_seconds: float, status: int) -> None:
        """A response's download latency: its ack carries it to the lane's fleet-wide
        AutoThrottle delay (``scripts/lib/throttle.lua``)."""
        self._book.sample(request, max(int(latency_seconds * 1000), 0), status)

    def throttled(self, steps: Sequence[Throttled]) -> None:
        """AUTOTHROTTLE_DEBUG: one line per step of a lane's fleet-wide delay, in the
        shape of Scrapy's own AutoThrottle lines."""
        if not self.throttle_debug:
            return
        for step in steps:
            logger.info(
                "redisspine autothrottle: lane: %s | delay:%5d ms (%+d) | latency:%5d ms | "
                "status: %d (fleet-wide)", step.lane, step.new_ms, step.new_ms - step.old_ms,
                step.latency_ms, step.status,
            )

    def learn_crawl_delay(self, url: str, seconds: float) -> None:
        """A robots.txt Crawl-delay: used here at once, shared through Redis."""
        lane = self._url_lane(url)
        if not lane or self.delays.knows(lane):
            return  # (by IP: a host not resolved yet learns it from its next robots.txt)
        kept = self.delays.learn(lane, seconds)
        self._stats.inc_value("redisspine/politeness/crawl_delays_learned")
        logger.info(
            "redisspine: %s asks for Crawl-delay %.1f s (kept: %.1f s)", lane, seconds, kept
        )
        if self._guard.available() and not self._guard.crawl_gone:
            frontier = self._frontier
            self._io.submit("crawl_delay", lambda: frontier.set_crawl_delay(lane, kept),
                            lambda reply: None, reported(self._guard, "crawl_delay"))

    def learned_from_lease(self, lane: str, crawl_delay: float | None) -> None:
        """A lease told this lane's Crawl-delay, learned by another worker."""
        if crawl_delay is not None and not self.delays.knows(lane):
            self.delays.learn(lane, crawl_delay)


def scrapy_ip_lanes(stats: StatsCollector) -> IpLanes:
    """Lanes by IP through Scrapy's resolver: the one ``DNS_RESOLVER`` installed on the
    reactor (so a project's own resolver decides, as for its downloads), read from
    Scrapy's DNS cache first. Failures are counted (IpLanes logs them)."""
    from scrapy.resolver import dnscache
    from twisted.internet import reactor

    from scrapy_redisspine.ip_lanes import IpLanes

    def peek(hostname: str) -> str | None:
        cached = dnscache.get(hostname)
        return cached if isinstance(cached, str) else None

    def failed(hostname: str, error: BaseException) -> None:
        del hostname, error
        stats.inc_value("redisspine/politeness/ip_unresolved")

    def resolve(hostname: str) -> Any:
        return reactor.resolve(hostname)  # type: ignore[arg-type]

    return IpLanes(resolve, peek, failed)
