"""Real ``scrapy crawl`` workers whose dedup record switches to a Bloom filter mid-crawl.

Checked from the test site's own request log: every page fetched, none twice. Run on
both filters: the Lua bitmap on the session's server, and RedisBloom's BF.* on a server
with the real ``redisbloom.so`` loaded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.integration.crawlproc import assert_exactly_once, assert_finished

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

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


def test_workers_switch_to_bloom_mid_crawl_and_fetch_each_page_once(
    fleet: Fleet, site_factory: SiteFactory, inspect: redis.Redis, dedup_redis_url: str,
    bloom_backend: str,
) -> None:
    site = site_factory(hosts=3, pages_per_host=40, fanout=5)
    settings = fleet.crawling(
        site,
        REDISSPINE_REDIS_URL=dedup_redis_url,
        REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS=30,
        REDISSPINE_DEDUP_CHECK_SECONDS=0.05,
        REDISSPINE_DEDUP_MIGRATION_CHUNK_SIZE=5,
        REDISSPINE_BLOOM_BACKEND=bloom_backend,
        # The bitmap filter grows layers during the crawl too. A RedisBloom filter this
        # small misses its error rate by far (measured: 2-3e-4 of lookups false
        # positives at capacity 50, asked 5e-7; near the rate asked from ~1,000 up),
        # which over this crawl's ~600 lookups dropped a page about one run in ten: it
        # gets a capacity at which "each page once" holds, and grows no layer.
        REDISSPINE_BLOOM_CAPACITY=50 if bloom_backend == "bitmap" else 2000,
        REDISSPINE_BLOOM_ERROR_RATE=1e-6,
    )
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
