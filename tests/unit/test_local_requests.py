"""Requests that cannot be stored stay in their worker's memory and are fetched
there, under the fleet's politeness; if the worker dies, the loss shows in the dead
letters. Each test runs on fakeredis and on the real redis-server."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from scrapy import Request

from scrapy_redisspine.keys import CrawlKeys
from tests.unit.conftest import drain, finish, next_request, pending

if TYPE_CHECKING:
    import pytest
    import redis

    from tests.unit.conftest import MakeScheduler

KEYS = CrawlKeys("redisspine", "test")


def _unstorable(url: str) -> Request:
    return Request(url, meta={"handle": object()})


def test_a_kept_request_takes_its_lanes_slot_fleet_wide(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    keeper, other = make_scheduler("w1"), make_scheduler("w2")
    keeper.enqueue_request(_unstorable("http://a.example/kept"))
    kept = next_request(keeper)
    assert kept is not None
    assert kept.url == "http://a.example/kept"
    assert client.hgetall(KEYS.busy) == {b"a.example": b"1"}
    other.enqueue_request(Request("http://a.example/shared"))
    assert other.outbox.try_flush()
    assert next_request(other, 2) is None, "the host's one slot is taken by the kept request"
    finish(keeper, kept)
    assert keeper.outbox.try_flush()
    shared = next_request(other)
    assert shared is not None
    assert shared.url == "http://a.example/shared"


def test_a_kept_request_waits_for_its_lanes_rest(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = make_scheduler(DOWNLOAD_DELAY=60)
    scheduler.enqueue_request(Request("http://a.example/first"))
    first = next_request(scheduler)
    assert first is not None
    finish(scheduler, first)
    assert scheduler.outbox.try_flush()
    scheduler.enqueue_request(_unstorable("http://a.example/kept"))
    assert next_request(scheduler, 3) is None, "the host rests 60 s"
    assert scheduler.has_pending_requests()
    assert len(scheduler) == 1


def test_a_kept_request_of_a_dead_worker_shows_in_the_dead_letters(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    dying = make_scheduler("w1")
    dying.enqueue_request(_unstorable("http://a.example/kept"))
    assert next_request(dying) is not None
    seconds, micros = client.time()
    client.zadd(KEYS.workers, {"w1": seconds * 1000 + micros // 1000 - 600_000})
    survivor = make_scheduler("w2")
    swept = survivor.frontier.upkeep.requeue_stale(
        timeout_ms=30_000, ceiling_ms=0, max_requeues=3
    )
    assert swept.requeued == 1
    assert next_request(survivor, 2) is None, "nothing to fetch: the request was lost"
    (letter,) = survivor.frontier.upkeep.dead_letters()
    assert "http://a.example/kept" in letter.reason
    assert "lived only in the memory of worker w1" in letter.reason


def test_kept_requests_still_waiting_at_close_are_said_lost(
    make_scheduler: MakeScheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = make_scheduler(free_slots=2)
    scheduler.enqueue_request(_unstorable("http://a.example/kept"))
    scheduler.enqueue_request(_unstorable("http://b.example/kept"))
    assert next_request(scheduler) is not None
    with caplog.at_level(logging.ERROR, logger="scrapy_redisspine"):
        scheduler.close("shutdown")
    assert any("2 request(s) that could not be stored" in r.getMessage()
               for r in caplog.records), caplog.text
    assert not client.exists(KEYS.busy), "the slots it held are free again"
    assert client.hlen(KEYS.dead) == 2, "the leased ones are in the dead letters"


def test_kept_requests_are_drained_in_order(make_scheduler: MakeScheduler) -> None:
    scheduler = make_scheduler()
    kept = [_unstorable(f"http://a.example/{i}") for i in range(3)]
    for request in kept:
        scheduler.enqueue_request(request)
    assert drain(scheduler) == kept


def test_a_crawl_whose_only_requests_were_kept_finishes_when_they_are_done(
    make_scheduler: MakeScheduler,
) -> None:
    # Scrapy's contracts (`scrapy check`, tests/test_contracts.py) wrap callbacks in
    # closures: every request of such a crawl is kept, none is ever queued in Redis.
    scheduler = make_scheduler()
    scheduler.enqueue_request(_unstorable("http://a.example/kept"))
    kept = next_request(scheduler)
    assert kept is not None
    assert pending(scheduler), "its request is in flight"
    finish(scheduler, kept)
    assert scheduler.outbox.try_flush()
    assert not pending(scheduler), "it had work (a kept request), and all of it is done"
