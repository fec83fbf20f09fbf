"""A Sentinel failover may move a worker to the new primary without any error (a
pooled connection reconnecting asks the sentinels and finds it): the worker must
notice the new primary itself, reconcile its leases with it, and never finish the
crawl on a count taken across the change.

The sentinels' answer is played by replacing ``connection.sentinel_primary`` as the
fleet member sees it; the schedulers run on fakeredis and on the real redis-server.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest
from scrapy import Request

from scrapy_redisspine import _fleet, _leasing
from scrapy_redisspine.connection import client_from_url, sentinel_primary
from tests.unit.conftest import clock_of, finish, next_request, pending

if TYPE_CHECKING:
    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import MakeScheduler

OLD = ("127.0.0.1", 7001)
NEW = ("127.0.0.1", 7002)


class Sentinels:
    """What the sentinels name as the primary, as the fleet member asks them."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.primary = OLD
        monkeypatch.setattr(_fleet, "sentinel_primary", lambda client: self.primary)


@pytest.fixture
def sentinels(monkeypatch: pytest.MonkeyPatch) -> Sentinels:
    return Sentinels(monkeypatch)


def _one_request_queued(scheduler: Scheduler) -> None:
    assert scheduler.enqueue_request(Request("http://example.com/a"))
    assert scheduler.outbox.try_flush()


def test_a_new_primary_has_the_worker_return_leases_it_does_not_hold(
    make_scheduler: MakeScheduler, sentinels: Sentinels, caplog: pytest.LogCaptureFixture,
) -> None:
    scheduler = make_scheduler(REDISSPINE_HOST_CONCURRENCY=1)
    _one_request_queued(scheduler)
    scheduler.fleet.heartbeat()  # the sentinels name OLD: nothing to do
    assert not scheduler.guard.reconcile_needed
    # What the new primary holds: a lease of this worker's that it acked on the old
    # one (the ack is lost); it holds the lane's only slot.
    assert len(scheduler.frontier.lease(1).leases) == 1
    assert next_request(scheduler) is None, "the lane's slot is held"
    sentinels.primary = NEW
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine.scheduler"):
        scheduler.fleet.heartbeat()
    assert scheduler.guard.reconcile_needed
    assert scheduler.stats.get_value("redisspine/redis/primary_changes") == 1
    [line] = [r.getMessage() for r in caplog.records if "new primary" in r.getMessage()]
    assert "127.0.0.1:7002 (was 127.0.0.1:7001)" in line
    request = next_request(scheduler)
    assert request is not None, "the lease it did not hold went back, and came to it again"
    assert request.url == "http://example.com/a"
    assert not scheduler.guard.reconcile_needed
    scheduler.fleet.heartbeat()  # the same primary again: no news
    assert scheduler.stats.get_value("redisspine/redis/primary_changes") == 1


def test_a_count_taken_across_a_change_of_primary_finishes_nothing(
    make_scheduler: MakeScheduler, sentinels: Sentinels,
) -> None:
    scheduler = make_scheduler()
    _one_request_queued(scheduler)
    request = next_request(scheduler)
    finish(scheduler, request)
    assert not pending(scheduler), "the crawl is done, as the same primary says"
    sentinels.primary = NEW
    assert pending(scheduler), "counted while the sentinels named another primary"
    assert scheduler.guard.reconcile_needed
    assert not pending(scheduler), "counted on the new primary throughout: done"


def test_a_heartbeat_goes_on_when_no_sentinel_answers(
    make_scheduler: MakeScheduler, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import redis

    def unanswered(client: object) -> tuple[str, int]:
        raise redis.sentinel.MasterNotFoundError("No master found for 'spine'")

    scheduler = make_scheduler()
    monkeypatch.setattr(_fleet, "sentinel_primary", unanswered)
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine.scheduler"):
        scheduler.fleet.heartbeat()
        scheduler.fleet.heartbeat()
        monkeypatch.setattr(_fleet, "sentinel_primary", lambda client: OLD)
        scheduler.fleet.heartbeat()
    said = [r.getMessage() for r in caplog.records if "sentinel" in r.getMessage()]
    assert len(said) == 2, said
    assert "no sentinel named the primary" in said[0]
    assert "answer again" in said[1]
    assert scheduler.stats.get_value("redisspine/redis_errors/sentinel") == 2
    assert not scheduler.guard.down, "the primary itself answered every heartbeat"


def test_only_a_sentinel_client_has_a_primary_to_ask_for(redis_url_for: str) -> None:
    client = client_from_url(redis_url_for)
    try:
        assert sentinel_primary(client) is None
    finally:
        client.close()


def test_a_lease_reconciles_once_a_minute_with_no_failure_seen(
    make_scheduler: MakeScheduler,
) -> None:
    """A failover that raised nothing here and said nothing (no Sentinel to ask: a
    cluster's redirections) may still have lost an ack: the lease Redis holds for
    this worker goes back within RECONCILE_SECONDS, and the lane is not stuck."""
    scheduler = make_scheduler(REDISSPINE_HOST_CONCURRENCY=1)
    _one_request_queued(scheduler)
    assert len(scheduler.frontier.lease(1).leases) == 1  # its ack lost in the failover
    assert next_request(scheduler) is None, "the lane's slot is held"
    assert not scheduler.guard.reconcile_needed
    clock_of(scheduler).advance(_leasing.RECONCILE_SECONDS)
    request = next_request(scheduler)
    assert request is not None, "the lease it did not hold went back, and came to it again"
    assert request.url == "http://example.com/a"
    finish(scheduler, request)
    assert not pending(scheduler)
