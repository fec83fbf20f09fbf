"""Scrapy's reactorless mode (``TWISTED_REACTOR_ENABLED = False``, Scrapy 2.15+):
``scrapy crawl`` runs on a bare asyncio loop and forbids importing Twisted's reactor.

The add-on's timers (heartbeat, sweep, lease wake-ups, outbox flushes) then run on
asyncio's loop, so the guarantees must hold there exactly as on the reactor: a
worker killed mid-crawl loses nothing (its leases come back through the others'
sweep, a timer), and the fleet keeps every host's delay (lease wake-ups, timers).
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Any

import pytest
import scrapy

from tests.integration.crawlproc import (
    assert_all_fetched,
    assert_finished,
    wait_for,
)
from tests.integration.test_crash_e2e import FAST_RECOVERY, _kill_then_finish
from tests.integration.test_politeness_e2e import CLOCK_SLACK, _by_host

if TYPE_CHECKING:
    from scrapy_redisspine.testing.site import TestSite
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet, WorkerResult

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        tuple(int(part) for part in scrapy.__version__.split(".")[:2]) < (2, 15),
        reason="Scrapy's reactorless mode came with Scrapy 2.15",
    ),
]

REACTORLESS = {"TWISTED_REACTOR_ENABLED": False, **FAST_RECOVERY}


def _settings(fleet: Fleet, site: TestSite, **extra: Any) -> dict[str, Any]:
    return fleet.crawling(site, **REACTORLESS, **extra)


def _assert_reactorless(results: list[WorkerResult]) -> None:
    """Each worker really ran without Twisted's reactor (the test project's
    ``ReportLoop`` says so as the spider closes), its Redis calls parked on asyncio's
    loop (greenlets, not threads), and nothing failed on the way."""
    for result in results:
        assert "Twisted reactor imported: no" in result.log, result.log[-3000:]
        assert result.stats.get("redisspine/redis/calls") == "greenlets", result.stats
        assert "Traceback" not in result.log, result.log[-3000:]


def test_reactorless_workers_lose_nothing_when_one_is_killed(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    site = site_factory(hosts=3, pages_per_host=20, latency=0.3)
    settings = _settings(fleet, site, CONCURRENT_REQUESTS=4)
    [victim] = fleet.start(1, settings, log="v")
    wait_for(lambda: len(site.requests()) >= 8, 60, "a few pages")
    results = _kill_then_finish(fleet, settings, victim)
    assert_finished(results)
    _assert_reactorless(results)
    twice = assert_all_fetched(site)
    assert len(twice) <= 4, f"more duplicates than the dead worker held: {twice}"
    # The dead worker's leases came back through a sweep, which is a timer.
    assert sum(r.stats.get("redisspine/recovery/requeued", 0) for r in results) > 0, [
        r.stats for r in results
    ]


def test_reactorless_fleet_keeps_every_hosts_delay(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    delay = 0.4
    # ~4 s of pages a host: long enough for the second worker, however late a loaded
    # machine starts it, to find some left (it must fetch, see the end)
    site = site_factory(hosts=3, pages_per_host=10, fanout=3, latency=0.05)
    results = fleet.run(2, _settings(fleet, site, DOWNLOAD_DELAY=delay))
    assert_finished(results)
    _assert_reactorless(results)
    assert_all_fetched(site)
    for host, times in _by_host(site).items():
        gaps = [later[0] - earlier[1] for earlier, later in pairwise(times)]
        assert min(gaps) >= delay - CLOCK_SLACK, f"{host}: gap {min(gaps):.3f} s < {delay} s"
    assert all(r.stats.get("downloader/request_count", 0) > 0 for r in results)
