"""Dedup under real concurrency, on a real redis-server.

Several processes enqueue overlapping fingerprints at once: each must be enqueued
exactly once, in SET mode, in Bloom mode, and across a live SET-to-Bloom switch run
by other processes while the adders go on.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import Counter
from typing import Any

import pytest
import redis

from scrapy_redisspine.dedup import (
    MODE_BLOOM,
    MODE_MIGRATING,
    MODE_SET,
    SET_MEMBER_BYTES,
    Dedup,
    DedupParams,
)
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from tests.queue_view import queued_count
from tests.racing import run_at_once

KEYS = CrawlKeys("redisspine", "dedup-race")
N_ADDERS = 4
BATCH = 25
# Tiny target rate: a false positive would look like a lost request in these checks.
BLOOM = {"backend": "bitmap", "capacity": 20_000, "error_rate": 1e-7}


def fingerprint(index: int) -> bytes:
    return hashlib.sha1(b"page-%d" % index).digest()


def _adder(url: str, job: tuple[str, list[int], bool], start: Any, results: Any) -> None:
    """Enqueue ``indexes`` in small batches; with ``until_bloom``, keep re-sending them
    until the switch is over, so that the adder runs through every mode."""
    worker, indexes, until_bloom = job
    client = redis.Redis.from_url(url)
    frontier = Frontier(client, KEYS, worker)
    modes: set[str] = set()
    enqueued: list[int] = []
    start.wait(30)
    rounds = 0
    while True:
        for i in range(0, len(indexes), BATCH):
            batch = indexes[i : i + BATCH]
            result = frontier.enqueue([NewRequest(b"%d" % n, fingerprint(n)) for n in batch])
            enqueued += [n for n, status in zip(batch, result.statuses, strict=True)
                         if status == "+"]
            mode = client.hget(KEYS.dedup, "mode")
            modes.add(mode.decode() if mode else MODE_SET)
        rounds += 1
        if not until_bloom or MODE_BLOOM in modes or rounds > 500:
            break
    client.close()
    results.put((worker, enqueued, sorted(modes)))


def _migrator(url: str, delay: float, start: Any, results: Any) -> None:
    """Wait, then switch the crawl to Bloom and drain the SET chunk by chunk."""
    client = redis.Redis.from_url(url)
    record = Dedup(client, KEYS, DedupParams(set_max_fingerprints=1, chunk_size=40, **BLOOM))
    record.open()
    start.wait(30)
    time.sleep(delay)
    moved = 0
    switched = False
    while True:
        step = record.maintain(budget_seconds=0)
        switched = switched or step.switched
        moved += step.moved
        if not step.more:
            break
        time.sleep(0.002)  # leave room for the adders between chunks
    client.close()
    results.put((f"migrator-{delay}", moved, switched))


def _enqueued(results: list[Any]) -> Counter[int]:
    """How often each page was enqueued, from the statuses the adders got back."""
    return Counter(n for result in results if result[0].startswith("adder") for n in result[1])


def _shuffled(indexes: range, seed: int) -> list[int]:
    order = list(indexes)
    random.Random(seed).shuffle(order)
    return order


@pytest.mark.parametrize("mode", ["set", "bloom"])
def test_processes_enqueue_each_fingerprint_once(
    redis_url: str, real_redis: redis.Redis, mode: str
) -> None:
    if mode == "bloom":
        record = Dedup(real_redis, KEYS, DedupParams(set_max_fingerprints=0, **BLOOM))
        record.open()
        assert record.maintain().mode == MODE_BLOOM
    pages = range(2000)
    adders = [(_adder, (redis_url, (f"adder-{i}", _shuffled(pages, i), False)))
              for i in range(N_ADDERS)]
    results = run_at_once(adders, timeout=120)
    queued = _enqueued(results)
    assert set(queued) == set(pages), "every page enqueued"
    assert max(queued.values()) == 1, "no page enqueued twice"
    assert queued_count(real_redis, KEYS) == len(pages)
    by_adder = [len(enqueued) for _, enqueued, _ in results]
    assert sum(by_adder) == 2000
    assert sum(1 for n in by_adder if n) > 1, f"one adder did all the work: {by_adder}"
    assert real_redis.exists(KEYS.seen) == (mode == "set")


def test_live_switch_under_concurrent_adders(redis_url: str, real_redis: redis.Redis) -> None:
    """3000 pages seen before the switch, 3000 new ones discovered during it by four
    processes at once, while two others switch the record and drain the SET."""
    old, new = range(3000), range(3000, 6000)
    real_redis.sadd(KEYS.seen, *(fingerprint(n)[:SET_MEMBER_BYTES] for n in old))
    adders = [
        (_adder, (redis_url, (f"adder-{i}", _shuffled(range(6000), i), True)))
        for i in range(N_ADDERS)
    ]
    migrators = [(_migrator, (redis_url, delay)) for delay in (0.05, 0.06)]
    results = run_at_once(adders + migrators, timeout=120)

    queued = _enqueued(results)
    assert queued_count(real_redis, KEYS) == len(new)
    assert not set(queued) & set(old), "a page seen before the switch was enqueued again"
    assert set(queued) == set(new), "a new page was lost"
    assert max(queued.values()) == 1, "a page was enqueued twice"
    adder_results = [r for r in results if r[0].startswith("adder")]
    modes_seen = {mode for _, _, modes in adder_results for mode in modes}
    assert MODE_MIGRATING in modes_seen, "the adders must have run during the switch"
    migrator_results = [r for r in results if r[0].startswith("migrator")]
    assert sum(moved for _, moved, _ in migrator_results) <= 6000
    assert sum(switched for _, _, switched in migrator_results) == 1
    assert not real_redis.exists(KEYS.seen), "the SET is freed"
    record = Dedup(real_redis, KEYS, DedupParams(**BLOOM))
    assert record.open().mode == MODE_BLOOM
    assert record.add([fingerprint(n) for n in range(6000)]) == [False] * 6000


def test_filter_grows_past_capacity_and_holds_its_error_rate(real_redis: redis.Redis) -> None:
    record = Dedup(real_redis, KEYS, DedupParams(
        set_max_fingerprints=0, backend="bitmap", capacity=5000, error_rate=0.01))
    record.open()
    record.maintain()
    for start in range(0, 60_000, 1000):
        record.add([fingerprint(n) for n in range(start, start + 1000)])
    state = record.state()
    assert state.active_layers == 4  # 5k + 10k + 20k + 40k >= 60k
    taken = 0
    for start in range(100_000, 120_000, 1000):
        taken += 1000 - sum(record.add([fingerprint(n) for n in range(start, start + 1000)]))
    # One 5000-fingerprint layer holding 60000 would answer "seen" to nearly everything.
    assert taken / 20_000 <= 0.01 * 1.5
