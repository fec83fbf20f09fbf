"""A Redis that may evict the crawl's keys is refused, at the join and mid-crawl.

With a ``maxmemory`` and an ``allkeys-*`` policy Redis deletes keys of its choosing
once full: the crawl's queue lists, leases, dedup record. Found by a fault run (a
crawl of 360 pages on a server set to ``allkeys-lru`` while a cache filled it): both
workers ended ``finished``, exit 0, with 182 pages fetched and 14 fetched twice, the
losses only in WARNING lines of repairs. A worker now refuses such a server before
it registers, and stops (``redisspine_config_error``, never ``finished``) when the
memory watch finds the policy set under a running crawl.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
from scrapy import Request

from scrapy_redisspine._joining import REASON_CONFIG, JoinRefused, join
from scrapy_redisspine.connection import evicting_policy
from scrapy_redisspine.settings import load_config
from tests.queue_view import queued_count
from tests.unit.conftest import SchedSpider, build_scheduler, finish

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis
    from twisted.internet import task

    from scrapy_redisspine.testing.redis_server import RedisServer


@pytest.fixture
def server_client(redis_server: RedisServer, redis_url: str) -> Iterator[redis.Redis]:
    """A client of the session's real server, whose memory settings are put back."""
    client = redis_server.client()
    yield client
    client.config_set("maxmemory", 0)
    client.config_set("maxmemory-policy", "noeviction")
    client.close()


@pytest.mark.parametrize(
    ("info", "evicting"),
    [
        ({"maxmemory": 1, "maxmemory_policy": "allkeys-lru"}, "allkeys-lru"),
        ({"maxmemory": 1, "maxmemory_policy": "allkeys-lfu"}, "allkeys-lfu"),
        ({"maxmemory": 1, "maxmemory_policy": "allkeys-random"}, "allkeys-random"),
        ({"maxmemory": 0, "maxmemory_policy": "allkeys-lru"}, ""),  # no limit
        ({"maxmemory": 1, "maxmemory_policy": "volatile-lru"}, ""),  # nothing expires
        ({"maxmemory": 1, "maxmemory_policy": "volatile-random"}, ""),
        ({"maxmemory": 1, "maxmemory_policy": "noeviction"}, ""),
        ({"maxmemory": 1}, ""),  # a reply without the policy (a proxy, fakeredis)
        ({}, ""),
    ],
)
def test_which_servers_may_evict_the_crawls_keys(info: dict[str, object], evicting: str) -> None:
    assert evicting_policy(info) == evicting


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_a_worker_refuses_to_join_a_server_that_may_evict(
    server_client: redis.Redis, redis_url: str, policy: str
) -> None:
    server_client.config_set("maxmemory", 500_000_000)
    server_client.config_set("maxmemory-policy", policy)
    with pytest.raises(JoinRefused) as refused:
        join(load_config({"REDISSPINE_REDIS_URL": redis_url}), "evicts", "spider", "w1")
    assert refused.value.reason == REASON_CONFIG
    message = str(refused.value)
    assert f"maxmemory-policy is {policy}" in message
    assert "Set maxmemory-policy noeviction" in message
    assert "\n" not in message
    assert server_client.dbsize() == 0, "refused before it registered or wrote anything"


@pytest.mark.parametrize(("maxmemory", "policy"), [
    (500_000_000, "volatile-lru"),  # the crawl's keys never expire: never evicted
    (500_000_000, "noeviction"),
    (0, "allkeys-lru"),  # no limit: nothing is evicted
])
def test_a_worker_joins_a_server_that_does_not_evict_its_keys(
    server_client: redis.Redis, redis_url: str, maxmemory: int, policy: str
) -> None:
    server_client.config_set("maxmemory", maxmemory)
    server_client.config_set("maxmemory-policy", policy)
    joined = join(load_config({"REDISSPINE_REDIS_URL": redis_url}), "keeps", "spider", "w1")
    try:
        assert joined.registration.status == "created"
    finally:
        joined.connection.close()


def test_a_policy_set_under_a_running_crawl_stops_the_worker_never_finished(
    server_client: redis.Redis, redis_url: str, clock: task.Clock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = build_scheduler(redis_url, clock, "w1", REDISSPINE_LEASE_BATCH_SIZE=1)
    scheduler.open(SchedSpider())
    keys = scheduler.frontier.keys
    try:
        for url in ("http://a.example/", "http://b.example/"):
            assert scheduler.enqueue_request(Request(url))
        assert scheduler.next_request() is not None  # one request leased, in progress
        server_client.config_set("maxmemory", 500_000_000)
        server_client.config_set("maxmemory-policy", "allkeys-lfu")
        # what the memory watch (the Recovery extension's sweep) reads and reports
        reading = scheduler.frontier.upkeep.memory()
        assert reading.evicting == "allkeys-lfu"
        with caplog.at_level(logging.ERROR, logger="scrapy_redisspine"):
            scheduler.guard.observe_memory(reading.used, reading.maxmemory, reading.evicting)
            scheduler.guard.observe_memory(reading.used, reading.maxmemory, reading.evicting)
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1, errors  # said once, however many sweeps see it
        assert "maxmemory-policy is allkeys-lfu" in errors[0]
        assert "close reason 'redisspine_config_error'" in errors[0]
        assert scheduler.refusal.reason == REASON_CONFIG
        assert scheduler.has_pending_requests(), "never idle, so never closed as finished"
        assert scheduler.next_request() is None
        assert scheduler.stats.get_value("redisspine/memory/evicting_policy") == "allkeys-lfu"
        assert scheduler.stats.get_value("redisspine/refused") == REASON_CONFIG
    finally:
        scheduler.close("redisspine_config_error")
    # what it held went back: the crawl is still in Redis, for a fleet that fixes it
    assert queued_count(server_client, keys) == 2
    assert server_client.hlen(keys.inflight) == 0


@pytest.mark.parametrize(("policy", "refused"), [
    ("allkeys-random", REASON_CONFIG),  # the server may have evicted work: not done
    ("volatile-lru", None),  # it never evicts the crawl's keys: done
])
def test_the_count_that_says_done_checks_the_policy_set_since_the_last_sweep(
    server_client: redis.Redis, redis_url: str, clock: task.Clock, policy: str,
    refused: str | None,
) -> None:
    # The memory watch looks at each sweep; keys evicted between two sweeps may be
    # the crawl's last work, so the count that says "done" checks the policy too.
    scheduler = build_scheduler(redis_url, clock, "w1")
    scheduler.open(SchedSpider())
    try:
        assert scheduler.enqueue_request(Request("http://a.example/"))
        request = scheduler.next_request()
        assert request is not None
        finish(scheduler, request)
        assert scheduler.outbox.try_flush()  # the ack
        clock.advance(60)  # past the idle poll: the next ask counts again
        server_client.config_set("maxmemory", 500_000_000)
        server_client.config_set("maxmemory-policy", policy)
        assert scheduler.has_pending_requests() is (refused is not None)
        assert scheduler.refusal.reason == refused
        # and so it stays until the engine closes
        assert scheduler.has_pending_requests() is (refused is not None)
    finally:
        scheduler.close(refused or "finished")


def test_a_user_who_may_not_run_info_joins_and_is_told_it_is_not_known(
    server_client: redis.Redis, redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # An ACL without INFO (e.g. "+@all -@dangerous"): whether the server may evict is
    # not known; the worker joins, says so in a line, and the memory watch reports
    # the refused INFO at each sweep (redisspine/redis_errors/memory).
    server_client.execute_command("ACL", "SETUSER", "no-info", "on", ">pw", "~*", "&*",
                                  "+@all", "-info")
    try:
        url = redis_url.replace("redis://", "redis://no-info:pw@", 1)
        with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
            joined = join(load_config({"REDISSPINE_REDIS_URL": url}), "acl", "spider", "w1")
        try:
            assert joined.registration.status == "created"
        finally:
            joined.connection.close()
        assert "refused INFO memory" in caplog.text
        assert "whether it may evict the crawl's keys is not known" in caplog.text
    finally:
        server_client.execute_command("ACL", "DELUSER", "no-info")
