"""From its 4th queued request on, a lane's new requests wait in a list per priority
(scripts/lib/lists.lua, issue 19): when lists are made, order (FIFO and LIFO, across
members and lists), priorities, put-back requests, the counts, and what happens when
a list or its counts are damaged by hand (never a request taken in silence, never a
crawl stuck). Run on fakeredis and on a real redis-server."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine.frontier import Frontier, NewRequest, priority_key
from scrapy_redisspine.members import index_entry, index_entry_parts, queue_size
from tests.queue_view import queued, queued_count

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.keys import CrawlKeys
    from tests.unit.conftest import FrontierFactory

LANE = "h.example"
WIDE = 10_000
#: Requests a lane holds before its new ones go to a list (lists.lua's lists_from)
LISTS_FROM = 4


def _new(*payloads: bytes, priority: int = 0, lane: str = LANE) -> list[NewRequest]:
    return [NewRequest(p, b"fp-" + p, priority=priority, lane=lane) for p in payloads]


def _payloads(frontier: Frontier, count: int = 100) -> list[bytes]:
    return [lease.payload for lease in frontier.lease(count).leases]


def _list(keys: CrawlKeys, priority: int = 0, lane: str = LANE) -> str:
    return keys.queue_list(lane, priority_key(priority))


@pytest.fixture
def wide(make_frontier: FrontierFactory) -> Frontier:
    return make_frontier("w1", concurrency=WIDE)


class TestOrder:
    @pytest.mark.parametrize(("order", "expected"), [
        ("fifo", [b"a", b"b", b"c", b"d", b"e", b"f"]),
        ("lifo", [b"f", b"e", b"d", b"c", b"b", b"a"])])
    def test_a_list_keeps_the_crawls_order_across_batches(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys,
        order: str, expected: list[bytes],
    ) -> None:
        frontier = make_frontier("w1", order, concurrency=WIDE)
        frontier.enqueue(_new(b"a", b"b", b"c", b"d"))
        frontier.enqueue(_new(b"e", b"f"))
        assert client.llen(crawl_keys.queue_list(LANE, priority_key(0), order == "lifo")) == 6
        assert _payloads(frontier, 2) == expected[:2]
        assert _payloads(frontier) == expected[2:]

    @pytest.mark.parametrize(("order", "expected"), [
        ("fifo", [b"a", b"b", b"c", b"d", b"e"]), ("lifo", [b"e", b"d", b"c", b"b", b"a"])])
    def test_a_lane_keeps_members_until_its_fourth_request_and_its_order_across(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys,
        order: str, expected: list[bytes],
    ) -> None:
        # one list key costs more than a few members: a lane of 1-3 requests (a broad
        # crawl's usual lane) keeps members; the order holds across the two
        frontier = make_frontier("w1", order, concurrency=WIDE)
        list_key = crawl_keys.queue_list(LANE, priority_key(0), order == "lifo")
        frontier.enqueue(_new(b"a", b"b"))
        frontier.enqueue(_new(b"c"))
        assert not client.exists(list_key)
        assert [r.member is not None for r in queued(client, crawl_keys)] == [True] * 3
        frontier.enqueue(_new(b"d"))  # the lane's 4th
        frontier.enqueue(_new(b"e"))
        assert client.lrange(list_key, 0, -1) == ([b"d", b"e"] if order == "fifo"
                                                  else [b"e", b"d"])
        assert frontier.upkeep.counts() == (5, 0)
        assert _payloads(frontier, 2) == expected[:2]
        assert _payloads(frontier) == expected[2:]

    def test_priorities_each_have_a_list_and_the_higher_goes_first(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        wide.enqueue(_new(b"low", priority=-5) + _new(b"mid") + _new(b"high", priority=9)
                     + _new(b"more"))
        wide.enqueue(_new(b"mid2") + _new(b"high2", priority=9))
        entries = client.zrange(crawl_keys.queue, 0, -1)
        assert entries == [index_entry(LANE, priority_key(p)) for p in (9, 0, -5)]
        assert _payloads(wide, 3) == [b"high", b"high2", b"mid"]
        assert _payloads(wide) == [b"more", b"mid2", b"low"]

    def test_a_put_back_request_goes_before_the_list_of_its_priority(
        self, wide: Frontier
    ) -> None:
        wide.enqueue(_new(b"a", b"b", b"c", b"d"))
        (first,) = wide.lease(1).leases
        assert wide.release([first.handle]) == 1
        wide.enqueue(_new(b"e"))
        assert _payloads(wide) == [b"a", b"b", b"c", b"d", b"e"]

    def test_with_lifo_a_put_back_request_goes_after_the_list_of_its_priority(
        self, make_frontier: FrontierFactory
    ) -> None:
        # LIFO's index entry sorts before the members of its priority: the list (the
        # newest requests) first, then members (older, or put back)
        frontier = make_frontier("w1", "lifo", concurrency=WIDE)
        frontier.enqueue(_new(b"a", b"b", b"c", b"d"))
        (first,) = frontier.lease(1).leases
        assert first.payload == b"d"
        assert frontier.release([first.handle]) == 1
        frontier.enqueue(_new(b"e"))
        assert _payloads(frontier) == [b"e", b"c", b"b", b"a", b"d"]

    def test_one_lease_takes_across_lists_and_members_in_order(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        wide.enqueue(_new(b"x1", b"x2", priority=3) + _new(b"y1", b"y2"))  # 4: lists
        held = wide.lease(1).leases  # x1
        wide.release([lease.handle for lease in held])
        batch = wide.lease(3)
        assert [lease.payload for lease in batch.leases] == [b"x1", b"x2", b"y1"]
        assert len({lease.key for lease in batch.leases}) == 3
        assert batch.queued == 1
        assert not client.exists(_list(crawl_keys, 3)), "an emptied list goes"
        assert client.zrange(crawl_keys.queue, 0, -1) == [index_entry(LANE, priority_key(0))]


class TestCounts:
    def test_the_counts_follow_every_move(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        other = _new(b"e", b"f", b"g", b"h", lane="other.example")
        assert wide.enqueue(_new(b"a", b"b", b"c", b"d") + other).repairs == ()
        assert client.hgetall(crawl_keys.queue_counts) == {b"requests": b"8", b"lists": b"2"}
        assert wide.upkeep.counts() == (8, 0)
        first = wide.lease(1)  # a list that keeps requests: no list emptied
        assert first.repairs == (), "the counts are numbers: nothing is counted again"
        assert wide.upkeep.counts() == (7, 1)
        second = wide.lease(1)
        assert second.repairs == ()
        leases = first.leases + second.leases
        assert wide.upkeep.counts() == (6, 2)
        wide.release([leases[0].handle])
        assert wide.upkeep.counts() == (7, 1)
        assert queued_count(client, crawl_keys) == 7
        rest = wide.lease(10)
        assert rest.repairs == ()
        assert wide.ack([lease.handle for lease in rest.leases] + [leases[1].handle]) == 8
        assert wide.upkeep.counts() == (0, 0)
        assert client.hgetall(crawl_keys.queue_counts) == {b"requests": b"0", b"lists": b"0"}

    @pytest.mark.parametrize("garbage", [{"requests": "lots"}, {"lists": "-"}])
    def test_garbage_counts_are_counted_again_and_never_read_as_empty(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys,
        garbage: dict[str, str],
    ) -> None:
        wide.enqueue(_new(b"a", b"b", b"c", b"d"))
        client.hset(crawl_keys.queue_counts, mapping=garbage)
        queued_now, _ = wide.upkeep.counts()
        assert queued_now >= 1, "a queue that holds requests never reads as empty"
        result = wide.enqueue(_new(b"e"))
        assert any(repair.startswith(crawl_keys.queue_counts + " ")
                   for repair in result.repairs)
        assert wide.upkeep.counts() == (5, 0)
        assert _payloads(wide) == [b"a", b"b", b"c", b"d", b"e"]

    def test_counts_of_the_wrong_type_are_counted_again(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        wide.enqueue(_new(b"a", b"b", b"c", b"d"))
        client.delete(crawl_keys.queue_counts)
        client.set(crawl_keys.queue_counts, "a string")
        assert wide.upkeep.counts()[0] >= 1
        batch = wide.lease(1)
        assert [lease.payload for lease in batch.leases] == [b"a"]
        assert any(repair.startswith(crawl_keys.queue_counts + " ") for repair in batch.repairs)
        assert wide.upkeep.counts() == (3, 1)

    def test_queue_size_reads_what_the_scripts_count(self) -> None:
        assert queue_size(2, [b"10", b"2"]) == 10
        assert queue_size(3, [None, None]) == 3
        assert queue_size(3, [b"x", b"1"]) == 3, "garbage adds nothing"
        assert queue_size(1, [b"0", b"5"]) == 1, "never below the ZSET's own"


class TestDamage:
    def test_a_list_deleted_by_hand_is_reported_and_the_crawl_goes_on(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        wide.enqueue(_new(b"lost1", b"lost2", b"lost3", b"lost4")
                     + _new(b"kept", lane="other.example"))
        client.delete(_list(crawl_keys))
        batch = wide.lease(10)
        assert [lease.payload for lease in batch.leases] == [b"kept"]
        assert any(repair.startswith(_list(crawl_keys) + " ") for repair in batch.repairs)
        assert wide.ack([lease.handle for lease in batch.leases]) == 1
        assert wide.upkeep.counts() == (0, 0)
        assert not client.exists(crawl_keys.backlog, crawl_keys.hosts)
        assert client.zcard(crawl_keys.queue) == 0

    def test_a_list_of_the_wrong_type_is_reported_and_left_alone(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        wide.enqueue(_new(b"lost1", b"lost2", b"lost3", b"lost4"))
        client.delete(_list(crawl_keys))
        client.set(_list(crawl_keys), "a string")
        batch = wide.lease(10)
        assert batch.leases == []
        assert any(repair.startswith(_list(crawl_keys) + " ") for repair in batch.repairs)
        assert client.get(_list(crawl_keys)) == b"a string"
        assert wide.upkeep.counts() == (0, 0)

    def test_requests_for_a_list_of_the_wrong_type_are_queued_as_members(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.set(_list(crawl_keys), "a string")
        result = wide.enqueue(_new(b"a", b"b", b"c", b"d"))
        assert result.statuses == "++++"
        assert any(repair.startswith(_list(crawl_keys) + " ") for repair in result.repairs)
        assert [request.member is not None for request in queued(client, crawl_keys)] == [
            True] * 4
        assert wide.upkeep.counts() == (4, 0)
        assert _payloads(wide) == [b"a", b"b", b"c", b"d"]

    def test_a_list_no_entry_reaches_is_not_taken_for_the_crawls(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # left by a crawl flushed before, or its entry deleted by hand
        client.rpush(_list(crawl_keys), b"stale1", b"stale2")
        fresh = [b"fresh%d" % i for i in range(LISTS_FROM)]
        result = wide.enqueue(_new(*fresh))
        assert any(repair.startswith(_list(crawl_keys) + " ") for repair in result.repairs)
        assert wide.upkeep.counts() == (LISTS_FROM, 0)
        assert _payloads(wide) == fresh

    def test_index_entries_are_never_taken_for_requests(self) -> None:
        assert index_entry_parts(index_entry(LANE, priority_key(-2))) == (
            LANE, priority_key(-2))
        assert index_entry_parts(index_entry(LANE, priority_key(3), lifo=True)) == (
            LANE, priority_key(3))
        member = b"%s\0%s%015d~" % (LANE.encode(), priority_key(0).encode(), 7)
        assert index_entry_parts(member) is None, "a member whose payload is '~'"
        assert index_entry_parts(b"garbage~") is None


class TestWholeCrawl:
    def test_purge_deletes_every_list(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        wide.enqueue(_new(b"a", b"a2") + _new(b"b", b"b2", priority=2)
                     + _new(b"c", b"c2", b"c3", b"c4", lane="o.example"))
        assert len(client.keys(crawl_keys.queue + ":*")) == 3
        wide.upkeep.purge()
        assert client.keys(crawl_keys.queue + "*") == []

    def test_a_flush_deletes_every_list(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        first = make_frontier("w1", concurrency=WIDE)
        first.register(flush=False, alive_ms=30_000, spider="s")
        first.enqueue(_new(b"a", b"a2", b"a3", b"a4") + _new(b"b", lane="o.example"))
        assert client.keys(crawl_keys.queue + ":*")
        first.leave()
        again = make_frontier("w2", concurrency=WIDE)
        assert again.register(flush=True, alive_ms=30_000, spider="s").flushed
        assert client.keys(crawl_keys.queue + "*") == []
        again.enqueue(_new(b"new"))
        assert _payloads(again) == [b"new"]


def test_a_full_redis_still_leases_from_lists(
    real_redis: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    # (a real server: fakeredis has no maxmemory) LTRIM, the first write, is no
    # "denyoom" command: leases, which free memory once acked, go on.
    frontier = Frontier(real_redis, crawl_keys, "w1", concurrency=WIDE)
    frontier.enqueue(_new(b"a", b"b", b"c", b"d"))
    real_redis.config_set("maxmemory", 1)
    try:
        batch = frontier.lease(2)  # LTRIM
        rest = frontier.lease(10)  # UNLINK
    finally:
        real_redis.config_set("maxmemory", 0)
    assert [lease.payload for lease in batch.leases + rest.leases] == [b"a", b"b", b"c", b"d"]
