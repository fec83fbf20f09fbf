"""Fleet-wide AutoThrottle: Scrapy's rule, applied in Redis to each lane's delay from
the latencies every worker's acks carry (``scripts/lib/throttle.lua``), on fakeredis
and the real redis-server (``client``)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.settings import Throttle

if TYPE_CHECKING:
    import redis

KEYS = CrawlKeys("redisspine", "throttled")
OTHER = CrawlKeys("redisspine", "throttled-too")
LANE = "slow.example"
RULE = Throttle(start_delay=4.0, max_delay=10.0, target_concurrency=2.0, debug=False)


def _frontier(client: redis.Redis, keys: CrawlKeys = KEYS, min_delay_ms: int = 100,
              rule: Throttle | None = RULE, worker: str = "w1") -> Frontier:
    return Frontier(client, keys, worker, concurrency=4, throttle=rule,
                    min_delay_ms=min_delay_ms)


def _fetch(frontier: Frontier, latency_ms: int, status: int = 200, rest_ms: int = 0) -> float:
    """Enqueue, lease and ack one request of the lane; its delay (ms) after the ack."""
    payload = f"{frontier.keys.crawl_id}-{frontier.worker_id}-{latency_ms}-{status}-".encode()
    payload += str(frontier.client.incr("test:n")).encode()
    frontier.enqueue([NewRequest(payload, hashlib.sha1(payload).digest(), lane=LANE)])
    # No waiting for rests here (the rest itself: test_the_lane_rests_...).
    frontier.client.hdel(frontier.keys.host_next, LANE)
    frontier.client.zadd(frontier.keys.hosts, {LANE: 0}, xx=True)
    (lease,) = frontier.lease(10).leases
    result = frontier.enqueue((), [(lease.key, lease.token, rest_ms, latency_ms, status)])
    assert result.acked == 1
    return float(frontier.client.hget(frontier.keys.lane_throttle, LANE) or -1)


def _scrapy_rule(old: float, latency: float, status: int = 200) -> float:
    """Scrapy's AutoThrottle._adjust_delay, in ms, min 100 ms."""
    target = latency / RULE.target_concurrency
    new = max(target, (old + target) / 2)  # Scrapy's steps, one by one
    new = min(max(100.0, new), RULE.max_delay * 1000)
    return old if status != 200 and new <= old else new


def test_the_delay_follows_scrapys_rule_from_the_start_delay(client: redis.Redis) -> None:
    frontier = _frontier(client)
    expected = RULE.start_delay * 1000
    for latency in (1000, 1000, 600, 3000, 200):
        expected = _scrapy_rule(expected, latency)
        assert _fetch(frontier, latency) == pytest.approx(expected, abs=0.01)


def test_the_delay_tends_to_latency_over_target_concurrency(client: redis.Redis) -> None:
    frontier = _frontier(client)
    for _ in range(20):
        delay = _fetch(frontier, 800)
    assert delay == pytest.approx(800 / RULE.target_concurrency, abs=1)


def test_bounds_download_delay_below_max_delay_above(client: redis.Redis) -> None:
    frontier = _frontier(client, min_delay_ms=1500)
    for _ in range(20):
        low = _fetch(frontier, 10)
    assert low == pytest.approx(1500)
    for _ in range(5):
        high = _fetch(frontier, 60_000)
    assert high == pytest.approx(RULE.max_delay * 1000)


def test_an_error_response_never_lowers_the_delay(client: redis.Redis) -> None:
    frontier = _frontier(client)
    assert _fetch(frontier, 10, status=500) == pytest.approx(4000)
    assert _fetch(frontier, 20_000, status=503) == pytest.approx(_scrapy_rule(4000, 20_000))


def test_acks_without_a_sample_leave_the_delay(client: redis.Redis) -> None:
    frontier = _frontier(client)
    first = _fetch(frontier, 1000)
    assert _fetch(frontier, -1) == first


def test_the_lane_rests_its_delay_after_each_ack(client: redis.Redis) -> None:
    frontier = _frontier(client)
    seconds, micros = client.time()
    before = seconds * 1000 + micros // 1000
    delay = _fetch(frontier, 6000)
    rest_until = float(client.hget(KEYS.host_next, LANE) or 0)
    assert rest_until >= before + delay - 1
    assert frontier.lease(10).leases == []


def test_every_crawl_of_the_group_moves_one_delay(client: redis.Redis) -> None:
    first, second = _frontier(client), _frontier(client, OTHER, worker="w2")
    a = _fetch(first, 2000)
    b = _fetch(second, 2000)
    assert b == pytest.approx(_scrapy_rule(a, 2000))
    assert KEYS.lane_throttle == OTHER.lane_throttle


def test_off_without_autothrottle(client: redis.Redis) -> None:
    assert _fetch(_frontier(client, rule=None), 1000) == -1
    assert not client.exists(KEYS.lane_throttle)


def test_status_shows_a_busy_lanes_autothrottle_delay(client: redis.Redis) -> None:
    from scrapy_redisspine.status import read_status

    frontier = _frontier(client)
    delay = _fetch(frontier, 3000)
    payload = b"still-in-flight"
    frontier.enqueue([NewRequest(payload, hashlib.sha1(payload).digest(), lane=LANE)])
    client.hdel(KEYS.host_next, LANE)
    client.zadd(KEYS.hosts, {LANE: 0}, xx=True)
    assert len(frontier.lease(10).leases) == 1  # busy, nothing queued
    (row,) = read_status(client, KEYS)["hosts"]
    assert (row["lane"], row["busy"], row["backlog"]) == (LANE, 1, 0)
    assert row["autothrottle_delay_seconds"] == pytest.approx(delay / 1000)


def test_the_delay_rests_the_lane_from_the_end_of_the_fetch(client: redis.Redis) -> None:
    # The ack's elapsed (ms since the fetch ended) comes off the AutoThrottle delay
    # too, up to the delay: a stale ack makes the lane due now, never earlier.
    frontier = _frontier(client)
    for elapsed, credited in ((1500, 1500), (600_000, None)):
        payload = f"credit-{elapsed}".encode()
        frontier.enqueue([NewRequest(payload, hashlib.sha1(payload).digest(), lane=LANE)])
        frontier.client.hdel(frontier.keys.host_next, LANE)
        frontier.client.zadd(frontier.keys.hosts, {LANE: 0}, xx=True)
        (lease,) = frontier.lease(10).leases
        seconds, micros = client.time()
        before = seconds * 1000 + micros // 1000
        delay = float(client.hget(KEYS.lane_throttle, LANE) or RULE.start_delay * 1000)
        result = frontier.enqueue((), [(lease.key, lease.token, 0, -1, 0, elapsed)])
        assert result.acked == 1
        rest_until = client.hget(KEYS.host_next, LANE)
        if credited is None:
            assert rest_until is None, "credited up to the delay: due at once"
        else:
            assert float(rest_until or 0) >= before + delay - credited - 1
            assert float(rest_until or 0) <= before + delay - credited + 1000
