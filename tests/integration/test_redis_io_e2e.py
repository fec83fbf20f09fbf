"""A worker's Redis calls run off the crawl's loop (issue 14): a Redis that stops
answering for longer than the call timeout never stops a download in progress.

Real ``scrapy crawl`` workers, a real redis-server frozen with SIGSTOP. The test
project's ``LoopLag`` extension logs each response as it reaches the engine (wall
clock) and, at close, the longest the crawl's loop went without running a timer.
"""

from __future__ import annotations

import os
import re
import signal
import time
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine.testing.redis_server import RedisServer
from tests.integration.crawlproc import (
    assert_exactly_once,
    assert_finished,
    wait_for,
    wait_workers,
)

if TYPE_CHECKING:
    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e

CALL_TIMEOUT = 2.0
FREEZE = 5.0
SLOW = 3.0  # the start pages take this long: their downloads span the freeze
_RECEIVED = re.compile(r"testproject: response (\S+) received at ([0-9.]+)")
_LAG = re.compile(r"testproject: loop lag max ([0-9.]+) s")


def _crawl(fleet: Fleet, site_factory: SiteFactory, **extra: Any) -> tuple[
        dict[str, float], float, tuple[float, float], Any]:
    """One worker on a site whose start pages are slow; Redis frozen for FREEZE s
    from just after the worker started fetching them. (response url -> time it
    reached the engine, the loop's worst lag, the freeze's (start, end), the site)."""
    site = site_factory(hosts=2, pages_per_host=6, slow_paths=["/p/0"], slow_latency=SLOW)
    with RedisServer() as server:
        settings = fleet.crawling(
            site, REDISSPINE_REDIS_URL=server.url, LINKS_REPORT_LOOP_LAG=True,
            REDISSPINE_REDIS_TIMEOUT_SECONDS=CALL_TIMEOUT, **extra)
        [worker] = fleet.start(1, settings)
        wait_for(lambda: "joined crawl" in worker.log_text(), 60, "the worker to join")
        time.sleep(0.5)  # its start pages are leased and on their way
        assert server.pid is not None
        frozen_at = time.time()
        os.kill(server.pid, signal.SIGSTOP)
        try:
            time.sleep(FREEZE)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        thawed_at = time.time()
        [result] = wait_workers([worker], timeout=120)
    assert_finished([result])
    assert_exactly_once(site)
    # calls timed out in the freeze (Redis ran them after the thaw, replies unread):
    # reconciled, since every page was fetched once and the crawl finished
    timed_out = {name: n for name, n in result.stats.items()
                 if name.startswith("redisspine/redis_errors/")}
    assert timed_out, sorted(result.stats)
    received = {url: float(at) for url, at in _RECEIVED.findall(result.log)}
    lag = _LAG.search(result.log)
    assert lag is not None, result.log[-3000:]
    return received, float(lag.group(1)), (frozen_at, thawed_at), site


def test_a_download_in_progress_completes_while_redis_is_frozen(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    received, lag, (frozen_at, thawed_at), site = _crawl(fleet, site_factory)
    starts = site.start_urls()
    served = {record["page"]: record["end"] for record in site.requests() if record.get("page")}
    for url in starts:
        # the site answered during the freeze, and the worker took the response in
        # at once (its loop was not waiting on Redis)
        assert frozen_at < served[url] < thawed_at, (url, served[url], frozen_at, thawed_at)
        assert frozen_at < received[url] < thawed_at, (url, received[url], frozen_at)
        assert received[url] - served[url] < 1.0, (url, received[url] - served[url])
    # no call held the loop for its timeout (CALL_TIMEOUT s) while Redis was frozen
    assert lag < CALL_TIMEOUT / 2, lag


def test_on_the_loop_a_frozen_redis_holds_every_download_for_the_call_timeout(
    fleet: Fleet, site_factory: SiteFactory
) -> None:
    # The control: with REDISSPINE_REDIS_THREAD = False the same freeze stops the
    # loop for a whole call timeout at least once (what the thread is for).
    _, lag, _, _ = _crawl(fleet, site_factory, REDISSPINE_REDIS_THREAD=False)
    assert lag >= CALL_TIMEOUT * 0.9, lag
