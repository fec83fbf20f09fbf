"""Bad values in Redis, written while real workers crawl (issue 12).

An operator, a bug or another tool overwrites the crawl's counts with garbage again
and again while two workers run. The crawl must end as usual: every page fetched,
every worker closing with ``finished``, no lane wedged, nothing lost.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest
import redis

from scrapy_redisspine.keys import CrawlKeys
from tests.integration.crawlproc import start_workers, wait_workers
from tests.queue_view import queued_count

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from scrapy_redisspine.testing.site import TestSite

pytestmark = pytest.mark.e2e


def _garble(client: redis.Redis, keys: CrawlKeys) -> int:
    """Garbage in every lane count, time and delay there is, in seq and the stats."""
    written = 0
    lanes = {*client.zrange(keys.hosts, 0, -1), *client.hkeys(keys.busy),
             *client.hkeys(keys.backlog)}
    for lane in lanes:
        for key in (keys.busy, keys.backlog, keys.host_next, keys.host_delay):
            client.hset(key, lane, "garbage")
            written += 1
    for order_key in client.hkeys(keys.inflight):
        client.hset(keys.requeues, order_key, "garbage")
        written += 1
    client.set(keys.seq, "garbage")
    client.hset(keys.stats, mapping=dict.fromkeys(("enqueued", "leased", "acked"), "x"))
    return written + 4


def test_a_crawl_under_a_rain_of_garbage_completes(
    project_dir: Path, site_factory: Callable[..., TestSite], redis_url: str,
    crawl_settings: dict[str, Any], worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=3, pages_per_host=20, latency=0.05)
    settings: dict[str, Any] = {
        **crawl_settings,
        "LINKS_START_URLS": ",".join(site.start_urls()),
        "CONCURRENT_REQUESTS": 4,
    }
    client = redis.Redis.from_url(redis_url)
    keys = CrawlKeys("redisspine", str(settings["REDISSPINE_CRAWL_ID"]))
    workers = start_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir)
    written, deadline = 0, time.monotonic() + 60
    while any(w.process.poll() is None for w in workers) and time.monotonic() < deadline:
        if site.requests():
            written += _garble(client, keys)
        time.sleep(0.1)

    results = wait_workers(workers, timeout=60)

    assert written > 20, "the crawl ended before much garbage was written"
    for result in results:
        assert (result.returncode, result.finish_reason) == (0, "finished"), (
            f"worker {result.index}: rc={result.returncode} reason={result.finish_reason}\n"
            + result.log[-4000:]
        )
        assert "Traceback" not in result.log, result.log[-4000:]
    missing = site.all_urls() - set(site.fetch_counts())
    assert not missing, f"{len(missing)} page(s) lost, e.g. {sorted(missing)[:3]}"
    assert queued_count(client, keys) == client.hlen(keys.inflight) == 0
