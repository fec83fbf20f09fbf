"""Lanes by IP address (``REDISSPINE_POLITENESS_KEY = "ip"``): the meaning of Scrapy's
``CONCURRENT_REQUESTS_PER_IP``, fleet-wide: every hostname that resolves to one
address shares that address's budget (many virtual hosts on one server).

Scrapy-free. A request's lane must be known when it enters the queue, but resolving
a name is asynchronous. So a hostname is resolved once per worker through the
resolver the caller passes (the worker passes Scrapy's installed one, the resolver of
``DNS_RESOLVER``, whose own cache it reads first: ``scrapy.resolver.dnscache``) and
kept here (LRU, ``cache_size`` names); requests of a name not known yet wait for
that one resolution, all of them together, never a DNS query per request. A name
that does not resolve falls back to its own lane (its download then fails as it
would anyway) and is counted. An IP literal is its own lane at once.
"""

from __future__ import annotations

import ipaddress
import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

logger = logging.getLogger(__name__)


class IpLanes:
    """Owns the hostname -> address cache and the resolutions under way.

    Invariant kept: each hostname has at most one resolution under way; every
    callback waiting for it is called exactly once, with an address or the name.
    """

    def __init__(
        self,
        resolve: Callable[[str], Any],
        peek: Callable[[str], str | None] = lambda _: None,
        on_failure: Callable[[str, BaseException], None] | None = None,
        cache_size: int = 10_000,
    ) -> None:
        """``resolve(name)`` returns a Deferred of the address; ``peek(name)`` a cached
        address of the resolver's own, or None."""
        self._resolve = resolve
        self._peek = peek
        self._on_failure = on_failure
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._cache_size = cache_size
        self._waiting: dict[str, list[Callable[[str], None]]] = {}
        self.resolutions = 0  # resolutions started (one per name, not per request)

    def lane(self, hostname: str) -> str | None:
        """The address lane of ``hostname`` if known now, else None (call :meth:`later`)."""
        if hostname in self._cache:
            self._cache.move_to_end(hostname)
            return self._cache[hostname]
        if _is_address(hostname):
            return hostname
        peeked = self._peek(hostname)
        if isinstance(peeked, str) and _is_address(peeked):
            self._keep(hostname, peeked)
            return peeked
        return None

    def later(self, hostname: str, done: Callable[[str], None]) -> None:
        """Call ``done(lane)`` once ``hostname`` is resolved (or failed: its own name)."""
        waiting = self._waiting.get(hostname)
        if waiting is not None:
            waiting.append(done)
            return
        self._waiting[hostname] = [done]
        self.resolutions += 1
        try:
            deferred = self._resolve(hostname)
        except Exception as exc:  # a resolver that raises at once fails like a late one
            self._failed(exc, hostname)
            return
        deferred.addCallbacks(self._resolved, self._failed, callbackArgs=(hostname,),
                              errbackArgs=(hostname,))

    def _resolved(self, address: Any, hostname: str) -> None:
        lane = str(address) if _is_address(str(address)) else hostname
        if lane != hostname:
            self._keep(hostname, lane)
        self._wake(hostname, lane)

    def _failed(self, failure: Any, hostname: str) -> None:
        error = getattr(failure, "value", failure)
        logger.warning("redisspine: %s does not resolve (%s): its requests take the "
                       "lane of its name", hostname, error)
        if self._on_failure is not None:
            self._on_failure(hostname, error)
        self._wake(hostname, hostname)

    def _wake(self, hostname: str, lane: str) -> None:
        for done in self._waiting.pop(hostname, []):
            try:
                done(lane)
            except Exception as exc:  # one caller's bug must not strand the others
                logger.error("redisspine: a request waiting for %s's address failed: %s: %s",
                             hostname, type(exc).__name__, exc)
                if self._on_failure is not None:
                    self._on_failure(hostname, exc)

    def _keep(self, hostname: str, address: str) -> None:
        self._cache[hostname] = address
        self._cache.move_to_end(hostname)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
