"""Fleet items with real workers: each page's item exactly once in the export, through
SIGKILLs, requeues and a frozen worker whose acks are fenced.

The ``links`` spider yields one item per page (``{"url": response.url}``). Workers
heartbeat every 0.3 s and are taken for dead after 1.5 s.
"""

from __future__ import annotations

import json
import signal
from collections import Counter
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine import cli
from tests.integration.crawlproc import (
    assert_all_fetched,
    assert_finished,
    wait_for,
    wait_workers,
)

if TYPE_CHECKING:
    from pathlib import Path

    import redis

    from scrapy_redisspine.testing.site import TestSite
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e

ITEMS = {
    "REDISSPINE_ITEMS": True,
    "REDISSPINE_HEARTBEAT_SECONDS": 0.3,
    "REDISSPINE_WORKER_TIMEOUT_SECONDS": 1.5,
    "REDISSPINE_SWEEP_SECONDS": 0.3,
}


def _settings(fleet: Fleet, site: TestSite, **extra: Any) -> dict[str, Any]:
    return fleet.crawling(site, **ITEMS, **extra)


def export_counts(url: str, crawl: str, out: Path, *options: str) -> Counter[str]:
    """``redisspine export`` of a crawl to ``out``: how often each page's item is in it."""
    assert cli.main(["--redis-url", url, "export", crawl, "-o", str(out), *options]) == 0
    return Counter(json.loads(line)["url"] for line in out.read_text().splitlines())


def _exported(fleet: Fleet, tmp_path: Path) -> Counter[str]:
    settings = fleet.settings
    return export_counts(settings["REDISSPINE_REDIS_URL"], settings["REDISSPINE_CRAWL_ID"],
                         tmp_path / "items.jsonl")


def assert_once_per_page(exported: Counter[str], site: TestSite) -> None:
    """Every page of the site has its item in the export, and none twice."""
    twice = {url: n for url, n in exported.items() if n > 1}
    assert not twice, f"items exported more than once: {twice}"
    missing = site.all_urls() - set(exported)
    assert not missing, f"{len(missing)} page(s) without an item, e.g. {sorted(missing)[:3]}"
    assert set(exported) == site.all_urls()


@pytest.mark.usefixtures("outside_any_project")
def test_three_workers_one_killed_after_its_item_and_replaced_export_once_per_page(
    fleet: Fleet, site_factory: SiteFactory, tmp_path: Path, real_redis: redis.Redis
) -> None:
    site = site_factory(hosts=3, pages_per_host=30, latency=0.05)
    settings = _settings(fleet, site, CONCURRENT_REQUESTS=4)
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
    results = wait_workers([*others, *replacement], timeout=120)
    assert_finished(results)
    twice = assert_all_fetched(site)
    assert kill_page in twice, "the killed page was never fetched again"
    assert_once_per_page(_exported(fleet, tmp_path), site)
    # the fleet's own count agrees: no item went in and was taken out again
    assert int(real_redis.hget(fleet.keys.stats, "items") or 0) == len(site.all_urls())


@pytest.mark.usefixtures("outside_any_project")
def test_a_frozen_worker_that_comes_back_writes_no_item_twice(
    fleet: Fleet, site_factory: SiteFactory, tmp_path: Path
) -> None:
    site = site_factory(hosts=2, pages_per_host=20, latency=0.2)
    settings = _settings(fleet, site, CONCURRENT_REQUESTS=4)
    [frozen] = fleet.start(1, settings, log="f")
    wait_for(lambda: len(site.requests()) >= 4, 30, "the first pages")
    frozen.process.send_signal(signal.SIGSTOP)
    try:
        others = fleet.start(2, settings, log="o")
        wait_for(lambda: len(site.fetch_counts()) >= len(site.all_urls()) - 2, 60,
                 "the other workers to take over")
    finally:
        frozen.process.send_signal(signal.SIGCONT)
    results = wait_workers([frozen, *others], timeout=90)
    assert_finished(results)
    assert_once_per_page(_exported(fleet, tmp_path), site)
    # What makes this a test of the fence: the frozen worker came back with pages it
    # had finished meanwhile, whose acks (and items) were refused.
    fenced = results[0].stats.get("redisspine/items/fenced", 0)
    assert fenced >= 1, results[0].log[-3000:]
