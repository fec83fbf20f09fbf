"""Crash safety with real workers: SIGKILL at every stage, poison pages, a frozen
worker coming back, Redis restarting, Redis running out of memory.

Workers here heartbeat every 0.3 s and are taken for dead after 1.5 s, so a killed
worker's leases come back within about two seconds.
"""

from __future__ import annotations

import signal
import time
from typing import TYPE_CHECKING, Any

import pytest
import redis

from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.testing.redis_server import RedisServer
from tests.integration.crawlproc import Worker, run_workers, start_workers, wait_workers

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from scrapy_redisspine.testing.site import TestSite
    from tests.integration.crawlproc import WorkerResult

pytestmark = pytest.mark.e2e

FAST_RECOVERY = {
    "REDISSPINE_HEARTBEAT_SECONDS": 0.3,
    "REDISSPINE_WORKER_TIMEOUT_SECONDS": 1.5,
    "REDISSPINE_SWEEP_SECONDS": 0.3,
}


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _finished(results: list[WorkerResult]) -> None:
    for result in results:
        assert (result.returncode, result.finish_reason) == (0, "finished"), (
            f"worker {result.index}: rc={result.returncode} reason={result.finish_reason}\n"
            + result.log[-4000:]
        )


def _all_fetched(site: TestSite) -> dict[str, int]:
    """Assert every page was fetched; return the pages fetched more than once."""
    counts = site.fetch_counts()
    missing = site.all_urls() - set(counts)
    assert not missing, f"{len(missing)} page(s) lost, e.g. {sorted(missing)[:3]}"
    return {url: n for url, n in counts.items() if n > 1}


def _settings(crawl_settings: dict[str, Any], site: TestSite, **extra: Any) -> dict[str, Any]:
    return {
        **crawl_settings,
        **FAST_RECOVERY,
        "LINKS_START_URLS": ",".join(site.start_urls()),
        **extra,
    }


def _kill_then_finish(
    project_dir: Path, settings: dict[str, Any], log_dir: Path, victim: Worker
) -> list[WorkerResult]:
    victim.kill()
    victim.process.wait()
    return run_workers(project_dir, "links", 2, settings, log_dir=log_dir, timeout=120)


@pytest.mark.compat
def test_sigkill_mid_download_loses_nothing(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=3, pages_per_host=20, latency=0.3)
    settings = _settings(crawl_settings, site, CONCURRENT_REQUESTS=4)
    [victim] = start_workers(project_dir, "links", 1, settings, log_dir=worker_log_dir / "v")
    _wait_for(lambda: sum(1 for r in site.requests() if r.get("end") is None) > 0
              or len(site.requests()) >= 8, 30, "downloads in progress")
    _wait_for(lambda: len(site.requests()) >= 8, 30, "a few pages")
    results = _kill_then_finish(project_dir, settings, worker_log_dir / "rest", victim)
    _finished(results)
    twice = _all_fetched(site)
    assert len(twice) <= 4, f"more duplicates than the dead worker held: {twice}"


def test_sigkill_inside_a_callback_after_it_yielded_requests(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=3, pages_per_host=20)
    victim_settings = _settings(crawl_settings, site, LINKS_KILL_PAGE="/p/4",
                                CONCURRENT_REQUESTS=2)
    [victim] = start_workers(project_dir, "links", 1, victim_settings,
                             log_dir=worker_log_dir / "v")
    wait_workers([victim], timeout=60)
    assert victim.process.returncode == -signal.SIGKILL, "the spider should have killed itself"
    results = run_workers(project_dir, "links", 2, _settings(crawl_settings, site),
                          log_dir=worker_log_dir / "rest")
    _finished(results)
    twice = _all_fetched(site)
    assert len(twice) <= 2 + 2, f"more duplicates than the dead worker held: {twice}"


def test_sigkill_between_lease_and_download(
    project_dir: Path, site_factory: Callable[..., TestSite], redis_url: str,
    crawl_settings: dict[str, Any], worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=2, pages_per_host=25, latency=1.0)
    # The fleet lets 8 requests per host be in flight, this worker's downloader
    # fetches one per host at a time: the rest wait in Scrapy's downloader queue,
    # leased and handed out but not yet fetched.
    victim_settings = _settings(crawl_settings, site, REDISSPINE_HOST_CONCURRENCY=8,
                                CONCURRENT_REQUESTS_PER_DOMAIN=1)
    [victim] = start_workers(project_dir, "links", 1, victim_settings,
                             log_dir=worker_log_dir / "v")
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("redisspine", settings_id(crawl_settings))
    _wait_for(lambda: client.hlen(keys.inflight) > len(site.requests()) + 1, 30,
              "leases not yet downloaded")
    held = client.hlen(keys.inflight)
    results = _kill_then_finish(project_dir, _settings(crawl_settings, site),
                                worker_log_dir / "rest", victim)
    _finished(results)
    twice = _all_fetched(site)
    assert len(twice) <= held


def settings_id(settings: dict[str, Any]) -> str:
    return str(settings["REDISSPINE_CRAWL_ID"])


def test_slow_download_of_a_live_worker_is_never_requeued(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=2, pages_per_host=10, slow_paths=("/p/3",), slow_latency=4.0)
    results = run_workers(project_dir, "links", 2, _settings(crawl_settings, site),
                          log_dir=worker_log_dir)
    _finished(results)
    assert _all_fetched(site) == {}, "a slow page of a live worker was fetched twice"
    assert sum(r.stats.get("redisspine/recovery/requeued", 0) for r in results) == 0


def test_poison_page_ends_in_dead_letters_and_the_crawl_completes(
    project_dir: Path, site_factory: Callable[..., TestSite], redis_url: str,
    crawl_settings: dict[str, Any], worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=2, pages_per_host=15)
    poison = site.start_urls()[0].replace("/p/0", "/p/5")
    settings = _settings(crawl_settings, site, LINKS_KILL_PAGE=poison, REDISSPINE_MAX_REQUEUES=2,
                         CONCURRENT_REQUESTS=1, REDISSPINE_LEASE_BATCH_SIZE=1)
    deaths, finished = 0, []
    deadline = time.monotonic() + 150
    workers = start_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir / "0")
    while not finished and time.monotonic() < deadline:
        time.sleep(0.1)
        for worker in list(workers):
            if worker.process.poll() is None:
                continue
            workers.remove(worker)
            if worker.process.returncode == -signal.SIGKILL:
                deaths += 1
                workers += start_workers(project_dir, "links", 1, settings,
                                         log_dir=worker_log_dir / str(deaths))
            else:
                finished.append(worker)
    rest = wait_workers(workers, timeout=60)
    _finished([*wait_workers(finished, timeout=1), *rest])
    assert deaths == 3, "the poison page kills once per try: first try + 2 requeues"
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("redisspine", settings_id(crawl_settings))
    letters = client.hvals(keys.dead)
    [letter] = [entry for entry in letters if poison.encode() in entry]
    assert b"stopped heartbeating" in letter
    assert b"requeued 2 times" in letter
    # Every request a dying worker held shares its fate; with one download slot that
    # is the poison page and at most the one request leased while its callback ran.
    assert len(letters) <= 2, letters
    fetched = set(site.fetch_counts())
    assert len(site.all_urls() - fetched) <= 3, "the rest of the crawl did not complete"


def test_frozen_worker_that_comes_back_is_fenced(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=2, pages_per_host=20, latency=0.2)
    settings = _settings(crawl_settings, site, CONCURRENT_REQUESTS=4)
    [frozen] = start_workers(project_dir, "links", 1, settings, log_dir=worker_log_dir / "f")
    _wait_for(lambda: len(site.requests()) >= 4, 30, "the first pages")
    frozen.process.send_signal(signal.SIGSTOP)
    try:
        others = start_workers(project_dir, "links", 1, settings, log_dir=worker_log_dir / "o")
        _wait_for(lambda: len(site.fetch_counts()) >= len(site.all_urls()) - 2, 60,
                  "the other worker to take over")
    finally:
        frozen.process.send_signal(signal.SIGCONT)
    results = wait_workers([frozen, *others], timeout=60)
    _finished(results)
    _all_fetched(site)
    frozen_stats = results[0].stats
    assert frozen_stats.get("redisspine/scheduler/presumed_dead", 0) >= 1 or frozen_stats.get(
        "redisspine/scheduler/ack_refused", 0
    ) >= 1, results[0].log[-3000:]


def test_redis_restart_with_aof_mid_crawl(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=3, pages_per_host=25, latency=0.05)
    with RedisServer(appendonly=True) as server:
        settings = _settings(crawl_settings, site, REDISSPINE_REDIS_URL=server.url,
                             CONCURRENT_REQUESTS=4)
        workers = start_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir)
        _wait_for(lambda: len(site.requests()) >= 20, 30, "the crawl to get going")
        server.restart()
        results = wait_workers(workers, timeout=120)
    _finished(results)
    _all_fetched(site)


def test_small_maxmemory_is_watched_not_hit(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=3, pages_per_host=150, fanout=8, latency=0.01)
    with RedisServer() as server:
        settings = _settings(crawl_settings, site, REDISSPINE_REDIS_URL=server.url,
                             CONCURRENT_REQUESTS=4)
        workers = start_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir)
        _wait_for(lambda: len(site.requests()) >= 10, 30, "the crawl to get going")
        used = int(server.client().info("memory")["used_memory"])
        server.client().config_set("maxmemory", used + 20_000)
        results = wait_workers(workers, timeout=120)
    _finished(results)
    shed = sum(r.stats.get("redisspine/memory/shed", 0) for r in results)
    assert shed > 0, "the budget was never reached: make the site bigger"
    logs = "\n".join(r.log for r in results)
    assert "near its memory budget" in logs
    assert "Traceback" not in logs


def test_requests_that_fail_or_are_ignored_leave_in_flight(
    project_dir: Path, test_site: TestSite, redis_url: str, crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    port = test_site.port
    extra = [
        f"http://127.0.0.10:{port}/no-such-page",  # 404: HttpError, then errback
        "http://127.0.0.1:9/refused",  # connection refused: retried, then errback
        f"http://127.0.0.99:{port}/p/0",  # offsite: IgnoreRequest in the downloader
    ]
    hosts = ",".join(["127.0.0.1"] + [f"127.0.0.{10 + i}" for i in range(3)])
    settings = {**crawl_settings, "LINKS_EXTRA_START_URLS": ",".join(extra), "RETRY_TIMES": 1}
    results = run_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir,
                          spider_args={"allowed_domains": hosts})
    _finished(results)
    _all_fetched(test_site)
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("redisspine", settings_id(crawl_settings))
    assert client.hlen(keys.inflight) == 0
    stats = [r.stats for r in results]
    assert sum(s.get("offsite/filtered", 0) for s in stats) >= 1
    assert sum(s.get("retry/count", 0) for s in stats) >= 1
    acked = sum(s.get("redisspine/scheduler/acked", 0) for s in stats)
    leased = sum(s.get("redisspine/scheduler/leased", 0) for s in stats)
    assert acked == leased
