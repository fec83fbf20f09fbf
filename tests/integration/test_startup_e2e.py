"""Start-up of real workers: joiners wait for the seeds, and what cannot start says
why in one line and exits non-zero.

Each test runs real ``scrapy crawl`` processes of the test project; the crawl's
outcome is read from the test site's own request log and the workers' logs.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine.testing.redis_server import RedisServer
from tests.integration.crawlproc import assert_all_fetched, assert_finished, wait_workers

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy_redisspine.testing.site import TestSite
    from tests.integration.crawlproc import Fleet, WorkerResult

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


def _refused(results: list[WorkerResult], reason: str, *said: str) -> str:
    (result,) = results
    detail = f"rc={result.returncode}\n{result.log[-3000:]}\n{result.output[-2000:]}"
    assert result.returncode != 0, detail
    assert result.finish_reason == reason, detail
    assert "Traceback" not in result.log + result.output, detail
    errors = [line for line in result.log.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, errors
    for text in said:
        assert text in errors[0], errors[0]
    return errors[0]


@pytest.mark.parametrize(
    ("url", "reason", "said"),
    [
        pytest.param("http://user:secret@127.0.0.1:1/0", "redisspine_config_error",
                     ("REDISSPINE_REDIS_URL must be a redis://",), id="wrong-scheme"),
        pytest.param("redis://:secret@127.0.0.1:1/0", "redisspine_redis_unreachable",
                     ("127.0.0.1:1", "***", "ConnectionError"), id="unreachable"),
    ],
)
def test_a_worker_that_cannot_start_says_why_in_one_line(
    fleet: Fleet, url: str, reason: str, said: tuple[str, ...],
) -> None:
    line = _refused(fleet.run(1, fleet.crawling(REDISSPINE_REDIS_URL=url), timeout=60),
                    reason, *said)
    assert "secret" not in line


def test_a_wrong_password_says_so_in_one_line(fleet: Fleet, tmp_path: Any) -> None:
    with RedisServer(directory=tmp_path / "redis") as server:
        admin = server.client()
        admin.config_set("requirepass", "right")
        admin.close()
        url = server.url.replace("redis://", "redis://:wrong@")
        line = _refused(fleet.run(1, fleet.crawling(REDISSPINE_REDIS_URL=url), timeout=60),
                        "redisspine_redis_unreachable", "AuthenticationError", "***")
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
