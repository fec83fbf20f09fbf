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

__all__ = ["GroupShardsConflict", "PlacementCorrupt", "claim_group_shards", "locate",
           "locate_on_cluster"]


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


class PlacementCorrupt(ValueError):
    """A registry that says where crawls live holds what no worker wrote."""


def locate(client: redis.Redis, keys: CrawlKeys, *, claim: bool = False) -> CrawlKeys:
    """``keys`` (from the settings: prefix, crawl id, group, shards) as the crawl is
    laid out on ``client``'s Redis (on a cluster: :func:`locate_on_cluster`; what
    writes to the crawl, a worker or a push, registers a new crawl's group: ``claim``)."""
    if not is_cluster(client):
        return replace(keys, cluster=False, colocated=False)
    return locate_on_cluster(client, keys, claim=claim)


def locate_on_cluster(client: redis.Redis, keys: CrawlKeys, *, claim: bool = False) -> CrawlKeys:
    """A registered crawl in its registered group (and with the group's number of
    slots); a crawl whose record sits under its own tag with no group registered,
    as an earlier version created it there, in that layout; a new crawl in its
    group's slots, the group registered first with ``claim`` (HSETNX: of workers
    joining a new crawl at once, every one ends up in the group the first wrote).

    Order matters: a new crawl's group is registered before anything of the crawl
    is written (its record among it, which a sharded crawl keeps under its own tag,
    where an earlier version's record would be too), and the record is read before
    the registry here, so whoever sees a record sees the group registered with it.

    Raises :class:`PlacementCorrupt` for a registered group no crawl can have, or a
    group's number of slots that is no positive number: guessing would put the
    crawl, or its lanes' budgets, where the others do not look."""
    keys = replace(keys, cluster=True, colocated=False, shard=None)
    recorded = client.exists(keys.record)
    group = client.hget(keys.crawl_groups, keys.crawl_id)
    if group is None and recorded:
        return keys
    if group is None and claim:
        client.hsetnx(keys.crawl_groups, keys.crawl_id, keys.group)
        group = client.hget(keys.crawl_groups, keys.crawl_id)
    try:
        placed = replace(keys, group=text(group) if group is not None else keys.group,
                         colocated=True)
    except ValueError as exc:
        raise PlacementCorrupt(
            f"{keys.crawl_groups} names {text(group)!r} as the politeness group of crawl "
            f"{keys.crawl_id!r}, which no crawl can have ({exc}): delete that field"
        ) from None
    stored = _group_shards(client, placed)
    return placed if stored is None else replace(placed, shards=stored)


def claim_group_shards(client: redis.Redis, keys: CrawlKeys) -> None:
    """A colocated crawl's worker: record its group's number of slots if none is, or
    raise :class:`GroupShardsConflict` if the group has another."""
    if not keys.colocated:
        return
    client.set(keys.group_shards, keys.shards, nx=True)
    stored = _group_shards(client, keys)
    if stored is not None and stored != keys.shards:
        raise GroupShardsConflict(keys, stored)


def _group_shards(client: redis.Redis, keys: CrawlKeys) -> int | None:
    raw = client.get(keys.group_shards)
    if raw is None:
        return None
    stored = number(raw, 0)
    if stored < 1 or text(raw).strip() != str(stored):
        raise PlacementCorrupt(
            f"{keys.group_shards} holds {text(raw)!r}, not the number of slots politeness "
            f"group {keys.group!r} spreads its lanes over: set it to its crawls' "
            f"REDISSPINE_SHARDS (1 by default)"
        )
    return stored
