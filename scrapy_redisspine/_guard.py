"""How one worker stands with its Redis: reachable or not, full or not, in sync or not.

Every part of a worker that calls Redis reports failures here, and asks here before
it calls, so one rule decides for all of them:

- a down Redis (connection refused, timeout ...) opens the breaker (``health``):
  calls wait for a growing back-off, buffered work stays in the worker;
- a full Redis (an OOM reply) is not a down one: the worker keeps calling, but stops
  queueing newly discovered requests (``memory_pressure``) until the memory watch
  sees room again;
- a Redis that may evict the crawl's keys to make room (``maxmemory`` and an
  ``allkeys-*`` policy) would lose work without a word: the memory watch tells the
  worker (``on_evicting``), which stops rather than end ``finished`` over it;
- a script error (a script refused to run, e.g. a key of the wrong type) is not an
  outage either: the other calls go on (heartbeats first of all: holding them back
  would get a live worker swept), only the failing operation backs off;
- after any failure Redis and the worker may disagree on the worker's leases (a
  lease reply lost in flight, a script that failed after it wrote, a restart that
  lost the last acks), so the next lease first reconciles them
  (``reconcile_needed``); so it does after a Sentinel failover, which may raise
  nothing at all (``primary_changed``), and after a restart or a takeover that the
  heartbeat sees as a new run id of the server (``server_changed``).

Scrapy-free: the scheduler, the extension and tools share it through the worker's
view (see ``scheduler.WorkerView``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import redis

from scrapy_redisspine.health import RedisHealth

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger("scrapy_redisspine.scheduler")

#: Share of the memory limit past which new discoveries are shed, and below which
#: they are queued again (hysteresis: no flapping around one value).
HIGH_WATER = 0.9
LOW_WATER = 0.8

#: Error replies that mean the server cannot serve now, not that a script is wrong.
_OUTAGE_REPLIES = ("BUSY", "LOADING", "MASTERDOWN", "READONLY", "TRYAGAIN", "CLUSTERDOWN",
                   "NOREPLICAS")
_SCRIPT_ERROR_FIRST_DELAY = 0.1
_SCRIPT_ERROR_MAX_DELAY = 5.0
_SCRIPT_ERROR_LOG_SECONDS = 60.0
#: Repair lines logged per minute at most (the rest are counted, and summed up).
_REPAIR_LINES_PER_MINUTE = 20


#: What a call to Redis may raise: Redis's errors, and a reply that does not parse
#: (a script ran, but its reply is not what the caller expected). The cluster client
#: raises some errors of its own that are no RedisError: a slot no known master
#: serves (mid-failover), or a call it refuses to send (keys of several slots).
CALL_ERRORS: tuple[type[Exception], ...] = (
    redis.RedisError, redis.exceptions.RedisClusterException, ValueError, TypeError,
    IndexError, KeyError, UnicodeDecodeError,
)


def crawl_gone_status(exc: Exception) -> str | None:
    """``lost``, ``purged`` or ``changed`` when a script refused to write because the
    crawl is not the caller's (``LOST <status>``, lib/crawl.lua), else None."""
    if isinstance(exc, redis.exceptions.ResponseError):
        code, _, status = str(exc).partition(" ")
        if code == "LOST" and status in ("lost", "purged", "changed"):
            return status
    return None


def is_script_error(exc: Exception) -> bool:
    """Did Redis refuse what was asked, or answer what cannot be read (not: could it
    not answer, or not store)?"""
    if isinstance(exc, redis.exceptions.SlotNotCoveredError):
        return False  # a master is gone and no replica took over yet: an outage
    if isinstance(exc, redis.exceptions.RedisClusterException) and "default node" in str(exc):
        # The cluster client is learning the cluster again (after a MOVED or a lost
        # connection, seen mid-reshard on Redis 8.2) while another thread calls: an
        # outage of a moment, not a refusal.
        return False
    if not isinstance(exc, redis.RedisError):
        return True  # a reply that does not parse: the script ran, something is off
    if not isinstance(exc, redis.exceptions.ResponseError):
        return False
    if isinstance(exc, (redis.exceptions.OutOfMemoryError, redis.exceptions.NoScriptError,
                        redis.exceptions.ReadOnlyError, redis.exceptions.ClusterError)):
        return False
    return not str(exc).startswith(_OUTAGE_REPLIES)


class RedisGuard:
    """Owns the breaker, the memory-pressure flag, the reconcile flag and the back-off
    of operations whose script failed."""

    def __init__(self, stats: StatsCollector, clock: Callable[[], float]) -> None:
        self._stats = stats
        self._clock = clock
        # operation -> (current delay, retry at, last logged)
        self._refused: dict[str, tuple[float, float, float]] = {}
        self._repair_window = (float("-inf"), 0, 0)  # (start, lines logged, held back)
        self.health = RedisHealth(
            on_error=lambda op: stats.inc_value(f"redisspine/redis_errors/{op}"), clock=clock
        )
        self.memory_pressure = False
        self.reconcile_needed = False
        #: Set once a script refused to write because the crawl in Redis is not this
        #: worker's any more (lost, purged, started afresh): nothing may write again.
        self.crawl_gone: str | None = None
        self.on_crawl_gone: Callable[[str], None] | None = None
        #: Called with the policy when the memory watch finds that a server the crawl
        #: lives on may evict its keys (see ``observe_memory``).
        self.on_evicting: Callable[[str], None] | None = None
        #: Counts the events after which Redis may lack writes it confirmed (any
        #: error but a full Redis's refusal, a change of primary): what the worker
        #: remembers of Redis's replies (``_seen``) holds only within one era.
        self.era = 0

    # -- the breaker ---------------------------------------------------------------

    @property
    def down(self) -> bool:
        return self.health.down

    def available(self, operation: str | None = None) -> bool:
        """May a call be tried now (the back-off after a failure has passed)? With an
        ``operation``, also: has the back-off after its script's last error passed?"""
        if not self.health.available():
            return False
        refused = self._refused.get(operation) if operation else None
        return refused is None or self._clock() >= refused[1]

    def healthy_for(self) -> float:
        return self.health.healthy_for()

    def stalled(self) -> None:
        """Redis answered, but after a stall longer than a worker timeout (a frozen
        server raises nothing): count health from now, as after an outage."""
        self.health.restart_healthy_clock()

    def succeeded(self, operation: str | None = None) -> None:
        self.health.succeeded()
        if operation is not None:
            self._refused.pop(operation, None)

    def failed(self, operation: str, exc: Exception) -> None:
        """A full Redis is not a down Redis: shed load, but keep calling it."""
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            self._stats.inc_value(f"redisspine/memory/oom/{operation}")
            if not self.memory_pressure:
                logger.warning(
                    "redisspine: Redis refused a write for lack of memory (%s): no longer "
                    "queueing newly discovered requests until it has room again", operation,
                )
            self.memory_pressure = True  # the memory watch clears it below LOW_WATER
            return
        self.reconcile_needed = True
        self.era += 1
        gone = crawl_gone_status(exc)
        if gone is not None:
            self._gone(gone)
        elif is_script_error(exc):
            self._script_failed(operation, exc)
        else:
            self.health.failed(operation, exc)

    def _script_failed(self, operation: str, exc: Exception) -> None:
        """Back this operation off (0.1 s doubling to 5 s); log once a minute."""
        now = self._clock()
        delay, _, logged = self._refused.get(operation, (0.0, 0.0, float("-inf")))
        delay = min(max(delay * 2, _SCRIPT_ERROR_FIRST_DELAY), _SCRIPT_ERROR_MAX_DELAY)
        if now - logged >= _SCRIPT_ERROR_LOG_SECONDS:
            logged = now
            logger.error(
                "redisspine: Redis refused %s (%s); retrying it with backoff, the rest of "
                "the worker goes on (see redisspine/script_errors/%s)", operation, exc, operation,
            )
        self._refused[operation] = (delay, now + delay, logged)
        self._stats.inc_value(f"redisspine/script_errors/{operation}")

    def _gone(self, status: str) -> None:
        if self.crawl_gone is None:
            self.crawl_gone = status
            if self.on_crawl_gone is not None:
                self.on_crawl_gone(status)

    def repaired(self, operation: str, repairs: Sequence[str]) -> None:
        """A script repaired malformed values it met (``scripts/lib/numbers.lua``):
        one WARNING each (at most 20 a minute; the rest counted and summed up), and
        ``redisspine/repaired``."""
        if not repairs:
            return
        self._stats.inc_value("redisspine/repaired", len(repairs))
        start, logged, held = self._repair_window
        now = self._clock()
        if now - start >= 60.0:
            if held:
                logger.warning("redisspine: %d more repair(s) of malformed values in the "
                               "last minute (see redisspine/repaired)", held)
            start, logged, held = now, 0, 0
        for repair in repairs:
            if logged < _REPAIR_LINES_PER_MINUTE:
                logged += 1
                logger.warning("redisspine: %s repaired a malformed value: %s", operation, repair)
            else:
                held += 1
        self._repair_window = (start, logged, held)

    def reconciled(self) -> None:
        self.reconcile_needed = False

    def primary_changed(self, old: tuple[str, int], new: tuple[str, int]) -> None:
        """Sentinel names another primary. The writes the old one took since the new
        one was promoted are lost, and a worker may have moved over without any error
        (a pooled connection reconnecting finds the new primary): Redis may hold
        leases for it that it acked on the old one. Reconcile before the next lease,
        as after an outage."""
        self.reconcile_needed = True
        self.era += 1
        self._stats.inc_value("redisspine/redis/primary_changes")
        logger.warning(
            "redisspine: Sentinel names a new primary, %s:%d (was %s:%d): moving to it and "
            "reconciling this worker's leases with it (see redisspine/redis/primary_changes)",
            *new, *old,
        )

    def server_changed(self, old: str, new: str) -> None:
        """The server's run id changed: Redis restarted (from a snapshot that may
        predate its last writes) or another server took over, possibly without any
        error reaching this worker (redis-py reconnects on its own). Reconcile before
        the next lease, as after an outage, and start a new era."""
        self.reconcile_needed = True
        self.era += 1
        self._stats.inc_value("redisspine/redis/server_changes")
        logger.warning(
            "redisspine: Redis restarted or another server took over (run id %s, was %s): "
            "its last writes may be lost, so this worker reconciles its leases with it "
            "(see redisspine/redis/server_changes)", new[:12], old[:12],
        )

    # -- the memory watch ------------------------------------------------------------

    def server_evicts(self, policy: str) -> None:
        """A server the crawl lives on may evict its keys (``policy``, its
        maxmemory-policy): the worker is told (``on_evicting``) and stops."""
        self._stats.set_value("redisspine/memory/evicting_policy", policy)
        if self.on_evicting is not None:
            self.on_evicting(policy)

    def observe_memory(self, used: int, limit: int, evicting: str = "") -> None:
        """Redis uses ``used`` of ``limit`` bytes (0: no limit): shed past 90 %, queue
        again below 80 %. ``evicting``: the maxmemory-policy of a server of the crawl
        that may evict its keys (``connection.evicting_policy``), else ""."""
        if evicting:
            self.server_evicts(evicting)
        if not limit:
            return
        share = used / limit
        self._stats.set_value("redisspine/memory/used_share", round(share, 3))
        if not self.memory_pressure and share >= HIGH_WATER:
            self.memory_pressure = True
            self._stats.set_value("redisspine/memory/over_budget", 1)
            logger.warning(
                "redisspine: Redis uses %d of %d bytes (%.0f %%): no longer queueing newly "
                "discovered requests until it falls below %.0f %%",
                used, limit, share * 100, LOW_WATER * 100,
            )
        elif self.memory_pressure and share < LOW_WATER:
            self.memory_pressure = False
            self._stats.set_value("redisspine/memory/over_budget", 0)
            logger.info("redisspine: Redis memory back to %.0f %%: queueing again", share * 100)
