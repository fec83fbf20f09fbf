"""``redisspine`` against real ``scrapy crawl`` workers, checked from the site's log."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine import cli
from tests.integration.crawlproc import (
    assert_exactly_once,
    assert_finished,
    wait_for,
    wait_workers,
)
from tests.queue_view import queued_count

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.testing.site import TestSite
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("outside_any_project")]

# Orders are read once per heartbeat: a short one keeps the tests short.
FAST = {"REDISSPINE_HEARTBEAT_SECONDS": 0.3, "REDISSPINE_SWEEP_SECONDS": 1,
        "LOGSTATS_INTERVAL": 1}


def _cli(redis_url: str, *args: str) -> None:
    assert cli.main(["--redis-url", redis_url, *args]) == 0, args


def _fetched(site: TestSite) -> int:
    return sum(site.fetch_counts().values())


def test_status_totals_match_what_the_crawl_did(
    fleet: Fleet, site_factory: SiteFactory, redis_url: str
) -> None:
    site = site_factory(hosts=3, pages_per_host=20)
    results = fleet.run(2, fleet.crawling(site, **FAST, DOWNLOAD_DELAY=0.05), timeout=60)
    assert_finished(results)
    command = Path(sys.executable).with_name("redisspine")  # the installed console script
    output = subprocess.run(
        [str(command), "--redis-url", redis_url, "status", fleet.keys.crawl_id, "--json"],
        check=True, capture_output=True, text=True,
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
    fleet: Fleet, site_factory: SiteFactory, redis_url: str
) -> None:
    site = site_factory(hosts=3, pages_per_host=30, latency=0.05)
    crawl = fleet.keys.crawl_id
    workers = fleet.start(2, fleet.crawling(site, **FAST))
    try:
        wait_for(lambda: _fetched(site) >= 10, 30, "10 pages fetched")
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
    assert_finished(results)
    assert_exactly_once(site)
    for result in results:
        # A worker slow to start (a loaded machine: once, 5 s) joins the crawl paused
        # and says so at its join; the others see the order come in.
        assert ("redisspine: fleet orders now paused" in result.log
                or "redisspine: fleet orders at join: paused" in result.log), result.log[-3000:]
        assert "redisspine: fleet orders now resumed" in result.log
        assert "Orders(" not in result.log
        assert "DEBUG: Operation failed" not in result.log, "redis-py's DEBUG noise"


def test_a_worker_started_on_a_paused_crawl_fetches_nothing_until_resumed(
    fleet: Fleet, site_factory: SiteFactory, redis_url: str, real_redis: redis.Redis
) -> None:
    """Orders given before a worker starts hold from its first lease: it used to read
    them at its first heartbeat only, and fetched pages of a paused crawl until then.
    The heartbeat here is long, so that the worker's window is wide and seen."""
    site = site_factory(hosts=3, pages_per_host=5)
    crawl = fleet.keys.crawl_id
    _cli(redis_url, "seed", crawl, *site.start_urls())  # `pause` takes a crawl that exists
    _cli(redis_url, "pause", crawl)
    [worker] = fleet.start(1, fleet.crawling(site, REDISSPINE_HEARTBEAT_SECONDS=4,
                                             REDISSPINE_WORKER_TIMEOUT_SECONDS=30))
    try:
        wait_for(lambda: real_redis.zcard(fleet.keys.workers) == 1, 60, "the worker joined")
        time.sleep(2.0)  # well before its first heartbeat
        assert _fetched(site) == 0, "pages fetched while paused"
        assert real_redis.hlen(fleet.keys.inflight) == 0, "requests leased while paused"
        _cli(redis_url, "resume", crawl)
        [result] = wait_workers([worker], timeout=60)
    finally:
        worker.kill()
    assert_finished([result])
    assert_exactly_once(site)
    assert "redisspine: fleet orders at join: paused" in result.log
    assert "redisspine: fleet orders now resumed" in result.log


def test_drain_exits_with_reason_drained_and_loses_nothing(
    fleet: Fleet, site_factory: SiteFactory, redis_url: str, real_redis: redis.Redis
) -> None:
    site = site_factory(hosts=3, pages_per_host=30, latency=0.1)
    settings = fleet.crawling(site, **FAST)
    crawl = fleet.keys.crawl_id
    workers = fleet.start(2, settings, log="a")
    try:
        wait_for(lambda: _fetched(site) >= 10, 30, "10 pages fetched")
        _cli(redis_url, "drain", crawl)
        drained = wait_workers(workers, timeout=20)
    finally:
        for worker in workers:
            worker.kill()
    assert_finished(drained, reason="drained")
    assert real_redis.hlen(fleet.keys.inflight) == 0, "a drained worker kept leases"
    assert queued_count(real_redis, fleet.keys) > 0
    _cli(redis_url, "resume", crawl)
    rest = fleet.run(2, settings, log="b", timeout=60)
    assert_finished(rest)
    assert_exactly_once(site)


def test_seed_into_a_running_keep_alive_crawl_gets_fetched(
    fleet: Fleet, test_site: TestSite, redis_url: str, real_redis: redis.Redis
) -> None:
    crawl = fleet.keys.crawl_id
    [worker] = fleet.start(1, fleet.crawling(**FAST, REDISSPINE_KEEP_ALIVE=True))
    try:
        wait_for(lambda: len(test_site.fetch_counts()) == len(test_site.all_urls()), 30,
                 "the site crawled")
        keys = fleet.keys
        wait_for(lambda: queued_count(real_redis, keys) + real_redis.hlen(keys.inflight) == 0, 10,
                 "the crawl idle")
        start = test_site.start_urls()[0]
        before = len(test_site.requests())
        seeded = start + "?seeded=1"
        _cli(redis_url, "seed", crawl, seeded, start)
        wait_for(lambda: any(r["path"].endswith("?seeded=1") for r in test_site.requests()),
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


def test_lpush_into_the_feed_key_of_a_running_keep_alive_crawl_gets_fetched(
    fleet: Fleet, test_site: TestSite, redis_url: str, real_redis: redis.Redis
) -> None:
    """scrapy-redis's way: ``lpush <spider>:start_urls`` of plain URLs and JSON entries
    (meta, a callback, cb_kwargs) into a running crawl; bad entries dead-lettered."""
    from scrapy_redisspine._frontier_upkeep import FrontierUpkeep

    feed = f"{fleet.spider}:start_urls"  # REDISSPINE_FEED_KEY's default
    real_redis.delete(feed)
    [worker] = fleet.start(1, fleet.crawling(**FAST, REDISSPINE_KEEP_ALIVE=True,
                                             REDISSPINE_FEED_SECONDS=0.2))
    keys = fleet.keys
    try:
        wait_for(lambda: len(test_site.fetch_counts()) == len(test_site.all_urls()), 30,
                 "the site crawled")
        wait_for(lambda: queued_count(real_redis, keys) + real_redis.hlen(keys.inflight) == 0, 10,
                 "the crawl idle")
        start = test_site.start_urls()[0]
        fed_json = {"url": start + "?fed=json", "meta": {"fed": "yes"},
                    "callback": "parse_fed", "cb_kwargs": {"n": 3}}
        real_redis.lpush(
            feed, start + "?fed=plain", json.dumps(fed_json), "not a url",
            json.dumps({"url": start + "?fed=nope", "callback": "no_such_method"}),
            start,  # seen already: the dedup drops it
        )
        paths = ("?fed=plain", "?fed=json")
        wait_for(lambda: all(any(r["path"].endswith(path) for r in test_site.requests())
                             for path in paths), 10, "the fed URLs fetched")
        wait_for(lambda: real_redis.exists(feed) == 0, 10, "the feed drained")
        before = len(test_site.requests())
        time.sleep(1)  # a few more drain ticks: nothing fed is fetched again
        letters = FrontierUpkeep(real_redis, keys, "test").dead_letters()
        _cli(redis_url, "drain", keys.crawl_id)
        [result] = wait_workers([worker], timeout=20)
    finally:
        if worker.process.poll() is None:
            worker.process.send_signal(signal.SIGINT)
            wait_workers([worker], timeout=30)
        real_redis.delete(feed)
    assert result.finish_reason == "drained"
    assert len(test_site.requests()) == before, "a fed entry was fetched twice"
    fetched = [r["path"] for r in test_site.requests()]
    assert sum(p.endswith("?fed=plain") for p in fetched) == 1
    assert sum(p.endswith("?fed=json") for p in fetched) == 1
    assert not any(p.endswith("?fed=nope") for p in fetched)
    logged = [json.loads(line.split("fed page: ", 1)[1]) for line in result.log.splitlines()
              if "fed page: " in line]
    assert logged == [{"url": start + "?fed=json", "fed": "yes", "cb_kwargs": {"n": 3}}]
    reasons = {letter.payload.decode(): letter.reason for letter in letters}
    assert set(reasons) == {"not a url", json.dumps(
        {"url": start + "?fed=nope", "callback": "no_such_method"})}
    assert "not an absolute http(s) URL" in reasons["not a url"]
    assert all(reason.startswith("bad feed entry: ") for reason in reasons.values())
    assert "'no_such_method' is not a method of the spider" in "".join(reasons.values())


def test_a_spider_fed_only_through_its_feed_key_crawls_the_site_and_finishes(
    fleet: Fleet, test_site: TestSite, real_redis: redis.Redis
) -> None:
    """A scrapy-redis style crawl: no start requests, the start URLs lpushed into the
    feed before the workers start; two workers crawl it once and finish."""
    feed = f"{fleet.spider}:start_urls"
    real_redis.delete(feed)
    real_redis.lpush(feed, *test_site.start_urls())
    try:
        results = fleet.run(2, fleet.crawling(**FAST, LINKS_JOIN_ONLY=True), timeout=60)
    finally:
        left = real_redis.llen(feed)
        real_redis.delete(feed)
    assert_finished(results)
    assert left == 0
    assert_exactly_once(test_site)


def test_status_after_a_worker_was_killed_keeps_its_last_totals_and_says_finished(
    fleet: Fleet, site_factory: SiteFactory, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Pages slow enough that the victim dies with leases held (~6 s of pages a host):
    # the rest can finish only once its sweep took the victim for dead. (At 0.05 s a
    # page the victim had crawled nearly all by its kill, and the rest could finish
    # before the victim's heartbeat aged: "alive", under load.)
    site = site_factory(hosts=3, pages_per_host=20, latency=0.3)
    settings = fleet.crawling(site, **FAST, REDISSPINE_WORKER_TIMEOUT_SECONDS=1.5)
    [victim] = fleet.start(1, settings, log="victim")
    wait_for(lambda: _fetched(site) >= 15, 30, "15 pages fetched")
    time.sleep(1.5)  # one push of its totals (every LOGSTATS_INTERVAL = 1 s) at least
    victim.kill()
    victim.process.wait()
    results = fleet.run(1, settings, log="rest", timeout=60)
    assert_finished(results)
    capsys.readouterr()
    _cli(redis_url, "status", fleet.keys.crawl_id, "--json")
    status = json.loads(capsys.readouterr().out)
    assert status["state"] == "finished"
    assert (status["rate_per_minute"], status["eta_seconds"]) == (None, None)
    states = sorted(worker["state"] for worker in status["workers"])
    assert states == ["closed", "dead"]
    dead = next(worker for worker in status["workers"] if worker["state"] == "dead")
    assert dead["totals"]["response_received_count"] >= 10, "the killed worker's pages"
    pages = sum(w["totals"]["response_received_count"] for w in status["workers"])
    assert status["fleet_stats"]["response_received_count"] == pages, (
        "the fleet's totals are the sum of each worker's last pushed ones")
    _cli(redis_url, "status", fleet.keys.crawl_id)
    text = capsys.readouterr().out
    assert text.startswith(f"crawl {fleet.keys.crawl_id}: finished")
    assert "dead: last pushed totals" in text
