"""The worker's one rule for Redis failures: down, full, or refusing a script."""

from __future__ import annotations

import logging

import pytest
import redis
from scrapy import Spider
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from scrapy_redisspine._guard import RedisGuard, is_script_error


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _guard() -> tuple[RedisGuard, Clock, MemoryStatsCollector]:
    clock = Clock()
    stats = MemoryStatsCollector(get_crawler(Spider))
    return RedisGuard(stats, clock), clock, stats


@pytest.mark.parametrize(("exc", "script"), [
    (redis.exceptions.ResponseError("WRONGTYPE Operation against a key"), True),
    (redis.exceptions.ResponseError("ERR user_script:12: attempt to perform arithmetic"), True),
    (redis.exceptions.ResponseError("BUSY Redis is busy running a script"), False),
    (redis.exceptions.ResponseError("LOADING Redis is loading the dataset"), False),
    (redis.exceptions.ResponseError("MASTERDOWN Link with MASTER is down"), False),
    (redis.exceptions.ReadOnlyError("You can't write against a read only replica"), False),
    (redis.exceptions.OutOfMemoryError("OOM command not allowed"), False),
    (redis.exceptions.NoScriptError("NOSCRIPT"), False),
    (redis.exceptions.ClusterDownError("CLUSTERDOWN"), False),
    (redis.exceptions.ConnectionError("refused"), False),
    (redis.exceptions.TimeoutError("timed out"), False),
])
def test_what_counts_as_a_script_error(exc: Exception, script: bool) -> None:
    assert is_script_error(exc) is script


def test_a_script_error_backs_off_its_operation_only() -> None:
    guard, clock, stats = _guard()
    guard.failed("lease", redis.exceptions.ResponseError("ERR bad value"))
    assert not guard.down
    assert guard.available(), "the breaker is closed"
    assert guard.available("heartbeat")
    assert not guard.available("lease")
    assert guard.reconcile_needed, "the script may have written before it failed"
    clock.now += 0.11
    assert guard.available("lease")
    guard.failed("lease", redis.exceptions.ResponseError("ERR bad value"))
    clock.now += 0.11
    assert not guard.available("lease"), "the back-off doubles"
    clock.now += 0.1
    assert guard.available("lease")
    guard.succeeded("lease")
    guard.failed("lease", redis.exceptions.ResponseError("ERR bad value"))
    clock.now += 0.11
    assert guard.available("lease"), "a success starts the back-off again"
    assert stats.get_value("redisspine/script_errors/lease") == 3
    assert stats.get_value("redisspine/redis_errors/lease") is None


def test_a_script_error_is_logged_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    guard, clock, _ = _guard()
    with caplog.at_level(logging.ERROR, logger="scrapy_redisspine"):
        for _ in range(5):
            guard.failed("enqueue", redis.exceptions.ResponseError("WRONGTYPE queue"))
            clock.now += 1
        clock.now += 60
        guard.failed("enqueue", redis.exceptions.ResponseError("WRONGTYPE queue"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "WRONGTYPE queue" in lines[0]
    assert "enqueue" in lines[0]


def test_an_outage_opens_the_breaker_for_every_operation() -> None:
    guard, _, stats = _guard()
    guard.failed("lease", redis.exceptions.ConnectionError("refused"))
    assert guard.down
    assert not guard.available("heartbeat")
    assert stats.get_value("redisspine/redis_errors/lease") == 1


def test_a_full_redis_is_memory_pressure_not_an_outage() -> None:
    guard, _, stats = _guard()
    guard.failed("enqueue", redis.exceptions.OutOfMemoryError("OOM"))
    assert guard.memory_pressure
    assert not guard.down
    assert guard.available("enqueue")
    assert stats.get_value("redisspine/memory/oom/enqueue") == 1


def test_repairs_are_counted_and_logged_at_most_twenty_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    guard, clock, stats = _guard()
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
        guard.repaired("lease", [f"redisspine:{{c}}:busy lane{i} \"x\" -> 0" for i in range(25)])
        guard.repaired("lease", ())
        clock.now += 61
        guard.repaired("enqueue", ["redisspine:{c}:seq - \"?\" -> 1700000000000"])
    # The guard's own lines: a record from elsewhere in this process may land in the
    # capture too (CI once caught another scheduler's "state in Redis is gone" here)
    lines = [r.getMessage() for r in caplog.records if r.module == "_guard"]
    assert stats.get_value("redisspine/repaired") == 26
    assert len(lines) == 22, "20, then the sum of the rest, then the next minute's"
    assert lines[0] == (
        'redisspine: lease repaired a malformed value: redisspine:{c}:busy lane0 "x" -> 0'
    )
    assert lines[20].startswith("redisspine: 5 more repair(s)")
    assert "enqueue repaired" in lines[21]


def test_the_cluster_clients_own_errors_are_caught_and_a_slot_without_master_is_an_outage(
) -> None:
    from redis.exceptions import RedisClusterException, SlotNotCoveredError

    from scrapy_redisspine._guard import CALL_ERRORS, is_script_error

    assert issubclass(SlotNotCoveredError, CALL_ERRORS)
    assert issubclass(RedisClusterException, CALL_ERRORS)
    assert not is_script_error(SlotNotCoveredError("slot 12 is not covered"))
    assert is_script_error(RedisClusterException("Keys in request don't hash to the same slot"))
    # redis-py's cluster client between two views of the cluster (seen mid-reshard on
    # Redis 8.2, another thread re-learning the nodes): an outage, retried as one
    assert not is_script_error(RedisClusterException(
        "The cluster has no default node to resolve the keys of this command against. "
        "The client may be closed, or not initialized yet."))
