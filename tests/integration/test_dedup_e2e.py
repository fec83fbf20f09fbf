"""Real ``scrapy crawl`` workers whose dedup record switches to a Bloom filter mid-crawl.

Checked from the test site's own request log: every page fetched, none twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.integration.crawlproc import assert_exactly_once, assert_finished

if TYPE_CHECKING:
    import redis

    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e


def test_workers_switch_to_bloom_mid_crawl_and_fetch_each_page_once(
    fleet: Fleet, site_factory: SiteFactory, real_redis: redis.Redis
) -> None:
    site = site_factory(hosts=3, pages_per_host=40, fanout=5)
    settings = fleet.crawling(
        site,
        REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS=30,
        REDISSPINE_DEDUP_CHECK_SECONDS=0.05,
        REDISSPINE_DEDUP_MIGRATION_CHUNK_SIZE=5,
        REDISSPINE_BLOOM_BACKEND="bitmap",
        REDISSPINE_BLOOM_CAPACITY=50,  # grows layers during the crawl too
        REDISSPINE_BLOOM_ERROR_RATE=1e-6,
    )
    results = fleet.run(3, settings)
    assert_finished(results)
    assert_exactly_once(site)
    assert real_redis.hget(fleet.keys.dedup, "mode") == b"bloom"
    assert not real_redis.exists(fleet.keys.seen)
    assert int(real_redis.hget(fleet.keys.dedup, "layers") or 0) > 1
    assert sum(r.stats.get("redisspine/dedup/switched", 0) for r in results) == 1
    assert sum(r.stats.get("dupefilter/filtered", 0) for r in results) > 0
