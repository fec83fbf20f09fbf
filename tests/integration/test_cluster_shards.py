"""A crawl sharded over 6 hash tags on a real 3-master Redis Cluster: every script
stays in one shard's slot (the cluster client refuses any other call), the shards
spread over the masters, and enqueue, lease, ack, release, sweep and the
termination count work across them."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import pytest
from redis.crc import key_slot

from scrapy_redisspine._shards import split_key
from scrapy_redisspine.connection import client_from_url, is_cluster
from scrapy_redisspine.frontier import NewRequest
from scrapy_redisspine.keys import CrawlKeys, shard_of
from scrapy_redisspine.sharded import ShardedFrontier
from scrapy_redisspine.testing.redis_cluster import ClusterServers
from tests.queue_view import queued_count

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

SHARDS = 6
ALIVE_MS = 30_000


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterServers]:
    with ClusterServers(masters=3) as servers:
        yield servers


@pytest.fixture
def client(cluster: ClusterServers) -> Iterator[redis.Redis]:
    client = client_from_url(cluster.url)
    yield client
    client.flushall()
    client.close()


@pytest.fixture
def keys() -> CrawlKeys:
    return CrawlKeys("redisspine", "sharded", cluster=True, shards=SHARDS)


def _lanes(per_shard: int = 1) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {index: [] for index in range(SHARDS)}
    n = 0
    while any(len(lanes) < per_shard for lanes in found.values()):
        lane = f"h{n}.test"
        if len(found[shard_of(lane, SHARDS)]) < per_shard:
            found[shard_of(lane, SHARDS)].append(lane)
        n += 1
    return found


def _request(lane: str, name: str) -> NewRequest:
    payload = f"https://{lane}/{name}".encode()
    return NewRequest(payload, hashlib.sha1(payload).digest(), lane=lane)


def _frontier(client: redis.Redis, keys: CrawlKeys, worker: str = "w1") -> ShardedFrontier:
    frontier = ShardedFrontier(client, keys, worker, concurrency=1)
    assert frontier.register(flush=False, alive_ms=ALIVE_MS, spider="s").status in (
        "created", "joined")
    return frontier


def _queued(client: redis.Redis, keys: CrawlKeys) -> list[int]:
    return [int(queued_count(client, view)) for view in keys.shard_views()]


def _inflight(client: redis.Redis, keys: CrawlKeys) -> list[int]:
    return [int(client.hlen(view.inflight)) for view in keys.shard_views()]


def test_the_shards_spread_over_every_master(cluster: ClusterServers, keys: CrawlKeys) -> None:
    ports = {cluster.master_of_slot(key_slot(view.queue.encode())).port
             for view in keys.shard_views()}
    assert len(ports) == 3


def test_a_crawl_runs_across_the_shards_of_a_cluster(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    assert is_cluster(client)
    frontier = _frontier(client, keys)
    frontier.done_starting()
    lanes = _lanes()
    frontier.enqueue([_request(lanes[0][0], "parent")])
    (parent,) = frontier.lease(1).leases
    children = [_request(lanes[shard][0], "child") for shard in range(SHARDS)]
    sent = frontier.enqueue(children, [(*parent.handle, 0)])
    assert sent.statuses == "+" * SHARDS
    assert sent.acked == 1
    assert _queued(client, keys) == [1] * SHARDS
    counts = frontier.fleet_counts(ALIVE_MS)
    assert (counts.queued, counts.inflight, counts.ever) == (SHARDS, 0, True)
    leases = frontier.lease(SHARDS).leases
    assert sorted(split_key(lease.key)[0] for lease in leases) == list(range(SHARDS))
    released = [lease for lease in leases if split_key(lease.key)[0] < 2]
    assert frontier.release([lease.handle for lease in released]) == 2
    assert frontier.ack([lease.handle for lease in leases if lease not in released]) == 4
    assert _queued(client, keys) == [1, 1, 0, 0, 0, 0]
    again = frontier.lease(SHARDS).leases
    assert frontier.ack([lease.handle for lease in again]) == 2
    counts = frontier.fleet_counts(ALIVE_MS)
    assert (counts.queued, counts.inflight, counts.ever) == (0, 0, True)
    assert frontier.mark_finished()


def test_a_dead_workers_leases_come_back_from_every_master(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    dead, sweeper = _frontier(client, keys, "dead"), _frontier(client, keys, "sweeper")
    lanes = _lanes()
    dead.enqueue([_request(lanes[shard][0], "p") for shard in range(SHARDS)])
    assert len(dead.lease(SHARDS).leases) == SHARDS
    client.zadd(keys.workers, {"dead": 1})
    swept = sweeper.upkeep.requeue_stale(timeout_ms=60_000, ceiling_ms=0, max_requeues=10)
    assert swept.requeued == SHARDS
    assert swept.workers_removed == 1
    assert client.zscore(keys.workers, "dead") is None
    assert client.zscore(keys.workers, "sweeper") is not None
    assert _queued(client, keys) == [1] * SHARDS
    assert _inflight(client, keys) == [0] * SHARDS


def test_a_recreated_crawl_refuses_the_old_epoch_in_every_shard(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    """Each shard's copy of the epoch follows the crawl's: a worker of the flushed
    crawl writes nothing into the new one."""
    old = _frontier(client, keys, "old")
    old.leave()
    fresh = ShardedFrontier(client, keys, "fresh")
    assert fresh.register(flush=True, alive_ms=ALIVE_MS, spider="s").flushed
    for view in keys.shard_views():
        assert client.hget(view.record, "epoch") == fresh.epoch.encode()
    lane = _lanes()[3][0]
    with pytest.raises(Exception, match="LOST changed"):
        old.enqueue([_request(lane, "p")])
    assert _queued(client, keys) == [0] * SHARDS


def test_another_number_of_shards_is_refused(client: redis.Redis, keys: CrawlKeys) -> None:
    _frontier(client, keys)
    other = ShardedFrontier(client, CrawlKeys("redisspine", "sharded", cluster=True,
                                              shards=3), "w2")
    refused = other.register(flush=False, alive_ms=ALIVE_MS, spider="s")
    assert (refused.status, refused.shards) == ("shards", SHARDS)


def test_a_purge_leaves_a_tombstone_in_every_shard(client: redis.Redis, keys: CrawlKeys) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes()
    frontier.enqueue([_request(lanes[shard][0], "p") for shard in range(SHARDS)])
    frontier.lease(2)
    assert frontier.upkeep.purge() > 0
    for view in keys.shard_views():
        assert client.hkeys(view.record) == [b"purged_ms"]
        assert client.hlen(view.group_busy) == 0
        assert not client.exists(view.queue)
    with pytest.raises(Exception, match="LOST purged"):
        frontier.enqueue([_request(lanes[1][0], "again")])
    assert frontier.upkeep.dead_letters() == []


def _crawl_through(frontier: ShardedFrontier, name: str = "p") -> None:
    """One request per shard, leased and acked: the crawl is done."""
    frontier.done_starting()
    lanes = _lanes()
    frontier.enqueue([_request(lanes[shard][0], name) for shard in range(SHARDS)])
    leases = frontier.lease(SHARDS).leases
    assert frontier.ack([lease.handle for lease in leases]) == SHARDS


def _left(client: redis.Redis, keys: CrawlKeys) -> list[str]:
    """The crawl's keys that exist, crawl-wide and in every shard (not its items)."""
    names = [*keys.all_crawl_keys(), *(key for view in keys.shard_views()
                                       for key in view.shard_keys())]
    items = {view.items for view in keys.shard_views()}
    return sorted({key for key in names if key not in items and client.exists(key)})


def test_persist_off_the_last_worker_deletes_every_shard_on_every_master(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    first, last = _frontier(client, keys, "first"), _frontier(client, keys, "last")
    last.done_starting()
    _crawl_through(first)
    assert not first.upkeep.purge_if_done(first.epoch, ALIVE_MS)
    assert client.hget(keys.record, "finished_ms") is not None
    assert last.upkeep.purge_if_done(last.epoch, ALIVE_MS)
    assert _left(client, keys) == [keys.record]
    assert client.hgetall(keys.record) == {b"shards": str(SHARDS).encode()}
    assert not client.sismember(keys.crawls, keys.crawl_id)


def test_a_purge_left_midway_is_finished_by_the_next_worker(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    """The last worker dies after the crawl's own step: the record says "purging",
    the shards still hold the dedup of the done crawl. The next worker deletes them
    before it starts the crawl afresh, so every URL is new again."""
    dying = _frontier(client, keys, "dying")
    _crawl_through(dying)
    assert dying.upkeep.crawl.purge_if_done_step(dying.epoch, ALIVE_MS, keep_record=True) == 3
    assert client.hget(keys.record, "purging_ms") is not None
    fresh = ShardedFrontier(client, keys, "fresh", concurrency=1)
    assert fresh.register(flush=False, alive_ms=ALIVE_MS, spider="s").status == "created"
    assert fresh.epoch != dying.epoch
    assert client.hget(keys.record, "purging_ms") is None
    lanes = _lanes()
    again = fresh.enqueue([_request(lanes[shard][0], "p") for shard in range(SHARDS)])
    assert again.statuses == "+" * SHARDS, "the old crawl's dedup went with it"


def test_a_late_purge_never_deletes_the_work_of_a_crawl_started_afresh(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    """The last worker froze after the crawl's own step; another worker finished the
    purge and started afresh; the frozen one wakes and goes on with its shards."""
    frozen = _frontier(client, keys, "frozen")
    _crawl_through(frozen)
    assert frozen.upkeep.crawl.purge_if_done_step(frozen.epoch, ALIVE_MS,
                                                  keep_record=True) == 3
    fresh = ShardedFrontier(client, keys, "fresh", concurrency=1)
    assert fresh.register(flush=False, alive_ms=ALIVE_MS, spider="s").status == "created"
    lanes = _lanes()
    fresh.enqueue([_request(lanes[shard][0], "new") for shard in range(SHARDS)])
    assert not frozen.upkeep.finish_purge(frozen.epoch, ALIVE_MS)
    assert _queued(client, keys) == [1] * SHARDS
    assert client.hget(keys.record, "epoch") == fresh.epoch.encode()


def test_a_request_pushed_while_the_crawl_is_deleted_keeps_it(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    last = _frontier(client, keys, "last")
    _crawl_through(last)
    assert last.upkeep.crawl.purge_if_done_step(last.epoch, ALIVE_MS, keep_record=True) == 3
    tool = ShardedFrontier(client, keys, "tool")  # epoch "": a tool outside the fleet
    lane = _lanes()[2][0]
    assert tool.enqueue([_request(lane, "pushed")]).statuses == "+"
    assert not last.upkeep.finish_purge(last.epoch, ALIVE_MS)
    assert client.hget(keys.record, "purging_ms") is None
    assert _queued(client, keys)[2] == 1
    joining = ShardedFrontier(client, keys, "joining", concurrency=1)
    assert joining.register(flush=False, alive_ms=ALIVE_MS, spider="s").status == "joined"
    assert [lease.payload for lease in joining.lease(1).leases] == [
        f"https://{lane}/pushed".encode()]
