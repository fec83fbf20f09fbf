"""Fleet-wide crawl limits with real workers: Scrapy's CLOSESPIDER_PAGECOUNT counts
for the whole fleet, and every worker closes with Scrapy's own reason."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.integration.crawlproc import assert_finished

if TYPE_CHECKING:
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e

BATCH = 16  # REDISSPINE_LEASE_BATCH_SIZE's default


def test_closespider_pagecount_300_at_3_workers_stops_the_whole_fleet(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    # Slow enough (0.3 s a page) that all three share the budget, with more lane slots
    # (6 hosts x 4) than the three workers' download slots (3 x 6).
    site = site_factory(hosts=6, pages_per_host=100, latency=0.3)
    settings = fleet.crawling(site, CLOSESPIDER_PAGECOUNT=300, CONCURRENT_REQUESTS=6,
                              REDISSPINE_HOST_CONCURRENCY=4,
                              REDISSPINE_HEARTBEAT_SECONDS=0.3,
                              REDISSPINE_WORKER_TIMEOUT_SECONDS=1.5)
    results = fleet.run(3, settings, timeout=120)
    assert_finished(results, reason="closespider_pagecount")
    fetched = len(site.requests())
    assert 300 <= fetched <= 300 + 3 * BATCH, fetched
    assert len(site.all_urls()) > fetched, "the site must be bigger than the budget"
    received = sum(int(r.stats.get("response_received_count", 0)) for r in results)
    assert 300 <= received <= 300 + 3 * BATCH, received
    per_worker = [int(r.stats.get("response_received_count", 0)) for r in results]
    assert all(0 < pages < 300 for pages in per_worker), (
        f"pages per worker {per_worker}: the budget was not shared by the fleet")


def test_closespider_itemcount_at_3_workers_closes_every_worker_with_scrapys_reason(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    site = site_factory(hosts=6, pages_per_host=100, latency=0.3)
    settings = fleet.crawling(site, CLOSESPIDER_ITEMCOUNT=100, CONCURRENT_REQUESTS=6,
                              REDISSPINE_HOST_CONCURRENCY=4, REDISSPINE_LIMITS_CHECK_SECONDS=0.2,
                              REDISSPINE_HEARTBEAT_SECONDS=0.3,
                              REDISSPINE_WORKER_TIMEOUT_SECONDS=1.5)
    results = fleet.run(3, settings, timeout=120)
    assert_finished(results, reason="closespider_itemcount")
    items = sum(int(r.stats.get("item_scraped_count", 0)) for r in results)
    # Counted every 0.2 s and heard at the next lease or heartbeat: the overshoot is
    # what was in progress then (3 workers x 6 downloads) and the pages that finished
    # during the check interval (about 60/s here): within one lease batch per worker.
    assert 100 <= items <= 100 + 3 * BATCH, items
    assert len(site.requests()) < len(site.all_urls())
