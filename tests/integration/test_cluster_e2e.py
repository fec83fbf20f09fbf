"""Real ``scrapy crawl`` workers on a real 3-master Redis Cluster and through Sentinel.

Each crawl id is chosen so that its keys' slot and the crawl registry's slot
(``P:crawls``) live on different masters: a plain client would be refused with MOVED
at open, a script or pipeline that crossed slots would be refused by the cluster.
On a cluster a crawl lives in its politeness group's slots: each crawl here has a
group of its own (its id), so that its id chooses its master.
"""

from __future__ import annotations

import json
import signal
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
    cluster_keys,
    wait_for,
    wait_workers,
)

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from scrapy_redisspine.testing.site import TestSite
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
        port = _master_port(cluster, cluster_keys(crawl, crawl).queue)
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
    return Fleet(project_dir, {"REDISSPINE_REDIS_URL": url, "REDISSPINE_CRAWL_ID": crawl,
                               "REDISSPINE_POLITENESS_GROUP": crawl}, worker_log_dir / crawl)


def _fetched_with(site: TestSite, query: str) -> bool:
    return any(record["path"].endswith(query) for record in site.requests())


def _cli_json(url: str, *args: str, capsys: pytest.CaptureFixture[str]) -> Any:
    capsys.readouterr()
    assert cli.main(["--redis-url", url, *args]) == 0, args
    return capsys.readouterr().out


def test_crawls_away_from_the_registry_fetch_every_page_once_and_finish(
    cluster: ClusterServers, site_factory: SiteFactory, project_dir: Path,
    worker_log_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    crawls = crawl_ids_away_from_registry(cluster, 2)
    assert len({_master_port(cluster, cluster_keys(c, c).queue) for c in crawls}) == 2
    for crawl in crawls:
        site = site_factory(hosts=3, pages_per_host=12)
        fleet = _fleet(project_dir, worker_log_dir, cluster.url, crawl)
        results = fleet.run(3, fleet.crawling(site, DOWNLOAD_DELAY=0.02), timeout=120)
        assert_finished(results)
        assert_exactly_once(site)
        # a cluster client's calls cannot park on the loop: they keep their threads
        assert {r.stats.get("redisspine/redis/calls") for r in results} == {"threads"}
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
    keys = cluster_keys(crawl, crawl)
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
        assert {r.stats.get("redisspine/redis/calls") for r in results} == {"threads"}
        with sentinel.primary.client() as primary:
            assert primary.sismember(CrawlKeys("redisspine", "via-sentinel").crawls,
                                     "via-sentinel")


def test_seed_and_a_tagged_feed_key_reach_a_running_crawl_on_the_cluster(
    cluster: ClusterServers, test_site: TestSite, project_dir: Path, worker_log_dir: Path,
) -> None:
    """``redisspine seed`` (the push tool) and scrapy-redis's ``lpush`` into a feed key
    named with the crawl's slot's tag (its group's), into a kept-alive crawl on a
    master away from the registry; then ``redisspine drain`` ends it."""
    crawl = crawl_ids_away_from_registry(cluster, 4)[3]
    feed = f"{{{cluster_keys(crawl, crawl).tag()}}}:start_urls"
    fleet = _fleet(project_dir, worker_log_dir, cluster.url, crawl)
    client = client_from_url(cluster.url)
    [worker] = fleet.start(1, fleet.crawling(
        test_site, REDISSPINE_KEEP_ALIVE=True, REDISSPINE_FEED_KEY=feed,
        REDISSPINE_FEED_SECONDS=0.2, REDISSPINE_HEARTBEAT_SECONDS=0.3))
    try:
        wait_for(lambda: len(test_site.fetch_counts()) == len(test_site.all_urls()), 60,
                 "the site crawled")
        start = test_site.start_urls()[0]
        assert cli.main(["--redis-url", cluster.url, "seed", crawl, start + "?seeded=1"]) == 0
        client.lpush(feed, start + "?fed=1")
        wait_for(lambda: _fetched_with(test_site, "?seeded=1") and
                 _fetched_with(test_site, "?fed=1"), 20, "the seeded and the fed URL fetched")
        # The feed loses an entry only after its request is enqueued (feed_done.lua),
        # so the fetch may come before the removal: wait for it as test_cli_e2e does.
        wait_for(lambda: client.llen(feed) == 0, 10, "the feed drained")
        assert cli.main(["--redis-url", cluster.url, "drain", crawl]) == 0
        [result] = wait_workers([worker], timeout=30)
    finally:
        client.close()
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGINT)
            wait_workers([worker], timeout=30)
    assert result.finish_reason == "drained"


def test_a_feed_key_in_another_slot_is_left_alone_with_one_error_line(
    cluster: ClusterServers, test_site: TestSite, project_dir: Path, worker_log_dir: Path,
) -> None:
    crawl = crawl_ids_away_from_registry(cluster, 5)[4]
    feed = "links:start_urls"  # REDISSPINE_FEED_KEY's default: no hash tag
    client = client_from_url(cluster.url)
    try:
        client.delete(feed)
        client.lpush(feed, test_site.start_urls()[0] + "?fed=1")
        fleet = _fleet(project_dir, worker_log_dir, cluster.url, crawl)
        [result] = fleet.run(1, fleet.crawling(test_site, REDISSPINE_FEED_SECONDS=0.2),
                             timeout=60)
        assert_finished([result])
        assert_exactly_once(test_site)
        assert client.llen(feed) == 1, "the entry stays in the feed"
    finally:
        client.delete(feed)
        client.close()
    errors = [line for line in result.log.splitlines() if "is not drained" in line]
    assert len(errors) == 1, errors
    assert "{" + cluster_keys(crawl, crawl).tag() + "}:start_urls" in errors[0]
    assert result.stats.get("redisspine/feed/cross_slot", 0) >= 1
