"""``redisspine`` against real ``scrapy crawl`` workers, checked from the site's log."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from scrapy_redisspine import cli
from scrapy_redisspine.keys import CrawlKeys
from tests.integration.crawlproc import run_workers, start_workers, wait_workers

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_redisspine.testing.site import TestSite

pytestmark = pytest.mark.e2e

# Orders are read once per heartbeat: a short one keeps the tests short.
FAST = {"REDISSPINE_HEARTBEAT_SECONDS": 0.3, "REDISSPINE_SWEEP_SECONDS": 1,
        "LOGSTATS_INTERVAL": 1}


@pytest.fixture(autouse=True)
def _outside_any_project(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("REDISSPINE_REDIS_URL", "REDIS_URL", "SCRAPY_SETTINGS_MODULE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def _cli(redis_url: str, *args: str) -> None:
    assert cli.main(["--redis-url", redis_url, *args]) == 0, args


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not in {timeout:.0f}s: {what}")
        time.sleep(0.05)


def _fetched(site: TestSite) -> int:
    return sum(site.fetch_counts().values())


def _assert_exactly_once(site: TestSite) -> None:
    counts = site.fetch_counts()
    assert set(counts) == site.all_urls()
    assert {url: n for url, n in counts.items() if n > 1} == {}


def test_status_totals_match_what_the_crawl_did(
    project_dir: Path, site_factory: Callable[..., TestSite], redis_url: str,
    crawl_settings: dict[str, Any], worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=3, pages_per_host=20)
    settings = {**crawl_settings, **FAST, "LINKS_START_URLS": ",".join(site.start_urls()),
                "DOWNLOAD_DELAY": 0.05}
    results = run_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir, timeout=60)
    assert [r.finish_reason for r in results] == ["finished", "finished"]
    command = Path(sys.executable).with_name("redisspine")  # the installed console script
    output = subprocess.run(
        [str(command), "--redis-url", redis_url, "status", settings["REDISSPINE_CRAWL_ID"],
         "--json"], check=True, capture_output=True, text=True,
    ).stdout
    status = json.loads(output)
    pages = _fetched(site)
    assert pages == len(site.all_urls())
    assert status["done"] == pages
    assert (status["queued"], status["in_flight"], status["dead_letters"]) == (0, 0, 0)
    fleet = status["fleet_stats"]
    assert fleet["response_received_count"] == pages
    assert fleet["item_scraped_count"] == pages
    assert fleet["response_received_count"] == sum(
        r.stats["response_received_count"] for r in results
    )
    assert "redisspine fleet:" in results[0].log


def test_pause_stops_fetching_and_resume_finishes(
    project_dir: Path, site_factory: Callable[..., TestSite], redis_url: str,
    crawl_settings: dict[str, Any], worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=3, pages_per_host=30, latency=0.05)
    settings = {**crawl_settings, **FAST, "LINKS_START_URLS": ",".join(site.start_urls())}
    crawl = settings["REDISSPINE_CRAWL_ID"]
    workers = start_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir)
    try:
        _wait_for(lambda: _fetched(site) >= 10, 30, "10 pages fetched")
        _cli(redis_url, "pause", crawl)
        time.sleep(1.5)  # a heartbeat, and what was held finishes
        paused_at = _fetched(site)
        time.sleep(2.0)
        assert _fetched(site) == paused_at, "pages fetched while paused"
        assert paused_at < len(site.all_urls())
        assert all(w.process.poll() is None for w in workers), "a paused worker exited"
        _cli(redis_url, "resume", crawl)
        results = wait_workers(workers, timeout=60)
    finally:
        for worker in workers:
            worker.kill()
    assert [r.finish_reason for r in results] == ["finished", "finished"]
    _assert_exactly_once(site)


def test_drain_exits_with_reason_drained_and_loses_nothing(
    project_dir: Path, site_factory: Callable[..., TestSite], redis_url: str,
    crawl_settings: dict[str, Any], worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=3, pages_per_host=30, latency=0.1)
    settings = {**crawl_settings, **FAST, "LINKS_START_URLS": ",".join(site.start_urls())}
    crawl = settings["REDISSPINE_CRAWL_ID"]
    keys = CrawlKeys("redisspine", crawl)
    workers = start_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir / "a")
    try:
        _wait_for(lambda: _fetched(site) >= 10, 30, "10 pages fetched")
        _cli(redis_url, "drain", crawl)
        drained = wait_workers(workers, timeout=20)
    finally:
        for worker in workers:
            worker.kill()
    assert [r.finish_reason for r in drained] == ["drained", "drained"], drained[0].log[-3000:]
    client = redis.Redis.from_url(redis_url)
    assert client.hlen(keys.inflight) == 0, "a drained worker kept leases"
    assert client.zcard(keys.queue) > 0
    _cli(redis_url, "resume", crawl)
    rest = run_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir / "b",
                       timeout=60)
    assert [r.finish_reason for r in rest] == ["finished", "finished"]
    _assert_exactly_once(site)


def test_seed_into_a_running_keep_alive_crawl_gets_fetched(
    project_dir: Path, test_site: TestSite, redis_url: str, crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    settings = {**crawl_settings, **FAST, "REDISSPINE_KEEP_ALIVE": True}
    crawl = settings["REDISSPINE_CRAWL_ID"]
    [worker] = start_workers(project_dir, "links", 1, settings, log_dir=worker_log_dir)
    try:
        _wait_for(lambda: len(test_site.fetch_counts()) == len(test_site.all_urls()), 30,
                  "the site crawled")
        client = redis.Redis.from_url(redis_url)
        keys = CrawlKeys("redisspine", crawl)
        _wait_for(lambda: client.zcard(keys.queue) + client.hlen(keys.inflight) == 0, 10,
                  "the crawl idle")
        start = test_site.start_urls()[0]
        before = len(test_site.requests())
        seeded = start + "?seeded=1"
        _cli(redis_url, "seed", crawl, seeded, start)
        _wait_for(lambda: any(r["path"].endswith("?seeded=1") for r in test_site.requests()),
                  10, "the seeded URL fetched")
        _cli(redis_url, "drain", crawl)
        [result] = wait_workers([worker], timeout=20)
    finally:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGINT)
            wait_workers([worker], timeout=30)
    assert result.finish_reason == "drained"
    # fetch_counts() folds queries into the page: count the site's raw requests instead
    assert len(test_site.requests()) == before + 1, "seeding a seen URL fetched it again"
