"""A Redis Cluster reshards a crawl's slot mid-crawl: its keys move to another master
one by one, and while they do the workers' scripts get ``ASK`` (a key already
moved) and ``TRYAGAIN`` (a script whose keys are split between the two masters).
No request may be lost, every worker rides through and finishes; counted from the
test site's own log."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING

import pytest
from redis.crc import key_slot

from scrapy_redisspine._joining import Joined, join
from scrapy_redisspine.connection import client_from_url
from scrapy_redisspine.settings import load_config
from scrapy_redisspine.testing.redis_cluster import ClusterServers
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

    from tests.conftest import SiteFactory

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("outside_any_project")]

#: Seconds the slot stays half-moved after each key: a crawl has some 20 keys, so
#: about a second of ASK and TRYAGAIN for every script of the crawl (or shard).
PAUSE_PER_KEY = 0.05


@pytest.mark.parametrize("shards", [1, 6], ids=["crawl", "shard"])
def test_a_slot_resharded_mid_crawl_loses_no_request(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path, shards: int,
) -> None:
    with ClusterServers(masters=3) as cluster:
        crawl = crawl_ids_away_from_registry(cluster, 1)[0]
        keys = cluster_keys(crawl, crawl, shards=shards)
        site = site_factory(hosts=6, pages_per_host=15, latency=0.05)
        fleet = Fleet(project_dir, {"REDISSPINE_REDIS_URL": cluster.url,
                                    "REDISSPINE_CRAWL_ID": crawl,
                                    "REDISSPINE_POLITENESS_GROUP": crawl}, worker_log_dir)
        workers = fleet.start(3, fleet.crawling(site, **FAST_RECOVERY,
                                                REDISSPINE_SHARDS=shards), log="fleet")
        total = len(site.all_urls())
        wait_for(lambda: len(site.requests()) >= total // 4, 60, "a quarter of the crawl")
        client = client_from_url(cluster.url)
        try:
            # the busiest shard's slot (the crawl's own, unsharded)
            view = max(keys.shard_views(), key=lambda view: queued_count(client, view))
            queued = queued_count(client, view)
        finally:
            client.close()
        slot = key_slot(view.queue.encode())
        source = cluster.master_of_slot(slot)
        target = next(master for master in cluster.masters if master is not source)
        moved = cluster.move_slot(slot, target, pause=PAUSE_PER_KEY)
        fetched_when_moved = len(site.requests())
        results = wait_workers(workers, timeout=180)
    assert queued > 0, "the slot moved held queued work"
    assert moved >= 5, f"only {moved} keys moved: the slot was not the crawl's"
    assert fetched_when_moved < total, "the crawl was over before the slot had moved"
    assert_finished(results)
    twice = assert_all_fetched(site)
    # A reply lost to a connection reset may send a lease back to the queue once.
    assert len(twice) <= 3 * 2, f"pages fetched twice: {twice}"
    logs = "\n".join(result.log for result in results)
    assert "Traceback" not in logs
    script_errors = {name: value for result in results for name, value in result.stats.items()
                     if name.startswith("redisspine/script_errors/")}
    assert not script_errors, f"a reshard's replies taken for script errors: {script_errors}"


def test_a_worker_joining_while_its_crawls_slot_is_half_moved_waits_and_joins(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """While a slot migrates, a script naming keys of it that are not on the node
    (moved already, or never written) is answered TRYAGAIN until the move is done:
    a worker started then rides through it instead of exiting."""
    config = load_config({})
    with ClusterServers(masters=3) as cluster:
        crawl = crawl_ids_away_from_registry(cluster, 1)[0]
        config = replace(config, redis_url=cluster.url, politeness_group=crawl)
        first = join(config, crawl, "spider", "first")
        slot = key_slot(cluster_keys(crawl, crawl).record.encode())
        target = next(m for m in cluster.masters if m is not cluster.master_of_slot(slot))
        joined: list[Joined] = []
        thread = threading.Thread(
            target=lambda: joined.append(join(config, crawl, "spider", "second")))

        def hold() -> None:  # the slot half-moved for 1.5 s, the second worker joining
            thread.start()
            time.sleep(1.5)

        with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
            cluster.move_slot(slot, target, hold=hold)
            thread.join(30)
        assert joined, "the join did not return"
        assert joined[0].registration.status == "joined"
        assert joined[0].registration.alive == 1
        assert "retrying for up to 30 s" in caplog.text
        for done in (first, *joined):
            done.connection.close()
