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

from scrapy_redisspine.testing.linkgraph import host_address
from scrapy_redisspine.testing.redis_server import RedisServer
from tests.integration.crawlproc import (
    assert_all_fetched,
    assert_finished,
    wait_for,
    wait_joined,
    wait_workers,
)

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.testing.site import TestSite
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet, Worker, WorkerResult

pytestmark = pytest.mark.e2e

FAST_RECOVERY = {
    "REDISSPINE_HEARTBEAT_SECONDS": 0.3,
    "REDISSPINE_WORKER_TIMEOUT_SECONDS": 1.5,
    "REDISSPINE_SWEEP_SECONDS": 0.3,
}


def _settings(fleet: Fleet, site: TestSite, **extra: Any) -> dict[str, Any]:
    """The crawl of ``site`` by workers that take a silent one for dead quickly."""
    return fleet.crawling(site, **FAST_RECOVERY, **extra)


def _kill_then_finish(fleet: Fleet, settings: dict[str, Any], victim: Worker) -> list[WorkerResult]:
    victim.kill()
    victim.process.wait()
    return fleet.run(2, settings, log="rest", timeout=120)


@pytest.mark.compat
def test_sigkill_mid_download_loses_nothing(fleet: Fleet, site_factory: SiteFactory) -> None:
    site = site_factory(hosts=3, pages_per_host=20, latency=0.3)
    settings = _settings(fleet, site, CONCURRENT_REQUESTS=4)
    [victim] = fleet.start(1, settings, log="v")
    wait_for(lambda: sum(1 for r in site.requests() if r.get("end") is None) > 0
             or len(site.requests()) >= 8, 30, "downloads in progress")
    wait_for(lambda: len(site.requests()) >= 8, 30, "a few pages")
    results = _kill_then_finish(fleet, settings, victim)
    assert_finished(results)
    twice = assert_all_fetched(site)
    assert len(twice) <= 4, f"more duplicates than the dead worker held: {twice}"


def test_sigkill_inside_a_callback_after_it_yielded_requests(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    site = site_factory(hosts=3, pages_per_host=20)
    victim_settings = _settings(fleet, site, LINKS_KILL_PAGE="/p/4", CONCURRENT_REQUESTS=2)
    [victim] = fleet.start(1, victim_settings, log="v")
    wait_workers([victim], timeout=60)
    assert victim.process.returncode == -signal.SIGKILL, "the spider should have killed itself"
    results = fleet.run(2, _settings(fleet, site), log="rest")
    assert_finished(results)
    twice = assert_all_fetched(site)
    assert len(twice) <= 2 + 2, f"more duplicates than the dead worker held: {twice}"


def test_sigkill_between_lease_and_download(
    fleet: Fleet, site_factory: SiteFactory, real_redis: redis.Redis
) -> None:
    site = site_factory(hosts=2, pages_per_host=25, latency=1.0)
    # The fleet lets 8 requests per host be in flight, this worker's downloader
    # fetches one per host at a time: the rest wait in Scrapy's downloader queue,
    # leased and handed out but not yet fetched.
    victim_settings = _settings(fleet, site, REDISSPINE_HOST_CONCURRENCY=8,
                                CONCURRENT_REQUESTS_PER_DOMAIN=1)
    [victim] = fleet.start(1, victim_settings, log="v")
    inflight = fleet.keys.inflight
    wait_for(lambda: real_redis.hlen(inflight) > len(site.requests()) + 1, 30,
             "leases not yet downloaded")
    held = real_redis.hlen(inflight)
    # the rest fetch 8 a host at a time too (one at a time, 25 pages of 1 s: 25 s)
    results = _kill_then_finish(fleet, _settings(fleet, site, REDISSPINE_HOST_CONCURRENCY=8),
                                victim)
    assert_finished(results)
    twice = assert_all_fetched(site)
    assert len(twice) <= held


def test_slow_download_of_a_live_worker_is_never_requeued(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    site = site_factory(hosts=2, pages_per_host=10, slow_paths=("/p/3",), slow_latency=4.0)
    results = fleet.run(2, _settings(fleet, site))
    assert_finished(results)
    twice = assert_all_fetched(site)
    assert twice == {}, "a slow page of a live worker was fetched twice"
    assert sum(r.stats.get("redisspine/recovery/requeued", 0) for r in results) == 0


def test_poison_page_ends_in_dead_letters_and_the_crawl_completes(
    fleet: Fleet, site_factory: SiteFactory, real_redis: redis.Redis
) -> None:
    site = site_factory(hosts=2, pages_per_host=15)
    poison = site.start_urls()[0].replace("/p/0", "/p/5")
    settings = _settings(fleet, site, LINKS_KILL_PAGE=poison, REDISSPINE_MAX_REQUEUES=2,
                         CONCURRENT_REQUESTS=1, REDISSPINE_LEASE_BATCH_SIZE=1)
    deaths, finished = 0, []
    deadline = time.monotonic() + 150
    workers = fleet.start(2, settings, log="0")
    while not finished and time.monotonic() < deadline:
        time.sleep(0.1)
        for worker in list(workers):
            if worker.process.poll() is None:
                continue
            workers.remove(worker)
            if worker.process.returncode == -signal.SIGKILL:
                deaths += 1
                workers += fleet.start(1, settings, log=str(deaths))
            else:
                finished.append(worker)
    rest = wait_workers(workers, timeout=60)
    assert_finished([*wait_workers(finished, timeout=1), *rest])
    assert deaths == 3, "the poison page kills once per try: first try + 2 requeues"
    letters = real_redis.hvals(fleet.keys.dead)
    [letter] = [entry for entry in letters if poison.encode() in entry]
    assert b"stopped heartbeating" in letter
    assert b"requeued 2 times" in letter
    # Every request a dying worker held shares its fate; with one download slot that
    # is the poison page and at most the one request leased while its callback ran.
    assert len(letters) <= 2, letters
    fetched = set(site.fetch_counts())
    assert len(site.all_urls() - fetched) <= 3, "the rest of the crawl did not complete"


def test_frozen_worker_that_comes_back_is_fenced(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    site = site_factory(hosts=2, pages_per_host=20, latency=0.2)
    settings = _settings(fleet, site, CONCURRENT_REQUESTS=4)
    [frozen] = fleet.start(1, settings, log="f")
    wait_for(lambda: len(site.requests()) >= 4, 30, "the first pages")
    frozen.process.send_signal(signal.SIGSTOP)
    try:
        others = fleet.start(1, settings, log="o")
        wait_for(lambda: len(site.fetch_counts()) >= len(site.all_urls()) - 2, 60,
                 "the other worker to take over")
    finally:
        frozen.process.send_signal(signal.SIGCONT)
    results = wait_workers([frozen, *others], timeout=60)
    assert_finished(results)
    assert_all_fetched(site)
    frozen_stats = results[0].stats
    assert frozen_stats.get("redisspine/scheduler/presumed_dead", 0) >= 1 or frozen_stats.get(
        "redisspine/scheduler/ack_refused", 0
    ) >= 1, results[0].log[-3000:]


def test_redis_restart_with_aof_mid_crawl(fleet: Fleet, site_factory: SiteFactory) -> None:
    site = site_factory(hosts=3, pages_per_host=25, latency=0.05)
    with RedisServer(appendonly=True) as server:
        settings = _settings(fleet, site, REDISSPINE_REDIS_URL=server.url, CONCURRENT_REQUESTS=4)
        workers = fleet.start(2, settings)
        wait_joined(server.url, fleet.keys, 2)  # a joining worker rides it: test_join_rides.py
        wait_for(lambda: len(site.requests()) >= 20, 30, "the crawl to get going")
        server.restart()
        results = wait_workers(workers, timeout=120)
    assert_finished(results)
    assert_all_fetched(site)


def test_many_hosts_lose_nothing_through_a_redis_restart_and_a_killed_worker(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    # 24 hosts: past a packed list's 16 entries, so the scripts keep the lane keys and
    # the in-flight indexes in Redis's hashed encodings (scripts/lib/hashed.lua). A
    # rewritten AOF (an RDB preamble) brings them back packed after the restart, and
    # the next writes convert them again; then a worker dies holding leases, which
    # come back through those keys. Nothing may be lost on the way.
    site = site_factory(hosts=24, pages_per_host=15, latency=0.2)
    with RedisServer(appendonly=True) as server:
        client = server.client()
        backlog = fleet.keys.backlog
        settings = _settings(fleet, site, REDISSPINE_REDIS_URL=server.url, CONCURRENT_REQUESTS=8)
        victim, survivor = fleet.start(2, settings)
        # (at -n 4 the survivor was once still joining when Redis restarted)
        wait_joined(server.url, fleet.keys, 2)
        wait_for(lambda: len(site.requests()) >= 40, 30, "the crawl to get going")
        wait_for(lambda: client.object("encoding", backlog) == b"hashtable", 10,
                 "the backlog of 24 lanes hashed")
        client.bgrewriteaof()
        wait_for(lambda: not int(client.info("persistence")["aof_rewrite_in_progress"]), 10,
                 "the AOF rewritten")
        server.restart()
        restarted_at = len(site.requests())
        wait_for(lambda: len(site.requests()) >= restarted_at + 40, 30, "the crawl going on")
        victim.kill()
        victim.process.wait()
        results = wait_workers([survivor], timeout=120)
    assert_finished(results)
    assert_all_fetched(site)


def test_small_maxmemory_is_watched_not_hit(fleet: Fleet, site_factory: SiteFactory) -> None:
    site = site_factory(hosts=3, pages_per_host=150, fanout=8, latency=0.01)
    with RedisServer() as server:
        settings = _settings(fleet, site, REDISSPINE_REDIS_URL=server.url, CONCURRENT_REQUESTS=4)
        workers = fleet.start(2, settings)
        wait_for(lambda: len(site.requests()) >= 10, 30, "the crawl to get going")
        used = int(server.client().info("memory")["used_memory"])
        server.client().config_set("maxmemory", used + 20_000)
        results = wait_workers(workers, timeout=120)
    shed = sum(r.stats.get("redisspine/memory/shed", 0) for r in results)
    assert shed > 0, "the budget was never reached: make the site bigger"
    # the crawl ran out of work without what it shed: no worker says "finished"
    for result in results:
        detail = f"worker {result.index}: rc={result.returncode}\n{result.log[-3000:]}"
        assert result.finish_reason == "redisspine_memory_exceeded", detail
        assert result.returncode != 0, detail
        assert f"without {shed} newly discovered request(s)" in result.log, detail
    logs = "\n".join(r.log for r in results)
    assert "near its memory budget" in logs
    assert "Traceback" not in logs


def test_a_worker_joining_a_redis_that_stays_full_brings_its_start_request_and_finishes(
    fleet: Fleet, site_factory: SiteFactory,
) -> None:
    # Redis fills up mid-crawl and never gets room back (the dedup SET keeps what it
    # grew). A worker that joins then, with a start request nobody had, must bring
    # it in and let the fleet finish: waiting for room would wait forever.
    site = site_factory(hosts=2, pages_per_host=40, fanout=4, latency=0.02)
    extra = f"http://{host_address(0)}:{site.port}/joined-late"  # a 404: in the site's log
    with RedisServer() as server:
        settings = _settings(fleet, site, REDISSPINE_REDIS_URL=server.url, CONCURRENT_REQUESTS=2)
        [first] = fleet.start(1, settings, log="first")
        wait_for(lambda: len(site.requests()) >= 10, 30, "the crawl to get going")
        # 2 MB of ballast and a budget 200 kB under what is used: what the crawl frees
        # as it drains (a few kB here) never gives Redis room back, on any allocator.
        # The ballast is made in Redis (SETRANGE), not sent: a 2 MB value sent with SET
        # left a 2 MB query buffer in `used_memory` until Redis's cron trimmed it, which
        # gave the crawl 2 MB of room (Redis 8.2, CI, once in many runs).
        server.client().setrange("ballast", 2_000_000, b"x")
        budget = int(server.client().info("memory")["used_memory"]) - 200_000
        server.client().config_set("maxmemory", budget)
        [late] = fleet.start(1, {**settings, "LINKS_EXTRA_START_URLS": extra}, log="late")
        results = wait_workers([first, late], timeout=120)
        used_at_end = int(server.client().info("memory")["used_memory"])
        left = server.client().zcard(fleet.keys.workers)
    assert used_at_end >= budget, (
        f"Redis got room back ({used_at_end} B used under a {budget} B budget): "
        "the case is not the one under test"
    )
    assert any(r["path"] == "/joined-late" for r in site.requests()), "the late start was lost"
    # discoveries were shed meanwhile: the crawl ends, loudly, as not finished
    for result in results:
        assert (result.returncode, result.finish_reason) != (0, "finished"), result.log[-3000:]
        assert result.finish_reason == "redisspine_memory_exceeded", result.log[-3000:]
    assert left == 0, "each worker left the fleet on its way out"
    logs = "\n".join(r.log for r in results)
    assert "Traceback" not in logs
    assert "while closing" not in logs, "what a closing worker held needs no room"


def test_requests_that_fail_or_are_ignored_leave_in_flight(
    fleet: Fleet, test_site: TestSite, real_redis: redis.Redis
) -> None:
    port = test_site.port
    extra = [
        f"http://127.0.0.10:{port}/no-such-page",  # 404: HttpError, then errback
        "http://127.0.0.1:9/refused",  # connection refused: retried, then errback
        f"http://127.0.0.99:{port}/p/0",  # offsite: IgnoreRequest in the downloader
    ]
    hosts = ",".join(["127.0.0.1"] + [f"127.0.0.{10 + i}" for i in range(3)])
    settings = fleet.crawling(LINKS_EXTRA_START_URLS=",".join(extra), RETRY_TIMES=1)
    results = fleet.run(2, settings, spider_args={"allowed_domains": hosts})
    assert_finished(results)
    assert_all_fetched(test_site)
    assert real_redis.hlen(fleet.keys.inflight) == 0
    stats = [r.stats for r in results]
    assert sum(s.get("offsite/filtered", 0) for s in stats) >= 1
    assert sum(s.get("retry/count", 0) for s in stats) >= 1
    acked = sum(s.get("redisspine/scheduler/acked", 0) for s in stats)
    leased = sum(s.get("redisspine/scheduler/leased", 0) for s in stats)
    assert acked == leased
