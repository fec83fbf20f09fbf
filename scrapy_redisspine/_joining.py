"""Joining a crawl at start-up, and why a worker may refuse to work.

A worker connects, checks the crawl's keys and registers in one step here; what
goes wrong on the way (Redis unreachable or refusing the password, a server that
may evict the crawl's keys, a key of the wrong type, a crawl id that belongs to
another spider, a bad setting) is one
:class:`JoinRefused` with a close reason and a one-line message, never a traceback:
the scheduler logs the line and closes the spider with the reason, and the
process exits non-zero.

The close reasons that mean "the work is not done" are listed in
:data:`FAILED_REASONS`; the docs (How it works, "Close reasons")
list them with what to do.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import redis
from redis.sentinel import MasterNotFoundError

from scrapy_redisspine.connection import RedisServerNotFound, describe_url
from scrapy_redisspine.control import CLOSE, Orders, read_orders
from scrapy_redisspine.frontier import CorruptKeyError, Frontier, Registration
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.placement import (
    GroupShardsConflict,
    PlacementCorrupt,
    claim_group_shards,
    locate,
)
from scrapy_redisspine.sharded import AnyFrontier, ShardedFrontier
from scrapy_redisspine.worker import WorkerConnection

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_redisspine.settings import SpineConfig

T = TypeVar("T")

logger = logging.getLogger("scrapy_redisspine.scheduler")

REASON_CONFIG = "redisspine_config_error"
REASON_UNREACHABLE = "redisspine_redis_unreachable"
REASON_CORRUPT = "redisspine_corrupt_key"
REASON_CONFLICT = "redisspine_crawl_conflict"
REASON_LOST = "redisspine_state_lost"
REASON_PURGED = "redisspine_purged"
REASON_MEMORY = "redisspine_memory_exceeded"
#: Close reasons after which the process exits non-zero: the crawl is not done.
FAILED_REASONS = frozenset({
    REASON_CONFIG, REASON_UNREACHABLE, REASON_CORRUPT, REASON_CONFLICT, REASON_LOST,
    REASON_PURGED, REASON_MEMORY,
})


#: How long a worker's join rides through a restart, a failover or a reshard under
#: way before it refuses (a replica is promoted within the cluster's node timeout).
JOIN_RIDE_SECONDS = 30.0


class JoinRefused(Exception):
    """This worker cannot work on its crawl; ``reason`` is its close reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Joined:
    connection: WorkerConnection
    frontier: AnyFrontier
    registration: Registration
    #: The fleet's orders as they stood when this worker joined: a crawl paused or
    #: draining before it started is so for it from its first lease on, not from its
    #: first heartbeat (REDISSPINE_HEARTBEAT_SECONDS later).
    orders: Orders


def join(config: SpineConfig, crawl_id: str, spider: str, worker_id: str) -> Joined:
    """Connect, check the crawl's keys and register this worker; or refuse."""
    try:
        keys = CrawlKeys(config.key_prefix, crawl_id, config.politeness_group,
                         shards=config.shards)
    except ValueError as exc:
        raise JoinRefused(REASON_CONFIG, str(exc)) from None
    connection = _connect(config, crawl_id, worker_id)
    keys = _riding(connection, lambda: _placed(config, connection, keys))
    options: dict[str, Any] = {
        "concurrency": config.host_concurrency, "backlog_cap": config.host_backlog_cap,
        "items_cap": config.items_max_count, "items_max_bytes": config.items_max_bytes,
        "page_budget": 0 if config.closespider_per_process else config.closespider_pagecount,
        "lane_page_limit": config.host_page_limit, "throttle": config.autothrottle,
        "min_delay_ms": int(config.download_delay * 1000),
    }
    frontier: AnyFrontier = (
        ShardedFrontier(connection.client, keys, worker_id, config.queue_order,
                        holder_timeout_ms=config.worker_timeout_ms, **options)
        if config.shards > 1
        else Frontier(connection.client, keys, worker_id, config.queue_order, **options))
    _refuse_if_evicting(connection, frontier)
    registration = _register(config, connection, frontier, spider)
    if registration.status == "conflict":
        _refuse(connection, REASON_CONFLICT, (
            f"crawl {crawl_id!r} on this Redis belongs to spider {registration.spider!r}, "
            f"and this is spider {spider!r}: two spiders on one crawl id would take each "
            f"other's requests. Give this spider a REDISSPINE_CRAWL_ID of its own"
        ))
    if registration.status == "shards":
        _refuse(connection, REASON_CONFLICT, (
            f"crawl {crawl_id!r} on this Redis was created with REDISSPINE_SHARDS = "
            f"{registration.shards}, and this worker has REDISSPINE_SHARDS = "
            f"{config.shards}: a crawl keeps its number of shards. Set "
            f"REDISSPINE_SHARDS = {registration.shards}, or start afresh with "
            f"REDISSPINE_FLUSH_ON_START = True (no worker alive) or another crawl id"
        ))
    if registration.alive == 0:
        _new_run(frontier)
    orders = _riding(connection, lambda: read_orders(frontier.client, frontier.keys))
    _log_joined(config, crawl_id, connection, registration, worker_id)
    return Joined(connection, frontier, registration, orders)


def _placed(config: SpineConfig, connection: WorkerConnection, keys: CrawlKeys) -> CrawlKeys:
    """The crawl's keys as it is laid out on this Redis (placement.py); on a cluster,
    a crawl of another group, or of a group spread over another number of slots, is
    refused, and one laid out by an earlier version is said to keep its own budget."""
    try:
        placed = locate(connection.client, keys, claim=True)
    except PlacementCorrupt as exc:
        _refuse(connection, REASON_CORRUPT, str(exc))
    if placed.colocated and placed.group != keys.group:
        _refuse(connection, REASON_CONFLICT, (
            f"crawl {keys.crawl_id!r} on this Redis Cluster lives in the slots of politeness "
            f"group {placed.group!r}, and this worker has REDISSPINE_POLITENESS_GROUP = "
            f"{keys.group!r}: a crawl keeps its group there. Set it to {placed.group!r}, "
            f"or start afresh with another crawl id"
        ))
    try:
        if placed.colocated and placed.shards != keys.shards:
            raise GroupShardsConflict(keys, placed.shards)
        claim_group_shards(connection.client, placed)
    except GroupShardsConflict as exc:
        _refuse(connection, REASON_CONFLICT, str(exc))
    except PlacementCorrupt as exc:
        _refuse(connection, REASON_CORRUPT, str(exc))
    if placed.cluster and not placed.colocated:
        logger.warning(
            "redisspine: crawl %r on this Redis Cluster was created by a version that kept "
            "politeness per crawl there: its lanes keep a budget of their own, not shared "
            "with politeness group %r. A new crawl id shares it", keys.crawl_id, keys.group)
    return placed


def eviction_refused(where: str, policy: str) -> str:
    """The one line of a worker that will not work on a server that may evict the
    crawl's keys (``connection.evicting_policy``), at its join or mid-crawl."""
    return (f"{where} may delete this crawl's keys to make room: its maxmemory-policy is "
            f"{policy} and a maxmemory is set, so once full it evicts keys of its choosing "
            f"(queued requests, leases, the dedup record) and the crawl would lose work "
            f"without knowing it. Set maxmemory-policy noeviction on that server (or a "
            f"volatile-* policy: the crawl's keys never expire), or give the crawl a Redis "
            f"of its own")


def _refuse_if_evicting(connection: WorkerConnection, frontier: AnyFrontier) -> None:
    """Refuse a server that may evict the crawl's keys before registering on it. One
    that will not say (``INFO`` refused: an ACL without ``@dangerous``, a proxy) is
    joined, with a line: the memory watch asks the same at each sweep and reports
    its refusal there."""

    def policy() -> str:
        try:
            return frontier.upkeep.memory().evicting
        except redis.exceptions.ResponseError as exc:
            logger.info(
                "redisspine: %s refused INFO memory (%s): whether it may evict the crawl's "
                "keys is not known", connection.description, exc)
            return ""

    evicting = _riding(connection, policy)
    if evicting:
        _refuse(connection, REASON_CONFIG, eviction_refused(connection.description, evicting))


def _register(config: SpineConfig, connection: WorkerConnection, frontier: AnyFrontier,
              spider: str) -> Registration:
    """Check the crawl's keys and register (riding through a failover: ``_riding``)."""

    def register() -> Registration:
        try:
            frontier.upkeep.check_key_types()
        except CorruptKeyError as exc:
            _refuse(connection, REASON_CORRUPT, str(exc))
        return frontier.register(
            flush=config.flush_on_start, alive_ms=config.worker_timeout_ms, spider=spider
        )

    return _riding(connection, register)


def _riding(connection: WorkerConnection, call: Callable[[], T]) -> T:
    """``call()``, riding through a server that went away after it answered this
    worker (a restart, a failover) and what a Redis Cluster (or a Sentinel's primary)
    says while it fails over or reshards, for up to :data:`JOIN_RIDE_SECONDS`: a
    worker started in that moment waits, as running workers do, instead of exiting.
    Anything else refuses at once."""
    deadline = time.monotonic() + JOIN_RIDE_SECONDS
    delay, warned = 0.1, False
    while True:
        try:
            return call()
        except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
            if not _passing(exc) or time.monotonic() + delay > deadline:
                _refuse(connection, REASON_UNREACHABLE,
                        _unreachable(connection.description, exc))
            if not warned:
                warned = True
                logger.warning(
                    "redisspine: %s while joining (%s: %s); a restart, a failover or a "
                    "reshard under way says so: retrying for up to %.0f s",
                    connection.description, type(exc).__name__, exc, JOIN_RIDE_SECONDS)
            time.sleep(delay)
            delay = min(2 * delay, 2.0)


#: redis-py's ConnectionErrors that say the credentials were refused, not that the
#: server went away (``ExternalAuthProviderError`` only in redis-py 6+).
_REFUSED_CREDENTIALS: tuple[type[Exception], ...] = tuple(
    getattr(redis.exceptions, name)
    for name in ("AuthenticationError", "AuthorizationError", "ExternalAuthProviderError")
    if hasattr(redis.exceptions, name)
)


def _passing(exc: Exception) -> bool:
    """Does ``exc`` come from a restart, a failover or a reshard under way, not from a
    wrong URL or password? Called only once this worker's connection answered
    (``_connect`` pings), so a connection lost, refused or timing out since means the
    server went away under the join (a restart: "Connection closed by server", then
    refused, then ``LOADING`` while it reads its AOF; a failover), as it would under a
    running worker, which rides it too. A password refused on reconnecting is no
    outage. Also cluster redirections and retries that ran out (``TRYAGAIN``, ``ASK``,
    ``CLUSTERDOWN``, a slot no master serves yet, redis-py's "TTL exhausted"), a
    primary turned replica, a Sentinel with no primary yet."""
    if isinstance(exc, _REFUSED_CREDENTIALS):
        return False
    return isinstance(exc, (
        redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
        redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
        redis.exceptions.AskError, redis.exceptions.RedisClusterException,
        redis.exceptions.ReadOnlyError, MasterNotFoundError,
    ))


def _refuse(connection: WorkerConnection, reason: str, message: str) -> NoReturn:
    """Close what this worker opened and refuse it, with ``reason`` and one line."""
    connection.close()
    raise JoinRefused(reason, message)


def _new_run(frontier: AnyFrontier) -> None:
    """The first worker of a new run forgets the last run's close order (a fleet-wide
    limit, ``limits``): with a raised limit the crawl goes on; with a limit still
    spent, the next lease or check sets it again. (Workers still alive are closing
    for it: a worker joining them keeps it.)"""
    with contextlib.suppress(redis.RedisError):  # a full Redis refuses no HDEL; an outage
        frontier.client.hdel(frontier.keys.control, CLOSE)  # shows at the first lease


def _connect(config: SpineConfig, crawl_id: str, worker_id: str) -> WorkerConnection:
    try:
        return WorkerConnection.open(config, crawl_id, worker_id)
    except RedisServerNotFound as exc:
        raise JoinRefused(REASON_CONFIG, f"cannot start an embedded redis-server: {exc}") from None
    except (redis.RedisError, OSError) as exc:
        where = (f"Redis {describe_url(config.redis_url)}" if config.redis_url
                 else "the embedded redis-server")
        raise JoinRefused(REASON_UNREACHABLE, _unreachable(where, exc)) from None


def _unreachable(where: str, exc: Exception) -> str:
    return f"cannot use {where}: {type(exc).__name__}: {exc}"


def _log_joined(
    config: SpineConfig, crawl_id: str, connection: WorkerConnection,
    registration: Registration, worker_id: str,
) -> None:
    logger.info(
        "redisspine: worker %s joined crawl %r on %s (%d other worker(s) alive)",
        worker_id, crawl_id, connection.description, registration.alive,
    )
    if registration.flushed:
        logger.info("redisspine: flushed crawl %r on start", crawl_id)
    elif config.flush_on_start:
        logger.warning(
            "redisspine: not flushing crawl %r: %d other worker(s) are working on it",
            crawl_id, registration.alive,
        )
    if registration.status == "finished":
        when = datetime.datetime.fromtimestamp(
            registration.finished_ms / 1000, tz=datetime.timezone.utc
        ).strftime("%Y-%m-%d %H:%M:%S UTC")
        logger.warning(
            "redisspine: crawl %r already finished at %s (%d request(s) done) and nothing "
            "is queued: this run has nothing to do. To crawl again from scratch, set "
            "REDISSPINE_FLUSH_ON_START = True, run `redisspine purge %s`, or use another "
            "REDISSPINE_CRAWL_ID; to add pages, `redisspine seed %s URL ...`",
            crawl_id, when, registration.acked, crawl_id, crawl_id,
        )


def leave_quietly(connection: WorkerConnection) -> None:
    """Close a connection on the way out of a refused start (it may be broken)."""
    with contextlib.suppress(redis.RedisError, OSError):
        connection.close()
