"""Which politeness lane a URL belongs to, and how long its host must rest.

Scrapy-free. A lane is the unit the fleet throttles: the exact hostname by default,
its IP address (``ip``: see ``ip_lanes``), or the registered domain
(``a.example.co.uk`` and ``b.example.co.uk`` share ``example.co.uk``) using
tldextract's bundled public-suffix snapshot, never a network fetch. URLs without a
host (``data:``, ``file:``) share one lane, ``""``, that is never delayed, so they
can never wedge a real host.
"""

from __future__ import annotations

import random
import re
import socket
from functools import lru_cache
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

NO_HOST_LANE = ""


@lru_cache(maxsize=1)
def _extractor() -> Callable[[str], object]:
    import tldextract

    # No suffix-list URLs and no cache dir: the snapshot bundled with tldextract is
    # used, and nothing is downloaded at run time.
    return tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)  # type: ignore[no-any-return]


def _registered_domain(hostname: str) -> str:
    result = _extractor()(hostname)
    domain = getattr(result, "top_domain_under_public_suffix", None)
    if domain is None:  # tldextract < 5.3
        domain = getattr(result, "registered_domain", "")
    return str(domain) or hostname  # IP addresses and bare names stay themselves


@lru_cache(maxsize=65_536)
def _system_address(hostname: str) -> str:
    try:
        return socket.gethostbyname(hostname)
    except (OSError, UnicodeError):
        return hostname  # its download fails as it would anyway


def make_lane_function(mode: str) -> Callable[[str], str]:
    """A URL -> lane function for ``REDISSPINE_POLITENESS_KEY`` (host, domain or ip).

    Called for every request: hostnames (few) are cached, URLs (nearly all
    different) are not. With ``ip`` this function resolves a name with the system
    resolver, blocking, once per name: it serves tools (``redisspine seed``, push);
    workers resolve through Scrapy's resolver without blocking (``ip_lanes``)."""
    domain_of = lru_cache(maxsize=65_536)(_registered_domain)
    key_of = {"domain": domain_of, "ip": _system_address}.get(mode)

    def lane(url: str) -> str:
        hostname = url_hostname(url)
        if not hostname:
            return NO_HOST_LANE
        return key_of(hostname) if key_of is not None else hostname

    return lane


#: ``scheme://host[:port]`` then a path, query, fragment or the end, with a plain
#: ASCII host (no userinfo, no IPv6 literal, nothing urlsplit would strip): most URLs
#: of a crawl. Its host is urlsplit's hostname, read without splitting the whole URL.
_PLAIN_HOST = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://([A-Za-z0-9._-]+)(?::[0-9]*)?(?=[/?#]|$)")


def url_hostname(url: str) -> str | None:
    """``urlsplit(url).hostname`` (None for a URL urlsplit refuses): the politeness
    key of every request a worker enqueues, so the common form skips the split."""
    match = _PLAIN_HOST.match(url)
    if match is not None:
        return match.group(1).lower()
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


class DelayPolicy:
    """The rest a lane needs after each fetch, in milliseconds.

    Default from ``DOWNLOAD_DELAY``; per-lane overrides by setting; a robots.txt
    ``Crawl-delay`` learned by any worker (capped) raises it. A jitter j (Scrapy's
    ``DOWNLOAD_DELAY_JITTER``, or 0.5 for ``RANDOMIZE_DOWNLOAD_DELAY``) spreads it
    over 1 to 1+j times: unlike Scrapy's 1-j to 1+j, the fleet never rests a host for
    less than the delay it promised.
    """

    def __init__(
        self,
        default_seconds: float,
        overrides: Mapping[str, float] | None = None,
        jitter: float = 0.5,
        max_crawl_delay_seconds: float = 60.0,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self.default_seconds = default_seconds
        self.overrides = dict(overrides or {})
        self.jitter = jitter
        self.max_crawl_delay_seconds = max_crawl_delay_seconds
        self._learned: dict[str, float] = {}
        self._rng = rng

    def learn(self, lane: str, crawl_delay_seconds: float) -> float:
        """Record a robots.txt Crawl-delay; return the capped value kept."""
        delay = min(max(crawl_delay_seconds, 0.0), self.max_crawl_delay_seconds)
        self._learned[lane] = delay
        return delay

    def knows(self, lane: str) -> bool:
        return lane in self._learned

    def base_seconds(self, lane: str) -> float:
        if lane == NO_HOST_LANE:
            return 0.0
        base = self.overrides.get(lane, self.default_seconds)
        return max(base, self._learned.get(lane, 0.0))

    def next_delay_ms(self, lane: str) -> int:
        seconds = self.base_seconds(lane)
        if self.jitter and seconds:
            seconds *= 1.0 + self.jitter * self._rng()
        return int(seconds * 1000)
