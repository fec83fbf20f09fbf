"""Leases alongside on a real loop and a real Redis: the scheduler driven as a crawl's
engine drives it (``alongside_driver.py``, in a process of its own so that its Redis
calls park on an asyncio loop in greenlets, as in a crawl under Scrapy's default
reactor).

Each test checks the outcome in Redis and in what the worker handed out: every
request handed out exactly once, nothing left queued or in flight. The faults: a
lease alongside whose reply is lost after Redis applied it (its leases exist in
Redis, the worker never heard of them), and one that fails before Redis saw it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.alongside_driver import HOSTS

if TYPE_CHECKING:
    import redis

pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[2]


def _drive(redis_url: str, n: int, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "tests.integration.alongside_driver", redis_url, str(n), *args],
        check=True, capture_output=True, text=True, timeout=150, cwd=ROOT,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def _assert_all_once_and_nothing_left(taken: list[str], n: int, client: redis.Redis) -> None:
    assert sorted(taken) == sorted(f"http://h{i % HOSTS}.test/p/{i}" for i in range(n))
    keys = {str(key, "utf-8") for key in client.keys("*alongside*")}
    assert any(key.endswith(":stats") for key in keys)  # the crawl's keys, by this pattern
    # Redis deletes a HASH or ZSET with its last entry: none of these may be left
    left = [key for key in keys if key.rsplit(":", 1)[-1] in
            ("queue", "inflight", "leases", "owned", "busy", "group_busy", "backlog")]
    assert left == []


def test_leases_go_alongside_and_every_request_is_handed_out_once(
    redis_url: str, real_redis: redis.Redis,
) -> None:
    n = 1200
    result = _drive(redis_url, n)
    assert result["stats"]["redisspine/redis/calls"] == "greenlets"
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
    """The second lease alongside fails: after Redis leased its requests (the reply
    lost: the next lease returns them as orphans), or before it reached Redis."""
    n = 1200
    result = _drive(redis_url, n, "--fail-alongside", fault)
    assert result["stats"].get("redisspine/scheduler/leases_alongside", 0) >= 2
    _assert_all_once_and_nothing_left(result["taken"], n, real_redis)
    returned = [line for line in result["warnings"] if "did not hold" in line]
    if fault == "reply-lost":  # Redis leased them, the worker never heard: returned
        assert result["lost"] > 0
        assert returned
        assert returned[0].startswith(f"redisspine: returned {result['lost']} ")
    else:
        assert not returned
