"""Fleet totals: pushed every interval and at close; each worker's last totals kept."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
from scrapy.utils.test import get_crawler

from scrapy_redisspine import Addon
from scrapy_redisspine.fleet_totals import FALLBACK_INTERVAL_SECONDS, FleetTotals, push_interval
from scrapy_redisspine.keys import CrawlKeys
from tests.unit.conftest import SchedSpider, clock_of

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import MakeScheduler

KEYS = CrawlKeys("redisspine", "test")


@pytest.mark.parametrize(
    ("logstats", "sweep", "interval"),
    [(60, 5, 5), (2, 5, 2), (0, 5, 5), (10, 0, 10), (0, 0, FALLBACK_INTERVAL_SECONDS)],
)
def test_the_interval_is_the_shorter_of_logstats_and_the_sweep(
    logstats: float, sweep: float, interval: float
) -> None:
    assert push_interval(logstats, sweep) == interval


def test_the_addon_switches_it_on_and_a_worker_without_a_sweep_still_pushes() -> None:
    settings = {"ADDONS": {Addon: 0}, "REDISSPINE_SWEEP_SECONDS": 0, "LOGSTATS_INTERVAL": 7}
    crawler = get_crawler(SchedSpider, settings)
    assert crawler.settings.getdict("EXTENSIONS")[FleetTotals] == 505
    assert FleetTotals.from_crawler(crawler).interval == 7


def _worker_totals(client: redis.Redis, worker: str) -> tuple[str, dict[str, int]]:
    raw = client.hget(KEYS.worker_stats, worker)
    assert raw is not None, f"no totals kept for {worker}"
    _ms, state, totals = raw.decode().split("\n", 2)
    return state, json.loads(totals)


@pytest.fixture
def worker(make_scheduler: MakeScheduler) -> Scheduler:
    return make_scheduler("w1")


def test_pushed_every_interval_on_the_clock(worker: Scheduler, client: redis.Redis) -> None:
    totals = FleetTotals(worker.stats, 2, clock=clock_of(worker))
    totals.worker_opened(worker.view)
    try:
        worker.stats.set_value("item_scraped_count", 3)
        clock_of(worker).advance(1)
        assert client.hget(KEYS.fleet_stats, "item_scraped_count") is None, "not yet"
        clock_of(worker).advance(1)
        assert client.hget(KEYS.fleet_stats, "item_scraped_count") == b"3"
        assert _worker_totals(client, "w1") == ("running", {
            "item_scraped_count": 3, "log_count/ERROR": 0, "redisspine/scheduler/acked": 0,
            "response_received_count": 0,
        })
        worker.stats.set_value("item_scraped_count", 5)
        clock_of(worker).advance(2)
        assert client.hget(KEYS.fleet_stats, "item_scraped_count") == b"5", "growth, once"
    finally:
        totals.spider_closed()


def test_the_push_at_close_marks_the_totals_final_even_when_nothing_grew(
    worker: Scheduler, client: redis.Redis
) -> None:
    totals = FleetTotals(worker.stats, 2, clock=clock_of(worker))
    totals.worker_opened(worker.view)
    worker.stats.set_value("response_received_count", 4)
    clock_of(worker).advance(2)
    assert _worker_totals(client, "w1")[0] == "running"
    totals.worker_closing(worker.view)
    assert not totals.running
    state, kept = _worker_totals(client, "w1")
    assert state == "closed"
    assert kept["response_received_count"] == 4
    assert client.hget(KEYS.fleet_stats, "response_received_count") == b"4"


def test_a_dead_workers_last_totals_stay_after_the_sweep_removed_it(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    dying = make_scheduler("dying", REDISSPINE_WORKER_TIMEOUT_SECONDS=2,
                           REDISSPINE_HEARTBEAT_SECONDS=1)
    totals = FleetTotals(dying.stats, 1, clock=clock_of(dying))
    totals.worker_opened(dying.view)
    dying.stats.set_value("item_scraped_count", 9)
    clock_of(dying).advance(1)
    totals.spider_closed()  # killed: no push at close
    client.zrem(KEYS.workers, "dying")  # what a sweep does to a dead worker
    state, kept = _worker_totals(client, "dying")
    assert (state, kept["item_scraped_count"]) == ("running", 9)
