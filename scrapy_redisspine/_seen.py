"""Fingerprints Redis confirmed, kept by the worker so that a repeat is dropped here.

Most links a crawl finds point at pages it has queued already (a site's menus, its
pagination, links back): on the bench site four of every five requests the callbacks
yield are repeats. Redis decides each one (``enqueue.lua``'s dedup), but sending a
repeat costs the worker its encoding and its share of a round trip, and Redis a dedup
check (issue 19: the worker's CPU per page is what a CPU-bound fleet pays for). A
fingerprint that Redis has told this worker is in the crawl's dedup record needs no
second question: nothing takes a fingerprint out of that record while the crawl
lives (a flush or a purge starts another crawl, which refuses this worker).

What is kept: fingerprints of requests Redis queued or refused as duplicates, only
from replies to sends made in the current *era*. Never a request still on its way,
a start request or a ``dont_filter`` one (their own rules apply), nor a request
dropped at its lane's backlog cap (not recorded). Redis can lose writes it
confirmed: an outage, a failover to a replica that had not received them yet. The
worker's guard counts such events (:attr:`RedisGuard.era`, on any Redis error and on
a change of primary); a new era forgets everything, so a request lost with such a
write is sent again when found again, exactly as without this cache.

Bounded: two generations of at most half the size each; when the young one is full
the old one is dropped (an approximation of "least recently confirmed" that costs one
set lookup or two). Scrapy-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


class ConfirmedSeen:
    """Fingerprints in the crawl's dedup record, as this worker last heard from Redis."""

    def __init__(self, size: int, era: Callable[[], int]) -> None:
        """``size``: most fingerprints kept (> 0); ``era()``: the guard's count of
        events that may have lost writes."""
        if size < 1:
            raise ValueError(f"size must be at least 1, not {size}")
        self._half = max(size // 2, 1)
        self._era_of = era
        self._era = era()
        self._young: set[bytes] = set()
        self._old: set[bytes] = set()

    @property
    def era(self) -> int:
        """The era now: stamp a send with it, and pass it back to :meth:`confirm`."""
        return self._era_of()

    def __contains__(self, fingerprint: bytes) -> bool:
        if self._era_of() != self._era:
            self._forget()
        return fingerprint in self._young or fingerprint in self._old

    def __len__(self) -> int:
        return len(self._young) + len(self._old)

    def confirm(self, fingerprints: Iterable[bytes], era: int) -> None:
        """Redis, answering a send made in ``era``, says these are in the record.
        A reply to a send of an earlier era is not trusted (see the module's text)."""
        if self._era_of() != self._era:
            self._forget()
        if era != self._era:
            return
        young, half = self._young, self._half
        for fingerprint in fingerprints:
            young.add(fingerprint)
            if len(young) >= half:
                self._old, young = young, set()
                self._young = young

    def _forget(self) -> None:
        self._era = self._era_of()
        self._young, self._old = set(), set()
