"""REDISSPINE_HOST_PAGE_LIMIT with real workers: each lane of the test site is fetched
exactly N times fleet-wide (from the site's own log), the rest dropped and counted,
and the crawl ends ``finished``."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from tests.integration.crawlproc import assert_finished

if TYPE_CHECKING:
    import redis

    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e

LIMIT = 5


def test_host_page_limit_5_on_a_3_host_site_fetches_exactly_5_pages_per_host_with_2_workers(
    fleet: Fleet, site_factory: SiteFactory, real_redis: redis.Redis
) -> None:
    # Two download slots per host, so both workers lease from one lane at once: the
    # limit holds because the lease script counts, not because one worker does.
    site = site_factory(hosts=3, pages_per_host=40, latency=0.05)
    settings = fleet.crawling(site, REDISSPINE_HOST_PAGE_LIMIT=LIMIT,
                              REDISSPINE_HOST_CONCURRENCY=2, CONCURRENT_REQUESTS=4)
    results = fleet.run(2, settings, timeout=120)
    assert_finished(results)
    served = [record for record in site.requests()
              if record.get("page") and record["method"] == "GET" and record["status"] == 200]
    per_host = Counter(record["host"] for record in served)
    assert sorted(per_host.values()) == [LIMIT] * 3, per_host
    reachable = Counter(urlsplit(url).hostname for url in site.all_urls())
    assert all(pages > LIMIT for pages in reachable.values()), reachable
    dropped = sum(int(r.stats.get("redisspine/scheduler/host_page_limited", 0))
                  for r in results)
    fleet_dropped = int(real_redis.hget(fleet.keys.stats, "host_page_limited") or 0)
    assert dropped == fleet_dropped > 0, (dropped, fleet_dropped)
    assert real_redis.hget(fleet.keys.record, "finished_ms") is not None
    assert {int(v) for v in real_redis.hvals(fleet.keys.lane_pages)} == {LIMIT}
