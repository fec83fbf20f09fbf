"""A worker joining while its Redis restarts waits for it, as a running worker does.

The join (connect, place, check the keys, register, read the orders) used to ride only
what a Redis Cluster says while it fails over or reshards; a single server restarting
under it ("Connection closed by server", then refused, then ``LOADING``) stopped the
worker with ``redisspine_redis_unreachable`` although the server had answered it a
moment before. Found by a crash test whose second worker was still joining when the
test restarted Redis. Each test here has a throwaway server of its own, since it
kills or reconfigures it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis
from redis.sentinel import MasterNotFoundError

from scrapy_redisspine import _joining
from scrapy_redisspine._joining import REASON_UNREACHABLE, JoinRefused, join
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.settings import load_config
from scrapy_redisspine.testing.redis_server import RedisServer
from scrapy_redisspine.worker import WorkerConnection

if TYPE_CHECKING:
    from collections.abc import Callable


def _after_connecting(monkeypatch: pytest.MonkeyPatch,
                      fault: Callable[[WorkerConnection], None]) -> None:
    """``fault`` strikes right after the worker's connection answered its ping."""
    opened = WorkerConnection.open

    def open_then_fault(cls: type[WorkerConnection], *args: Any) -> WorkerConnection:
        connection = opened(*args)
        fault(connection)
        return connection

    monkeypatch.setattr(WorkerConnection, "open", classmethod(open_then_fault))


def test_a_join_cut_by_a_redis_restart_waits_for_it_and_joins(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with RedisServer(appendonly=True) as server:
        back = threading.Event()

        def restart_in_a_second(connection: WorkerConnection) -> None:
            server.kill()

            def start() -> None:
                time.sleep(1.0)
                server.start()
                back.set()

            threading.Thread(target=start, daemon=True).start()

        _after_connecting(monkeypatch, restart_in_a_second)
        config = load_config({"REDISSPINE_REDIS_URL": server.url})
        with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
            joined = join(config, "rides", "spider", "w1")
        try:
            assert back.is_set(), "the join returned before the server was back"
            assert joined.registration.status == "created"  # the first worker of the crawl
            assert "while joining" in caplog.text
            assert "retrying for up to 30 s" in caplog.text
            client = server.client()
            try:
                assert client.zcard(CrawlKeys("redisspine", "rides").workers) == 1
            finally:
                client.close()
        finally:
            joined.connection.close()


def test_a_server_that_does_not_come_back_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_joining, "JOIN_RIDE_SECONDS", 1.0)
    with RedisServer() as server:
        _after_connecting(monkeypatch, lambda connection: server.kill())
        config = load_config({"REDISSPINE_REDIS_URL": server.url})
        with pytest.raises(JoinRefused) as refused:
            join(config, "gone", "spider", "w1")
    assert refused.value.reason == REASON_UNREACHABLE
    message = str(refused.value)
    assert message.startswith("cannot use Redis redis://127.0.0.1:"), message
    assert "ConnectionError" in message
    assert "\n" not in message


def test_a_password_refused_on_reconnecting_is_refused_at_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The server stays up; it now wants a password this worker does not have. Riding
    # that for 30 s would only delay the one line that says so.
    with RedisServer() as server:
        def new_password(connection: WorkerConnection) -> None:
            admin = server.client()
            try:
                admin.config_set("requirepass", "changed")
                admin.execute_command("AUTH", "changed")
                admin.client_kill_filter(_type="normal", skipme=True)
            finally:
                admin.close()

        _after_connecting(monkeypatch, new_password)
        config = load_config({"REDISSPINE_REDIS_URL": server.url})
        with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"), \
                pytest.raises(JoinRefused) as refused:
            join(config, "locked", "spider", "w1")
    assert refused.value.reason == REASON_UNREACHABLE
    assert "AuthenticationError" in str(refused.value)
    assert "retrying" not in caplog.text


@pytest.mark.parametrize(("exc", "ridden"), [
    (redis.exceptions.ConnectionError("Connection closed by server."), True),
    (redis.exceptions.TimeoutError("Timeout reading from socket"), True),
    (redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"), True),
    (redis.exceptions.TryAgainError("TRYAGAIN"), True),
    (redis.exceptions.ReadOnlyError("READONLY"), True),
    (MasterNotFoundError("no primary"), True),
    (redis.exceptions.AuthenticationError("invalid password"), False),
    (redis.exceptions.AuthorizationError("NOPERM"), False),
    (redis.exceptions.ResponseError("WRONGTYPE"), False),
    (redis.exceptions.OutOfMemoryError("OOM"), False),
])
def test_what_a_join_rides_through(exc: Exception, ridden: bool) -> None:
    assert _joining._passing(exc) is ridden
