"""Requests that cannot be stored in Redis, kept in this worker's memory.

Like Scrapy's own scheduler, which falls back to its memory queue for a request its
disk queue cannot take (``scheduler/unserializable``), a request whose meta or
callback no other worker could rebuild (an open file, a lambda, a method of another
object) is not dropped: it stays here and is fetched by this worker, under its
lane's fleet-wide politeness (``Frontier.take_slot`` leases one of the lane's slots
for it). It is not shared and not crash-safe: the lease carries a *marker* naming
the request and why it could not be stored, so that if this worker dies, whoever
leases the requeued marker buries it with that reason and the loss shows in the
dead letters.

Scrapy-free: requests are held, never built or inspected beyond URL and priority.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger("scrapy_redisspine.scheduler")

#: A marker payload starts with this; no codec output does (msgpack and JSON maps
#: start with a map header or "{").
MARKER_PREFIX = b"\x00redisspine-local\x00"


def marker(worker_id: str, url: str, reason: str) -> bytes:
    """The payload of a local request's lease: who held it, what, and why."""
    data = {"worker": worker_id, "url": url, "reason": reason}
    return MARKER_PREFIX + json.dumps(data).encode()


def marker_reason(payload: bytes) -> str | None:
    """Why a leased payload is no request (a marker), or None for a request."""
    if not payload.startswith(MARKER_PREFIX):
        return None
    try:
        data = json.loads(payload[len(MARKER_PREFIX):])
        return (f"request {data['url']} could not be stored ({data['reason']}) and lived "
                f"only in the memory of worker {data['worker']}, which did not finish it")
    except (ValueError, KeyError, TypeError):
        return "a marker of a request that lived in one worker's memory (unreadable)"


class LocalQueue:
    """Owns the requests kept in memory, by lane (oldest first), and which kinds of
    failure were logged (once each)."""

    def __init__(self, worker_id: str, stats: StatsCollector) -> None:
        self._worker_id = worker_id
        self._stats = stats
        self._lanes: OrderedDict[str, deque[tuple[Request, bytes]]] = OrderedDict()
        self._kinds: set[str] = set()
        self.keys: set[str] = set()  # order keys of the local leases handed out

    def __len__(self) -> int:
        return sum(len(requests) for requests in self._lanes.values())

    def add(self, request: Request, lane: str, reason: str) -> None:
        """Keep ``request`` (it could not be stored, for ``reason``)."""
        kind = reason.replace(request.url, "<url>")
        self._stats.inc_value("redisspine/scheduler/local")
        if kind not in self._kinds:
            self._kinds.add(kind)
            logger.warning(
                "redisspine: %s: kept in this worker's memory and fetched here, with the "
                "fleet's politeness (not shared with other workers, lost if this worker "
                "dies); others like it are counted in redisspine/scheduler/local", reason,
            )
        marked = marker(self._worker_id, request.url, reason)
        self._lanes.setdefault(lane, deque()).append((request, marked))

    def lanes(self) -> list[str]:
        return list(self._lanes)

    def first(self, lane: str) -> tuple[Request, bytes]:
        return self._lanes[lane][0]

    def taken(self, lane: str, key: str) -> Request:
        """The lane's first request got the lease ``key``: it leaves the queue."""
        requests = self._lanes[lane]
        request, _ = requests.popleft()
        if not requests:
            del self._lanes[lane]
        self.keys.add(key)
        return request

    def lost(self) -> int:
        """This worker closes: the requests still here are lost; how many."""
        count = len(self)
        self._lanes.clear()
        return count
