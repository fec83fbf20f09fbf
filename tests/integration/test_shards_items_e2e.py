"""Fleet items (``REDISSPINE_ITEMS``) on a sharded crawl, with real ``scrapy crawl``
workers: each page's item in exactly one shard's stream, once, through a SIGKILL of a
worker holding items without their acks; ``redisspine export`` reads every shard's
stream, also following a live crawl on a 3-master Redis Cluster (with a kill too).

The ``links`` spider yields one item per page (``{"url": response.url}``); the pages
are counted from the test site's own URL list.
"""

from __future__ import annotations

import signal
import threading
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine import cli
from scrapy_redisspine.connection import client_from_url
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.testing.redis_cluster import ClusterServers
from tests.integration.crawlproc import (
    Fleet,
    assert_all_fetched,
    assert_finished,
    cluster_keys,
    wait_for,
    wait_workers,
)
from tests.integration.test_items_e2e import ITEMS, assert_once_per_page, export_counts

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from tests.conftest import SiteFactory

pytestmark = pytest.mark.e2e

def _per_shard(client: redis.Redis, keys: CrawlKeys) -> tuple[list[int], list[int]]:
    """Each shard's stream length and its own count of items stored."""
    return ([int(client.xlen(view.items)) for view in keys.shard_views()],
            [int(client.hget(view.stats, "items") or 0) for view in keys.shard_views()])


@pytest.mark.usefixtures("outside_any_project")
def test_three_workers_on_three_shards_one_killed_with_items_export_once_per_page(
    fleet: Fleet, site_factory: SiteFactory, tmp_path: Path, redis_url: str,
) -> None:
    site = site_factory(hosts=6, pages_per_host=15, latency=0.05)
    settings = fleet.crawling(site, **ITEMS, REDISSPINE_SHARDS=3, CONCURRENT_REQUESTS=4)
    kill_page = site.start_urls()[0].replace("/p/0", "/p/6")
    # Whichever worker gets kill_page first dies the moment its item passed the
    # pipelines: it holds that item (and those of other pages in progress) without
    # their acks. The others fetch the page again and live.
    workers = fleet.start(3, {**settings, "LINKS_KILL_AFTER_ITEM": kill_page,
                              "LINKS_KILL_ONCE_FILE": str(tmp_path / "killed")}, log="w")
    wait_for(lambda: any(w.process.poll() is not None for w in workers), 90, "the kill")
    [victim] = [w for w in workers if w.process.poll() is not None]
    assert victim.process.returncode == -signal.SIGKILL, victim.log_text()[-3000:]
    others = [w for w in workers if w is not victim]
    replacement = fleet.start(1, settings, log="r")
    results = wait_workers([*others, *replacement], timeout=150)
    assert_finished(results)
    twice = assert_all_fetched(site)
    assert kill_page in twice, "the killed page was never fetched again"
    crawl = str(fleet.settings["REDISSPINE_CRAWL_ID"])
    assert_once_per_page(export_counts(redis_url, crawl, tmp_path / "items.jsonl"), site)
    keys = CrawlKeys(fleet.keys.prefix, fleet.keys.crawl_id, shards=3)
    client = client_from_url(redis_url)
    try:
        in_streams, stored = _per_shard(client, keys)
        crawl_wide = int(client.xlen(keys.items))
    finally:
        client.close()
    pages = len(site.all_urls())
    # the fleet's own counts agree: no item went in and was taken out again
    assert sum(in_streams) == sum(stored) == pages, (in_streams, stored)
    assert in_streams == stored
    assert sum(1 for n in in_streams if n) >= 2, f"every item in one shard: {in_streams}"
    assert crawl_wide == 0, "the crawl-wide items stream stays unused"
    assert cli.main(["--redis-url", redis_url, "status", crawl, "--json"]) == 0


@pytest.mark.usefixtures("outside_any_project")
def test_an_export_follows_a_crawl_on_six_shards_over_three_masters_through_a_kill(
    site_factory: SiteFactory, project_dir: Path, worker_log_dir: Path, tmp_path: Path,
) -> None:
    site = site_factory(hosts=8, pages_per_host=10, latency=0.05)
    kill_page = site.start_urls()[0].replace("/p/0", "/p/6")
    with ClusterServers(masters=3) as cluster:
        crawl = "sharded-items"
        fleet = Fleet(project_dir, {"REDISSPINE_REDIS_URL": cluster.url,
                                    "REDISSPINE_CRAWL_ID": crawl}, worker_log_dir)
        settings = fleet.crawling(site, **ITEMS, REDISSPINE_SHARDS=6, CONCURRENT_REQUESTS=4)
        # one worker dies holding items without their acks, as on one server
        workers = fleet.start(3, {**settings, "LINKS_KILL_AFTER_ITEM": kill_page,
                                  "LINKS_KILL_ONCE_FILE": str(tmp_path / "killed")}, log="w")
        keys = cluster_keys(crawl, shards=6)
        client = client_from_url(cluster.url)
        followed: dict[str, Any] = {}
        try:
            # the export starts once the crawl exists and reads it live to its end
            wait_for(lambda: client.hget(keys.record, "shards") is not None, 60,
                     "the crawl's record")

            def follow() -> None:
                try:
                    followed["items"] = export_counts(cluster.url, crawl, tmp_path / "f.jsonl",
                                                "--follow")
                except BaseException as exc:  # read by the test's thread
                    followed["error"] = exc

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            wait_for(lambda: any(w.process.poll() is not None for w in workers), 90,
                     "the kill")
            [victim] = [w for w in workers if w.process.poll() is not None]
            assert victim.process.returncode == -signal.SIGKILL, victim.log_text()[-3000:]
            replacement = fleet.start(1, settings, log="r")
            results = wait_workers([*(w for w in workers if w is not victim), *replacement],
                                   timeout=150)
            follower.join(60)
            assert not follower.is_alive(), "the export did not stop at the crawl's end"
            in_streams, stored = _per_shard(client, keys)
        finally:
            client.close()
        assert_finished(results)
        assert kill_page in assert_all_fetched(site), "the killed page was never refetched"
        assert "error" not in followed, followed.get("error")
        assert_once_per_page(followed["items"], site)
        # and a fresh export of the finished crawl gives the same
        assert_once_per_page(export_counts(cluster.url, crawl, tmp_path / "all.jsonl"), site)
    assert sum(in_streams) == sum(stored) == len(site.all_urls()), (in_streams, stored)
    assert sum(1 for n in in_streams if n) >= 2, f"every item in one shard: {in_streams}"
