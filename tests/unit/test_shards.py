"""Sharding's pure parts: the key layout, lane -> shard, routing, the double collect."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import pytest

from scrapy_redisspine._shards import (
    ShardCounts,
    double_collect,
    plan_enqueue,
    route,
)
from scrapy_redisspine.keys import SHARD_KEY_NAMES, CrawlKeys, shard_of

LANES = ("example.com", "a.test", "b.test", "127.0.0.2", "Straße.de", "", "x" * 300)


def _properties() -> list[str]:
    return [name for name, value in vars(CrawlKeys).items() if isinstance(value, property)]


def _tag(key: str) -> str:
    start = key.index("{")
    return key[start + 1 : key.index("}", start)]


def test_one_shard_names_every_key_as_before() -> None:
    """REDISSPINE_SHARDS = 1: the crawl-wide view and shard 0 are today's layout."""
    for cluster in (False, True):
        before = CrawlKeys("redisspine", "books", "shops", cluster=cluster)
        one = CrawlKeys("redisspine", "books", "shops", cluster=cluster, shards=1)
        for view in (one, one.shard_view(0)):
            for name in _properties():
                assert getattr(view, name) == getattr(before, name), name
        assert one.all_crawl_keys() == before.all_crawl_keys()
    plain = CrawlKeys("redisspine", "books")
    assert plain.queue == "redisspine:{books}:queue"
    assert plain.workers == "redisspine:{books}:workers"


def test_a_shard_holds_its_frontier_keys_and_shares_the_crawl_wide_ones() -> None:
    keys = CrawlKeys("redisspine", "books", shards=4)
    for index, view in enumerate(keys.shard_views()):
        for name in _properties():
            key = getattr(view, name)
            if name in SHARD_KEY_NAMES:
                assert _tag(key) == f"books/{index}", key
            else:
                assert key == getattr(keys, name), name
    frontier_keys = {getattr(view, name) for view in keys.shard_views()
                     for name in SHARD_KEY_NAMES}
    assert len(frontier_keys) == 4 * len(SHARD_KEY_NAMES)
    assert frontier_keys <= set(keys.all_crawl_keys())


def test_on_a_cluster_a_shards_group_keys_take_the_shards_tag() -> None:
    """One lease or ack stays in one slot: the shard's."""
    keys = CrawlKeys("redisspine", "books", "shops", cluster=True, shards=3)
    view = keys.shard_view(2)
    assert {_tag(key) for key in view.group_keys()} == {"books/2"}
    one_server = CrawlKeys("redisspine", "books", "shops", shards=3).shard_view(2)
    assert {_tag(key) for key in one_server.group_keys()} == {"g:shops"}


def test_bad_shard_numbers_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 1 shard"):
        CrawlKeys("redisspine", "books", shards=0)
    with pytest.raises(ValueError, match="not one of the crawl's 2"):
        CrawlKeys("redisspine", "books", shards=2).shard_view(2)
    with pytest.raises(ValueError, match="at least 1 shard"):
        shard_of("a.test", 0)


def test_lane_to_shard_is_crc32_of_the_lanes_bytes() -> None:
    for shards in (1, 2, 3, 6, 7):
        for lane in LANES:
            assert shard_of(lane, shards) == zlib.crc32(lane.encode()) % shards


def test_lane_to_shard_is_the_same_in_every_process() -> None:
    """Python's hash() is salted per process; shard_of must not be."""
    code = ("import sys; from scrapy_redisspine.keys import shard_of; "
            "print(' '.join(str(shard_of(l, 6)) for l in sys.argv[1:]))")
    seen = set()
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-c", code, *LANES], env=env, check=True,
                             capture_output=True, text=True)
        seen.add(run.stdout.strip())
    expected = " ".join(str(zlib.crc32(lane.encode()) % 6) for lane in LANES)
    assert seen == {expected}


def test_a_batch_is_routed_to_its_lanes_shards_in_order() -> None:
    lanes = ["a.test", "b.test", "a.test", "c.test", "b.test"]
    routed = route(lanes, 3)
    assert sorted(p for positions in routed.values() for p in positions) == list(range(5))
    for shard, positions in routed.items():
        assert positions == sorted(positions)
        assert all(shard_of(lanes[p], 3) == shard for p in positions)


def _lanes_of(shards: int) -> dict[int, str]:
    """One lane per shard, found with shard_of (nothing hard-coded)."""
    found: dict[int, str] = {}
    n = 0
    while len(found) < shards:
        found.setdefault(shard_of(f"h{n}.test", shards), f"h{n}.test")
        n += 1
    return found


def test_children_of_other_shards_go_before_the_ack_and_own_ones_with_it() -> None:
    lane = _lanes_of(3)
    plan = plan_enqueue([lane[1], lane[0], lane[2], lane[1]], [0], 3)
    assert plan.first == {1: [0, 3], 2: [2]}
    assert plan.last == {0: ([1], [0])}


def test_acks_in_several_shards_wait_for_every_child() -> None:
    """A's parent may have a child in B while B's parent has one in A: every child
    goes first, then the acks."""
    lane = _lanes_of(3)
    plan = plan_enqueue([lane[1], lane[0]], [0, 1, 0], 3)
    assert plan.first == {1: [0], 0: [1]}
    assert plan.last == {0: ([], [0, 2]), 1: ([], [1])}


def test_acks_alone_and_requests_alone() -> None:
    lane = _lanes_of(2)
    assert plan_enqueue([], [1], 2).last == {1: ([], [0])}
    assert plan_enqueue([], [1], 2).first == {}
    only = plan_enqueue([lane[0], lane[1]], [], 2)
    assert only.first == {0: [0], 1: [1]}
    assert only.last == {}


class _Shards:
    """Two shards' state, read as shard_counts.lua would."""

    def __init__(self) -> None:
        self.state = {0: ShardCounts(0, 0, True, 10), 1: ShardCounts(0, 1, True, 20)}
        self.reads: list[int] = []
        self.on_read: dict[int, object] = {}

    def read(self, index: int) -> ShardCounts:
        self.reads.append(index)
        hook = self.on_read.pop(len(self.reads), None)
        if callable(hook):
            hook()
        return self.state[index]

    def move_child_in_and_ack_parent(self) -> None:
        """A child enters shard 0 (enqueue), then its parent is acked in shard 1."""
        self.state[0] = ShardCounts(1, 0, True, 11)
        self.state[1] = ShardCounts(0, 0, True, 21)


def test_a_move_between_the_reads_is_not_taken_for_idle() -> None:
    shards = _Shards()
    # After shard 0 was read empty and before shard 1 is read: the move.
    shards.on_read[2] = shards.move_child_in_and_ack_parent
    collected = double_collect(shards.read, 2)
    first_pass = [ShardCounts(0, 0, True, 10), ShardCounts(0, 0, True, 21)]
    assert all(c.queued + c.inflight == 0 for c in first_pass)  # a single pass: "done"
    assert shards.reads == [0, 1, 0, 1]
    assert not collected.settled
    assert not collected.idle
    assert (collected.queued, collected.inflight) == (1, 0)


def test_a_quiet_idle_crawl_is_idle() -> None:
    shards = _Shards()
    shards.state[1] = ShardCounts(0, 0, True, 20)
    collected = double_collect(shards.read, 2)
    assert collected.settled
    assert collected.idle
    assert collected.ever
    assert collected.stamp == 30


def test_work_that_came_and_went_between_the_passes_unsettles_them() -> None:
    shards = _Shards()
    shards.state[1] = ShardCounts(0, 0, True, 20)

    def came_and_went() -> None:
        shards.state[0] = ShardCounts(0, 0, True, 12)  # enqueued, leased, acked
    shards.on_read[3] = came_and_went
    collected = double_collect(shards.read, 2)
    assert (collected.queued, collected.inflight) == (0, 0)
    assert not collected.idle
