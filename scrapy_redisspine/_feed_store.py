"""The crawl's feed key as the workers see it: read a batch, then end it.

Scrapy-free. A batch is read first and taken out of the feed only by
``feed_done.lua``, after the caller enqueued its good entries: read-then-remove,
not pop-and-enqueue in one script, because an entry becomes a request only in
Python (JSON checked against the spider, Scrapy's fingerprint), which no script can
do. A worker that dies between the two leaves the batch in the feed; the next read
enqueues it again and the crawl's dedup drops what is already in (feed entries
cannot be ``dont_filter``). Two workers reading one batch at once both enqueue it
(the dedup keeps one) and each removes one copy of each entry it read, so an entry
fed twice (the same text) may lose its second copy, which the dedup would drop.

Keys touched: the feed key (LIST or ZSET), dead, stats, record.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_redisspine._results import Repairs, fields, number, repairs_of
from scrapy_redisspine.scripts import ScriptSet

if TYPE_CHECKING:
    from collections.abc import Sequence

    import redis

    from scrapy_redisspine.keys import CrawlKeys

#: The feed key's Redis types this reads (anything else is the user's mistake).
FEED_KINDS = ("list", "zset")


class FeedTypeError(ValueError):
    """The feed key holds neither a LIST nor a ZSET."""


@dataclass(frozen=True)
class FeedBatch:
    """Entries read from the feed, as they are stored (bytes), and how it is read."""

    kind: str
    entries: tuple[bytes, ...]


@dataclass(frozen=True)
class FeedDone:
    removed: int  # entries taken out of the feed, dead-lettered ones included
    buried: int  # entries dead-lettered
    repairs: Repairs = ()


class FeedStore:
    """One crawl's feed key: LIST entries are read from the head (scrapy-redis's
    LPOP end), ZSET entries highest score first (its ZREVRANGE)."""

    def __init__(
        self, client: redis.Redis, keys: CrawlKeys, feed_key: str,
        scripts: ScriptSet | None = None,
    ) -> None:
        self.client = client
        self.keys = keys
        self.feed_key = feed_key
        self.epoch = ""  # the crawl's identity (lib/crawl.lua); "": no check
        self._scripts = scripts if scripts is not None else ScriptSet(client, keys)

    def read(self, limit: int) -> FeedBatch:
        """Up to ``limit`` entries, left in the feed; none when the key is absent."""
        kind = self.client.type(self.feed_key)
        kind = kind.decode() if isinstance(kind, bytes) else str(kind)
        if kind == "none":
            return FeedBatch("list", ())
        entries: list[Any]
        if kind == "list":
            entries = self.client.lrange(self.feed_key, 0, limit - 1)
        elif kind == "zset":
            entries = self.client.zrevrange(self.feed_key, 0, limit - 1)
        else:
            raise FeedTypeError(f"feed key {self.feed_key!r} holds a {kind}, not a list "
                                "or a sorted set: it is not drained")
        return FeedBatch(kind, tuple(_as_bytes(entry) for entry in entries))

    def done(
        self, kind: str, bad: Sequence[tuple[str, bytes]], enqueued: Sequence[bytes]
    ) -> FeedDone:
        """Remove the ``enqueued`` entries and dead-letter the ``bad`` ones
        (reason, entry), in one step (``feed_done.lua``)."""
        if not bad and not enqueued:
            return FeedDone(0, 0)
        args: list[bytes | str | int] = [self.epoch, kind, len(bad)]
        for reason, entry in bad:
            args += [dead_letter_id(entry), reason, entry]
        args += list(enqueued)
        reply = self._scripts.run("feed_done", args, more_keys=[self.feed_key])
        removed, buried, repairs = fields(reply, 3)
        return FeedDone(number(removed), number(buried), repairs_of(repairs))


def dead_letter_id(entry: bytes) -> str:
    """A bad feed entry's dead-letter field: one per entry text, so a bad entry
    pushed twice is one dead letter, and no order key (``requeue-dead`` skips it)."""
    return "feed:" + hashlib.sha1(entry, usedforsecurity=False).hexdigest()


def _as_bytes(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")
