"""Where a crawl's keys live on the Redis a worker or tool talks to.

On one server (or Sentinel) a crawl's key names depend only on the settings. On Redis
Cluster every script must stay in one slot, and a lease touches both the crawl's keys
and its politeness group's (a lane's slots and rest, shared by the group's crawls). So
there a crawl lives in its group's slots (``CrawlKeys.colocated``): every crawl of the
group leases a lane in the slot that holds the lane's budget, in one atomic script, as
on one server. A crawl created on a cluster by an earlier version keeps its own slot
and per-crawl politeness (its keys were laid out so); it is found where it is.

Tools do not know the workers' settings, so each colocated crawl is registered with
its group (``P:crawl_groups``), and each group with its number of slots
(``P:{g:G}:shards``: a lane's budget lives in one slot, so every crawl of a group
spreads its lanes the same way, ``REDISSPINE_SHARDS``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from scrapy_redisspine._results import number, text
from scrapy_redisspine.connection import is_cluster

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.keys import CrawlKeys

__all__ = ["GroupShardsConflict", "claim_group_shards", "locate"]


class GroupShardsConflict(ValueError):
    """The politeness group's lanes are spread over another number of slots."""

    def __init__(self, keys: CrawlKeys, stored: int) -> None:
        super().__init__(
            f"politeness group {keys.group!r} on this Redis Cluster spreads its lanes over "
            f"{stored} slot(s) (REDISSPINE_SHARDS = {stored} of its crawls), and this "
            f"worker has REDISSPINE_SHARDS = {keys.shards}: a lane's budget lives in one "
            f"slot, so every crawl of a group must agree. Set REDISSPINE_SHARDS = "
            f"{stored}, or give this crawl a REDISSPINE_POLITENESS_GROUP of its own"
        )
        self.stored = stored


def locate(client: redis.Redis, keys: CrawlKeys) -> CrawlKeys:
    """``keys`` (from the settings: prefix, crawl id, group, shards) as the crawl is
    laid out on ``client``'s Redis.

    On a cluster: a registered crawl in its registered group (and with the group's
    number of slots); a crawl whose record sits under its own tag, as an earlier
    version created it there, in that layout; a new crawl in its group's slots."""
    if not is_cluster(client):
        return replace(keys, cluster=False, colocated=False)
    keys = replace(keys, cluster=True, colocated=False, shard=None)
    group = client.hget(keys.crawl_groups, keys.crawl_id)
    if group is None and client.exists(keys.record):
        return keys
    placed = replace(keys, group=text(group) if group is not None else keys.group,
                     colocated=True)
    stored = client.get(placed.group_shards)
    return placed if stored is None else replace(placed, shards=number(stored, keys.shards))


def claim_group_shards(client: redis.Redis, keys: CrawlKeys) -> None:
    """A colocated crawl's worker: record its group's number of slots if none is, or
    raise :class:`GroupShardsConflict` if the group has another."""
    if not keys.colocated:
        return
    client.set(keys.group_shards, keys.shards, nx=True)
    stored = number(client.get(keys.group_shards), keys.shards)
    if stored != keys.shards:
        raise GroupShardsConflict(keys, stored)
