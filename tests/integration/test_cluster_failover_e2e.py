"""A Redis Cluster master fails over mid-crawl: no request is lost, every worker rides
through (MOVED, connections reset) and finishes. Persistence on (``appendonly yes``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from redis.crc import key_slot

from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.testing.redis_cluster import ClusterServers, SentinelServers
from tests.integration.crawlproc import (
    Fleet,
    assert_all_fetched,
    assert_finished,
    wait_for,
    wait_workers,
)
from tests.integration.test_cluster_e2e import FAST_RECOVERY, crawl_ids_away_from_registry

if TYPE_CHECKING:
    from pathlib import Path

    from scrapy_redisspine.testing.site import TestSite
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Worker

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("outside_any_project")]


def _a_third_of_a_crawl(
    cluster: ClusterServers, site_factory: SiteFactory, project_dir: Path,
    worker_log_dir: Path,
) -> tuple[int, TestSite, list[Worker]]:
    """Three workers a third of the way through a crawl whose slot is away from the
    registry's master: the crawl's slot, the site, the workers."""
    crawl = crawl_ids_away_from_registry(cluster, 1)[0]
    slot = key_slot(CrawlKeys("redisspine", crawl).queue.encode())
    site = site_factory(hosts=3, pages_per_host=20, latency=0.1)
    fleet = Fleet(project_dir, {"REDISSPINE_REDIS_URL": cluster.url,
                                "REDISSPINE_CRAWL_ID": crawl}, worker_log_dir)
    workers = fleet.start(3, fleet.crawling(site, **FAST_RECOVERY), log="fleet")
    total = len(site.all_urls())
    wait_for(lambda: len(site.requests()) >= total // 3, 60, "a third of the crawl")
    return slot, site, workers


def test_a_manual_failover_of_the_crawls_master_loses_no_request(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path,
) -> None:
    with ClusterServers(masters=3, replicas=1, appendonly=True) as cluster:
        slot, site, workers = _a_third_of_a_crawl(cluster, site_factory, project_dir,
                                                  worker_log_dir)
        total = len(site.all_urls())
        old = cluster.master_of_slot(slot)
        new = cluster.fail_over(slot)
        assert new is not old
        fetched_at_failover = len(site.requests())
        assert fetched_at_failover < total, "the crawl was over before the failover"
        results = wait_workers(workers, timeout=180)
        assert_finished(results)
        twice = assert_all_fetched(site)
        # A reply lost to a reset connection may send a lease back to the queue once.
        assert len(twice) <= 3 * 2, f"pages fetched twice: {twice}"


def test_a_sentinel_failover_mid_crawl_loses_no_request(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path,
) -> None:
    """The old primary takes writes until Sentinel turns it into a replica: what it
    acknowledged in that moment is gone, and the workers' reconciliation (a lease
    they do not know goes back, an ack refused for a lease that is not there) must
    turn that into at most a page fetched twice, never one lost."""
    with SentinelServers(appendonly=True) as sentinel:
        site = site_factory(hosts=3, pages_per_host=20, latency=0.1)
        fleet = Fleet(project_dir, {"REDISSPINE_REDIS_URL": sentinel.url,
                                    "REDISSPINE_CRAWL_ID": "sentinel-failover"},
                      worker_log_dir)
        workers = fleet.start(3, fleet.crawling(site, **FAST_RECOVERY), log="fleet")
        total = len(site.all_urls())
        wait_for(lambda: len(site.requests()) >= total // 3, 60, "a third of the crawl")
        old = sentinel.primary_port()
        new = sentinel.fail_over()
        assert new.port != old
        assert len(site.requests()) < total, "the crawl was over before the failover"
        results = wait_workers(workers, timeout=180)
        assert_finished(results)
        twice = assert_all_fetched(site)
        assert len(twice) <= 3 * 4, f"pages fetched twice: {twice}"


def test_the_crawls_master_killed_mid_crawl_its_replica_takes_over_and_nothing_is_lost(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path,
) -> None:
    """SIGKILL of the master: for the cluster's node timeout (2 s here) no master
    serves the crawl's slot, then its replica is promoted. Replication is
    asynchronous, so writes the dead master acknowledged last may be gone: the
    workers ride through the outage and reconcile, and every page is fetched."""
    with ClusterServers(masters=3, replicas=1, appendonly=True) as cluster:
        slot, site, workers = _a_third_of_a_crawl(cluster, site_factory, project_dir,
                                                  worker_log_dir)
        total = len(site.all_urls())
        victim = cluster.master_of_slot(slot)
        replica = cluster.replica_of(victim)
        victim.kill()
        wait_for(lambda: cluster.is_master(replica), 60, "the replica promoted")
        assert len(site.requests()) < total, "the crawl was over before the failover"
        results = wait_workers(workers, timeout=240)
        assert_finished(results)
        twice = assert_all_fetched(site)
        assert len(twice) <= 3 * 8, f"pages fetched twice: {twice}"
