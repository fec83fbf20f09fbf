"""REDISSPINE_IDLE_CLOSE_SECONDS with real workers: a kept-alive fleet crawls the test
site, then every worker closes with reason ``idle`` (exit 0) a bit after the crawl ran
dry, measured fleet-wide."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tests.integration.crawlproc import assert_exactly_once, assert_finished

if TYPE_CHECKING:
    import redis

    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e

IDLE_SECONDS = 2.0


def test_idle_close_with_keep_alive_closes_both_workers_idle_after_the_crawl_runs_dry(
    fleet: Fleet, site_factory: SiteFactory, real_redis: redis.Redis
) -> None:
    site = site_factory(hosts=3, pages_per_host=15, latency=0.02)
    settings = fleet.crawling(site, REDISSPINE_KEEP_ALIVE=True,
                              REDISSPINE_IDLE_CLOSE_SECONDS=IDLE_SECONDS,
                              REDISSPINE_HEARTBEAT_SECONDS=0.3)
    results = fleet.run(2, settings, timeout=90)
    closed_at = time.time()
    assert_finished(results, reason="idle")
    assert_exactly_once(site)
    last_fetch = max(record["end"] for record in site.requests())
    # The idle time starts after the last ack, which follows the last response.
    assert closed_at - last_fetch >= IDLE_SECONDS, closed_at - last_fetch
    assert real_redis.hget(fleet.keys.control, "close_reason") == b"idle"
    assert real_redis.hget(fleet.keys.record, "finished_ms") is None, "idle, not finished"
