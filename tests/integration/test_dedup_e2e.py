"""Real ``scrapy crawl`` workers whose dedup record switches to a Bloom filter mid-crawl.

Checked from the test site's own request log: every page fetched, none twice. Run on
both filters: the Lua bitmap on the session's server, and RedisBloom's BF.* on a server
with the real ``redisbloom.so`` loaded.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.crawlproc import (
    assert_all_fetched,
    assert_exactly_once,
    assert_finished,
    wait_for,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from scrapy_redisspine.testing.site import TestSite
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e


@pytest.fixture(params=["bitmap", "redisbloom"])
def bloom_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def dedup_redis_url(request: pytest.FixtureRequest, bloom_backend: str) -> str:
    """The session server for the Lua bitmap; the RedisBloom server for BF.*."""
    return str(request.getfixturevalue(
        "bloom_redis_url" if bloom_backend == "redisbloom" else "redis_url"
    ))


@pytest.fixture
def inspect(dedup_redis_url: str) -> Iterator[redis.Redis]:
    import redis

    client = redis.Redis.from_url(dedup_redis_url)
    yield client
    client.close()


def _switching(
    fleet: Fleet, site: TestSite, redis_url: str, bloom_backend: str, **extra: Any
) -> dict[str, Any]:
    """The crawl of ``site``, its record switching to ``bloom_backend``'s filter at 30."""
    return fleet.crawling(
        site,
        REDISSPINE_REDIS_URL=redis_url,
        REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS=30,
        REDISSPINE_BLOOM_BACKEND=bloom_backend,
        # The bitmap filter grows layers during the crawl too. A RedisBloom filter this
        # small misses its error rate by far (measured: 2-3e-4 of lookups false
        # positives at capacity 50, asked 5e-7; near the rate asked from ~1,000 up),
        # which over a crawl's ~600 lookups dropped a page about one run in ten: it
        # gets a capacity at which "each page once" holds (and a crawl of this site
        # alone grows no layer of it).
        REDISSPINE_BLOOM_CAPACITY=50 if bloom_backend == "bitmap" else 2000,
        REDISSPINE_BLOOM_ERROR_RATE=1e-6,
        **extra,
    )


def test_workers_switch_to_bloom_mid_crawl_and_fetch_each_page_once(
    fleet: Fleet, site_factory: SiteFactory, inspect: redis.Redis, dedup_redis_url: str,
    bloom_backend: str,
) -> None:
    site = site_factory(hosts=3, pages_per_host=40, fanout=5)
    settings = _switching(fleet, site, dedup_redis_url, bloom_backend,
                          REDISSPINE_DEDUP_CHECK_SECONDS=0.05,
                          REDISSPINE_DEDUP_MIGRATION_CHUNK_SIZE=5)
    results = fleet.run(3, settings)
    assert_finished(results)
    assert_exactly_once(site)
    assert inspect.hget(fleet.keys.dedup, "mode") == b"bloom"
    assert inspect.hget(fleet.keys.dedup, "impl") == bloom_backend.encode()
    assert not inspect.exists(fleet.keys.seen)
    if bloom_backend == "redisbloom":
        assert inspect.type(fleet.keys.bloom) == b"MBbloom--"
        fields = inspect.execute_command("BF.INFO", fleet.keys.bloom)  # type: ignore[no-untyped-call]
        if isinstance(fields, list):  # redis-py without a reply parser for BF.INFO
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        assert fields[b"Number of items inserted"] >= 120  # every page, once
    else:
        assert int(inspect.hget(fleet.keys.dedup, "layers") or 0) > 1
    assert sum(r.stats.get("redisspine/dedup/switched", 0) for r in results) == 1
    assert sum(r.stats.get("dupefilter/filtered", 0) for r in results) > 0


def test_workers_killed_mid_switch_lose_nothing_and_the_next_ones_carry_it_on(
    fleet: Fleet, site_factory: SiteFactory, inspect: redis.Redis, dedup_redis_url: str,
    bloom_backend: str,
) -> None:
    # The crawl's SET holds 20,000 fingerprints of an earlier run (none of this
    # site's) when it starts: it switches at once and drains into the filter one
    # fingerprint a chunk, 20 ms of chunks every 0.2 s, for seconds, while the workers
    # crawl; both are SIGKILLed in the middle of it. Two new workers find the crawl
    # "migrating", go on moving the SET, and finish the crawl (the switch may outlast
    # it on a loaded machine: a later run carries it on). Every page is fetched; only
    # the pages the dead held in flight may be fetched twice.
    site = site_factory(hosts=3, pages_per_host=40, fanout=5, latency=0.05)
    earlier = [os.urandom(14) for _ in range(20_000)]  # the SET keeps 14 bytes of each
    for i in range(0, len(earlier), 1000):
        inspect.sadd(fleet.keys.seen, *earlier[i:i + 1000])
    settings = _switching(
        fleet, site, dedup_redis_url, bloom_backend,
        REDISSPINE_DEDUP_CHECK_SECONDS=0.2,
        REDISSPINE_DEDUP_MIGRATION_CHUNK_SIZE=1,
        # the dead are taken for dead, and their leases swept back, within ~2 s
        REDISSPINE_HEARTBEAT_SECONDS=0.3,
        REDISSPINE_WORKER_TIMEOUT_SECONDS=1.5,
        REDISSPINE_SWEEP_SECONDS=0.3,
    )
    victims = fleet.start(2, settings, log="victims")
    wait_for(lambda: len(site.requests()) >= 20, 60, "pages fetched")
    for victim in victims:
        victim.kill()
    for victim in victims:
        victim.process.wait()
    assert inspect.hget(fleet.keys.dedup, "mode") == b"migrating", "killed mid-switch"
    left = inspect.scard(fleet.keys.seen)
    assert left > 0
    held = inspect.hlen(fleet.keys.inflight)
    results = fleet.run(2, settings, log="rest", timeout=120)
    assert_finished(results)
    twice = assert_all_fetched(site)
    assert len(twice) <= held, f"more pages twice than the dead held: {twice}"
    assert inspect.scard(fleet.keys.seen) < left, "the next workers moved more of it"
    assert sum(r.stats.get("redisspine/dedup/migrated", 0) for r in results) > 0
