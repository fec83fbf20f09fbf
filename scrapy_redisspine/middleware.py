"""Downloader middleware: what a response says about its host, told to the fleet.

- A 429 or 503 with ``Retry-After`` blocks the host fleet-wide until then (capped by
  ``REDISSPINE_MAX_RETRY_AFTER_SECONDS``), instead of every worker retrying on its own:
  the block travels with the ack of the request that got the answer.
- A robots.txt ``Crawl-delay`` (Scrapy's ``robots_parsed`` signal, Scrapy 2.14 and
  later, with ``ROBOTSTXT_OBEY``) is learned once per host and shared through Redis.
- The time a response came in travels with its request's ack: the lane's rest counts
  from the end of the fetch, not from the ack after the callback and the item
  pipeline (``scripts/enqueue.lua``).
- With ``AUTOTHROTTLE_ENABLED``, a response's download latency (Scrapy's
  ``download_latency`` meta) and status travel with its request's ack, which moves its
  lane's delay fleet-wide (Scrapy's AutoThrottle rule, ``scripts/lib/throttle.lua``);
  ``autothrottle_dont_adjust_delay`` in meta keeps a response out, as in Scrapy.

In-flight state itself is not written here: the lease script records a request in
the in-flight HASH in the same atomic step that takes it off the queue, which no
middleware call could match (it would add a round trip and a window for loss).
"""

from __future__ import annotations

import datetime
import email.utils
import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import signals as scrapy_signals

from scrapy_redisspine import signals
from scrapy_redisspine._components import component_config

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response

    from scrapy_redisspine.settings import SpineConfig


logger = logging.getLogger(__name__)

_RETRY_AFTER_STATUSES = (429, 503)


def parse_retry_after(value: bytes | str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP date)."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if text.isascii() and text.isdigit():
        return float(text)
    try:
        moment = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError):
        return None
    if moment.tzinfo is None:  # "-0000" or no zone: an HTTP date is always GMT
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return max(moment.timestamp() - (time.time() if now is None else now), 0.0)


class Politeness:
    """Feeds Retry-After and Crawl-delay into the fleet's per-host schedule."""

    def __init__(self, config: SpineConfig, user_agent: str = "*") -> None:
        self.config = config
        self.user_agent = user_agent
        self.worker: signals.WorkerView | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Politeness:
        middleware = cls(component_config(crawler),
                         crawler.settings.get("ROBOTSTXT_USER_AGENT")
                         or crawler.settings.get("USER_AGENT") or "*")
        crawler.signals.connect(middleware.worker_opened, signal=signals.worker_opened)
        robots_parsed = getattr(scrapy_signals, "robots_parsed", None)
        if robots_parsed is not None:  # sent since Scrapy 2.14
            crawler.signals.connect(middleware.robots_parsed, signal=robots_parsed)
        elif crawler.settings.getbool("ROBOTSTXT_OBEY"):
            logger.warning(
                "redisspine: this Scrapy has no robots_parsed signal (Scrapy >= 2.14 has): "
                "robots.txt Crawl-delay is not applied fleet-wide"
            )
        return middleware

    def worker_opened(self, worker: signals.WorkerView) -> None:
        self.worker = worker

    def process_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:  # Scrapy < 2.14 also passes spider=
        if self.worker is not None:
            self.worker.hosts.received(request)
        if self.config.autothrottle is not None and self.worker is not None:
            latency = request.meta.get("download_latency")
            if isinstance(latency, int | float) and (
                request.meta.get("autothrottle_dont_adjust_delay", False) is not True
            ):
                self.worker.hosts.observe(request, float(latency), response.status)
        if response.status in _RETRY_AFTER_STATUSES and self.worker is not None:
            seconds = parse_retry_after(response.headers.get(b"Retry-After"))
            if seconds is not None:
                capped = min(seconds, self.config.max_retry_after_seconds)
                self.worker.hosts.block_host(request, capped)
                logger.info(
                    "redisspine: %s answered %d with Retry-After %.0f s: host blocked "
                    "fleet-wide for %.0f s", request.url, response.status, seconds, capped,
                )
        return response

    def robots_parsed(self, robotparser: Any, request: Request, **_: Any) -> None:
        if self.worker is None:
            return
        try:
            delay = robotparser.crawl_delay(self.user_agent)
        except Exception:  # a parser that cannot answer means no Crawl-delay
            delay = None
        if delay:
            self.worker.hosts.learn_crawl_delay(request.url, float(delay))
