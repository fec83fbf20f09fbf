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
    return [int(client.zcard(view.queue)) for view in keys.shard_views()]


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
