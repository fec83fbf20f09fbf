"""A crawl over 4 shards on one Redis (fakeredis and a real redis-server): enqueue,
lease, ack, release, bury and sweep land in each lane's shard; termination counts
span them all; a crawl keeps the number of shards it was created with."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine._shards import split_key
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import SHARD_KEY_NAMES, CrawlKeys, shard_of
from scrapy_redisspine.sharded import ShardedFrontier
from tests.queue_view import queued_count

if TYPE_CHECKING:
    import redis

SHARDS = 4
ALIVE_MS = 30_000
WIDE = 10_000


def _lanes(shards: int = SHARDS, per_shard: int = 1) -> dict[int, list[str]]:
    """``per_shard`` lanes owned by each shard, found with shard_of."""
    found: dict[int, list[str]] = {index: [] for index in range(shards)}
    n = 0
    while any(len(lanes) < per_shard for lanes in found.values()):
        lane = f"h{n}.test"
        if len(found[shard_of(lane, shards)]) < per_shard:
            found[shard_of(lane, shards)].append(lane)
        n += 1
    return found


def _request(lane: str, name: str, **kwargs: bool) -> NewRequest:
    payload = f"https://{lane}/{name}".encode()
    return NewRequest(payload, hashlib.sha1(payload).digest(), lane=lane, **kwargs)


@pytest.fixture
def keys() -> CrawlKeys:
    return CrawlKeys("redisspine", "sharded", shards=SHARDS)


def _frontier(client: redis.Redis, keys: CrawlKeys, worker: str = "w1") -> ShardedFrontier:
    frontier = ShardedFrontier(client, keys, worker, concurrency=WIDE)
    assert frontier.register(flush=False, alive_ms=ALIVE_MS, spider="s").status in (
        "created", "joined")
    return frontier


def _queued(client: redis.Redis, keys: CrawlKeys) -> list[int]:
    return [int(queued_count(client, view)) for view in keys.shard_views()]


def _inflight(client: redis.Redis, keys: CrawlKeys) -> list[int]:
    return [int(client.hlen(view.inflight)) for view in keys.shard_views()]


def test_requests_go_to_their_lanes_shards_and_dedup_there(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes(per_shard=2)
    batch = [_request(lane, "p") for shard in lanes for lane in lanes[shard]]
    batch.append(_request(lanes[3][0], "p"))  # a duplicate, in shard 3
    result = frontier.enqueue(batch)
    assert result.statuses == "+" * 8 + "d"
    assert _queued(client, keys) == [2, 2, 2, 2]
    assert not client.exists(keys.queue)  # the crawl-wide view's stays unused
    assert frontier.enqueue([_request(lanes[1][1], "p")]).statuses == "d"


def test_leases_come_from_every_shard_and_name_theirs(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes(per_shard=2)
    frontier.enqueue([_request(lane, "p") for shard in lanes for lane in lanes[shard]])
    batch = frontier.lease(8)
    assert len(batch.leases) == 8
    for lease in batch.leases:
        shard, _ = split_key(lease.key)
        assert shard == shard_of(lease.lane, SHARDS)
    assert _inflight(client, keys) == [2, 2, 2, 2]
    assert frontier.ack([lease.handle for lease in batch.leases]) == 8
    assert _inflight(client, keys) == [0, 0, 0, 0]


def test_the_starting_shard_turns_from_lease_to_lease(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes(per_shard=3)
    frontier.enqueue([_request(lane, "p") for shard in lanes for lane in lanes[shard]])
    firsts = [split_key(frontier.lease(1).leases[0].key)[0] for _ in range(SHARDS)]
    assert sorted(firsts) == list(range(SHARDS))


def test_a_page_acks_with_its_children_in_other_shards(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes()
    frontier.enqueue([_request(lanes[0][0], "parent")])
    (parent,) = frontier.lease(1).leases
    children = [_request(lanes[shard][0], "child") for shard in range(SHARDS)]
    result = frontier.enqueue(children, [(*parent.handle, 0)])
    assert result.statuses == "++++"
    assert result.acked == 1
    assert _queued(client, keys) == [1, 1, 1, 1]
    assert _inflight(client, keys) == [0, 0, 0, 0]


def test_release_and_bury_go_to_the_leases_shard(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes()
    frontier.enqueue([_request(lanes[shard][0], "p") for shard in range(SHARDS)])
    leases = {split_key(lease.key)[0]: lease for lease in frontier.lease(4).leases}
    assert frontier.release([leases[1].handle, leases[2].handle]) == 2
    assert frontier.bury(leases[3].handle, "cannot be processed") == 1
    assert _queued(client, keys) == [0, 1, 1, 0]
    assert _inflight(client, keys) == [1, 0, 0, 0]
    assert client.hlen(keys.shard_view(3).dead) == 1
    # A stale token is fenced in its shard as it is without shards.
    assert frontier.release([(leases[0].key, "0")]) == 0


def test_orphans_are_released_in_every_shard(client: redis.Redis, keys: CrawlKeys) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes()
    frontier.enqueue([_request(lanes[shard][0], "p") for shard in range(SHARDS)])
    leases = frontier.lease(4).leases
    kept = [lease.key for lease in leases if split_key(lease.key)[0] in (0, 2)]
    assert frontier.release_orphans(kept) == 2
    assert _inflight(client, keys) == [1, 0, 1, 0]


def test_a_dead_workers_leases_come_back_from_every_shard(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    dead, sweeper = _frontier(client, keys, "dead"), _frontier(client, keys, "sweeper")
    lanes = _lanes(per_shard=2)
    dead.enqueue([_request(lane, "p") for shard in lanes for lane in lanes[shard]])
    assert len(dead.lease(8).leases) == 8
    client.zadd(keys.workers, {"dead": 1})
    # A small limit: each shard's sweep takes one lease of the dead worker's two
    # there; it must stay listed until every shard took all.
    partial = sweeper.upkeep.requeue_stale(timeout_ms=60_000, ceiling_ms=0, max_requeues=10,
                                           limit=1)
    assert partial.requeued == SHARDS
    assert partial.workers_removed == 0
    assert client.zscore(keys.workers, "dead") is not None
    full = sweeper.upkeep.requeue_stale(timeout_ms=60_000, ceiling_ms=0, max_requeues=10)
    assert full.requeued == SHARDS
    assert full.workers_removed == 1
    assert client.zscore(keys.workers, "dead") is None
    assert _queued(client, keys) == [2, 2, 2, 2]
    assert _inflight(client, keys) == [0, 0, 0, 0]


def test_a_sweep_keeps_a_worker_that_beat_again(client: redis.Redis, keys: CrawlKeys) -> None:
    late, sweeper = _frontier(client, keys, "late"), _frontier(client, keys, "sweeper")
    lanes = _lanes()
    late.enqueue([_request(lanes[0][0], "p")])
    late.lease(1)
    client.zadd(keys.workers, {"late": 1})
    swept = sweeper.shards[0].upkeep.requeue_stale(
        timeout_ms=60_000, ceiling_ms=0, max_requeues=10, remove=False)
    assert swept.swept == ("late",)
    assert swept.workers_removed == 0
    late.heartbeat()
    assert sweeper.crawl.run_script("forget_workers", [60_000, "late"]) == 0
    assert client.zscore(keys.workers, "late") is not None


def test_termination_counts_span_every_shard(client: redis.Redis, keys: CrawlKeys) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes()
    frontier.done_starting()
    counts = frontier.fleet_counts(ALIVE_MS)
    assert (counts.queued, counts.inflight, counts.ever) == (0, 0, False)
    frontier.enqueue([_request(lanes[2][0], "p"), _request(lanes[3][0], "p")])
    counts = frontier.fleet_counts(ALIVE_MS)
    assert (counts.queued, counts.inflight, counts.ever) == (2, 0, True)
    assert not frontier.mark_finished()
    leases = frontier.lease(2).leases
    counts = frontier.fleet_counts(ALIVE_MS)
    assert (counts.queued, counts.inflight) == (0, 2)
    frontier.ack([lease.handle for lease in leases])
    counts = frontier.fleet_counts(ALIVE_MS)
    assert (counts.queued, counts.inflight, counts.ever, counts.starting) == (0, 0, True, 0)
    assert not counts.has_work
    assert frontier.mark_finished()
    assert client.hexists(keys.record, "finished_ms")


def test_a_move_during_the_count_is_never_idle(client: redis.Redis, keys: CrawlKeys) -> None:
    """Read shard B empty; a child enters B and its parent is acked in A; read A
    empty: the double collect sees B's stamp move (real scripts, real counters)."""
    frontier = _frontier(client, keys)
    lanes = _lanes()
    frontier.enqueue([_request(lanes[1][0], "parent")])
    (parent,) = frontier.lease(1).leases
    reads: list[int] = []

    def read(index: int) -> object:
        reads.append(index)
        if reads == [0, 1]:  # shard 0 was read empty; shard 1 (the parent's) is next
            frontier.enqueue([_request(lanes[0][0], "child")], [(*parent.handle, 0)])
        return frontier.shard_counts(index)

    from scrapy_redisspine._shards import double_collect
    collected = double_collect(read, SHARDS)  # type: ignore[arg-type]
    assert not collected.idle
    assert not collected.settled
    assert frontier.collect().queued == 1


def test_a_crawl_keeps_its_number_of_shards(client: redis.Redis, keys: CrawlKeys) -> None:
    _frontier(client, keys)
    other = ShardedFrontier(client, CrawlKeys("redisspine", "sharded", shards=2), "w2")
    refused = other.register(flush=False, alive_ms=ALIVE_MS, spider="s")
    assert (refused.status, refused.shards) == ("shards", SHARDS)
    assert client.zscore(keys.workers, "w2") is None  # nothing written
    plain = Frontier(client, CrawlKeys("redisspine", "sharded"), "w3")
    assert plain.register(flush=False, alive_ms=ALIVE_MS, spider="s").status == "shards"
    assert client.hget(keys.record, "shards") == b"4"


def test_a_crawl_made_before_shards_has_one(client: redis.Redis) -> None:
    plain = Frontier(client, CrawlKeys("redisspine", "old"), "w1")
    assert plain.register(flush=False, alive_ms=ALIVE_MS, spider="s").status == "created"
    assert not client.hexists(CrawlKeys("redisspine", "old").record, "shards")
    sharded = ShardedFrontier(client, CrawlKeys("redisspine", "old", shards=3), "w2")
    refused = sharded.register(flush=False, alive_ms=ALIVE_MS, spider="s")
    assert (refused.status, refused.shards) == ("shards", 1)


def test_a_flush_empties_every_shard_and_takes_a_new_number(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes()
    frontier.enqueue([_request(lanes[shard][0], "p") for shard in range(SHARDS)])
    frontier.lease(2)
    group_busy = keys.group_busy
    assert client.hlen(group_busy) == 2
    frontier.leave()
    fresh = ShardedFrontier(client, CrawlKeys("redisspine", "sharded", shards=2), "w2")
    registration = fresh.register(flush=True, alive_ms=ALIVE_MS, spider="s")
    assert registration.flushed
    assert registration.status == "created"
    assert _queued(client, keys) == [0, 0, 0, 0]
    assert _inflight(client, keys) == [0, 0, 0, 0]
    assert client.hlen(group_busy) == 0  # the shards' slots left the group's counts
    assert client.hget(keys.record, "shards") == b"2"


def test_dead_letters_of_every_shard_are_listed_and_reinjected(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes()
    frontier.enqueue([_request(lanes[shard][0], "p") for shard in range(SHARDS)])
    for lease in frontier.lease(SHARDS).leases:
        assert frontier.bury(lease.handle, "cannot be processed") == 1
    letters = frontier.upkeep.dead_letters(100)
    assert sorted(int(letter.field.split("/")[0]) for letter in letters) == list(range(SHARDS))
    for letter in letters:
        assert split_key(letter.field)[0] == shard_of(letter.lane, SHARDS)
    assert frontier.upkeep.reinject_dead(letter.field for letter in letters[:3]) == 3
    assert frontier.upkeep.drop_dead([letters[3].field]) == 1
    assert sum(_queued(client, keys)) == 3
    assert len(frontier.upkeep.dead_letters(100)) == SHARDS - 4
    assert frontier.upkeep.counts() == (3, 0)


def test_a_purge_deletes_every_shard_and_frees_the_groups_slots(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes()
    frontier.enqueue([_request(lanes[shard][0], "p") for shard in range(SHARDS)])
    frontier.lease(3)
    assert client.hlen(keys.group_busy) == 3
    assert frontier.upkeep.purge() > 0
    assert client.hlen(keys.group_busy) == 0
    for view in keys.shard_views():
        assert not any(client.exists(getattr(view, name)) for name in SHARD_KEY_NAMES)
    assert client.hkeys(keys.record) == [b"purged_ms"]
    assert frontier.fleet_counts(ALIVE_MS).status == "purged"


def test_a_slot_for_a_request_in_memory_is_taken_in_its_lanes_shard(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    frontier = _frontier(client, keys)
    lane = _lanes()[2][0]
    lease, _, _ = frontier.take_slot(lane, 0, b"local marker")
    assert lease is not None
    assert split_key(lease.key)[0] == 2
    assert _inflight(client, keys) == [0, 0, 1, 0]
    assert frontier.ack([lease.handle]) == 1


def test_start_requests_are_found_in_their_shards(client: redis.Redis, keys: CrawlKeys) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes()
    starts = [_request(lanes[shard][0], "start", is_start=True) for shard in range(SHARDS)]
    assert frontier.enqueue(starts[:2]).statuses == "++"
    found = frontier.injected_starts([request.fingerprint for request in starts])
    assert found == [True, True, False, False]
    assert frontier.enqueue(starts).statuses == "ss++"
    frontier.upkeep.check_key_types()


def test_a_lease_fills_from_the_shards_that_have_work(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    """Each shard is asked for its share; what the empty ones leave is taken from
    those that gave all they were asked."""
    frontier = _frontier(client, keys)
    lanes = _lanes(per_shard=6)
    frontier.enqueue([_request(lane, "p") for lane in lanes[1]])
    for _ in range(SHARDS):  # whichever shard the rotation starts at
        batch = frontier.lease(6)
        assert len(batch.leases) == 6
        assert {split_key(lease.key)[0] for lease in batch.leases} == {1}
        assert (batch.queued, batch.inflight) == (0, 6)
        assert frontier.release([lease.handle for lease in batch.leases]) == 6


def _crawl_through(frontier: ShardedFrontier, lanes: dict[int, list[str]]) -> None:
    """One request per shard, leased and acked: the crawl is done."""
    frontier.done_starting()
    frontier.enqueue([_request(lanes[shard][0], "p") for shard in range(SHARDS)])
    leases = frontier.lease(SHARDS).leases
    assert frontier.ack([lease.handle for lease in leases]) == SHARDS


def test_persist_off_the_last_worker_deletes_every_shard(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    """The first to close marks the crawl finished; the last deletes all of it, every
    shard in the same step, and leaves the registries."""
    first, last = _frontier(client, keys, "first"), _frontier(client, keys, "last")
    last.done_starting()
    _crawl_through(first, _lanes())
    assert not first.upkeep.purge_if_done(first.epoch, ALIVE_MS)
    assert client.hget(keys.record, "finished_ms") is not None
    assert last.upkeep.purge_if_done(last.epoch, ALIVE_MS)
    assert [key for key in keys.all_crawl_keys() if client.exists(key)] == [keys.record]
    assert client.hgetall(keys.record) == {b"shards": str(SHARDS).encode()}, (
        "only the note of where its items streams are")
    assert not client.sismember(keys.crawls, keys.crawl_id)


def test_persist_off_keeps_a_crawl_whose_shard_still_holds_work(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    frontier = _frontier(client, keys)
    lanes = _lanes()
    _crawl_through(frontier, lanes)
    frontier.enqueue([_request(lanes[3][0], "late")])
    assert not frontier.upkeep.purge_if_done(frontier.epoch, ALIVE_MS)
    assert _queued(client, keys) == [0, 0, 0, 1]
    assert client.hget(keys.record, "epoch") == frontier.epoch.encode()


def test_the_queue_counted_is_every_shards_as_last_seen(
    client: redis.Redis, keys: CrawlKeys,
) -> None:
    """A lease asks only the shards it needs; the queue it reports (and the heartbeat,
    whose own count reads the crawl-wide queue a sharded crawl leaves empty) is every
    shard's as last seen: the worker's len(scheduler)."""
    frontier = _frontier(client, keys)
    lanes = _lanes(per_shard=2)
    frontier.enqueue([_request(lane, "p") for shard in range(SHARDS) for lane in lanes[shard]])
    assert frontier.lease(SHARDS).queued == SHARDS  # one from each shard, one left in each
    assert frontier.lease(1).queued == SHARDS - 1
    assert frontier.heartbeat().queued == SHARDS - 1
