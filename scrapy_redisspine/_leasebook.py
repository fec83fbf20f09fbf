"""The leases one worker holds, from the lease call to the ack.

A leased request is *ready* (leased in a batch, not yet asked for by the engine),
then *handed out* (the engine downloads and processes it) until the engine is done
with it, when its ack goes to the outbox. Redis holds every one of them in the
crawl's in-flight HASH all along; this book is the worker's side of that record: it
knows, for each, the fencing handle an ack or a release must present, its
politeness lane, a Retry-After block its response asked for, and (with AutoThrottle)
its download latency and status, the sample its ack carries to the fleet.

No Redis and no Scrapy here: the book is data, kept by the scheduler's parts.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy import Request

    from scrapy_redisspine.frontier import LeaseHandle


@dataclass(frozen=True)
class Finished:
    """A handed-out request the engine is done with: what its ack needs."""

    handle: LeaseHandle
    lane: str
    block_ms: int  # a Retry-After block (0: none)
    latency_ms: int = -1  # its download latency, for AutoThrottle (-1: no sample)
    status: int = 0  # its response's status (0: none)
    received_at: float | None = None  # the worker's clock when its response came in


class LeaseBook:
    """Owns the ready list, the handed-out leases, their lanes and blocks.

    Invariant kept: a lease is in exactly one of ``ready`` or ``handed out`` from
    :meth:`add` until :meth:`finish`, :meth:`drop_ready` or :meth:`take_all`.
    """

    def __init__(self) -> None:
        self._ready: deque[tuple[Request, LeaseHandle]] = deque()
        self._handed_out: dict[Request, LeaseHandle] = {}
        self._lanes: dict[str, str] = {}  # order key -> politeness lane
        self._blocks: dict[str, int] = {}  # order key -> Retry-After block (ms)
        self._samples: dict[str, tuple[int, int]] = {}  # order key -> latency ms, status
        self._received: dict[str, float] = {}  # order key -> when its response came in

    @property
    def ready(self) -> int:
        return len(self._ready)

    @property
    def handed_out(self) -> int:
        return len(self._handed_out)

    def add(self, request: Request, handle: LeaseHandle, lane: str) -> None:
        self._lanes[handle[0]] = lane
        self._ready.append((request, handle))

    def hand_out(self) -> Request | None:
        """The next ready request, now in the engine's hands; None if none is ready."""
        if not self._ready:
            return None
        request, handle = self._ready.popleft()
        self._handed_out[request] = handle
        return request

    def holds(self, request: Request) -> bool:
        """Is ``request`` handed out by this book (so an ack will end it)?"""
        return request in self._handed_out

    def block(self, request: Request, milliseconds: int) -> bool:
        """Rest the request's lane this long after its ack; False if not ours."""
        handle = self._handed_out.get(request)
        if handle is None:
            return False
        self._blocks[handle[0]] = milliseconds
        return True

    def sample(self, request: Request, latency_ms: int, status: int) -> bool:
        """The request's response came in this fast (AutoThrottle); False if not ours."""
        handle = self._handed_out.get(request)
        if handle is None:
            return False
        self._samples[handle[0]] = (latency_ms, status)
        return True

    def received(self, request: Request, at: float) -> bool:
        """The request's response came in at ``at`` (the worker's clock): its fetch
        ended then, and its lane's rest counts from there; False if not ours. The
        first response counts (a retry is a request of its own)."""
        handle = self._handed_out.get(request)
        if handle is None:
            return False
        self._received.setdefault(handle[0], at)
        return True

    def finish(self, request: Request) -> Finished | None:
        """The engine is done with ``request``; None if this book never handed it out
        (e.g. robots.txt, fetched through ``engine.download()``)."""
        handle = self._handed_out.pop(request, None)
        if handle is None:
            return None
        key = handle[0]
        latency_ms, status = self._samples.pop(key, (-1, 0))
        return Finished(handle, self._lanes.pop(key, ""), self._blocks.pop(key, 0),
                        latency_ms, status, self._received.pop(key, None))

    def known_keys(self) -> list[str]:
        """Order keys of every lease the book holds (ready or handed out)."""
        return [key for _, (key, _) in self._ready] + [
            key for key, _ in self._handed_out.values()
        ]

    def drop_ready(self) -> list[LeaseHandle]:
        """Forget the ready leases (a sweep may have taken them); their handles."""
        handles = [handle for _, handle in self._ready]
        self._ready.clear()
        for key, _ in handles:
            self._lanes.pop(key, None)
            self._blocks.pop(key, None)
            self._samples.pop(key, None)
            self._received.pop(key, None)
        return handles

    def take_all(self) -> list[LeaseHandle]:
        """Forget every lease (the worker closes); their handles, to release."""
        handles = [handle for _, handle in self._ready] + list(self._handed_out.values())
        self._ready.clear()
        self._handed_out.clear()
        self._lanes.clear()
        self._blocks.clear()
        self._samples.clear()
        self._received.clear()
        return handles
