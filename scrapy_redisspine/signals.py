"""Signals the plugin sends through Scrapy's signal manager, and what they carry.

``worker_opened`` hands the extensions and the middleware a :class:`WorkerView`:
the narrow part of a worker they may use (the frontier's upkeep calls, the Redis
guard, the host policy, a wake-up, the item box), so that they share the scheduler's connection
and worker identity without reaching into the scheduler itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_redisspine._frontier_upkeep import FrontierUpkeep
    from scrapy_redisspine._guard import RedisGuard
    from scrapy_redisspine._host_policy import HostPolicy
    from scrapy_redisspine._itembox import ItemBox
    from scrapy_redisspine._redis_io import RedisIO
    from scrapy_redisspine._starts import StartRegistry
    from scrapy_redisspine.sharded_upkeep import ShardedUpkeep

#: Sent by the scheduler once it joined its crawl. Arguments: ``worker`` (a
#: :class:`WorkerView`).
worker_opened = object()

#: Sent by the scheduler as it starts closing, while its connection is still open
#: (e.g. for a last push of fleet stats). Arguments: ``worker``.
worker_closing = object()


@dataclass(frozen=True)
class WorkerView:
    """What other components may use of an open worker (see the module docstring)."""

    worker_id: str
    #: sweeps, counts, fleet stats, memory: the frontier's upkeep (of every shard)
    upkeep: FrontierUpkeep | ShardedUpkeep
    guard: RedisGuard  # ask before calling Redis, report failures, memory pressure
    hosts: HostPolicy  # delays; Retry-After and Crawl-delay from responses
    wake: Callable[[], None]  # new work may be in Redis: lease soon
    starts: StartRegistry  # which requests start() yielded (startmw.StartRequests)
    items: ItemBox | None = None  # REDISSPINE_ITEMS: items go with their acks (fleet_items)
    close_ordered: Callable[[str], None] | None = None  # a fleet-wide limit was reached
    io: RedisIO | None = None  # where Redis calls run (off the crawl's loop, in order)
