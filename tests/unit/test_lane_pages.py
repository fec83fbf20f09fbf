"""REDISSPINE_HOST_PAGE_LIMIT: at most N leases per lane over the crawl, fleet-wide.

lease.lua enforces it (counted in ``lane_pages``); what a spent lane still has queued
leaves the queue at its next turn, counted as ``host_page_limited``. Scripts run on
fakeredis and on a real redis-server; the scheduler with a FakeEngine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy import Request

from scrapy_redisspine.frontier import Frontier, NewRequest
from tests.queue_view import queued_count
from tests.unit.conftest import finish, next_request, pending

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.keys import CrawlKeys
    from tests.unit.conftest import FrontierFactory, MakeScheduler

ALIVE_MS = 30_000


def _queue(frontier: Frontier, lane: str, n: int, start: int = 0) -> None:
    frontier.enqueue([NewRequest(f"{lane}{i}".encode(), f"fp-{lane}{i}".encode(), lane=lane)
                      for i in range(start, start + n)])


def _limited(make_frontier: FrontierFactory, worker_id: str, limit: int) -> Frontier:
    frontier = make_frontier(worker_id, concurrency=3)
    frontier.lane_page_limit = limit
    return frontier


def _counts(client: redis.Redis, keys: CrawlKeys) -> tuple[int, int, bool, int]:
    """Queued requests, the lane `a`'s backlog count, whether `a` is scheduled, and
    the fleet's host_page_limited counter."""
    return (queued_count(client, keys), int(client.hget(keys.backlog, "a") or 0),
            client.zscore(keys.hosts, "a") is not None,
            int(client.hget(keys.stats, "host_page_limited") or 0))


class TestLease:
    def test_two_workers_lease_at_most_the_limit_of_a_lane_and_the_rest_is_dropped(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        first, second = _limited(make_frontier, "w1", 2), _limited(make_frontier, "w2", 2)
        _queue(first, "a", 5)
        _queue(first, "b", 1)
        leased = first.lease(1).leases + second.lease(5).leases
        assert sorted(lease.lane for lease in leased) == ["a", "a", "b"], "2 of a, b's one"
        batch = first.lease(5)
        assert (batch.leases, batch.page_limited) == ([], 3), "a's other 3 dropped"
        assert _counts(client, crawl_keys) == (0, 0, False, 3)
        assert client.hgetall(crawl_keys.lane_pages) == {b"a": b"2", b"b": b"1"}
        assert second.lease(5).page_limited == 0, "counted once"

    def test_a_crawl_whose_lanes_are_spent_is_finished_when_its_leases_are_acked(
        self, make_frontier: FrontierFactory
    ) -> None:
        worker = _limited(make_frontier, "w1", 1)
        worker.register(flush=False, alive_ms=ALIVE_MS, spider="sched")
        worker.done_starting()
        _queue(worker, "a", 3)
        (lease,) = worker.lease(5).leases
        assert worker.ack([(lease.key, lease.token, 0)]) == 1
        assert worker.lease(5).page_limited == 2
        counts = worker.fleet_counts(ALIVE_MS)
        assert (counts.queued, counts.inflight) == (0, 0)
        assert worker.mark_finished(), "a budget the user set: the crawl finished"

    def test_requests_arriving_for_a_spent_lane_are_dropped_at_its_next_turn(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker = _limited(make_frontier, "w1", 1)
        _queue(worker, "a", 1)
        assert len(worker.lease(5).leases) == 1
        _queue(worker, "a", 2, start=1)
        assert _counts(client, crawl_keys) == (2, 2, True, 0)
        assert worker.lease(5).page_limited == 2
        assert _counts(client, crawl_keys) == (0, 0, False, 2)

    def test_a_lease_put_back_unfetched_gives_its_page_back(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker = _limited(make_frontier, "w1", 2)
        _queue(worker, "a", 3)
        (lease,) = worker.lease(1).leases
        assert worker.release([lease.handle]) == 1
        assert client.hget(crawl_keys.lane_pages, "a") == b"0"
        assert len(worker.lease(5).leases) == 2, "the released one again, and one more"
        assert worker.lease(5).page_limited == 1
        assert client.hget(crawl_keys.lane_pages, "a") == b"2"

    def test_an_orphaned_lease_put_back_gives_its_page_back(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker = _limited(make_frontier, "w1", 2)
        _queue(worker, "a", 2)
        worker.lease(2)  # as if the reply was lost: the worker never got them
        assert worker.release_orphans([]) == 2
        assert client.hget(crawl_keys.lane_pages, "a") == b"0"
        assert len(worker.lease(5).leases) == 2

    def test_no_limit_writes_no_count(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker = _limited(make_frontier, "w1", 0)
        _queue(worker, "a", 3)
        assert len(worker.lease(5).leases) == 3
        assert not client.exists(crawl_keys.lane_pages)

    def test_a_count_that_is_no_number_is_repaired_and_the_lane_starts_again(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        worker = _limited(make_frontier, "w1", 2)
        _queue(worker, "a", 3)
        client.hset(crawl_keys.lane_pages, "a", "garbage")
        batch = worker.lease(5)
        assert len(batch.leases) == 2
        assert any("lane_pages" in repair for repair in batch.repairs), batch.repairs
        assert client.hget(crawl_keys.lane_pages, "a") == b"2"


class TestScheduler:
    def test_the_setting_reaches_the_lease_and_drops_are_a_scrapy_stat(
        self, make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        scheduler = make_scheduler(REDISSPINE_HOST_PAGE_LIMIT=1, REDISSPINE_HOST_CONCURRENCY=4,
                                   free_slots=4)
        assert scheduler.frontier.lane_page_limit == 1
        for n in range(3):
            scheduler.enqueue_request(Request(f"http://a.test/{n}"))
        scheduler.enqueue_request(Request("http://b.test/"))
        scheduler.outbox.flush()
        fetched = [next_request(scheduler), next_request(scheduler)]
        assert sorted(request.url for request in fetched if request) == [
            "http://a.test/0", "http://b.test/"]
        for request in fetched:
            finish(scheduler, request)
        assert next_request(scheduler) is None
        assert scheduler.stats.get_value("redisspine/scheduler/host_page_limited") == 2
        assert int(client.hget(crawl_keys.stats, "host_page_limited") or 0) == 2
        assert not queued_count(client, crawl_keys)
        assert not pending(scheduler), "nothing left: Scrapy closes it as finished"
