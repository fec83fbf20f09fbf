"""``finished`` is never said over lost or undone work: real workers, real faults.

Each test runs real ``scrapy crawl`` workers against the test site and a Redis of
its own, injects the fault mid-crawl and checks how every worker ended (its close
reason and exit code) and what Redis holds afterwards.
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.testing.redis_server import RedisServer
from tests.integration.crawlproc import (
    start_workers,
    wait_for,
    wait_joined,
    wait_workers,
    worker_env,
)

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    import redis

    from scrapy_redisspine.testing.site import TestSite
    from tests.integration.crawlproc import WorkerResult

pytestmark = pytest.mark.e2e

FAST = {
    "REDISSPINE_HEARTBEAT_SECONDS": 0.3,
    "REDISSPINE_WORKER_TIMEOUT_SECONDS": 1.5,
    "REDISSPINE_SWEEP_SECONDS": 0.3,
    "CONCURRENT_REQUESTS": 4,
}


def _ended_with(results: list[WorkerResult], reason: str, said: str) -> None:
    for result in results:
        detail = f"worker {result.index}: rc={result.returncode}\n{result.log[-3000:]}"
        assert result.finish_reason == reason, detail
        assert result.returncode != 0, detail
        assert said in result.log, detail
        assert "Traceback" not in result.log, detail


def _crawl_to_the_end(
    project_dir: Path, crawl_settings: dict[str, Any], log_dir: Path
) -> WorkerResult:
    """One ``links`` worker crawls the test site to the end."""
    (done,) = wait_workers(
        start_workers(project_dir, "links", 1, {**crawl_settings, **FAST}, log_dir=log_dir),
        timeout=120,
    )
    assert (done.returncode, done.finish_reason) == (0, "finished"), done.log[-3000:]
    return done


def _crawl_keys(client: redis.Redis, keys: CrawlKeys) -> list[str]:
    return [key for key in keys.all_crawl_keys() if client.exists(key)]


def test_redis_restarted_empty_mid_crawl_is_never_finished(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    # Slow pages: the crawl takes 8 s or more, so the restart always lands mid-crawl
    # (with 0.05 s a loaded machine's restart once came after the last page).
    site = site_factory(hosts=3, pages_per_host=40, latency=0.2)
    with RedisServer() as server:  # no persistence: a restart comes back empty
        settings = {**crawl_settings, **FAST, "REDISSPINE_REDIS_URL": server.url,
                    "LINKS_START_URLS": ",".join(site.start_urls())}
        workers = start_workers(project_dir, "links", 3, settings, log_dir=worker_log_dir)
        keys = CrawlKeys("redisspine", settings["REDISSPINE_CRAWL_ID"])
        # a worker still joining would ride the restart and start the crawl afresh on
        # the empty server, as a worker started a moment later does
        wait_joined(server.url, keys, 3)
        wait_for(lambda: len(site.requests()) >= 20, 30, "the crawl to get going")
        server.restart()
        results = wait_workers(workers, timeout=120)
        client = server.client()
        try:
            left = _crawl_keys(client, keys)
        finally:
            client.close()
    assert len(site.fetch_counts()) < len(site.all_urls()), "the fault came too late"
    _ended_with(results, "redisspine_state_lost", "state in Redis is gone")
    assert left == [], f"the workers wrote {left} into the empty Redis"


def test_purge_under_live_workers_says_purged(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path, redis_url: str,
) -> None:
    site = site_factory(hosts=3, pages_per_host=40, latency=0.05)
    settings = {**crawl_settings, **FAST, "LINKS_START_URLS": ",".join(site.start_urls())}
    workers = start_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir)
    # (one joining after the purge would start the crawl afresh)
    wait_joined(redis_url, CrawlKeys("redisspine", settings["REDISSPINE_CRAWL_ID"]), 2)
    wait_for(lambda: len(site.requests()) >= 20, 30, "the crawl to get going")
    purged = subprocess.run(
        [sys.executable, "-m", "scrapy_redisspine.cli", "--redis-url", redis_url,
         "purge", settings["REDISSPINE_CRAWL_ID"], "--yes"],
        env=worker_env(), capture_output=True, text=True, timeout=60, check=False,
    )
    assert purged.returncode == 0, purged.stderr
    results = wait_workers(workers, timeout=120)
    _ended_with(results, "redisspine_purged", "was purged")
    for result in results:
        assert "presumed dead" not in result.log


def test_a_second_spider_on_the_same_crawl_id_is_refused_in_one_line(
    project_dir: Path, crawl_settings: dict[str, Any], worker_log_dir: Path,
    test_site: TestSite,
) -> None:
    _crawl_to_the_end(project_dir, crawl_settings, worker_log_dir)
    other = start_workers(project_dir, "other", 1, {**crawl_settings, **FAST},
                          log_dir=worker_log_dir / "other")
    (refused,) = wait_workers(other, timeout=60)
    _ended_with([refused], "redisspine_crawl_conflict", "belongs to spider 'links'")
    errors = [line for line in refused.log.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, errors


def test_running_a_finished_crawl_again_says_it_finished(
    project_dir: Path, crawl_settings: dict[str, Any], worker_log_dir: Path,
    test_site: TestSite,
) -> None:
    done = _crawl_to_the_end(project_dir, crawl_settings, worker_log_dir)
    fetched = len(test_site.requests())
    again = start_workers(project_dir, "links", 1, {**crawl_settings, **FAST},
                          log_dir=worker_log_dir / "again")
    (rerun,) = wait_workers(again, timeout=60)
    assert (rerun.returncode, rerun.finish_reason) == (0, "finished"), rerun.log[-3000:]
    warnings = [line for line in rerun.log.splitlines() if "already finished at" in line]
    assert len(warnings) == 1, rerun.log[-3000:]
    assert f"({done.stats['redisspine/scheduler/acked']} request(s) done)" in warnings[0]
    assert "REDISSPINE_FLUSH_ON_START" in warnings[0]
    assert len(test_site.requests()) == fetched, "nothing was fetched again"


def test_a_redis_frozen_past_the_timeout_is_no_death_of_its_workers(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    # Redis stops answering for longer than the worker timeout, then comes back with
    # everything: every heartbeat is old, but nobody swept, so nobody was "presumed
    # dead", and the crawl completes.
    import os
    import signal

    site = site_factory(hosts=3, pages_per_host=30, latency=0.05)
    with RedisServer() as server:
        settings = {**crawl_settings, **FAST, "REDISSPINE_REDIS_URL": server.url,
                    "LINKS_START_URLS": ",".join(site.start_urls())}
        workers = start_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir)
        wait_for(lambda: len(site.requests()) >= 15, 30, "the crawl to get going")
        assert server.pid is not None
        os.kill(server.pid, signal.SIGSTOP)
        time.sleep(3 * FAST["REDISSPINE_WORKER_TIMEOUT_SECONDS"])
        os.kill(server.pid, signal.SIGCONT)
        results = wait_workers(workers, timeout=120)
    for result in results:
        assert (result.returncode, result.finish_reason) == (0, "finished"), result.log[-3000:]
        assert "presumed dead" not in result.log, result.log[-3000:]
    missing = site.all_urls() - set(site.fetch_counts())
    assert not missing, f"{len(missing)} page(s) never fetched"
