"""A Redis Cluster master fails over mid-crawl: no request is lost, every worker rides
through (MOVED, connections reset) and finishes. Persistence on (``appendonly yes``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from redis.crc import key_slot

from scrapy_redisspine.testing import redis_cluster
from scrapy_redisspine.testing.redis_cluster import ClusterServers, SentinelServers
from tests.integration.crawlproc import (
    Fleet,
    assert_all_fetched,
    assert_finished,
    cluster_keys,
    wait_for,
    wait_workers,
)
from tests.integration.test_cluster_e2e import FAST_RECOVERY, crawl_ids_away_from_registry
from tests.queue_view import queued_count

if TYPE_CHECKING:
    from pathlib import Path

    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.testing.site import TestSite
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Worker

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("outside_any_project")]


def _a_third_of_a_crawl(
    cluster: ClusterServers, site_factory: SiteFactory, project_dir: Path,
    worker_log_dir: Path, shards: int = 1,
) -> tuple[int, TestSite, list[Worker]]:
    """Three workers a third of the way through a crawl whose crawl-wide keys are away
    from the registry's master: the slot to hit, the site, the workers. Unsharded,
    the crawl's slot; sharded (``REDISSPINE_SHARDS``), a slot of the master holding
    the most of the shards' work (queued and leased) at that moment."""
    crawl = crawl_ids_away_from_registry(cluster, 1)[0]
    keys = cluster_keys(crawl, crawl, shards=shards)
    # sharded: enough hosts (lanes) for every master to hold some of the shards' work
    hosts, pages = (3, 20) if shards == 1 else (12, 10)
    site = site_factory(hosts=hosts, pages_per_host=pages, latency=0.1)
    fleet = Fleet(project_dir, {"REDISSPINE_REDIS_URL": cluster.url,
                                "REDISSPINE_CRAWL_ID": crawl,
                                "REDISSPINE_POLITENESS_GROUP": crawl}, worker_log_dir)
    workers = fleet.start(3, fleet.crawling(site, **FAST_RECOVERY, REDISSPINE_SHARDS=shards),
                          log="fleet")
    _a_third_fetched(site, workers)
    if shards == 1:
        return key_slot(keys.queue.encode()), site, workers
    return _busiest_shard_slot(cluster, keys), site, workers


def _a_third_fetched(site: TestSite, workers: list[Worker]) -> None:
    """Wait for every worker to have joined (on a loaded machine one may still be
    starting when the others are a third through, and a worker that cannot join
    stops) and for a third of the site to be fetched."""
    for worker in workers:
        wait_for(lambda worker=worker: "joined crawl" in worker.log_text(), 60,
                 "every worker joined")
    total = len(site.all_urls())
    wait_for(lambda: len(site.requests()) >= total // 3, 60, "a third of the crawl")


def _busiest_shard_slot(cluster: ClusterServers, keys: CrawlKeys) -> int:
    """A shard's slot on the master whose shards hold the most work now (requests
    queued and leased): a failover there hits leases in flight and a queue still to
    drain."""
    work: dict[int, int] = {}
    slot_of: dict[int, int] = {}
    with redis_cluster.client(cluster.url) as client:
        for view in keys.shard_views():
            slot = key_slot(view.queue.encode())
            port = cluster.master_of_slot(slot).port
            slot_of.setdefault(port, slot)
            work[port] = (work.get(port, 0) + int(queued_count(client, view))
                          + int(client.hlen(view.inflight)))
    busiest = max(work, key=lambda port: work[port])
    assert work[busiest], f"no shard holds work a third of the way through: {work}"
    return slot_of[busiest]


SHARDINGS = [pytest.param(1, id="unsharded"), pytest.param(6, id="six-shards")]


@pytest.mark.parametrize("shards", SHARDINGS)
def test_a_manual_failover_of_the_crawls_master_loses_no_request(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path, shards: int,
) -> None:
    with ClusterServers(masters=3, replicas=1, appendonly=True) as cluster:
        slot, site, workers = _a_third_of_a_crawl(cluster, site_factory, project_dir,
                                                  worker_log_dir, shards)
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


@pytest.mark.parametrize("min_replicas", [
    pytest.param(0, id="old-primary-takes-writes"),
    pytest.param(1, id="min-replicas-to-write"),
])
def test_a_sentinel_failover_mid_crawl_loses_no_request(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path, min_replicas: int,
) -> None:
    """Sentinel promotes the replica, but the old primary is demoted only seconds
    later (it is converted once seen still claiming to be primary): meanwhile it takes
    the writes of every pooled connection still on it, and they are gone. Each worker
    asks the sentinels at each heartbeat, moves to the new primary and reconciles (a
    lease it does not know goes back, an ack refused for a lease that is not there):
    every page fetched, each at most twice (a write is lost once), every worker
    finished, none left waiting on leases the new primary says it holds.

    With ``min-replicas-to-write`` on the old primary it refuses writes once its
    replica is promoted: nothing it acknowledged is lost, only replies in the air
    (as in the cluster's failover, a few per worker)."""
    with SentinelServers(appendonly=True, min_replicas_to_write=min_replicas) as sentinel:
        site = site_factory(hosts=3, pages_per_host=20, latency=0.1)
        fleet = Fleet(project_dir, {"REDISSPINE_REDIS_URL": sentinel.url,
                                    "REDISSPINE_CRAWL_ID": "sentinel-failover"},
                      worker_log_dir)
        workers = fleet.start(3, fleet.crawling(site, **FAST_RECOVERY), log="fleet")
        total = len(site.all_urls())
        _a_third_fetched(site, workers)
        old = sentinel.primary_port()
        new = sentinel.fail_over()
        assert new.port != old
        assert len(site.requests()) < total, "the crawl was over before the failover"
        results = wait_workers(workers, timeout=180)
        assert_finished(results)
        twice = assert_all_fetched(site)
        assert all(times == 2 for times in twice.values()), f"fetched over twice: {twice}"
        if min_replicas:
            assert len(twice) <= 3 * 4, f"pages fetched twice: {twice}"
        moved = [result for result in results if "Sentinel names a new primary" in result.log]
        assert moved, "no worker saw the new primary"


@pytest.mark.parametrize("shards", SHARDINGS)
def test_the_crawls_master_killed_mid_crawl_its_replica_takes_over_and_nothing_is_lost(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path, shards: int,
) -> None:
    """SIGKILL of the master: for the cluster's node timeout (2 s here) no master
    serves the crawl's slot, then its replica is promoted. Replication is
    asynchronous, so writes the dead master acknowledged last may be gone: the
    workers ride through the outage and reconcile, and every page is fetched."""
    with ClusterServers(masters=3, replicas=1, appendonly=True) as cluster:
        slot, site, workers = _a_third_of_a_crawl(cluster, site_factory, project_dir,
                                                  worker_log_dir, shards)
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
