"""The throwaway redis-server behind the tests: crash and restart tests are only as
good as its kill() and restart(), and isolation between tests rests on redis_url."""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_redisspine.testing.redis_server import RedisServer, RedisServerError, free_port

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
    with pytest.raises(RedisServerError, match="Bad directive"):
        RedisServer(extra_args=["--no-such-option", "1"]).start()


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
