"""Which requests are start requests: by where they came from, not by a meta flag.

A crawl takes each start request once, however many workers run ``start()`` (a
worker that joins or restarts mid-crawl must not inject them again): the enqueue
script keeps a ``starts`` SET. A request is a start request when the spider's
``start()`` yielded this very object (``startmw.StartRequests`` notes each one
here). Scrapy's ``meta["is_start_request"]`` is no proof: the retry and redirect
middlewares copy meta into the new requests they make, and those must be fetched.

Start requests with ``dont_filter=True`` that are identical are all fetched, as in
Scrapy: the k-th identical one of a worker's ``start()`` is taken once per crawl
as "the k-th", so N workers yielding the same list still put each in once.

Without the middleware (the scheduler set by hand, without the add-on), the meta
flag is all there is, and retries of start requests are dropped: the scheduler
says so once.
"""

from __future__ import annotations

import logging
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy import Request

logger = logging.getLogger("scrapy_redisspine.scheduler")


class StartRegistry:
    """Owns the set of start requests not yet enqueued (weakly: a request that is
    dropped is forgotten with it) and the count of identical ones seen so far."""

    def __init__(self) -> None:
        self.attached = False  # a middleware notes start requests
        self._warned = False
        self._pending: weakref.WeakSet[Request] = weakref.WeakSet()
        self._seen: dict[bytes, int] = {}  # fingerprint -> occurrences so far

    def attach(self) -> None:
        self.attached = True

    def note(self, request: Request) -> None:
        """The spider's ``start()`` yielded ``request``."""
        self._pending.add(request)

    def is_start(self, request: Request) -> bool:
        """Did ``start()`` yield this request (once: a request enqueued again, e.g.
        after a failed download, is no start request any more)?"""
        if not self.attached:
            flagged = bool(request.meta.get("is_start_request"))
            if flagged and not self._warned:
                self._warned = True
                logger.warning(
                    "redisspine: the spider middleware scrapy_redisspine.startmw.StartRequests "
                    "is not enabled (the add-on enables it): start requests are known by "
                    "their meta only, so retries and redirects of start requests are "
                    "dropped. Use ADDONS = {\"scrapy_redisspine.Addon\": 0}."
                )
            return flagged
        if request in self._pending:
            self._pending.discard(request)
            return True
        return False

    def start_key(self, fingerprint: bytes) -> bytes:
        """What the crawl's ``starts`` SET records for this start request: its
        fingerprint, and for the k-th identical one (k > 0) the count too."""
        occurrence = self._seen.get(fingerprint, 0)
        self._seen[fingerprint] = occurrence + 1
        return fingerprint if occurrence == 0 else fingerprint + b"#%d" % occurrence

    def done(self) -> None:
        """``start()`` is exhausted: the counts are no longer needed."""
        self._seen.clear()
