"""Politeness across crawls (issue 20), checked from the test site's own request log.

Two crawls on one Redis, three ``scrapy crawl`` workers each, fetch the same hosts.
In one politeness group (the default: every crawl under one key prefix) the site
sees one fleet: with delay D and concurrency 1 no two fetches of a host overlap and
no gap between them is below D, whichever crawl made them. A worker of one crawl
killed with SIGKILL does not wedge a shared lane for the other once its lease is
swept.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine.keys import CrawlKeys
from tests.integration.crawlproc import assert_finished, wait_for, wait_workers
from tests.queue_view import queued_count

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.testing.site import TestSite
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet, WorkerResult

pytestmark = pytest.mark.e2e

# As in test_politeness_e2e: the site stamps with time.time(), the lane's rest starts
# at Redis TIME when the ack arrives, both on this machine.
CLOCK_SLACK = 0.005
FAST_RECOVERY = {
    "REDISSPINE_HEARTBEAT_SECONDS": 0.3,
    "REDISSPINE_WORKER_TIMEOUT_SECONDS": 1.5,
    "REDISSPINE_SWEEP_SECONDS": 0.3,
}


def _by_host(site: TestSite) -> dict[str, list[tuple[float, float]]]:
    fetches: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for record in site.requests():
        if record.get("page") and "error" not in record:
            fetches[record["host"]].append((record["start"], record["end"]))
    return {host: sorted(times) for host, times in fetches.items()}


def _smallest_gaps(site: TestSite) -> dict[str, float]:
    return {
        host: min(later[0] - earlier[1] for earlier, later in pairwise(times))
        for host, times in _by_host(site).items()
    }


def _two_crawls(fleet: Fleet, site: TestSite, **extra: Any) -> tuple[dict[str, Any], ...]:
    first = fleet.crawling(site, **extra)
    second = {**first, "REDISSPINE_CRAWL_ID": first["REDISSPINE_CRAWL_ID"] + "-other"}
    return first, second


def _every_page_fetched_by_both(site: TestSite) -> None:
    counts = Counter(site.fetch_counts())
    fetched = {url: counts[url] for url in site.all_urls()}
    assert min(fetched.values()) >= 2, "each crawl fetches every page once (own dedup)"


def _run_both(
    fleet: Fleet, site: TestSite, first: dict[str, Any], second: dict[str, Any],
    timeout: float = 120,
) -> tuple[list[WorkerResult], dict[str, float]]:
    """Three workers of each crawl to their end, every one ``finished`` and every page
    fetched by both crawls: the results, and each host's smallest gap."""
    workers = fleet.start(3, first, log="a") + fleet.start(3, second, log="b")
    results = wait_workers(workers, timeout=timeout)
    assert_finished(results)
    _every_page_fetched_by_both(site)
    return results, _smallest_gaps(site)


def _assert_polite(gaps: dict[str, float], delay: float) -> None:
    for host, gap in gaps.items():
        assert gap >= -CLOCK_SLACK, f"{host}: two fetches overlapped"
        assert gap >= delay - CLOCK_SLACK, f"{host}: gap {gap:.3f} s < {delay} s"


def test_two_crawls_of_one_group_keep_every_hosts_delay_with_no_overlap(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    delay = 0.3
    site = site_factory(hosts=3, pages_per_host=6, fanout=3, latency=0.05)
    first, second = _two_crawls(fleet, site, DOWNLOAD_DELAY=delay)
    results, gaps = _run_both(fleet, site, first, second)
    _assert_polite(gaps, delay)
    # Several workers of each crawl fetched, so the gaps held between workers, not
    # only within one. (Not all three: a worker that a loaded machine started after
    # its crawl's ~4 s of pages were taken rightly fetched none; seen at -n 4.)
    for crawl in (results[:3], results[3:]):
        fetched = [r.stats.get("downloader/request_count", 0) for r in crawl]
        assert sum(1 for n in fetched if n > 0) >= 2, f"pages per worker: {fetched}"


def test_two_crawls_of_different_groups_do_not_share_a_budget(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    """The control: the test above would notice crawls that ignore each other."""
    delay = 0.3
    site = site_factory(hosts=3, pages_per_host=6, fanout=3, latency=0.05)
    first, second = _two_crawls(fleet, site, DOWNLOAD_DELAY=delay)
    second["REDISSPINE_POLITENESS_GROUP"] = "elsewhere"
    _, gaps = _run_both(fleet, site, first, second)
    assert min(gaps.values()) < delay - CLOCK_SLACK


def test_a_killed_worker_of_one_crawl_does_not_wedge_the_shared_lane(
    fleet: Fleet, site_factory: SiteFactory, real_redis: redis.Redis
) -> None:
    delay = 0.2
    site = site_factory(hosts=2, pages_per_host=8, fanout=3, latency=0.4)
    first, second = _two_crawls(fleet, site, DOWNLOAD_DELAY=delay, **FAST_RECOVERY)
    crawl_a = CrawlKeys("redisspine", first["REDISSPINE_CRAWL_ID"])
    a_workers = fleet.start(3, first, log="a")
    b_workers = fleet.start(3, second, log="b")
    victim = a_workers[0]

    def victim_holds_a_lease() -> bool:
        owners = (entry.split(b"\n", 1)[0] for entry in real_redis.hvals(crawl_a.inflight))
        return any(f":{victim.pid}:".encode() in owner for owner in owners)

    wait_for(victim_holds_a_lease, 60, "a lease held by the victim")
    victim.kill()
    victim.process.wait()
    results = wait_workers(a_workers[1:] + b_workers, timeout=120)
    assert_finished(results)
    _every_page_fetched_by_both(site)
    swept = sum(r.stats.get("redisspine/recovery/requeued", 0) for r in results[:2])
    assert swept >= 1, "crawl a's survivors requeued the victim's lease"
    # The victim's slot went back to the group: nothing is counted in flight at the end.
    assert not real_redis.exists(crawl_a.group_busy), real_redis.hgetall(crawl_a.group_busy)
    for host, gap in _smallest_gaps(site).items():
        assert gap >= delay - CLOCK_SLACK, f"{host}: gap {gap:.3f} s < {delay} s"


def test_a_crawl_whose_only_worker_died_is_swept_by_the_other_crawl_of_the_group(
    fleet: Fleet, site_factory: SiteFactory, real_redis: redis.Redis
) -> None:
    # Crawl a's one worker is killed holding leases: nobody of crawl a is left to
    # sweep them, and their slots are the group's. Crawl b's workers sweep crawl a
    # (its workers silent for 3x the timeout), so b fetches every page and ends
    # `finished`; a's leases are back in a's own queue for a's next run.
    site = site_factory(hosts=2, pages_per_host=8, fanout=3, latency=0.4)
    first, second = _two_crawls(fleet, site, **FAST_RECOVERY)
    crawl_a = CrawlKeys("redisspine", first["REDISSPINE_CRAWL_ID"])
    [victim] = fleet.start(1, first, log="a")
    wait_for(lambda: real_redis.hlen(crawl_a.inflight) >= 2, 60, "leases held by the victim")
    victim.kill()
    victim.process.wait()
    held = real_redis.hlen(crawl_a.inflight)
    results = wait_workers(fleet.start(2, second, log="b"), timeout=120)
    assert_finished(results)
    fetched_by_b = sum(r.stats.get("response_received_count", 0) for r in results)
    assert fetched_by_b >= len(site.all_urls()), "crawl b fetched every page"
    assert sum(r.stats.get("redisspine/recovery/group_requeued", 0) for r in results) == held
    assert any("had 1 dead worker(s) holding the group's lane slots" in r.log for r in results)
    assert real_redis.hlen(crawl_a.inflight) == 0
    assert queued_count(real_redis, crawl_a) >= held, "a's leases went back to a's queue"
    assert not real_redis.exists(crawl_a.group_busy), real_redis.hgetall(crawl_a.group_busy)
