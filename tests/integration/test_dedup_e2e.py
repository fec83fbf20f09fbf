"""Real ``scrapy crawl`` workers whose dedup record switches to a Bloom filter mid-crawl.

Checked from the test site's own request log: every page fetched, none twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import redis

from scrapy_redisspine.keys import CrawlKeys
from tests.integration.crawlproc import run_workers

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from scrapy_redisspine.testing.site import TestSite

pytestmark = pytest.mark.e2e


def test_workers_switch_to_bloom_mid_crawl_and_fetch_each_page_once(
    project_dir: Path,
    site_factory: Callable[..., TestSite],
    redis_url: str,
    crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=3, pages_per_host=40, fanout=5)
    settings = {
        **crawl_settings,
        "LINKS_START_URLS": ",".join(site.start_urls()),
        "REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS": 30,
        "REDISSPINE_DEDUP_CHECK_SECONDS": 0.05,
        "REDISSPINE_DEDUP_MIGRATION_CHUNK_SIZE": 5,
        "REDISSPINE_BLOOM_BACKEND": "bitmap",
        "REDISSPINE_BLOOM_CAPACITY": 50,  # grows layers during the crawl too
        "REDISSPINE_BLOOM_ERROR_RATE": 1e-6,
    }
    results = run_workers(project_dir, "links", 3, settings, log_dir=worker_log_dir)
    for result in results:
        assert (result.returncode, result.finish_reason) == (0, "finished"), result.log[-4000:]
    counts = site.fetch_counts()
    assert set(counts) == site.all_urls(), "a page was never fetched"
    assert max(counts.values()) == 1, "a page was fetched twice"
    keys = CrawlKeys("redisspine", settings["REDISSPINE_CRAWL_ID"])
    client = redis.Redis.from_url(redis_url)
    try:
        assert client.hget(keys.dedup, "mode") == b"bloom"
        assert not client.exists(keys.seen)
        assert int(client.hget(keys.dedup, "layers") or 0) > 1
    finally:
        client.close()
    assert sum(r.stats.get("redisspine/dedup/switched", 0) for r in results) == 1
    assert sum(r.stats.get("dupefilter/filtered", 0) for r in results) > 0
