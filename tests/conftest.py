"""Fixtures shared by unit and integration tests: a real Redis and the test site.

The session's redis-server is spawned here, on a free loopback port in a temporary
directory: tests never touch a Redis someone else uses. A missing redis-server binary
fails the tests that need it (with the reason) instead of skipping them, so a CI
run cannot go green by testing nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine.connection import RedisServerNotFound
from scrapy_redisspine.testing.redis_server import RedisServer
from scrapy_redisspine.testing.site import TestSite

if TYPE_CHECKING:
    from pathlib import Path

    import redis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """One redis-server for the whole session (no persistence: it is reset per test)."""
    server = RedisServer()
    try:
        server.start()
    except RedisServerNotFound as exc:
        missing = str(exc)
    else:
        missing = ""
    if missing:
        pytest.fail(f"these tests need a real redis-server: {missing}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, emptied for this test (FLUSHALL).

    Restarts the server if an earlier test took it down, so one careless test
    cannot fail every test after it.
    """
    if not redis_server.running:
        redis_server.restart()
    client = redis_server.client()
    try:
        client.flushall()
    finally:
        client.close()
    return redis_server.url


@pytest.fixture
def real_redis(redis_server: RedisServer, redis_url: str) -> Iterator[redis.Redis]:
    """A client of the session's real redis-server, emptied for this test."""
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def outside_any_project(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Run in an empty directory with no Redis URL and no Scrapy project in the
    environment, as the ``redisspine`` command is run by hand."""
    for name in ("REDISSPINE_REDIS_URL", "REDIS_URL", "SCRAPY_SETTINGS_MODULE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


SiteFactory = Callable[..., TestSite]


@pytest.fixture
def site_factory(tmp_path: Path) -> Iterator[SiteFactory]:
    """Start test sites with custom parameters; all are stopped after the test.

    Each site logs to ``tmp_path / "site-<n>.jsonl"`` unless ``log_path`` is given.
    """
    sites: list[TestSite] = []

    def make(**kwargs: Any) -> TestSite:
        kwargs.setdefault("log_path", tmp_path / f"site-{len(sites)}.jsonl")
        site = TestSite(**kwargs)
        sites.append(site)
        return site.start()

    yield make
    for site in sites:
        site.stop()


@pytest.fixture
def test_site(site_factory: SiteFactory) -> TestSite:
    """A started default site (3 hosts x 20 pages) logging to a file in tmp_path."""
    return site_factory()
