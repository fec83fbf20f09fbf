"""Real ``scrapy crawl`` workers on a real 3-master Redis Cluster and through Sentinel.

Each crawl id is chosen so that its keys' slot and the crawl registry's slot
(``P:crawls``) live on different masters: a plain client would be refused with MOVED
at open, a script or pipeline that crossed slots would be refused by the cluster.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from redis.crc import key_slot

from scrapy_redisspine import cli
from scrapy_redisspine.connection import client_from_url
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.testing.redis_cluster import ClusterServers, SentinelServers
from tests.integration.crawlproc import (
    Fleet,
    assert_all_fetched,
    assert_exactly_once,
    assert_finished,
    wait_for,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from tests.conftest import SiteFactory

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("outside_any_project")]

FAST_RECOVERY = {
    "REDISSPINE_HEARTBEAT_SECONDS": 0.3,
    "REDISSPINE_WORKER_TIMEOUT_SECONDS": 1.5,
    "REDISSPINE_SWEEP_SECONDS": 0.3,
}


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterServers]:
    with ClusterServers(masters=3) as servers:
        yield servers


def _master_port(cluster: ClusterServers, key: str) -> int:
    port = cluster.master_of_slot(key_slot(key.encode())).port
    assert port is not None
    return port


def crawl_ids_away_from_registry(cluster: ClusterServers, count: int) -> list[str]:
    """Crawl ids whose keys live on a master that does not hold ``P:crawls``, one per
    such master while there are, so that the crawls also use different masters."""
    registry = _master_port(cluster, CrawlKeys("redisspine", "_").crawls)
    found: dict[int, str] = {}
    extra: list[str] = []
    for n in range(1000):
        crawl = f"cluster-{n}"
        port = _master_port(cluster, CrawlKeys("redisspine", crawl).queue)
        if port == registry:
            continue
        if port not in found:
            found[port] = crawl
        else:
            extra.append(crawl)
        if len(found) + len(extra) >= count and len(found) == len(cluster.masters) - 1:
            break
    return [*found.values(), *extra][:count]


def _fleet(project_dir: Path, worker_log_dir: Path, url: str, crawl: str) -> Fleet:
    return Fleet(project_dir, {"REDISSPINE_REDIS_URL": url, "REDISSPINE_CRAWL_ID": crawl},
                 worker_log_dir / crawl)


def _cli_json(url: str, *args: str, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    assert cli.main(["--redis-url", url, *args]) == 0, args
    return capsys.readouterr().out


def test_crawls_away_from_the_registry_fetch_every_page_once_and_finish(
    cluster: ClusterServers, site_factory: SiteFactory, project_dir: Path,
    worker_log_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    crawls = crawl_ids_away_from_registry(cluster, 2)
    assert len({_master_port(cluster, CrawlKeys("redisspine", c).queue) for c in crawls}) == 2
    for crawl in crawls:
        site = site_factory(hosts=3, pages_per_host=12)
        fleet = _fleet(project_dir, worker_log_dir, cluster.url, crawl)
        results = fleet.run(3, fleet.crawling(site, DOWNLOAD_DELAY=0.02), timeout=120)
        assert_finished(results)
        assert_exactly_once(site)
        status = json.loads(_cli_json(cluster.url, "status", crawl, "--json", capsys=capsys))
        assert status["done"] == len(site.all_urls())
        assert (status["queued"], status["in_flight"], status["dead_letters"]) == (0, 0, 0)
    listed = _cli_json(cluster.url, "list", capsys=capsys)
    for crawl in crawls:
        assert f"{crawl}\t0 queued\t0 in flight" in listed


def test_a_killed_workers_leases_are_swept_back_on_the_cluster(
    cluster: ClusterServers, site_factory: SiteFactory, project_dir: Path,
    worker_log_dir: Path,
) -> None:
    crawl = crawl_ids_away_from_registry(cluster, 3)[2]  # not a crawl of the test above
    site = site_factory(hosts=3, pages_per_host=15, latency=0.3)
    fleet = _fleet(project_dir, worker_log_dir, cluster.url, crawl)
    settings = fleet.crawling(site, **FAST_RECOVERY, CONCURRENT_REQUESTS=4)
    [victim] = fleet.start(1, settings, log="victim")
    keys = CrawlKeys("redisspine", crawl)
    client = client_from_url(cluster.url)  # finds the crawl's node itself
    try:
        wait_for(lambda: client.hlen(keys.inflight) >= 2, 60, "the victim holds leases")
        held = client.hlen(keys.inflight)
        victim.kill()
        victim.process.wait()
        results = fleet.run(2, settings, log="rest", timeout=120)
        assert_finished(results)
        twice = assert_all_fetched(site)
        assert len(twice) <= held + 4, f"more duplicates than the dead worker held: {twice}"
        stats = client.hgetall(keys.stats)
        assert int(stats.get(b"requeued", 0)) >= 1, stats
    finally:
        client.close()


def test_a_crawl_through_sentinel_fetches_every_page_once(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path,
) -> None:
    with SentinelServers() as sentinel:
        site = site_factory(hosts=3, pages_per_host=10)
        fleet = _fleet(project_dir, worker_log_dir, sentinel.url, "via-sentinel")
        results = fleet.run(2, fleet.crawling(site, DOWNLOAD_DELAY=0.02), timeout=120)
        assert_finished(results)
        assert_exactly_once(site)
        with sentinel.primary.client() as primary:
            assert primary.sismember(CrawlKeys("redisspine", "via-sentinel").crawls,
                                     "via-sentinel")
