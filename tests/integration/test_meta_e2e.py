"""Rich meta across real workers: items, nested requests and typed values stored by one
``scrapy crawl`` process come back to its callbacks as they were, in whichever worker
leases them, in both serializers, with the project's item classes allowed by default."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.integration.crawlproc import Fleet, assert_exactly_once, assert_finished

if TYPE_CHECKING:
    from tests.conftest import SiteFactory

pytestmark = pytest.mark.e2e


@pytest.mark.compat
@pytest.mark.parametrize("serializer", ["msgpack", "json"])
def test_items_and_requests_in_meta_reach_callbacks_of_other_workers(
    fleet: Fleet, site_factory: SiteFactory, serializer: str
) -> None:
    site = site_factory(hosts=2, pages_per_host=15, fanout=3)
    meta_fleet = Fleet(fleet.project_dir, fleet.settings, fleet.log_dir, spider="meta")
    # No local cache: every request a worker leases is decoded from its payload.
    results = meta_fleet.run(2, meta_fleet.crawling(
        site, REDISSPINE_SERIALIZER=serializer, REDISSPINE_LOCAL_REQUEST_CACHE=0,
    ))
    assert_finished(results)
    assert_exactly_once(site)
    total = {name: sum(r.stats.get(name, 0) for r in results)
             for name in ("meta/checked", "meta/wrong", "redisspine/scheduler/unserializable",
                          "redisspine/scheduler/undecodable", "item_scraped_count")}
    assert total == {
        "meta/checked": len(site.all_urls()), "meta/wrong": 0,
        "redisspine/scheduler/unserializable": 0, "redisspine/scheduler/undecodable": 0,
        "item_scraped_count": len(site.all_urls()),
    }, "\n".join(r.log[-3000:] for r in results)
