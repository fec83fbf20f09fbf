"""``status`` tells the truth: an ETA that knows politeness, none when there is no
honest one, ``finished`` for a finished crawl, dead workers' last totals marked."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine.cli_commands import lane_pace
from scrapy_redisspine.cli_output import render_status
from scrapy_redisspine.control import DRAIN, PAUSED, StatsPusher, give_order, record_progress
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.settings import load_config
from scrapy_redisspine.status import read_status
from scrapy_redisspine.status_eta import LanePace

if TYPE_CHECKING:
    import redis



def _now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _queue(frontier: Frontier, lane: str, count: int) -> None:
    frontier.enqueue([NewRequest(f"{lane}/{i}".encode(), f"fp-{lane}-{i}".encode(), lane=lane)
                      for i in range(count)])


@pytest.fixture
def busy_crawl(frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys) -> Frontier:
    """The issue's crawl: 110 queued, 92 of them on a lane with a 1 s Crawl-delay; the
    fleet acks 500 a minute; one live worker."""
    frontier.register(flush=False, alive_ms=30_000)
    _queue(frontier, "slow.test", 92)
    _queue(frontier, "fast.test", 18)
    frontier.set_crawl_delay("slow.test", 1.0)
    now = _now_ms(client)
    client.zadd(crawl_keys.progress, {f"{now - 30_000}:w1:0:0": now - 30_000})
    client.hset(crawl_keys.stats, "acked", 250)
    return frontier


def test_the_eta_is_the_slowest_lanes_backlog_at_its_delay_not_the_fleet_rate(
    busy_crawl: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    status = read_status(client, crawl_keys)
    assert status["queued"] == 110
    assert 450 <= status["rate_per_minute"] <= 510  # 110 left at that rate: ~13 s
    assert status["eta_seconds"] == 92
    assert status["eta_bound"] == "politeness"
    assert status["slowest_lane"] == {"lane": "slow.test", "backlog": 92,
                                      "seconds_per_request": 1.0, "seconds": 92}
    assert "ETA 1m32s (politeness: slow.test, 92 queued at 1.0 s each)" in render_status(status)


def test_the_projects_delay_and_concurrency_give_each_lanes_pace(
    busy_crawl: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    pace = lane_pace(load_config({"DOWNLOAD_DELAY": 3, "REDISSPINE_HOST_CONCURRENCY": 2,
                                  "REDISSPINE_HOST_DELAYS": {"fast.test": 20}}))
    assert pace == LanePace(3.0, {"fast.test": 20.0}, 2)
    status = read_status(client, crawl_keys, pace=pace)
    # slow.test: 92 x max(3, 1) / 2 = 138 s; fast.test: 18 x 20 / 2 = 180 s
    assert status["slowest_lane"]["lane"] == "fast.test"
    assert status["eta_seconds"] == 180


def test_without_any_delay_the_eta_comes_from_the_rate(
    frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    frontier.register(flush=False, alive_ms=30_000)
    _queue(frontier, "a.test", 50)
    now = _now_ms(client)
    client.zadd(crawl_keys.progress, {f"{now - 30_000}:w1:0:0": now - 30_000})
    client.hset(crawl_keys.stats, "acked", 50)
    status = read_status(client, crawl_keys)
    assert status["slowest_lane"] is None
    assert status["eta_bound"] == "rate"
    assert 29 <= status["eta_seconds"] <= 31


@pytest.mark.parametrize("order", [PAUSED, DRAIN])
def test_no_eta_while_paused_or_draining(
    busy_crawl: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, order: str
) -> None:
    give_order(client, crawl_keys, order, True)
    status = read_status(client, crawl_keys)
    assert status["state"] == ("paused" if order == PAUSED else "draining")
    assert status["eta_seconds"] is None
    assert "ETA -" in render_status(status)


def test_no_eta_when_no_worker_runs(
    busy_crawl: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    busy_crawl.leave()
    status = read_status(client, crawl_keys)
    assert status["state"] == "waiting for workers"
    assert status["eta_seconds"] is None


def test_a_finished_crawl_says_finished_and_has_no_rate(
    frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    frontier.register(flush=False, alive_ms=30_000)
    _queue(frontier, "a.test", 1)
    frontier.ack([frontier.lease(1).leases[0].handle])
    record_progress(client, crawl_keys, "w1", 0, 0)
    client.hset(crawl_keys.stats, "acked", 1)
    assert frontier.mark_finished()
    status = read_status(client, crawl_keys)
    assert (status["state"], status["rate_per_minute"], status["eta_seconds"]) == (
        "finished", None, None)
    text = render_status(status)
    assert text.startswith("crawl test: finished\n")
    assert "ETA finished" in text
    assert "rate" not in text


def test_a_dead_workers_last_pushed_totals_are_kept_and_marked(
    frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    frontier.register(flush=False, alive_ms=30_000)
    StatsPusher(client, crawl_keys, worker_id="killed").push(
        {"response_received_count": 40, "item_scraped_count": 38})
    StatsPusher(client, crawl_keys, worker_id="left").push({"item_scraped_count": 2},
                                                            final=True)
    StatsPusher(client, crawl_keys, worker_id="w1").push({"item_scraped_count": 5})
    status = read_status(client, crawl_keys)
    rows = {row["id"]: row for row in status["workers"]}
    assert rows["w1"]["state"] == "alive"
    assert rows["w1"]["totals"]["item_scraped_count"] == 5
    assert rows["killed"]["state"] == "dead"
    assert not rows["killed"]["alive"]
    assert rows["killed"]["totals"]["response_received_count"] == 40
    assert rows["left"]["state"] == "closed"
    assert status["workers_alive"] == 1
    assert status["fleet_stats"]["item_scraped_count"] == 45
    text = render_status(status)
    killed = next(line for line in text.splitlines() if line.startswith("killed"))
    assert "dead: last pushed totals" in killed
    assert killed.split()[-3:] == ["40", "38", "0"], "pages, items, errors"
    assert json.loads(json.dumps(status)) == status, "still JSON-ready"


def test_sections_with_nothing_to_show_print_no_empty_table(
    client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    client.sadd(crawl_keys.crawls, crawl_keys.crawl_id)
    text = render_status(read_status(client, crawl_keys))
    assert "workers: 0 alive of 0" in text
    assert "worker  alive" not in text, "no header of an empty workers table"
    assert "top hosts" not in text
    assert "lane" not in text


def test_shed_requests_and_the_feed_are_shown_only_when_there_are_any(
    client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    client.sadd(crawl_keys.crawls, crawl_keys.crawl_id)
    quiet = render_status(read_status(client, crawl_keys))
    assert "shed" not in quiet
    assert "feed:" not in quiet
    client.hset(crawl_keys.stats, mapping={"shed": 3, "fed": 12, "feed_dead_lettered": 2})
    text = render_status(read_status(client, crawl_keys))
    assert "shed 3 request(s) for lack of Redis memory: the crawl will not close as " \
        "finished" in text
    assert "feed: 12 entry(ies) enqueued, 2 dead-lettered" in text


def test_workers_still_starting_and_those_cut_short_are_shown_when_there_are_any(
    client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    client.sadd(crawl_keys.crawls, crawl_keys.crawl_id)
    quiet = read_status(client, crawl_keys)
    assert (quiet["workers_starting"], quiet["workers_cut_short"]) == (0, 0)
    assert "start requests" not in render_status(quiet)
    now = _now_ms(client)
    client.zadd(crawl_keys.starting, {"seeding": now, "killed": now - 60_000})
    status = read_status(client, crawl_keys)
    assert (status["workers_starting"], status["workers_cut_short"]) == (1, 1)
    assert ("  1 still producing start requests; 1 stopped before noting theirs done"
            in render_status(status))


def test_redis_memory_and_the_budget_the_workers_hold_it_to(
    real_redis: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    real_redis.sadd(crawl_keys.crawls, crawl_keys.crawl_id)
    memory = read_status(real_redis, crawl_keys, memory_budget_bytes=10**12)["redis_memory"]
    assert memory["used_bytes"] > 0
    assert memory["budget_bytes"] == 10**12, "no maxmemory: the setting's budget"
    real_redis.config_set("maxmemory", 10**9)
    try:
        status = read_status(real_redis, crawl_keys, memory_budget_bytes=10**12)
    finally:
        real_redis.config_set("maxmemory", 0)
    assert status["redis_memory"]["max_bytes"] == 10**9
    assert status["redis_memory"]["budget_bytes"] == 10**9, "the smaller of the two"
    assert "byte budget" in render_status(status)


def test_status_warns_of_a_server_that_may_evict_the_crawls_keys(
    real_redis: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    real_redis.sadd(crawl_keys.crawls, crawl_keys.crawl_id)
    status = read_status(real_redis, crawl_keys)
    assert status["redis_memory"]["evicting_policy"] is None
    assert "maxmemory-policy" not in render_status(status)
    real_redis.config_set("maxmemory", 10**9)
    real_redis.config_set("maxmemory-policy", "allkeys-lru")
    try:
        status = read_status(real_redis, crawl_keys)
    finally:
        real_redis.config_set("maxmemory", 0)
        real_redis.config_set("maxmemory-policy", "noeviction")
    assert status["redis_memory"]["evicting_policy"] == "allkeys-lru"
    assert ("  warning: Redis's maxmemory-policy is allkeys-lru with a maxmemory set: it may "
            "evict this crawl's keys, so workers refuse to run on it" in render_status(status))


def _queue_lanes(client: redis.Redis, keys: CrawlKeys, lanes: int) -> None:
    frontier = Frontier(client, keys, "w1", "fifo")
    frontier.register(flush=False, alive_ms=30_000)
    for i in range(lanes):
        _queue(frontier, f"h{i}.test", 1)


def _as_after_a_restart(client: redis.Redis, keys: list[str]) -> None:
    for key in keys:
        client.restore(key, 0, client.dump(key), replace=True)  # type: ignore[arg-type]


def test_frontier_keys_kept_packed_past_16_entries_get_a_hint_with_the_setting(
    real_redis: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    # Redis's defaults keep a HASH or ZSET of up to 128 entries packed. The scripts
    # convert the frontier's keys past 16 (lib/hashed.lua), but a restart packs them
    # again until a script next sets an entry in them (here: what an RDB load does,
    # DUMP and RESTORE): 20 lanes queued leave `backlog` and `hosts` as packed lists
    # of 20, which every lease and ack would scan (benchmarks/RESULTS.md, session 17)
    _queue_lanes(real_redis, crawl_keys, 20)
    _as_after_a_restart(real_redis, [crawl_keys.backlog, crawl_keys.hosts])
    status = read_status(real_redis, crawl_keys)
    packed = {key["key"]: key for key in status["packed_keys"]}
    assert set(packed) == {"backlog", "hosts"}, status["packed_keys"]
    assert packed["backlog"]["entries"] == 20
    assert packed["backlog"]["encoding"] in {"listpack", "ziplist"}
    text = render_status(status)
    assert "backlog (20), hosts (20) as packed lists" in text
    assert "hash-max-listpack-entries 16 and zset-max-listpack-entries 16" in text
    assert json.loads(json.dumps(status))["packed_keys"] == status["packed_keys"]
    # with the recommended thresholds (the names every server of the matrix takes)
    # the same crawl's keys are hash tables and skip lists: no hint
    names = ("hash-max-ziplist-entries", "zset-max-ziplist-entries")
    before = {name: real_redis.config_get(name)[name] for name in names}
    other = CrawlKeys(crawl_keys.prefix, "tuned")
    try:
        for name in names:
            real_redis.config_set(name, 16)
        _queue_lanes(real_redis, other, 20)
    finally:
        for name, value in before.items():
            real_redis.config_set(name, value)
    tuned = read_status(real_redis, other)
    assert tuned["packed_keys"] == []
    assert "hint:" not in render_status(tuned)


def test_no_packed_hint_when_the_server_refuses_object_encoding(
    crawl_keys: CrawlKeys,
) -> None:
    # fakeredis has no OBJECT command, as a managed Redis may rename it or an ACL
    # deny it: the encoding is not known, so nothing is claimed either way
    import fakeredis

    fake = fakeredis.FakeRedis()
    _queue_lanes(fake, crawl_keys, 20)
    status = read_status(fake, crawl_keys)
    assert status["packed_keys"] is None
    assert status["queued"] == 20, "the rest of the status is read as before"
    assert "hint:" not in render_status(status)


def test_each_shard_of_a_sharded_crawl_is_looked_at(
    real_redis: redis.Redis,
) -> None:
    from scrapy_redisspine.sharded import ShardedFrontier

    keys = CrawlKeys("redisspine", "sharded", shards=2)
    frontier = ShardedFrontier(real_redis, keys, "w1")
    frontier.register(flush=False, alive_ms=30_000, spider="s")
    frontier.enqueue([NewRequest(f"h{i}/0".encode(), f"fp-{i}".encode(), lane=f"h{i}.test")
                      for i in range(60)])
    _as_after_a_restart(real_redis, [view.backlog for view in keys.shard_views()])
    packed = read_status(real_redis, keys)["packed_keys"]
    backlog = {key["shard"]: key["entries"] for key in packed if key["key"] == "backlog"}
    assert set(backlog) == {0, 1}, packed  # each shard's keys, by shard
    assert sum(backlog.values()) == 60
