"""Fleet-wide crawl limits: Scrapy's CLOSESPIDER_* counted for the whole crawl.

Scripts run on fakeredis and on a real redis-server; schedulers with a FakeEngine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.utils.test import get_crawler
from twisted.internet import task

from scrapy_redisspine.control import CLOSE, read_orders
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.limits import FleetLimits
from scrapy_redisspine.settings import load_config
from tests.queue_view import queued_count
from tests.unit.conftest import SchedSpider, engine_of, finish, next_request, pending

if TYPE_CHECKING:
    from scrapy_redisspine.keys import CrawlKeys
    from tests.unit.conftest import FrontierFactory, MakeScheduler

ALIVE_MS = 30_000


def _queue(frontier: Frontier, n: int) -> None:
    frontier.enqueue([NewRequest(f"r{i}".encode(), f"fp{i}".encode(), lane=f"l{i}")
                      for i in range(n)])


class TestPageBudget:
    def test_the_fleet_leases_at_most_the_budget_then_every_lease_says_close(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        first, second = make_frontier("w1"), make_frontier("w2")
        first.page_budget = second.page_budget = 3
        _queue(first, 6)
        assert len(first.lease(2).leases) == 2
        batch = second.lease(5)
        assert (len(batch.leases), batch.close_reason) == (1, ""), "one left of 3"
        spent = first.lease(5)
        assert (spent.leases, spent.close_reason) == ([], "closespider_pagecount")
        assert read_orders(client, crawl_keys).close_reason == "closespider_pagecount"
        unbudgeted = make_frontier("w3")  # a worker without the budget obeys the order too
        assert unbudgeted.lease(5).close_reason == "closespider_pagecount"
        assert queued_count(client, crawl_keys) == 3

    def test_no_budget_leases_as_always(self, frontier: Frontier) -> None:
        _queue(frontier, 3)
        batch = frontier.lease(5)
        assert (len(batch.leases), batch.close_reason) == (3, "")


class TestCountLimits:
    @pytest.fixture
    def worker(self, frontier: Frontier) -> Frontier:
        frontier.register(flush=False, alive_ms=ALIVE_MS, spider="sched")
        return frontier

    def test_the_item_limit_counts_every_workers_items(self, worker: Frontier) -> None:
        upkeep = worker.upkeep
        limits = {"item_limit": 5, "error_limit": 0, "timeout_ms": 0}
        assert upkeep.count_limits(3, 0, **limits) == ""
        assert upkeep.count_limits(2, 0, **limits) == "closespider_itemcount"

    def test_the_first_limit_reached_stays_the_reason(
        self, worker: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        upkeep = worker.upkeep
        assert upkeep.count_limits(0, 2, item_limit=0, error_limit=2,
                                   timeout_ms=0) == "closespider_errorcount"
        assert upkeep.count_limits(9, 0, item_limit=1, error_limit=0,
                                   timeout_ms=0) == "closespider_errorcount"
        assert client.hget(crawl_keys.control, CLOSE) == b"closespider_errorcount"
        assert int(client.hget(crawl_keys.stats, "scraped") or 0) == 9

    def test_the_timeout_runs_from_the_crawls_first_start(
        self, worker: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        upkeep = worker.upkeep
        assert upkeep.count_limits(0, 0, item_limit=0, error_limit=0, timeout_ms=60_000) == ""
        client.hset(crawl_keys.record, "created_ms", 1)  # the crawl began long ago
        assert upkeep.count_limits(0, 0, item_limit=0, error_limit=0,
                                   timeout_ms=60_000) == "closespider_timeout"

    def test_a_crawl_that_is_gone_is_refused(
        self, worker: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.delete(crawl_keys.record)
        with pytest.raises(redis.ResponseError, match="LOST lost"):
            worker.upkeep.count_limits(1, 0, item_limit=1, error_limit=0, timeout_ms=0)
        assert not client.exists(crawl_keys.control)


class TestScheduler:
    def test_a_worker_at_the_page_budget_finishes_what_it_has_and_closes_with_scrapys_reason(
        self, make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        scheduler = make_scheduler(CLOSESPIDER_PAGECOUNT=2)
        for n in range(4):
            scheduler.enqueue_request(Request(f"http://a{n}.test/"))
        scheduler.outbox.flush()
        done = [next_request(scheduler), next_request(scheduler)]
        assert next_request(scheduler) is None, "the budget is spent"
        assert scheduler.fleet.orders.close_reason == "closespider_pagecount"
        assert pending(scheduler), "never 'finished' while closing for a limit"
        assert engine_of(scheduler).closed == [], "requests are still in progress"
        for request in done:
            finish(scheduler, request)
        scheduler.fleet.heartbeat()
        assert engine_of(scheduler).closed == ["closespider_pagecount"]
        scheduler.close("closespider_pagecount")
        assert queued_count(client, crawl_keys) == 2
        assert client.hget(crawl_keys.record, "finished_ms") is None

    def test_a_close_order_heard_at_the_heartbeat_stops_the_ready_leases(
        self, make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        scheduler = make_scheduler(free_slots=4)
        for n in range(4):
            scheduler.enqueue_request(Request(f"http://a{n}.test/"))
        scheduler.outbox.flush()
        first = next_request(scheduler)
        assert scheduler.book.ready == 3
        client.hset(crawl_keys.control, CLOSE, "closespider_itemcount")
        scheduler.fleet.heartbeat()
        assert scheduler.next_request() is None, "leased but unstarted: not started"
        finish(scheduler, first)
        scheduler.fleet.heartbeat()
        assert engine_of(scheduler).closed == ["closespider_itemcount"]
        scheduler.close("closespider_itemcount")
        assert queued_count(client, crawl_keys) == 3, "the unstarted leases went back"

    def test_per_process_keeps_scrapys_meaning(self, make_scheduler: MakeScheduler) -> None:
        scheduler = make_scheduler(CLOSESPIDER_PAGECOUNT=1,
                                   REDISSPINE_CLOSESPIDER_PER_PROCESS=True)
        assert scheduler.frontier.page_budget == 0


class _Upkeep:
    def __init__(self, reasons: list[Any]) -> None:
        self.reasons = reasons
        self.calls: list[tuple[int, int]] = []

    def count_limits(self, items: int, errors: int, **_: Any) -> str:
        self.calls.append((items, errors))
        reason = self.reasons.pop(0)
        if isinstance(reason, Exception):
            raise reason
        return str(reason)


class _Guard:
    crawl_gone = None

    def available(self, _: str) -> bool:
        return True

    def failed(self, *_: Any) -> None:
        pass

    def succeeded(self, *_: Any) -> None:
        pass


class _View:
    def __init__(self, upkeep: _Upkeep) -> None:
        self.upkeep = upkeep
        self.guard = _Guard()
        self.closed: list[str] = []
        self.close_ordered = self.closed.append
        self.io = None  # calls at once (InlineIO)


class TestExtension:
    def test_off_without_a_fleet_limit_or_per_process(self) -> None:
        with pytest.raises(NotConfigured):
            FleetLimits.from_crawler(get_crawler(SchedSpider, {"CLOSESPIDER_PAGECOUNT": 5}))
        with pytest.raises(NotConfigured):
            FleetLimits.from_crawler(get_crawler(SchedSpider, {
                "CLOSESPIDER_ITEMCOUNT": 5, "REDISSPINE_CLOSESPIDER_PER_PROCESS": True}))

    def test_counts_are_kept_through_a_failed_call_and_the_reason_closes_the_worker(
        self,
    ) -> None:
        crawler = get_crawler(SchedSpider, {"CLOSESPIDER_ITEMCOUNT": 3})
        clock = task.Clock()
        limits = FleetLimits(load_config(crawler.settings), crawler.stats, clock)
        upkeep = _Upkeep([redis.ConnectionError("down"), "", "closespider_itemcount"])
        view = _View(upkeep)
        limits.worker_opened(view)  # type: ignore[arg-type]
        limits.item_scraped()
        limits.item_scraped()
        limits.spider_error()
        limits.check()  # fails: the counts wait
        limits.check()
        limits.item_scraped()
        limits.check()
        assert upkeep.calls == [(2, 1), (2, 1), (1, 0)]
        assert view.closed == ["closespider_itemcount"]
        assert not limits.running


def test_a_bad_closespider_value_is_refused_naming_the_setting() -> None:
    from scrapy_redisspine.settings import ConfigError

    with pytest.raises(ConfigError, match="CLOSESPIDER_PAGECOUNT"):
        load_config({"CLOSESPIDER_PAGECOUNT": "many"})


def test_status_says_a_fleet_limit_was_reached(
    frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    from scrapy_redisspine.cli_output import render_status
    from scrapy_redisspine.status import read_status

    frontier.register(flush=False, alive_ms=ALIVE_MS, spider="sched")
    client.hset(crawl_keys.control, CLOSE, "closespider_timeout")
    status = read_status(client, crawl_keys)
    assert status["close_reason"] == "closespider_timeout"
    assert "fleet limit reached: every worker closes (closespider_timeout)" in render_status(
        status)


def test_a_new_run_forgets_the_last_runs_close_order_but_a_joiner_keeps_it(
    make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    first = make_scheduler("w1")
    client.hset(crawl_keys.control, CLOSE, "closespider_pagecount")
    make_scheduler("w2")  # w1 is alive: w2 joins a fleet that is closing
    assert client.hget(crawl_keys.control, CLOSE) == b"closespider_pagecount"
    first.close("closespider_pagecount")
    client.zrem(crawl_keys.workers, "w2")  # gone too: the next worker starts a new run
    make_scheduler("w3")
    assert client.hget(crawl_keys.control, CLOSE) is None
