"""Leases alongside on a real loop and a real Redis: the scheduler driven as a crawl's
engine drives it (``alongside_driver.py``, in a process of its own so that its Redis
calls run off an asyncio loop, parked in greenlets or on threads, as in a crawl under
Scrapy's default reactor).

Each test checks the outcome in Redis and in what the worker handed out: every
request handed out exactly once, nothing left queued or in flight. The faults: a
lease alongside whose reply is lost after Redis applied it (its leases exist in
Redis, the worker never heard of them), one that fails before Redis saw it, and a
worker killed right after Redis took a lease alongside (another worker's sweep
returns what it held; only what it had handed out and not acked comes twice).
Last, real ``scrapy crawl`` workers whose downloaders want more than a lease at a
time: every page of the test site fetched once, by its own log.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.alongside_driver import urls
from tests.integration.crawlproc import (
    UNHURRIED,
    assert_all_fetched,
    assert_exactly_once,
    assert_finished,
    wait_for,
)

if TYPE_CHECKING:
    import redis

    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


def _drive(redis_url: str, n: int, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.integration.alongside_driver", redis_url, str(n), *args],
        check=True, capture_output=True, text=True, timeout=150, cwd=ROOT,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _taken_lines(text: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("taken ")]


def _assert_all_once_and_nothing_left(taken: list[str], n: int, client: redis.Redis) -> None:
    assert sorted(taken) == sorted(urls(n))
    keys = {str(key, "utf-8") for key in client.keys("*alongside*")}
    assert any(key.endswith(":stats") for key in keys)  # the crawl's keys, by this pattern
    # Redis deletes a HASH or ZSET with its last entry: none of these may be left
    left = [key for key in keys if key.rsplit(":", 1)[-1] in
            ("queue", "inflight", "leases", "owned", "busy", "group_busy", "backlog")]
    assert left == []


@pytest.mark.parametrize("calls", ["greenlets", "threads"])
def test_leases_go_alongside_and_every_request_is_handed_out_once(
    redis_url: str, real_redis: redis.Redis, calls: str,
) -> None:
    n = 1200
    result = _drive(redis_url, n, "--setting",
                    f"REDISSPINE_REDIS_GREENLETS={json.dumps(calls == 'greenlets')}")
    assert result["stats"]["redisspine/redis/calls"] == calls
    assert result["stats"].get("redisspine/scheduler/leases_alongside", 0) > 0
    _assert_all_once_and_nothing_left(result["taken"], n, real_redis)


@pytest.mark.parametrize("setting", ["REDISSPINE_LEASE_ALONGSIDE=false",
                                     "REDISSPINE_SHARDS=2"], ids=["off", "sharded"])
def test_none_alongside_when_switched_off_or_sharded(
    redis_url: str, real_redis: redis.Redis, setting: str,
) -> None:
    n = 600
    result = _drive(redis_url, n, "--setting", setting)
    assert "redisspine/scheduler/leases_alongside" not in result["stats"]
    assert result["stats"].get("redisspine/scheduler/leased", 0) >= n
    _assert_all_once_and_nothing_left(result["taken"], n, real_redis)


@pytest.mark.parametrize("fault", ["reply-lost", "never-sent"])
def test_a_failed_lease_alongside_loses_nothing_and_hands_out_nothing_twice(
    redis_url: str, real_redis: redis.Redis, fault: str,
) -> None:
    """The first lease alongside fails: after Redis leased its requests (the reply
    lost: the next lease returns them as orphans), or before it reached Redis."""
    n = 1200
    result = _drive(redis_url, n, "--fail-alongside", fault)
    assert result["stats"].get("redisspine/scheduler/leases_alongside", 0) >= 1
    _assert_all_once_and_nothing_left(result["taken"], n, real_redis)
    returned = [line for line in result["warnings"] if "did not hold" in line]
    if fault == "reply-lost":  # Redis leased them, the worker never heard: returned
        assert result["lost"] > 0
        assert returned
        assert returned[0].startswith(f"redisspine: returned {result['lost']} ")
    else:
        assert not returned


# -- real `scrapy crawl` workers ----------------------------------------------------------

#: A downloader with room for more than a lease batch (4 here) beyond the one on its
#: way, over enough lane slots (40 hosts x 4) that leases come back full: leases go
#: alongside. Redis counts as near however loaded the machine is (the test project's
#: RedisNearUnderLoad): a loop slow to deliver replies must not keep them from going.
WIDE = {"CONCURRENT_REQUESTS": 64, "REDISSPINE_HOST_CONCURRENCY": 4,
        "REDISSPINE_LEASE_BATCH_SIZE": 4, "TESTPROJECT_REDIS_NEAR": True,
        "REDISSPINE_HEARTBEAT_SECONDS": 0.3, "REDISSPINE_WORKER_TIMEOUT_SECONDS": 1.5,
        "REDISSPINE_SWEEP_SECONDS": 0.3}


@pytest.mark.e2e
def test_a_crawl_with_leases_alongside_fetches_every_page_once(
    fleet: Fleet, site_factory: SiteFactory,
) -> None:
    site = site_factory(hosts=40, pages_per_host=25, fanout=10, latency=0.2)
    # Nobody dies here: a worker presumed dead has its leases fetched again, by design,
    # and on a loaded 2-core machine (the suite's other crawls beside it) WIDE's 1.5 s
    # timeout was missed once (heartbeats 2 s late, sweeps of 1.6 s; 113 requeued).
    results = fleet.run(2, fleet.crawling(site, **{**WIDE, **UNHURRIED}), log="w")
    assert_finished(results)
    assert_exactly_once(site)  # the site's own log: every page, none twice
    assert sum(r.stats.get("redisspine/scheduler/leases_alongside", 0) for r in results) > 0


def test_a_worker_killed_with_two_leases_on_their_way_loses_nothing(
    redis_url: str, real_redis: redis.Redis,
) -> None:
    """SIGKILL right after Redis took a lease alongside, with the lease carrying the
    outbox on its way too: a second worker's sweep returns everything the dead one
    held (its book, both leases, the acks it never sent), and only that is handed
    out twice."""
    n = 3000
    fast = ["--setting", "REDISSPINE_HEARTBEAT_SECONDS=0.3",
            "--setting", "REDISSPINE_WORKER_TIMEOUT_SECONDS=1.5",
            "--setting", "REDISSPINE_SWEEP_SECONDS=0.3"]
    victim = subprocess.run(
        [sys.executable, "-m", "tests.integration.alongside_driver", redis_url, str(n),
         "--die-in-alongside", "1", *fast],
        capture_output=True, text=True, timeout=150, cwd=ROOT, check=False,
    )
    assert victim.returncode == -9, victim.stderr[-3000:]
    first = _taken_lines(victim.stdout)
    assert 0 < len(first) < n
    inflight = next(str(key, "utf-8") for key in real_redis.keys("*alongside*:inflight"))
    held = real_redis.hlen(inflight)  # all the dead worker's: nobody else ran
    assert held >= 2 * 16  # at least the lease alongside's and one batch of its book
    # (it stops when nothing was handed out for 8 s: the sweep comes within ~2 s)
    result = _drive(redis_url, n, "--no-enqueue", "--idle-seconds", "8", *fast)
    second = result["taken"]
    assert set(first) | set(second) == set(urls(n))  # nothing lost
    twice = set(first) & set(second)
    assert len(twice) <= held, f"more handed out twice than the dead worker held ({held})"
    _assert_all_once_and_nothing_left(sorted(set(first) | set(second)), n, real_redis)


@pytest.mark.e2e
def test_a_crawl_worker_killed_among_leases_alongside_loses_nothing(
    fleet: Fleet, site_factory: SiteFactory, real_redis: redis.Redis,
) -> None:
    """SIGKILL a real worker mid-crawl, leases alongside among its leases: the other
    worker's sweep returns what the dead one held, and only that is fetched twice."""
    site = site_factory(hosts=40, pages_per_host=25, fanout=10, latency=0.2)
    settings = fleet.crawling(site, **WIDE)
    [victim] = fleet.start(1, settings, log="v")
    wait_for(lambda: len(site.requests()) >= 300, 60, "the crawl well under way")
    held = real_redis.hlen(fleet.keys.inflight)  # the most the victim can have held
    victim.kill()
    victim.process.wait()
    results = fleet.run(1, settings, log="rest", timeout=120)
    assert_finished(results)
    twice = assert_all_fetched(site)
    assert len(twice) <= held, f"more fetched twice than the dead worker held ({held}): {twice}"
    assert results[0].stats.get("redisspine/scheduler/leases_alongside", 0) > 0
