"""REDISSPINE_SHARDS in a Scrapy worker: the scheduler joins through a ShardedFrontier,
and everything a worker does (leases and acks, the count that finishes the crawl,
the Recovery sweep, the dedup record's upkeep, the feed drain, the fleet's counters)
spans the shards; a setting a sharded crawl cannot take is refused at open in one line.

Each scheduler test runs on fakeredis and on the real redis-server.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import pytest
from redis import exceptions as redis_errors
from scrapy import Request

from scrapy_redisspine.extension import Recovery
from scrapy_redisspine.frontier import NewRequest
from scrapy_redisspine.keys import CrawlKeys, shard_of
from scrapy_redisspine.pushing import PushOptions, push_frontier
from scrapy_redisspine.sharded import ShardedFrontier
from scrapy_redisspine.sharded_upkeep import ShardedUpkeep, sharded_upkeep
from tests.queue_view import queued_count
from tests.unit.conftest import clock_of, engine_of, finish, next_request, pending

if TYPE_CHECKING:
    import redis
    from twisted.internet import task

    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import MakeScheduler

SHARDS = 3
KEYS = CrawlKeys("redisspine", "test", shards=SHARDS)
FAST = {
    "REDISSPINE_SHARDS": SHARDS, "REDISSPINE_WORKER_TIMEOUT_SECONDS": 2,
    "REDISSPINE_HEARTBEAT_SECONDS": 1, "REDISSPINE_SWEEP_SECONDS": 1,
}


def _lanes(per_shard: int = 1) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {index: [] for index in range(SHARDS)}
    n = 0
    while any(len(lanes) < per_shard for lanes in found.values()):
        lane = f"h{n}.example"
        if len(found[shard_of(lane, SHARDS)]) < per_shard:
            found[shard_of(lane, SHARDS)].append(lane)
        n += 1
    return found


def _one_lane_per_shard() -> list[str]:
    return [lanes[0] for lanes in _lanes().values()]


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    assert not any(record.exc_info for record in caplog.records), "no traceback"
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def _refused_with(scheduler: Scheduler, caplog: pytest.LogCaptureFixture, reason: str,
                  *said: str) -> None:
    (line,) = _errors(caplog)
    for text in said:
        assert text in line, line
    engine = engine_of(scheduler)
    assert engine.failed, "the process exits non-zero"
    assert scheduler.has_pending_requests(), "never idle: never 'finished'"
    clock_of(scheduler).advance(0)
    assert engine.closed == [reason]


def _dead_worker_holding(client: redis.Redis, lanes: list[str], name: str = "dead") -> None:
    """A worker that leased one request of each lane and stopped heartbeating."""
    dead = ShardedFrontier(client, KEYS, name, concurrency=10)
    dead.register(flush=False, alive_ms=2000, spider="sched")
    dead.enqueue([NewRequest(f"https://{lane}/{name}".encode(), f"fp-{lane}-{name}".encode(),
                             lane=lane) for lane in lanes])
    assert len(dead.lease(len(lanes)).leases) == len(lanes)
    seconds, micros = client.time()
    client.zadd(KEYS.workers, {name: seconds * 1000 + micros // 1000 - 60_000})


def _queued(client: redis.Redis) -> list[int]:
    return [int(queued_count(client, view)) for view in KEYS.shard_views()]


def test_a_sharded_worker_crawls_through_every_shard_and_finishes(
    make_scheduler: MakeScheduler, client: redis.Redis,
) -> None:
    worker = make_scheduler("w1", free_slots=4, **FAST)
    assert isinstance(worker.frontier, ShardedFrontier)
    assert isinstance(worker.view.upkeep, ShardedUpkeep)
    assert client.hget(KEYS.record, "shards") == str(SHARDS).encode()
    lanes = _one_lane_per_shard()
    for lane in lanes:
        assert worker.enqueue_request(Request(f"https://{lane}/start"))
    worker.outbox.try_flush()
    assert _queued(client) == [1, 1, 1], "each request in its lane's shard"
    assert not client.exists(KEYS.queue), "the crawl-wide queue stays unused"
    fetched = []
    while (request := next_request(worker)) is not None:
        fetched.append(request.url)
        finish(worker, request)
    assert sorted(fetched) == sorted(f"https://{lane}/start" for lane in lanes)
    assert not pending(worker), "the count over every shard says the crawl is done"
    acked = [int(client.hget(view.stats, "acked") or 0) for view in KEYS.shard_views()]
    assert acked == [1, 1, 1]


def test_a_worker_with_another_number_of_shards_is_refused_naming_both(
    make_scheduler: MakeScheduler, caplog: pytest.LogCaptureFixture,
) -> None:
    make_scheduler("w1", **FAST)
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        other = make_scheduler("w2", REDISSPINE_SHARDS=2)
    _refused_with(other, caplog, "redisspine_crawl_conflict",
                  f"REDISSPINE_SHARDS = {SHARDS}", "REDISSPINE_SHARDS = 2")


def test_an_unsharded_worker_on_a_sharded_crawl_is_refused(
    make_scheduler: MakeScheduler, caplog: pytest.LogCaptureFixture,
) -> None:
    make_scheduler("w1", **FAST)
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        other = make_scheduler("w2")
    _refused_with(other, caplog, "redisspine_crawl_conflict",
                  f"REDISSPINE_SHARDS = {SHARDS}", "REDISSPINE_SHARDS = 1")


def test_a_crawl_id_with_a_slash_is_refused_at_open(
    make_scheduler: MakeScheduler, caplog: pytest.LogCaptureFixture, client: redis.Redis,
) -> None:
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        worker = make_scheduler("w1", REDISSPINE_CRAWL_ID="a/b")
    _refused_with(worker, caplog, "redisspine_config_error", "'a/b'", "'/'")
    assert not client.keys("*"), "nothing written"


def test_fleet_items_work_sharded_with_the_caps_shared(make_scheduler: MakeScheduler) -> None:
    worker = make_scheduler("w1", **FAST, REDISSPINE_ITEMS=True,
                            REDISSPINE_ITEMS_MAX_COUNT=10, REDISSPINE_ITEMS_MAX_BYTES=1000)
    assert worker.refusal.reason is None
    assert isinstance(worker.frontier, ShardedFrontier)
    # the caps are the crawl's: each of the 3 shards' streams holds ceil(cap / 3)
    assert [(shard.items_cap, shard.items_max_bytes) for shard in worker.frontier.shards] == [
        (4, 334)] * SHARDS


def test_a_sharded_workers_items_go_with_their_acks_and_loose_ones_once(
    make_scheduler: MakeScheduler, client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker = make_scheduler("w1", free_slots=4, **FAST, REDISSPINE_ITEMS=True)
    assert isinstance(worker.frontier, ShardedFrontier)
    assert worker.view.items is not None
    lanes = _one_lane_per_shard()
    worker.enqueue_request(Request(f"https://{lanes[1]}/page"))
    worker.outbox.try_flush()
    request = next_request(worker)
    assert request is not None
    worker.view.items.add({"n": 1}, request, request.url)
    finish(worker, request)
    worker.outbox.flush()
    streams = [int(client.xlen(view.items)) for view in KEYS.shard_views()]
    assert streams == [0, 1, 0], "the page's item in its lane's shard, with its ack"
    # A loose item (of no ack) sent with requests for every shard, one shard's call
    # failing: the outbox keeps it all and sends it again; the item lands once.
    for lane in lanes:
        worker.enqueue_request(Request(f"https://{lane}/more"))
    worker.view.items.add({"from": "start"}, None, "")
    real = worker.frontier.crawl.pipelined
    down = worker.frontier.shards[2].keys.queue

    def pipelined(calls: Any) -> list[Any]:
        ran = iter(real([call for call in calls if down not in call[1]]))
        return [redis_errors.ConnectionError("shard down") if down in call[1] else next(ran)
                for call in calls]

    with monkeypatch.context() as patch:
        patch.setattr(worker.frontier.crawl, "pipelined", pipelined)
        with pytest.raises(redis_errors.ConnectionError):
            worker.outbox.flush()
    worker.outbox.flush()
    assert sum(int(client.xlen(view.items)) for view in KEYS.shard_views()) == 2
    assert _queued(client) == [1, 1, 1]
    assert worker.stats.get_value("redisspine/items/stored") == 2


def test_a_per_process_page_count_works_sharded(make_scheduler: MakeScheduler) -> None:
    worker = make_scheduler("w1", **FAST, CLOSESPIDER_PAGECOUNT=10,
                            REDISSPINE_CLOSESPIDER_PER_PROCESS=True)
    assert isinstance(worker.frontier, ShardedFrontier)
    assert worker.refusal.reason is None


@pytest.mark.parametrize("value", [0, -1, "three", 1.5])
def test_a_bad_number_of_shards_is_a_config_error(
    clock: task.Clock, caplog: pytest.LogCaptureFixture, value: object,
) -> None:
    from scrapy.utils.test import get_crawler

    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import FakeEngine, SchedSpider

    crawler = get_crawler(SchedSpider, {"REDISSPINE_SHARDS": value})
    scheduler = Scheduler.from_crawler(crawler, engine=FakeEngine(), clock=clock)
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        scheduler.open(SchedSpider())
    _refused_with(scheduler, caplog, "redisspine_config_error", "REDISSPINE_SHARDS")
    scheduler.close("redisspine_config_error")


def test_the_sweep_takes_a_dead_workers_leases_back_in_every_shard(
    make_scheduler: MakeScheduler, client: redis.Redis,
) -> None:
    lanes = _one_lane_per_shard()
    _dead_worker_holding(client, lanes)
    worker = make_scheduler("w1", **FAST)
    recovery = Recovery(worker.config, worker.stats, clock=clock_of(worker))
    recovery.worker_opened(worker.view)
    try:
        for _ in range(4):
            clock_of(worker).advance(1)
    finally:
        recovery.spider_closed()
    assert _queued(client) == [1, 1, 1]
    assert worker.stats.get_value("redisspine/recovery/requeued") == SHARDS
    assert worker.stats.get_value("redisspine/fleet/requeued") == SHARDS, "summed over shards"
    assert client.zscore(KEYS.workers, "dead") is None, "forgotten once every shard swept"


def test_unindexed_leases_are_repaired_in_every_shard(
    make_scheduler: MakeScheduler, client: redis.Redis,
) -> None:
    lanes = _one_lane_per_shard()
    _dead_worker_holding(client, lanes)
    for view in KEYS.shard_views():  # no sweep finds these any more
        client.delete(view.owned, view.leases)
    worker = make_scheduler("w1", **FAST)
    recovery = Recovery(worker.config, worker.stats, clock=clock_of(worker))
    recovery.worker_opened(worker.view)
    try:
        for _ in range(3 + 2 * SHARDS):  # one step per sweep, a shard after the other
            clock_of(worker).advance(1)
    finally:
        recovery.spider_closed()
    assert _queued(client) == [1, 1, 1]
    assert worker.stats.get_value("redisspine/recovery/unindexed") == SHARDS


def test_the_unindexed_cursor_walks_the_shards_one_pass(client: redis.Redis) -> None:
    upkeep = sharded_upkeep(client, KEYS, "tool")
    cursors = []
    cursor = "0"
    for _ in range(10 * SHARDS):
        cursor = upkeep.repair_unindexed(cursor, 10, timeout_ms=1000, max_requeues=3).cursor
        cursors.append(cursor)
        if cursor == "0":
            break
    assert cursors[-1] == "0", "a pass ends"
    shards = [int(step.partition(":")[0]) for step in cursors[:-1]]
    assert shards == sorted(shards), "the shards one after the other"
    assert {*shards, 0} == set(range(SHARDS)), "every shard"
    assert "1:0" in cursors
    assert "2:0" in cursors
    again = upkeep.repair_unindexed("junk", 10, timeout_ms=1000, max_requeues=3).cursor
    assert again == cursors[0], "a cursor of no shard starts a pass again"


def test_a_group_sweep_of_a_sharded_crawl_sweeps_its_shards(client: redis.Redis) -> None:
    lanes = _one_lane_per_shard()
    _dead_worker_holding(client, lanes)
    other = CrawlKeys("redisspine", "other")
    from scrapy_redisspine.frontier import Frontier

    sweeper = Frontier(client, other, "sweeper")
    sweeper.register(flush=False, alive_ms=2000, spider="sched")
    found = sweeper.upkeep.of_crawl("test")
    assert isinstance(found, ShardedUpkeep)
    result = found.requeue_stale(timeout_ms=2000, ceiling_ms=0, max_requeues=3)
    assert result.requeued == SHARDS
    assert _queued(client) == [1, 1, 1]


def test_the_dupefilter_keeps_every_shards_record(make_scheduler: MakeScheduler) -> None:
    from scrapy_redisspine.dupefilter import RedisDupeFilter

    worker = make_scheduler("w1", **FAST)
    assert isinstance(worker.df, RedisDupeFilter)
    assert [dedup.keys.seen for dedup in worker.df.dedups] == [
        view.seen for view in KEYS.shard_views()]
    turns = []
    for _ in range(SHARDS + 1):
        assert worker.df.dedup is not None
        turns.append(worker.df.dedup.keys.seen)
        worker.df._next_tick(worker.df.maintain())
    assert turns == [*(view.seen for view in KEYS.shard_views()), KEYS.shard_view(0).seen]
    with pytest.raises(RuntimeError, match="sharded"):
        worker.df.request_seen(Request("https://example.com/"))


def test_a_push_into_a_sharded_crawl_routes_by_lane(client: redis.Redis) -> None:
    frontier = push_frontier(client, KEYS, PushOptions())
    assert isinstance(frontier, ShardedFrontier)
    lanes = _one_lane_per_shard()
    frontier.push([NewRequest(f"https://{lane}/".encode(), f"fp-{lane}".encode(), lane=lane)
                   for lane in lanes])
    assert _queued(client) == [1, 1, 1]


# -- CLOSESPIDER_PAGECOUNT over shards (take_pages.lua) ------------------------------


def _budgeted(client: redis.Redis, worker: str, budget: int) -> ShardedFrontier:
    frontier = ShardedFrontier(client, KEYS, worker, concurrency=100, page_budget=budget,
                               holder_timeout_ms=2000)
    frontier.register(flush=False, alive_ms=2000, spider="sched")
    return frontier


def _fill(frontier: ShardedFrontier, per_lane: int = 10) -> None:
    frontier.enqueue([NewRequest(f"https://{lane}/{n}".encode(), f"fp-{lane}-{n}".encode(),
                                 lane=lane)
                      for lane in _one_lane_per_shard() for n in range(per_lane)])


def _leased(client: redis.Redis) -> int:
    return sum(int(client.hget(view.stats, "leased") or 0) for view in KEYS.shard_views())


def test_the_page_budget_spans_the_shards_and_closes_the_crawl(client: redis.Redis) -> None:
    frontier = _budgeted(client, "w1", 5)
    _fill(frontier)
    assert len(frontier.lease(3).leases) == 3
    last = frontier.lease(10)
    assert len(last.leases) == 2, "what is left of the budget"
    spent = frontier.lease(10)
    assert (spent.leases, spent.close_reason) == ([], "closespider_pagecount")
    assert _leased(client) == 5
    assert client.hget(KEYS.control, "close_reason") == b"closespider_pagecount"
    assert not client.exists(KEYS.page_holds), "every hold settled"


def test_a_hold_not_leased_goes_back_and_no_close_while_one_is_open(
    client: redis.Redis,
) -> None:
    first, second = _budgeted(client, "w1", 6), _budgeted(client, "w2", 6)
    _fill(first, per_lane=1)  # 3 requests: a hold of 6 leases only 3
    assert len(first.lease(6).leases) == 3
    assert int(client.hget(KEYS.stats, "pages_taken") or 0) == 3, "3 went back"
    _fill(second, per_lane=5)
    assert first._take_pages(2)[0] == 2  # first holds 2 (a lease under way)
    got = second.lease(10)
    assert len(got.leases) == 1, "the budget less what is leased and held"
    waiting = second.lease(10)
    assert (waiting.leases, waiting.close_reason) == ([], ""), "no close: a hold is open"
    first._unsettled = 0  # its lease gave nothing: the 2 go back
    first._settle()
    assert len(second.lease(10).leases) == 2
    assert second.lease(10).close_reason == "closespider_pagecount"
    assert _leased(client) == 6


def test_a_dead_holders_pages_stay_spent_the_budget_is_never_overspent(
    client: redis.Redis,
) -> None:
    dead, alive = _budgeted(client, "dead", 5), _budgeted(client, "alive", 5)
    _fill(alive)
    assert dead._take_pages(3)[0] == 3  # then it dies before its lease and settle
    seconds, micros = client.time()
    client.zadd(KEYS.workers, {"dead": seconds * 1000 + micros // 1000 - 60_000})
    assert len(alive.lease(10).leases) == 2
    assert alive.lease(10).close_reason == "closespider_pagecount"
    assert _leased(client) == 2, "under-spent by the dead worker's hold, never over"


def test_a_lease_that_fails_counts_its_hold_as_spent(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import redis as redis_module

    frontier = _budgeted(client, "w1", 4)
    _fill(frontier)

    def down(count: int) -> Any:
        raise redis_module.ConnectionError("down")

    monkeypatch.setattr(frontier, "_lease", down)
    with pytest.raises(redis_module.ConnectionError):
        frontier.lease(3)
    monkeypatch.undo()
    assert len(frontier.lease(10).leases) == 1, "the failed lease's 3 stay spent"


def test_a_garbage_page_count_reads_as_spent(client: redis.Redis) -> None:
    frontier = _budgeted(client, "w1", 4)
    _fill(frontier)
    client.hset(KEYS.stats, "pages_taken", "garbage")
    spent = frontier.lease(3)
    assert (spent.leases, spent.close_reason) == ([], "closespider_pagecount")
    assert any("pages_taken" in repair for repair in spent.repairs)


def test_a_sharded_worker_closes_at_the_fleet_page_count(
    make_scheduler: MakeScheduler, client: redis.Redis,
) -> None:
    worker = make_scheduler("w1", free_slots=8, **FAST, CLOSESPIDER_PAGECOUNT=2)
    for lane in _one_lane_per_shard():
        worker.enqueue_request(Request(f"https://{lane}/"))
    worker.outbox.flush()
    done = [next_request(worker), next_request(worker)]
    assert next_request(worker) is None, "the budget is spent"
    assert worker.fleet.orders.close_reason == "closespider_pagecount"
    for request in done:
        finish(worker, request)
    worker.fleet.heartbeat()
    assert engine_of(worker).closed == ["closespider_pagecount"]
    worker.close("closespider_pagecount")
    assert _leased(client) == 2
    assert sum(_queued(client)) == 1


def test_the_metrics_read_a_sharded_crawl_in_its_layout(client: redis.Redis) -> None:
    from scrapy_redisspine.metrics import read_for

    frontier = ShardedFrontier(client, KEYS, "w1", concurrency=10)
    frontier.register(flush=False, alive_ms=2000, spider="sched")
    _fill(frontier, per_lane=2)
    assert len(frontier.lease(1).leases) == 1
    status = read_for(client, timeout_ms=2000, top_lanes=5)(CrawlKeys("redisspine", "test"))
    assert (status["shards"], status["queued"], status["in_flight"]) == (SHARDS, 5, 1)
    assert status["counters"]["enqueued"] == 6


def test_a_kept_alive_sharded_fleet_closes_idle(
    make_scheduler: MakeScheduler, client: redis.Redis,
) -> None:
    settings = {**FAST, "REDISSPINE_KEEP_ALIVE": True, "REDISSPINE_IDLE_CLOSE_SECONDS": 5}
    first, second = make_scheduler("w1", **settings), make_scheduler("w2", **settings)
    worker = ShardedFrontier(client, KEYS, "seeder", concurrency=10)
    worker.register(flush=False, alive_ms=2000, spider="sched")
    worker.done_starting()
    _fill(worker, per_lane=1)  # work in the shards: not idle
    first.fleet.heartbeat()
    second.fleet.heartbeat()
    seconds, micros = client.time()
    client.hset(KEYS.record, "idle_since_ms", seconds * 1000 + micros // 1000 - 10_000)
    first.fleet.heartbeat()
    assert engine_of(first).closed == [], "requests are queued in the shards"
    for view in KEYS.shard_views():
        client.delete(view.queue, view.hosts, view.backlog)
    first.fleet.heartbeat()
    client.hset(KEYS.record, "idle_since_ms", seconds * 1000 + micros // 1000 - 10_000)
    first.fleet.heartbeat()
    assert engine_of(first).closed == ["idle"]
    second.fleet.heartbeat()
    assert engine_of(second).closed == ["idle"], "the whole fleet"


def test_a_crawl_id_no_crawl_may_have_is_left_out_of_the_group_sweep(
    client: redis.Redis,
) -> None:
    from scrapy_redisspine.frontier import Frontier

    sweeper = Frontier(client, CrawlKeys("redisspine", "other"), "sweeper")
    sweeper.register(flush=False, alive_ms=2000, spider="sched")
    client.sadd(sweeper.keys.group_crawls, "old/id", "fine")
    assert sweeper.upkeep.group_crawls(10) == ["fine"]


def test_a_malformed_member_of_a_shard_is_reported_with_the_shards_keys(
    make_scheduler: MakeScheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture,
) -> None:
    worker = make_scheduler("w1", **FAST)
    client.zadd(KEYS.shard_view(1).queue, {b"000000000000000\xffnot a request": 0})
    with caplog.at_level(logging.ERROR, logger="scrapy_redisspine"):
        assert next_request(worker) is None
    (line,) = _errors(caplog)
    assert "1 malformed member(s) of redisspine:{test/*}:queue" in line, line
    assert "dead letters in redisspine:{test/*}:dead" in line, line
    assert client.hlen(KEYS.shard_view(1).dead) == 1
