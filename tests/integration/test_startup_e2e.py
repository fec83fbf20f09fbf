"""Start-up of real workers: joiners wait for the seeds, and what cannot start says
why in one line and exits non-zero.

Each test runs real ``scrapy crawl`` processes of the test project; the crawl's
outcome is read from the test site's own request log and the workers' logs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine.testing.linkgraph import host_address
from scrapy_redisspine.testing.redis_server import RedisServer
from tests.integration.crawlproc import (
    assert_all_fetched,
    assert_finished,
    assert_refused,
    wait_for,
    wait_workers,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_redisspine.testing.site import TestSite
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e


def test_workers_that_join_before_anything_is_queued_wait_for_the_seeds(
    fleet: Fleet, site_factory: Callable[..., TestSite],
) -> None:
    # Two workers only join (their spider yields no start request); the seeding
    # worker starts later and yields its start requests slowly. Nobody may finish
    # before the crawl is done.
    # slow pages keep the seeder's one download slot busy, so the joiners get work
    site = site_factory(hosts=3, pages_per_host=10, latency=0.3)
    joiners = fleet.start(2, fleet.crawling(site, LINKS_JOIN_ONLY=True), log="joiners")
    time.sleep(2)
    assert all(worker.process.poll() is None for worker in joiners), "a joiner finished early"
    # one download at a time: the seeder cannot hold every host's slot itself
    seeder = fleet.start(1, fleet.crawling(site, LINKS_START_PAUSE_SECONDS=0.5,
                                           CONCURRENT_REQUESTS=1), log="seeder")
    results = wait_workers([*joiners, *seeder], timeout=120)
    assert_finished(results)
    assert_all_fetched(site)
    assert all("no request queued yet" in result.log for result in results[:2])
    assert sum(result.stats.get("response_received_count", 0) for result in results[:2]) > 0
    assert not any(CUT_SHORT in result.log for result in results), "nobody stopped"


CUT_SHORT = "stopped without noting their start requests done"


@pytest.mark.parametrize("stop", ["terminate", "kill"])
def test_a_crawl_done_after_its_seeder_stopped_mid_start_says_so(
    fleet: Fleet, site_factory: Callable[..., TestSite], stop: str,
) -> None:
    # The seeder is stopped (Ctrl-C's graceful shutdown, or SIGKILL) after its first
    # start request, its other two never yielded. The joiner crawls what there is
    # (this site's pages link across hosts: all of it), waits until the seeder is
    # taken for dead, and finishes saying that start requests may be missing.
    site = site_factory(hosts=3, pages_per_host=10, latency=0.1)
    settings = fleet.crawling(site, REDISSPINE_HEARTBEAT_SECONDS=0.3,
                              REDISSPINE_WORKER_TIMEOUT_SECONDS=1.5)
    [joiner] = fleet.start(1, {**settings, "LINKS_JOIN_ONLY": True}, log="joiner")
    # 3 s before each of its three start requests: stopped ~3 s before its second
    [seeder] = fleet.start(1, {**settings, "LINKS_START_PAUSE_SECONDS": 3.0}, log="seeder")
    wait_for(lambda: len(site.requests()) >= 1, 60, "the first start page fetched")
    getattr(seeder, stop)()
    seeder.process.wait()
    [result] = wait_workers([joiner], timeout=120)
    assert_finished([result])
    assert_all_fetched(site)
    assert CUT_SHORT in result.log
    assert result.stats.get("redisspine/fleet/starts_cut_short") == 1
    # As the warning says: run it again, and what its start() yields that the crawl
    # does not have is crawled, though the crawl had finished (here a start URL that
    # the first run never reached, a 404 in the site's own log)
    extra = f"http://{host_address(0)}:{site.port}/never-queued"
    [again] = fleet.run(1, {**settings, "LINKS_EXTRA_START_URLS": extra}, log="again",
                        timeout=60)
    assert_finished([again])
    assert [r["path"] for r in site.requests()].count("/never-queued") == 1


def test_scrapys_rule_on_request_closes_a_crawl_that_never_had_a_request(
    fleet: Fleet, site_factory: Callable[..., TestSite],
) -> None:
    # REDISSPINE_WAIT_FOR_FIRST_REQUEST = False: a lone worker whose spider yields no
    # request closes `finished` at once, as on Scrapy.
    site = site_factory(hosts=1, pages_per_host=3)
    settings = fleet.crawling(site, LINKS_JOIN_ONLY=True,
                              REDISSPINE_WAIT_FOR_FIRST_REQUEST=False)
    started = time.monotonic()
    [lone] = fleet.run(1, settings, log="lone", timeout=60)
    assert_finished([lone])
    assert time.monotonic() - started < 30, "it waited for a first request"
    assert "never had a request queued and no worker is starting" in lone.log
    assert site.requests() == []


def test_without_waiting_a_seeder_still_in_its_start_holds_the_crawl_open(
    fleet: Fleet, site_factory: Callable[..., TestSite],
) -> None:
    # Even without the wait, a worker still producing start requests counts as work
    # fleet-wide: a joiner that comes while the seeder is in its slow start() stays,
    # takes part, and nothing is left undone.
    site = site_factory(hosts=3, pages_per_host=10, latency=0.3)
    extra = {"REDISSPINE_WAIT_FOR_FIRST_REQUEST": False}
    seeder = fleet.start(1, fleet.crawling(site, LINKS_START_PAUSE_SECONDS=3.0,
                                           CONCURRENT_REQUESTS=1, **extra), log="seeder")
    time.sleep(1.5)  # registered and in its start(), its first request not yet sent
    joiners = fleet.start(2, fleet.crawling(site, LINKS_JOIN_ONLY=True, **extra),
                          log="joiners")
    results = wait_workers([*seeder, *joiners], timeout=120)
    assert_finished(results)
    assert_all_fetched(site)
    assert sum(result.stats.get("response_received_count", 0) for result in results[1:]) > 0
    assert not any("never had a request queued" in result.log for result in results)


@pytest.mark.parametrize(
    ("url", "reason", "said"),
    [
        pytest.param("http://user:secret@127.0.0.1:1/0", "redisspine_config_error",
                     ("REDISSPINE_REDIS_URL: ", "is no Redis URL"), id="wrong-scheme"),
        pytest.param("redis://:secret@127.0.0.1:1/0", "redisspine_redis_unreachable",
                     ("127.0.0.1:1", "***", "ConnectionError"), id="unreachable"),
        pytest.param("redis+sentinel://:secret@127.0.0.1:1", "redisspine_config_error",
                     ("REDISSPINE_REDIS_URL: ", "names the service"), id="sentinel-no-service"),
        pytest.param("redis+cluster://:secret@127.0.0.1:1", "redisspine_redis_unreachable",
                     ("redis+cluster://:***@127.0.0.1:1", "ConnectionError"),
                     id="cluster-unreachable"),
        pytest.param("redis+sentinel://:secret@127.0.0.1:1/spine", "redisspine_redis_unreachable",
                     ("redis+sentinel://:***@127.0.0.1:1/spine", "ConnectionError"),
                     id="sentinel-unreachable"),
    ],
)
def test_a_worker_that_cannot_start_says_why_in_one_line(
    fleet: Fleet, url: str, reason: str, said: tuple[str, ...],
) -> None:
    [result] = fleet.run(1, fleet.crawling(REDISSPINE_REDIS_URL=url), timeout=60)
    line = assert_refused(result, reason, *said)
    assert "secret" not in line


def test_a_wrong_password_says_so_in_one_line(fleet: Fleet, tmp_path: Any) -> None:
    with RedisServer(directory=tmp_path / "redis") as server:
        admin = server.client()
        admin.config_set("requirepass", "right")
        admin.close()
        url = server.url.replace("redis://", "redis://:wrong@")
        [result] = fleet.run(1, fleet.crawling(REDISSPINE_REDIS_URL=url), timeout=60)
        line = assert_refused(result, "redisspine_redis_unreachable", "AuthenticationError",
                              "***")
    assert "wrong" not in line


def test_a_start_request_answered_429_is_retried_and_fetched(
    fleet: Fleet, site_factory: Callable[..., TestSite],
) -> None:
    # Scrapy's RetryMiddleware copies the start request, meta and all (also
    # is_start_request): the copy is a retry to fetch, not a start request again.
    probe = site_factory(hosts=2, pages_per_host=5)
    host, path = probe.start_urls()[0].split("://", 1)[1].split("/", 1)
    busy = f"{host.split(':')[0]}/{path}"
    site = site_factory(hosts=2, pages_per_host=5, busy_paths={busy: 1})
    results = fleet.run(2, fleet.crawling(site), timeout=120)
    assert_finished(results)
    assert_all_fetched(site)
    answers = [entry["status"] for entry in site.requests()
               if f"{entry['host']}{entry['path']}" == busy]
    assert answers == [429, 200], "answered 429 once, then fetched by the retry"
