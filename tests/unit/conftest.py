"""Unit-test fixtures: a Redis client on each backend, and frontier builders.

``client`` runs a test twice: on fakeredis (fast, fresh server per test) and on the
session's real redis-server (emptied before the test), so a Lua script that only
works on one of them is caught. The real server comes from ``tests/conftest.py``,
which fails (never skips) when no redis-server binary exists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import fakeredis
import pytest

from scrapy_redisspine.frontier import Frontier
from scrapy_redisspine.keys import CrawlKeys

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from scrapy_redisspine.testing.redis_server import RedisServer

BACKENDS = ("fakeredis", "redis")


@pytest.fixture
def crawl_keys() -> CrawlKeys:
    return CrawlKeys("redisspine", "test")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def real_redis(redis_server: RedisServer, redis_url: str) -> Iterator[redis.Redis]:
    """A client of the session's real redis-server, emptied for this test."""
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def make_client(
    backend: str, request: pytest.FixtureRequest
) -> Callable[[], redis.Redis]:
    """More clients of the same backend (same data), e.g. one per thread or worker."""
    if backend == "fakeredis":
        server = fakeredis.FakeServer()
        return lambda: fakeredis.FakeRedis(server=server)
    redis_server: RedisServer = request.getfixturevalue("redis_server")
    request.getfixturevalue("redis_url")  # FLUSHALL before the test
    return redis_server.client


@pytest.fixture
def client(make_client: Callable[[], redis.Redis]) -> Iterator[redis.Redis]:
    """One client per test, on fakeredis or a real redis-server, bytes in and out."""
    redis_client = make_client()
    yield redis_client
    redis_client.close()


FrontierFactory = Callable[..., Frontier]


@pytest.fixture
def make_frontier(
    client: redis.Redis, crawl_keys: CrawlKeys
) -> FrontierFactory:
    """``make_frontier(worker_id="w1", order="fifo", client=None, concurrency=1,
    backlog_cap=0)`` on the test crawl.

    ``concurrency`` is how many requests of one politeness lane may be in flight at
    once, fleet-wide: a test that leases several requests of one lane together needs
    at least that many (or requests in distinct lanes).
    """

    def make(
        worker_id: str = "w1",
        order: str = "fifo",
        client_: redis.Redis | None = None,
        *,
        concurrency: int = 1,
        backlog_cap: int = 0,
    ) -> Frontier:
        return Frontier(
            client_ or client, crawl_keys, worker_id, order,
            concurrency=concurrency, backlog_cap=backlog_cap,
        )

    return make


@pytest.fixture
def frontier(make_frontier: FrontierFactory) -> Frontier:
    return make_frontier()


class StubHooks:
    """Stands in for the engine hooks: reports free download slots, wakes nothing."""

    def __init__(self, free_slots: int) -> None:
        self.free_slots = free_slots
        self.wakes = 0

    def free_download_slots(self) -> int:
        return self.free_slots

    def wake(self) -> None:
        self.wakes += 1

    def uninstall(self) -> None:
        pass
