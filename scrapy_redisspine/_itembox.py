"""The items of requests in progress, held until their requests are done.

An item that reached the end of the item pipelines (``fleet_items.FleetItems`` hears
Scrapy's ``item_scraped``) is encoded at once and kept here under the request whose
callback produced it, while that request is still handed out. Scrapy sends
``item_scraped`` before the engine lets go of the request (its scraper awaits the
item pipelines, async ones included, before ``remove_request``; see ``_engine``), so
when the scheduler buffers the request's ack it takes the request's items with it
(:meth:`ItemBox.take`), and they travel to Redis in the same script call as the ack
(``scripts/enqueue.lua``). A worker killed before that call loses them with the
lease; the request is fetched again and its items produced again.

An item whose request this worker did not hand out (yielded by ``start()``, or from
a response that a downloader middleware tied to a request of its own) belongs to no
ack: it goes as a loose item, written unfenced.

Scrapy-free: requests are only keys here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy_redisspine.item_codec import ItemEncodeError

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._clock import Clock
    from scrapy_redisspine._guard import RedisGuard
    from scrapy_redisspine._leasebook import LeaseBook
    from scrapy_redisspine._outbox import Outbox
    from scrapy_redisspine.frontier import StreamItem
    from scrapy_redisspine.item_codec import ItemCodec

logger = logging.getLogger("scrapy_redisspine.items")

_LOG_INTERVAL_SECONDS = 60.0


class ItemBox:
    """Owns the encoded items of handed-out requests (no keys of its own: the items go
    out through the outbox, with the acks).

    Invariant kept: an item of a handed-out request leaves this box only with that
    request's ack (:meth:`take`) or is dropped with its lease (:meth:`clear`), never
    on its own.
    """

    def __init__(
        self, codec: ItemCodec, book: LeaseBook, outbox: Outbox, *, guard: RedisGuard,
        stats: StatsCollector, clock: Clock, flush_seconds: float,
    ) -> None:
        self._codec = codec
        self._book = book
        self._outbox = outbox
        self._guard = guard
        self._stats = stats
        self._clock = clock
        self._flush_seconds = flush_seconds
        self._pending: dict[Request, list[StreamItem]] = {}
        self._last_log = float("-inf")

    def __len__(self) -> int:
        """Items held for requests not yet done."""
        return sum(len(items) for items in self._pending.values())

    def add(self, item: Any, request: Request | None, url: str) -> None:
        """An item reached the end of the pipelines, produced for ``request``."""
        if self._guard.memory_pressure:
            self._outbox.items_shed(1)  # as newly discovered requests are
            return
        try:
            entry = self._codec.encode(item, url)
        except ItemEncodeError as exc:
            self._stats.inc_value("redisspine/items/unserializable")
            self._log_once(f"redisspine: an item from {url} not stored: {exc}")
            return
        if request is not None and self._book.holds(request):
            self._pending.setdefault(request, []).append(entry)
            return
        self._stats.inc_value("redisspine/items/loose")
        self._outbox.add_loose(entry, self._flush_seconds)

    def take(self, request: Request) -> list[StreamItem]:
        """The items of ``request``, which the engine is done with: they go with its ack."""
        return self._pending.pop(request, [])

    def clear(self) -> int:
        """Forget the items of requests never acked (the worker closes and hands
        their leases back: whoever fetches them again produces them again)."""
        held = len(self)
        self._pending.clear()
        return held

    def _log_once(self, line: str) -> None:
        now = self._clock.seconds()
        if now - self._last_log > _LOG_INTERVAL_SECONDS:
            self._last_log = now
            logger.warning("%s (see redisspine/items/unserializable)", line)
