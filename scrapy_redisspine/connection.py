"""Redis connections, and the embedded redis-server used when no URL is configured.

Embedded mode exists so that ``pip install`` alone gives a persistent, resumable
crawl that several local ``scrapy crawl`` processes share: the first process starts a
redis-server on a unix socket in the project's data directory (AOF persistence on),
the others find the socket and join. A file lock serialises start-up so that two
processes starting at once do not both launch a server.
"""

from __future__ import annotations

import fcntl
import logging
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import parse_url
from redis.crc import key_slot
from redis.exceptions import RedisClusterException
from redis.retry import Retry
from redis.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

from scrapy_redisspine import _redis_urls as redis_urls
from scrapy_redisspine._packing import hiredis_packed
from scrapy_redisspine.server_binaries import (
    RedisServerNotFound,
    find_redis_server,
    server_version,
)

if TYPE_CHECKING:
    import os
    from collections.abc import Iterator, Mapping

logger = logging.getLogger(__name__)

__all__ = [  # find_redis_server and RedisServerNotFound live in server_binaries.py
    "RedisServerNotFound",
    "client_from_url",
    "describe_url",
    "ensure_embedded_server",
    "find_redis_server",
    "is_cluster",
    "is_cooperative",
    "routed_to",
    "same_slot",
    "sentinel_primary",
    "shutdown_embedded_if_unused",
]

SOCKET_NAME = "redis.sock"
_START_TIMEOUT_SECONDS = 10.0
_MAX_SOCKET_PATH = 103  # sun_path is 104 bytes on macOS, 108 on Linux


def client_from_url(url: str, *, cooperative: bool = False, **options: Any) -> redis.Redis:
    """A client for the workers and tools: bytes in and out (payloads are binary).

    ``redis+cluster://`` gives a :class:`~redis.cluster.RedisCluster` (it follows the
    slot map: MOVED/ASK, a promoted replica), ``redis+sentinel://`` a client of the
    service's current primary (it asks the sentinels again after a failover), any
    other URL redis-py's own ``from_url``. ``options`` go to every connection. Typed
    as ``redis.Redis`` because that is the command interface both clients share.
    """
    quiet_redis_debug()
    options = {"decode_responses": False, "health_check_interval": 30, **options}
    target = redis_urls.parse(url)
    if target.kind == redis_urls.CLUSTER:
        return cast("redis.Redis", _cluster_client(target, options))
    if target.kind == redis_urls.SENTINEL:
        return _sentinel_client(target, options)
    base = parse_url(url).get("connection_class", redis.Connection)  # type: ignore[no-untyped-call]
    if not cooperative:
        return redis.Redis.from_url(url, connection_class=hiredis_packed(base), **options)
    from scrapy_redisspine._loop_io import cooperative_connection, cooperative_retry

    client = redis.Redis.from_url(url, connection_class=cooperative_connection(base),
                                  **options)
    retry = cooperative_retry(client.get_retry())
    if retry is not None:
        client.set_retry(retry)
    return client


def is_cooperative(client: object) -> bool:
    """Whether every connection of ``client`` parks a LoopIO call while it waits (a
    plain client made with ``cooperative=True``; never a Cluster or Sentinel one)."""
    from scrapy_redisspine._loop_io import CooperativeConnection

    pool = getattr(client, "connection_pool", None)
    return (type(client) is redis.Redis and type(pool) is redis.ConnectionPool
            and issubclass(pool.connection_class, CooperativeConnection))


def _credentials(target: redis_urls.RedisTarget) -> dict[str, Any]:
    found = {"username": target.username, "password": target.password}
    return {name: value for name, value in found.items() if value is not None}


def _cluster_client(target: redis_urls.RedisTarget, options: dict[str, Any]) -> RedisCluster:
    """Startup nodes from the URL; the client learns the rest of the cluster from them."""
    # Not among the options redis-py gives a cluster node connection (it would drop it).
    options.pop("health_check_interval", None)
    nodes = [ClusterNode(host, port) for host, port in target.nodes]  # type: ignore[no-untyped-call]
    try:
        return RedisCluster(startup_nodes=nodes, ssl=target.tls, **_credentials(target),
                            connection_class=hiredis_packed(
                                redis.SSLConnection if target.tls else redis.Connection),
                            **options)
    except RedisClusterException as exc:
        # It asks the nodes for the slot map at once, and its error is no RedisError:
        # callers report an unreachable Redis in one line for a ConnectionError.
        raise redis.ConnectionError(str(exc)) from None


def _sentinel_client(target: redis_urls.RedisTarget, options: dict[str, Any]) -> redis.Redis:
    """The service's primary, found through the sentinels at every (re)connect. The URL's
    credentials are the data nodes'; sentinels are asked without (their usual set-up)."""
    sentinel_options: dict[str, Any] = {name: options[name] for name in ("socket_timeout",
                                                         "socket_connect_timeout")
                        if name in options}
    sentinel = Sentinel(  # type: ignore[no-untyped-call]
        list(target.nodes), ssl=target.tls, sentinel_kwargs={"ssl": target.tls,
                                                             **sentinel_options})
    managed = SentinelManagedSSLConnection if target.tls else SentinelManagedConnection
    primary = sentinel.master_for(  # type: ignore[no-untyped-call]
        target.service, db=target.db, ssl=target.tls, **_credentials(target),
        connection_class=hiredis_packed(managed), **options)
    return cast("redis.Redis", primary)


def sentinel_primary(client: object) -> tuple[str, int] | None:
    """The address the sentinels name as the service's primary now, for a client of
    ``redis+sentinel://`` (None for any other). Asking is also what moves the client:
    redis-py asks the sentinels only when a connection (re)connects, so after a
    failover a pooled connection keeps talking to the old primary, which takes writes
    until Sentinel demotes it (seconds later), and those writes are lost. Once this
    sees the new address, redis-py drops the pool's idle connections to the old one,
    and each busy one as it comes back: every later call goes to the new primary.
    Raises MasterNotFoundError (a ConnectionError) when no sentinel names one."""
    pool = getattr(client, "connection_pool", None)
    if not isinstance(pool, SentinelConnectionPool) or not pool.is_master:
        return None
    host, port = pool.get_master_address()  # type: ignore[no-untyped-call]
    return str(host), int(port)


def is_cluster(client: object) -> bool:
    """Whether ``client`` talks to a Redis Cluster (some calls must go one by one)."""
    return isinstance(client, RedisCluster)


def same_slot(client: object, key: str, other: str) -> bool:
    """Whether one script may touch both keys: always on one server; on a cluster only
    when they hash to one slot (the cluster client refuses the call before sending it,
    with an error that is no RedisError)."""
    return not isinstance(client, RedisCluster) or key_slot(key.encode()) == key_slot(
        other.encode())


def routed_to(client: object, key: str) -> dict[str, Any]:
    """Options that send a command to the server holding ``key``: on a cluster, its
    node. For what the cluster client cannot route itself, a module command its
    command table lacks (``BF.EXISTS`` on a server without RedisBloom), or a keyless
    command that must see the crawl's own server (``INFO memory``; ``TIME``, the clock
    the crawl's scripts read); elsewhere none."""
    if isinstance(client, RedisCluster):
        return {"target_nodes": client.get_node_from_key(key)}  # type: ignore[no-untyped-call]
    return {}


def evicting_policy(info: Mapping[str, Any]) -> str:
    """The ``maxmemory_policy`` of an ``INFO memory`` reply when that server may delete
    the crawl's keys to make room, else "".

    Why it matters: a server that evicts takes queued requests, leases and the dedup
    record without a word, and the crawl would then end ``finished`` over work it
    lost. Only an ``allkeys-*`` policy with a ``maxmemory`` set does: the crawl's keys
    never expire, so a ``volatile-*`` policy never picks one (it refuses writes, as
    ``noeviction`` does, which the memory watch handles), and without a limit nothing
    is evicted. A reply without the fields (a proxy, fakeredis) evicts nothing known."""
    policy = str(info.get("maxmemory_policy", ""))
    if policy.startswith("allkeys-") and int(info.get("maxmemory", 0) or 0) > 0:
        return policy
    return ""


def quiet_redis_debug() -> None:
    """Keep redis-py's DEBUG lines (one per failed operation and connection retry,
    with the connection's details) out of a worker's log at Scrapy's default level,
    DEBUG: the worker reports an outage itself, once, in one line. A level someone
    set on the ``redis`` logger is left as it is (set it to DEBUG to see them)."""
    redis_logger = logging.getLogger("redis")
    if redis_logger.level == logging.NOTSET:
        redis_logger.setLevel(logging.INFO)


def describe_url(url: str) -> str:
    """The URL with any password masked, for logs."""
    return redis_urls.masked(url)


@contextmanager
def _locked(directory: Path) -> Iterator[None]:
    with open(directory / "start.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _running_version(socket_path: Path) -> str:
    """The joined server's own word on what it is (INFO), for the log."""
    client = redis.Redis(unix_socket_path=str(socket_path), socket_timeout=2)
    try:
        info = client.info("server")
    except redis.RedisError:
        return "version unknown"
    finally:
        client.close()
    if "valkey_version" in info:
        return f"Valkey {info['valkey_version']}"
    return f"Redis {info.get('redis_version', '?')}"


def _ping(socket_path: Path) -> bool:
    if not socket_path.exists():
        return False
    client = redis.Redis(unix_socket_path=str(socket_path), socket_timeout=2)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


#: Entries past which the frontier's HASHes and ZSETs should not stay packed: what the
#: embedded server is started with, what Operations recommends, what the scripts
#: convert the frontier's keys past on any server (``hashed_above`` in
#: scripts/lib/hashed.lua, which a test holds equal), and what ``redisspine status``
#: holds a user's Redis to (status.py's hint).
PACKED_ENTRIES_MAX = 16
#: The embedded server's compact encodings end at 16 entries (Redis's default: 128).
#: The frontier's lane HASHes and ZSETs (``busy``, ``backlog``, ``hosts``, ...) hold a
#: field per lane, and in-flight's ``leases`` and ``owned`` a member per lease: in a
#: listpack every read and write of one scans the key, so with 20 to 128 lanes each
#: costs up to ~100 comparisons instead of a hash lookup. At 16 the scripts run 19-41 %
#: fewer instructions per request, by server (benchmarks/RESULTS.md, session 17), for a
#: few KB more per crawl; a request's own bytes do not change. The ``ziplist`` names are the
#: ones Redis 6.2 knows; Redis 7+ and Valkey take them as aliases.
EMBEDDED_ENCODING_ARGS = (
    "--hash-max-ziplist-entries", str(PACKED_ENTRIES_MAX),
    "--zset-max-ziplist-entries", str(PACKED_ENTRIES_MAX),
)


def _start_server(binary: str, directory: Path, socket_path: Path) -> None:
    socket_path.unlink(missing_ok=True)
    command = [
        binary,
        "--port", "0",
        "--unixsocket", str(socket_path),
        "--unixsocketperm", "700",
        "--dir", str(directory),
        "--appendonly", "yes",
        "--save", "",
        "--daemonize", "yes",
        "--pidfile", str(directory / "redis.pid"),
        "--logfile", str(directory / "redis.log"),
        *EMBEDDED_ENCODING_ARGS,
    ]
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL, capture_output=True)
    deadline = time.monotonic() + _START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if _ping(socket_path):
            return
        time.sleep(0.05)
    raise RuntimeError(
        f"embedded redis-server did not answer on {socket_path} within "
        f"{_START_TIMEOUT_SECONDS:.0f}s; see {directory / 'redis.log'}"
    )


def ensure_embedded_server(directory: str | os.PathLike[str], binary: str | None = None) -> str:
    """Start (or join) the project's embedded redis-server; return its URL."""
    path = Path(directory).resolve()
    path.mkdir(parents=True, exist_ok=True)
    socket_path = path / SOCKET_NAME
    if len(str(socket_path)) > _MAX_SOCKET_PATH:
        raise ValueError(
            f"embedded redis-server socket path {socket_path} is longer than unix sockets "
            f"allow ({_MAX_SOCKET_PATH} bytes); set REDISSPINE_EMBEDDED_DIR to a shorter path"
        )
    with _locked(path):
        if _ping(socket_path):
            logger.info("joining embedded redis-server at %s (%s)", socket_path,
                        _running_version(socket_path))
        else:
            server = find_redis_server(binary)
            logger.info("starting embedded redis-server %s (%s) at %s", server,
                        server_version(server), socket_path)
            _start_server(server, path, socket_path)
    return f"unix://{socket_path}"


def shutdown_embedded_if_unused(directory: str | os.PathLike[str]) -> bool:
    """Stop the embedded server when no other client is connected (it saves its AOF).

    Runs under the start lock, so a process joining at this moment either sees the
    old server (and keeps it alive by being connected) or starts a new one.
    """
    path = Path(directory).resolve()
    socket_path = path / SOCKET_NAME
    with _locked(path):
        if not _ping(socket_path):
            return False
        # No retries: the server hangs up on SHUTDOWN, and a retrying client would
        # wait out its backoff against a server that is gone.
        client = redis.Redis(
            unix_socket_path=str(socket_path), socket_timeout=5, retry=Retry(NoBackoff(), 0)
        )
        try:
            if len(client.client_list()) > 1:
                return False
            client.shutdown()  # AOF is on: it is flushed first
        except redis.ConnectionError:
            pass  # the server closes the connection as it shuts down
        finally:
            client.close()
        return True
