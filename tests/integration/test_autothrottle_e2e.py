"""Fleet-wide AutoThrottle (issue 20), checked from the test site's own request log.

With ``AUTOTHROTTLE_ENABLED`` and the add-on, every worker's acks carry their
requests' download latencies to Redis, where each lane's delay follows Scrapy's
AutoThrottle rule; the lane rests that delay after each fetch, whichever worker made
it. Against a host with a fixed latency L and target concurrency 1 the gaps between
fetches start near the start delay and converge toward L.
"""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING

import pytest

from tests.integration.crawlproc import assert_all_fetched, assert_finished

if TYPE_CHECKING:
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e

CLOCK_SLACK = 0.005


def test_two_workers_converge_to_latency_over_target(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    latency = 0.4
    site = site_factory(hosts=1, pages_per_host=20, fanout=3, latency=latency)
    settings = fleet.crawling(
        site, AUTOTHROTTLE_ENABLED=True, AUTOTHROTTLE_START_DELAY=2.0,
        AUTOTHROTTLE_TARGET_CONCURRENCY=1.0, AUTOTHROTTLE_MAX_DELAY=10.0,
        AUTOTHROTTLE_DEBUG=True, DOWNLOAD_DELAY=0,
    )
    results = fleet.run(2, settings)
    assert_finished(results)
    assert_all_fetched(site)
    times = sorted((r["start"], r["end"]) for r in site.requests()
                   if r.get("page") and "error" not in r)
    gaps = [later[0] - earlier[1] for earlier, later in pairwise(times)]
    # Scrapy's rule from 2.0 s toward 0.4 s: 1.2, 0.8, 0.6, 0.5, 0.45 ... (each gap is
    # the delay after the ack, plus the ack's way to Redis).
    assert 1.2 - CLOCK_SLACK <= gaps[0] <= 1.2 + 0.5, gaps[:3]
    assert gaps[0] > gaps[2] > gaps[4], f"the delay shrinks step by step: {gaps[:6]}"
    tail = gaps[-5:]
    assert min(tail) >= latency - 0.05, f"never below latency / target: {tail}"
    assert max(tail) <= latency * 1.35, f"converged toward latency / target: {tail}"
    # Both workers fetched, so the delay held across processes, and each logged its
    # steps (AUTOTHROTTLE_DEBUG) as Scrapy's own extension does.
    assert all(r.stats.get("downloader/request_count", 0) > 0 for r in results)
    assert all("redisspine autothrottle: lane: 127.0.0.10" in r.log for r in results)
    # Scrapy's own per-process AutoThrottle is off under the add-on: no line of its own.
    assert not any("slot: 127.0.0.10 | conc:" in r.log for r in results)
