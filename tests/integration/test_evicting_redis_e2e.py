"""Real ``scrapy crawl`` workers on a Redis that may evict the crawl's keys.

Found by this fault, before the fix: a server switched to ``allkeys-lru`` with a
small ``maxmemory`` while another client filled it as a cache evicted the crawl's
queue lists and leases; both workers ended ``finished`` (exit 0) with 182 of 360
pages fetched and 14 fetched twice. ``finished`` must never be said over lost work,
so a worker refuses such a server at its start and stops when one turns so under it.
Each test has a throwaway server, since it reconfigures it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_redisspine.testing.redis_server import RedisServer
from tests.integration.crawlproc import wait_for, wait_joined, wait_workers

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e

REFUSED = "redisspine_config_error"


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with RedisServer() as throwaway:
        yield throwaway


def test_workers_refuse_a_redis_that_may_evict_and_fetch_nothing(
    fleet: Fleet, site_factory: SiteFactory, server: RedisServer
) -> None:
    site = site_factory(hosts=2, pages_per_host=10)
    client = server.client()
    try:
        client.config_set("maxmemory", 500_000_000)
        client.config_set("maxmemory-policy", "allkeys-lru")
        results = fleet.run(2, fleet.crawling(site, REDISSPINE_REDIS_URL=server.url))
        assert client.dbsize() == 0, "nothing written: refused before registering"
    finally:
        client.close()
    for result in results:
        assert result.returncode != 0, result.log[-2000:]
        assert result.finish_reason == REFUSED
        errors = [line for line in result.log.splitlines() if " ERROR: " in line]
        assert len(errors) == 1, errors
        assert "maxmemory-policy is allkeys-lru" in errors[0]
        assert "Traceback" not in result.log
    assert site.requests() == [], "no page fetched"


def test_a_redis_turned_evicting_under_a_crawl_stops_it_never_finished(
    fleet: Fleet, site_factory: SiteFactory, server: RedisServer
) -> None:
    site = site_factory(hosts=6, pages_per_host=60, fanout=4, latency=0.05)
    settings = fleet.crawling(site, REDISSPINE_REDIS_URL=server.url, CONCURRENT_REQUESTS=4,
                              REDISSPINE_SWEEP_SECONDS=0.5)
    client = server.client()
    stop = threading.Event()

    def fill_as_a_cache() -> None:  # another tenant of the server
        i = 0
        while not stop.is_set():
            # (the server may refuse or evict: either is the point)
            with contextlib.suppress(redis.RedisError):
                client.set(f"cache:{i}", b"x" * 2000)
            i += 1
            if i % 50 == 0:
                time.sleep(0.05)

    filler = threading.Thread(target=fill_as_a_cache, daemon=True)
    try:
        workers = fleet.start(2, settings)
        wait_joined(server.url, fleet.keys, 2)
        wait_for(lambda: len(site.requests()) >= 20, 30, "the crawl to get going")
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", used + 3_000_000)
        client.config_set("maxmemory-policy", "allkeys-lru")
        filler.start()
        results = wait_workers(workers, timeout=120)
    finally:
        stop.set()
        if filler.is_alive():
            filler.join()
        client.close()
    fetched = len(set(site.fetch_counts()) & site.all_urls())
    assert fetched < len(site.all_urls()), "the crawl was stopped before its end"
    for result in results:
        assert result.finish_reason == REFUSED, (result.finish_reason, result.log[-3000:])
        assert result.returncode != 0
        errors = [line for line in result.log.splitlines() if " ERROR: " in line]
        assert any("maxmemory-policy is allkeys-lru" in line for line in errors), errors
        assert "Traceback" not in result.log
