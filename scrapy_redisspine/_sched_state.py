"""The scheduler's shared state, declared once, and the rule for Redis failures.

``scheduler.Scheduler`` is one Scrapy component written in a few small modules, a
chain of mixins each building on the one before: this base (the attributes that
``Scheduler.__init__`` sets, declared so each part type-checks alone), its buffers
to Redis (``_sched_outbox``), its life in the fleet (``_sched_fleet``), its
politeness hooks (``_sched_politeness``) and its leases (``_sched_leases``). Only
``Scheduler`` is ever instantiated.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import redis

if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Callable

    from scrapy import Request, Spider
    from scrapy.crawler import Crawler
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.statscollectors import StatsCollector
    from twisted.internet import task

    from scrapy_redisspine._engine import EngineHooks
    from scrapy_redisspine.control import Orders
    from scrapy_redisspine.frontier import Frontier, LeaseHandle, NewRequest
    from scrapy_redisspine.health import RedisHealth
    from scrapy_redisspine.politeness import DelayPolicy
    from scrapy_redisspine.request_codec import RequestCodec
    from scrapy_redisspine.settings import SpineConfig
    from scrapy_redisspine.worker import WorkerConnection

logger = logging.getLogger("scrapy_redisspine.scheduler")

#: (order key, token, rest of its lane in ms, time.monotonic() when the request was done)
PendingAck = tuple[str, str, int, float]


class SchedulerState:
    """Attributes of the scheduler (set by ``Scheduler.__init__``)."""

    config: SpineConfig
    df: BaseDupeFilter
    stats: StatsCollector
    crawler: Crawler | None
    worker_id: str
    spider: Spider | None
    connection: WorkerConnection | None
    frontier: Frontier | None
    codec: RequestCodec | None
    delays: DelayPolicy
    health: RedisHealth
    memory_pressure: bool
    orders: Orders
    _hooks: EngineHooks | None
    _outbox: list[tuple[NewRequest, Request]]
    _acks: list[PendingAck]
    _local: dict[bytes, Request]
    _lanes: dict[str, str]
    _blocks: dict[str, int]
    _lane: Callable[[str], str]
    _ready: deque[tuple[Request, LeaseHandle]]
    _handed_out: dict[Request, LeaseHandle]
    _fleet_pending: bool
    _fleet_checked_at: float
    _last_empty_lease: float
    _reconcile_leases: bool
    _last_shed_log: float
    _wake_call: Any  # twisted IDelayedCall
    _flush_call: Any  # twisted IDelayedCall
    _flush_due: float
    _timers: list[task.LoopingCall]
    _drain_closing: bool

    def _redis_failed(self, operation: str, exc: Exception) -> None:
        """A full Redis is not a down Redis: shed load, but keep calling it."""
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            self.stats.inc_value(f"redisspine/memory/oom/{operation}")
            if not self.memory_pressure:
                logger.warning(
                    "redisspine: Redis refused a write for lack of memory (%s): no longer "
                    "queueing newly discovered requests until it has room again", operation,
                )
            self.memory_pressure = True  # the recovery sweep clears it below 80 %
            return
        # After any failure, Redis and this worker may disagree on its leases: a reply
        # lost after Redis ran a lease, or a restart that lost the last writes (acks
        # included). The next lease first returns leases this worker does not hold.
        self._reconcile_leases = True
        self.health.failed(operation, exc)
