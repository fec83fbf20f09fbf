"""What a crawl's queue holds, read the way the scripts lay it out (lib/lists.lua):
the requests waiting in each lane's lists, and the members of the queue ZSET
(requests put back, or queued by an earlier version). For assertions only."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from scrapy_redisspine.members import index_entry_parts, parse_member, queue_size

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.keys import CrawlKeys


class Queued(NamedTuple):
    """One queued request: its lane, priority key and payload; ``member`` is its
    queue ZSET member, or None while it waits in a list (no order key yet)."""

    lane: str
    priority_key: str
    payload: bytes
    member: bytes | None


def queued(client: redis.Redis, keys: CrawlKeys) -> list[Queued]:
    """Every queued request, in the order the queue ZSET sorts its entries (within a
    list, the list's order)."""
    found: list[Queued] = []
    for entry in client.zrange(keys.queue, 0, -1):
        parts = index_entry_parts(entry)
        if parts is None:
            lane, priority_key, _, payload = parse_member(entry)
            found.append(Queued(lane, priority_key, payload, entry))
            continue
        lane, priority_key = parts
        for payload in client.lrange(keys.queue_list(lane, priority_key), 0, -1):
            found.append(Queued(lane, priority_key, payload, None))
    return found


def queued_payloads(client: redis.Redis, keys: CrawlKeys) -> list[bytes]:
    """The payloads of :func:`queued`, sorted."""
    return sorted(request.payload for request in queued(client, keys))


def queued_count(client: redis.Redis, keys: CrawlKeys) -> int:
    """How many requests are queued, as the workers count them."""
    return queue_size(client.zcard(keys.queue),
                      client.hmget(keys.queue_counts, "requests", "lists"))
