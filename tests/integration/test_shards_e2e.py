"""Real ``scrapy crawl`` workers on a sharded crawl (``REDISSPINE_SHARDS``): on one
Redis, through a SIGKILL, on a 3-master Redis Cluster; and the refusals at open.

Every outcome is read from the test site's own log (what it served, how often).
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import TYPE_CHECKING, Any

import pytest
from redis.crc import key_slot

from scrapy_redisspine import cli, control
from scrapy_redisspine.connection import client_from_url
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.testing.redis_cluster import ClusterServers
from tests.integration.crawlproc import (
    UNHURRIED,
    Fleet,
    assert_all_fetched,
    assert_exactly_once,
    assert_finished,
    assert_refused,
    cluster_keys,
    wait_for,
    wait_workers,
)
from tests.queue_view import queued_count

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from scrapy_redisspine.testing.site import TestSite
    from tests.conftest import SiteFactory

pytestmark = pytest.mark.e2e

FAST_RECOVERY = {
    "REDISSPINE_HEARTBEAT_SECONDS": 0.3,
    "REDISSPINE_WORKER_TIMEOUT_SECONDS": 1.5,
    "REDISSPINE_SWEEP_SECONDS": 0.3,
}


def _sharded(keys: CrawlKeys, shards: int, cluster: bool = False) -> CrawlKeys:
    if cluster:
        return cluster_keys(keys.crawl_id, shards=shards)
    return CrawlKeys(keys.prefix, keys.crawl_id, shards=shards)


def _acked_per_shard(client: redis.Redis, keys: CrawlKeys) -> dict[int, int]:
    """Requests each shard acked (its own ``stats``)."""
    return {view.shard or 0: int(client.hget(view.stats, "acked") or 0)
            for view in keys.shard_views()}


def _in_flight(client: redis.Redis, keys: CrawlKeys) -> int:
    return sum(int(client.hlen(view.inflight)) for view in keys.shard_views())


def test_three_workers_on_three_shards_fetch_every_page_once(
    fleet: Fleet, site_factory: SiteFactory, redis_url: str,
) -> None:
    site = site_factory(hosts=6, pages_per_host=10)
    results = fleet.run(3, fleet.crawling(site, REDISSPINE_SHARDS=3, DOWNLOAD_DELAY=0.02),
                        timeout=120)
    assert_finished(results)
    assert_exactly_once(site)
    keys = _sharded(fleet.keys, 3)
    client = client_from_url(redis_url)
    try:
        acked = _acked_per_shard(client, keys)
        assert sum(acked.values()) == len(site.all_urls()), acked
        assert sum(1 for count in acked.values() if count) >= 2, (
            f"the crawl's lanes all fell in one shard: {acked}")
        assert queued_count(client, fleet.keys) == 0, "the crawl-wide queue stays unused"
        assert client.hget(fleet.keys.record, "shards") == b"3"
        assert client.hget(fleet.keys.record, "finished_ms") is not None
    finally:
        client.close()


def test_a_killed_worker_on_a_sharded_crawl_loses_nothing(
    fleet: Fleet, site_factory: SiteFactory, redis_url: str,
) -> None:
    concurrency = 3
    site = site_factory(hosts=6, pages_per_host=10, latency=0.2)
    settings = fleet.crawling(site, **FAST_RECOVERY, REDISSPINE_SHARDS=3,
                              CONCURRENT_REQUESTS=concurrency)
    keys = _sharded(fleet.keys, 3)
    client = client_from_url(redis_url)
    try:
        [victim] = fleet.start(1, settings, log="victim")
        wait_for(lambda: _in_flight(client, keys) >= 2, 60, "the victim holds leases")
        others = fleet.start(2, settings, log="others")
        wait_for(lambda: len(site.requests()) >= 15, 60, "the fleet under way")
        held = _in_flight(client, keys)  # the fleet's leases, the victim's among them
        victim.kill()
        victim.process.wait()
        killed_at = time.time()  # dead by now: a fetch it sent before dying is before this
        replacement = fleet.start(1, settings, log="replacement")
        results = wait_workers([*others, *replacement], timeout=120)
        requeued = sum(int(client.hget(view.stats, "requeued") or 0)
                       for view in keys.shard_views())
    finally:
        client.close()
    assert_finished(results)
    twice = assert_all_fetched(site)
    # at most what the victim held: downloads in progress, and pages it fetched whose
    # acks had not left yet (leased ahead, unstarted ones go back unfetched)
    assert len(twice) <= held, f"more duplicates than the fleet held leases: {twice}"
    for url in twice:  # only pages the victim had leased when it died
        first = min(record["start"] for record in site.requests() if record["page"] == url)
        assert first < killed_at, f"{url} was first fetched after the kill"
    assert requeued >= 1, "the victim's leases came back through the sweep"
    assert any("requeued" in result.log for result in results)


@pytest.mark.usefixtures("outside_any_project")
def test_three_workers_on_six_shards_over_a_three_master_cluster(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=8, pages_per_host=8)
    with ClusterServers(masters=3) as cluster:
        fleet = Fleet(project_dir, {"REDISSPINE_REDIS_URL": cluster.url,
                                    "REDISSPINE_CRAWL_ID": "sharded-cluster"}, worker_log_dir)
        results = fleet.run(3, fleet.crawling(site, REDISSPINE_SHARDS=6,
                                              DOWNLOAD_DELAY=0.02), timeout=150)
        assert_finished(results)
        assert_exactly_once(site)
        keys = _sharded(fleet.keys, 6, cluster=True)
        client = client_from_url(cluster.url)
        try:
            acked = _acked_per_shard(client, keys)
            masters = {cluster.master_of_slot(key_slot(view.stats.encode())).port
                       for view in keys.shard_views() if acked[view.shard or 0]}
            finished = client.hget(keys.record, "finished_ms")
            # every worker laid the crawl out alike (none took it for an earlier
            # version's, whose shards are under {crawl id/i}: placement.py)
            stray = [key for key in client.keys("*") if b"{sharded-cluster/" in key]
        finally:
            client.close()
        assert stray == [], stray
    assert sum(acked.values()) == len(site.all_urls()), acked
    assert len(masters) >= 2, f"the crawl's working shards sat on one master: {acked}"
    assert finished is not None


def test_a_worker_with_another_number_of_shards_is_refused_in_one_line(
    fleet: Fleet, site_factory: SiteFactory,
) -> None:
    site = site_factory(hosts=2, pages_per_host=3)
    assert_finished(fleet.run(1, fleet.crawling(site, REDISSPINE_SHARDS=3), timeout=90))
    for other in (1, 2):
        [result] = fleet.run(1, fleet.crawling(site, REDISSPINE_SHARDS=other), timeout=60,
                             log=f"n{other}")
        assert_refused(result, "redisspine_crawl_conflict", "REDISSPINE_SHARDS = 3",
                 f"REDISSPINE_SHARDS = {other}")


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        pytest.param({"REDISSPINE_SHARDS": 0}, ("REDISSPINE_SHARDS",), id="zero-shards"),
        pytest.param({"REDISSPINE_SHARDS": "many"}, ("REDISSPINE_SHARDS",), id="not-a-number"),
        pytest.param({"REDISSPINE_CRAWL_ID": "a/b"}, ("'a/b'", "'/'"), id="slash-in-crawl-id"),
    ],
)
def test_a_setting_a_sharded_crawl_cannot_take_is_refused_at_open(
    fleet: Fleet, test_site: TestSite, extra: dict[str, Any], said: tuple[str, ...],
) -> None:
    [result] = fleet.run(1, fleet.crawling(test_site, **extra), timeout=60)
    assert_refused(result, "redisspine_config_error", *said)


def test_closespider_pagecount_holds_fleet_wide_over_shards(
    fleet: Fleet, site_factory: SiteFactory, redis_url: str,
) -> None:
    budget = 60
    site = site_factory(hosts=6, pages_per_host=40, latency=0.1)
    settings = fleet.crawling(site, REDISSPINE_SHARDS=3, CLOSESPIDER_PAGECOUNT=budget,
                              CONCURRENT_REQUESTS=4, REDISSPINE_HOST_CONCURRENCY=2,
                              **UNHURRIED)  # nobody dies here
    results = fleet.run(3, settings, timeout=120)
    assert_finished(results, reason="closespider_pagecount")
    keys = _sharded(fleet.keys, 3)
    client = client_from_url(redis_url)
    try:
        leased = sum(int(client.hget(view.stats, "leased") or 0) for view in keys.shard_views())
        held = client.hlen(keys.page_holds)
    finally:
        client.close()
    assert leased == budget, "every page of the budget leased, none more"
    assert held == 0, "every hold settled"
    served = sum(site.fetch_counts().values())
    assert served <= budget, f"the site served {served} pages for a budget of {budget}"
    assert len(site.all_urls()) > served, "the site must be bigger than the budget"
    per_worker = [int(r.stats.get("response_received_count", 0)) for r in results]
    assert sum(1 for pages in per_worker if pages) >= 2, (
        f"pages per worker {per_worker}: the budget was not shared by the fleet")


def _keys_of(client: redis.Redis, crawl: str) -> list[bytes]:
    """Every key of the crawl on the server or on every master. The registries and
    the politeness group's keys are not the crawl's: they outlive it (on a cluster
    the crawl's shards live in its group's slots, ``P:{g:G/i}:C/<name>``, beside the
    group's keys, ``P:{g:G/i}:<name>``)."""
    return sorted(key for key in client.keys("*")
                  if (f"{{{crawl}".encode() in key and b"}:g:" not in key)
                  or f"}}:{crawl}/".encode() in key)


@pytest.mark.usefixtures("outside_any_project")
@pytest.mark.parametrize("where", ["one-redis", "cluster"])
def test_persist_off_deletes_a_sharded_crawl_when_it_finishes(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path, redis_url: str,
    tmp_path: Path, *, where: str,
) -> None:
    """Three workers crawl with REDISSPINE_PERSIST = False and fleet items: every page
    once; after, nothing of the crawl is left but its items streams (and the note of
    its number of shards that finds them), which `redisspine export` reads whole; a
    second run crawls the site again (its dedup went with it)."""
    site = site_factory(hosts=6, pages_per_host=5)
    crawl, shards = "sharded-transient", 6 if where == "cluster" else 3
    with contextlib.ExitStack() as stack:
        url = (stack.enter_context(ClusterServers(masters=3)).url if where == "cluster"
               else redis_url)
        fleet = Fleet(project_dir, {"REDISSPINE_REDIS_URL": url, "REDISSPINE_CRAWL_ID": crawl},
                      worker_log_dir)
        client = client_from_url(url)
        stack.callback(client.close)
        keys = _sharded(fleet.keys, shards, cluster=where == "cluster")
        settings = fleet.crawling(site, REDISSPINE_SHARDS=shards, REDISSPINE_PERSIST=False,
                                  REDISSPINE_ITEMS=True, DOWNLOAD_DELAY=0.02)
        # Paused until all three have joined: a worker that joins after the last one
        # deleted the finished crawl starts it afresh (what persistence off means)
        client.hset(fleet.keys.control, control.PAUSED, 1)
        workers = fleet.start(3, settings)
        wait_for(lambda: client.zcard(fleet.keys.workers) == 3, 60, "three workers joined")
        client.hdel(fleet.keys.control, control.PAUSED)
        assert_finished(wait_workers(workers, timeout=150))
        assert_exactly_once(site)
        items = {view.items.encode() for view in keys.shard_views()}
        assert [key for key in _keys_of(client, crawl) if key not in items] == [
            keys.record.encode()]
        assert client.hgetall(keys.record) == {b"shards": str(shards).encode()}
        assert not client.sismember(fleet.keys.crawls, crawl)
        out = tmp_path / "items.jsonl"
        assert cli.main(["--redis-url", url, "export", crawl, "-o", str(out)]) == 0
        exported = [json.loads(line)["url"] for line in out.read_text().splitlines()]
        assert sorted(exported) == sorted(site.all_urls()), "every page's item, once"
        assert_finished(fleet.run(1, settings, timeout=150, log="again"))
    assert set(site.fetch_counts().values()) == {2}, "the second run fetched every page again"
