"""The frontier contract, run on fakeredis and on a real redis-server.

Every state change is one Lua script; these tests pin what each script promises
(statuses, ownership, order, atomic moves between keys) and that the scripts behave
the same on both backends.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
import redis

from scrapy_redisspine.frontier import (
    ORDER_KEY_LENGTH,
    PRIORITY_KEY_LENGTH,
    CorruptKeyError,
    Frontier,
    Lease,
    LeaseHandle,
    NewRequest,
    Registration,
    priority_key,
    split_member,
)
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.members import index_entry
from tests.queue_view import queued, queued_count

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.unit.conftest import FrontierFactory

ALIVE_MS = 30_000
#: A lane concurrency no test reaches: leases are never held back by politeness
#: (tests/unit/test_politeness.py covers the per-lane limits).
WIDE = 10_000


def _requests(*payloads: bytes, **kwargs: Any) -> list[NewRequest]:
    return [NewRequest(payload, b"fp-" + payload, **kwargs) for payload in payloads]


def _payloads(frontier: Frontier, count: int = 100) -> list[bytes]:
    return [lease.payload for lease in frontier.lease(count).leases]


def _member(payload: bytes, key: str, lane: str = "", priority: int = 0) -> bytes:
    """The queue member enqueue writes: lane, NUL, priority key, order key, payload."""
    return lane.encode() + b"\0" + priority_key(priority).encode() + key.encode() + payload


@pytest.fixture
def wide(make_frontier: FrontierFactory) -> Frontier:
    """Worker w1 with a lane concurrency no test reaches: many leases of one lane."""
    return make_frontier(concurrency=WIDE)


def _existing(client: redis.Redis, *keys: str) -> list[str]:
    """Those of ``keys`` that exist, in the order given."""
    return [key for key in keys if client.exists(key)]


def _stats(client: redis.Redis, keys: CrawlKeys) -> dict[str, int]:
    return {name.decode(): int(value) for name, value in client.hgetall(keys.stats).items()}


def _declare_dead(client: redis.Redis, keys: CrawlKeys, worker_id: str) -> None:
    """Make ``worker_id``'s last heartbeat ancient (1 ms after the epoch)."""
    client.zadd(keys.workers, {worker_id: 1})


def _sweep_as_dead(frontier: Frontier, client: redis.Redis, keys: CrawlKeys) -> int:
    """Declare ``frontier``'s worker dead, requeue the leases of every worker silent for
    over a minute; the number requeued."""
    _declare_dead(client, keys, frontier.worker_id)
    return frontier.upkeep.requeue_stale(
        timeout_ms=60_000, ceiling_ms=0, max_requeues=10, limit=1000
    ).requeued


def _leased(frontier: Frontier, payload: bytes = b"a") -> Lease:
    """Enqueue one request and lease it."""
    frontier.enqueue(_requests(payload))
    (lease,) = frontier.lease(1).leases
    return lease


def _requeued_back_to(
    frontier: Frontier, client: redis.Redis, keys: CrawlKeys, lease: Lease
) -> Lease:
    """Sweep ``lease`` back to the queue (its owner declared dead), lease it again."""
    assert _sweep_as_dead(frontier, client, keys) == 1
    (again,) = frontier.lease(1).leases
    assert again.key == lease.key
    assert again.token != lease.token
    return again


@dataclass(frozen=True)
class _Ending:
    """One of the three ways a lease ends (ack, release, bury), run on a list of handles."""

    name: str
    #: Ends the leases behind the handles; how many it ended.
    run: Callable[[Frontier, list[LeaseHandle]], int]
    #: The counter in ``stats`` it bumps.
    stat: str
    #: (queued, inflight) once it ended a crawl's only lease.
    counts_after: tuple[int, int]
    #: The dead letters' reasons it leaves behind, having ended that lease.
    letters: tuple[str, ...] = ()


BURY_REASON = "cannot be processed"
ENDINGS = (
    _Ending("ack", lambda frontier, handles: frontier.ack(handles), "acked", (0, 0)),
    _Ending("release", lambda frontier, handles: frontier.release(handles), "released", (1, 0)),
    _Ending(
        "bury",
        lambda frontier, handles: sum(frontier.bury(handle, BURY_REASON) for handle in handles),
        "dead_lettered", (0, 0), (BURY_REASON,),
    ),
)


def _endings(*names: str) -> list[Any]:
    """``ENDINGS`` (those named, if any) as parameters with readable ids."""
    return [pytest.param(end, id=end.name) for end in ENDINGS if not names or end.name in names]


#: An order key no request has.
UNKNOWN_KEY = "999999999999999"


def _assert_held(
    client: redis.Redis, keys: CrawlKeys, lease: Lease, owner: str = "w1"
) -> None:
    """``lease`` is still in flight as leased (entry with owner and token, lease time,
    owner index), and nothing is dead-lettered."""
    entry = client.hget(keys.inflight, lease.key)
    assert entry is not None
    assert entry.startswith(f"{owner}\n{lease.token}\n".encode())
    assert client.zscore(keys.leases, lease.key) is not None
    assert client.zscore(keys.owned, f"{owner}\n{lease.key}") == 0
    assert not client.exists(keys.dead)


def _assert_refused_then_ended(
    client: redis.Redis, keys: CrawlKeys, ending: _Ending, *,
    by: Frontier, handle: LeaseHandle, holder: Frontier, lease: Lease,
) -> None:
    """``by``, presenting ``handle``, is refused and changes nothing; then ``holder``
    ends ``lease`` (the crawl's only lease, its own) with the lease's handle."""
    assert ending.run(by, [handle]) == 0
    _assert_held(client, keys, lease, holder.worker_id)
    assert holder.upkeep.counts() == (0, 1)
    assert ending.stat not in _stats(client, keys)
    assert ending.run(holder, [lease.handle]) == 1
    assert holder.upkeep.counts() == ending.counts_after
    assert _stats(client, keys)[ending.stat] == 1
    assert tuple(letter.reason for letter in holder.upkeep.dead_letters()) == ending.letters


class TestEnqueue:
    def test_statuses_per_request(self, frontier: Frontier) -> None:
        result = frontier.enqueue(
            [
                NewRequest(b"a", b"fp-a"),
                NewRequest(b"a again", b"fp-a"),
                NewRequest(b"start", b"fp-s", is_start=True, dont_filter=True),
                NewRequest(b"start again", b"fp-s", is_start=True, dont_filter=True),
            ]
        )
        assert result.statuses == "+d+s"
        assert result.enqueued == 2
        assert result.acked == 0

    def test_empty_batch(self, frontier: Frontier) -> None:
        assert frontier.enqueue([]).statuses == ""

    def test_seen_fingerprint_is_filtered_across_calls_and_workers(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        first, second = make_frontier("w1"), make_frontier("w2")
        assert first.enqueue([NewRequest(b"a", b"fp")]).statuses == "+"
        assert second.enqueue([NewRequest(b"b", b"fp")]).statuses == "d"
        assert client.smembers(crawl_keys.seen) == {b"fp"}
        assert queued_count(client, crawl_keys) == 1
        stats = _stats(client, crawl_keys)
        assert stats["enqueued"] == 1
        assert stats["filtered"] == 1

    def test_dont_filter_skips_and_does_not_record_the_seen_check(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        assert frontier.enqueue([NewRequest(b"a", b"fp")]).statuses == "+"
        result = frontier.enqueue(
            [NewRequest(b"a", b"fp", dont_filter=True), NewRequest(b"b", b"fp2", dont_filter=True)]
        )
        assert result.statuses == "++"
        assert client.smembers(crawl_keys.seen) == {b"fp"}
        assert queued_count(client, crawl_keys) == 3

    def test_start_request_enters_once_even_with_dont_filter(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        start = NewRequest(b"start", b"fp-start", dont_filter=True, is_start=True)
        assert make_frontier("w1").enqueue([start]).statuses == "+"
        assert make_frontier("w2").enqueue([start]).statuses == "s"
        assert make_frontier("w3").enqueue([start, start]).statuses == "ss"
        assert queued_count(client, crawl_keys) == 1
        assert client.smembers(crawl_keys.starts) == {b"fp-start"}
        assert not client.exists(crawl_keys.seen)

    def test_start_request_already_seen_as_a_link_is_a_duplicate(
        self, frontier: Frontier
    ) -> None:
        assert frontier.enqueue([NewRequest(b"link", b"fp")]).statuses == "+"
        assert frontier.enqueue([NewRequest(b"start", b"fp", is_start=True)]).statuses == "d"

    def test_filtered_start_request_records_both_sets(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([NewRequest(b"start", b"fp", is_start=True)])
        assert client.smembers(crawl_keys.starts) == {b"fp"}
        assert client.smembers(crawl_keys.seen) == {b"fp"}
        assert frontier.enqueue([NewRequest(b"link", b"fp")]).statuses == "d"

    def test_flags(self) -> None:
        assert NewRequest(b"x").flags() == "f"
        assert NewRequest(b"x", dont_filter=True).flags() == "-"
        assert NewRequest(b"x", is_start=True).flags() == "fs"
        assert NewRequest(b"x", dont_filter=True, is_start=True).flags() == "s"

    def test_push_enqueues_from_outside(self, wide: Frontier) -> None:
        assert wide.push(_requests(b"a", b"b")).statuses == "++"
        assert _payloads(wide) == [b"a", b"b"]

    def test_a_lanes_first_requests_are_members(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([NewRequest(b"\x00pay\nload", b"fp", priority=-3, lane="example.com")])
        ((member, score),) = client.zrange(crawl_keys.queue, 0, -1, withscores=True)
        assert score == 0
        lane, key, payload = split_member(member)
        assert (lane, payload) == ("example.com", b"\x00pay\nload")
        assert len(key) == ORDER_KEY_LENGTH
        assert key.isdigit()
        assert member == _member(b"\x00pay\nload", key, "example.com", -3)
        assert not client.exists(crawl_keys.queue_counts)

    def test_from_a_lanes_fourth_request_new_ones_wait_in_its_list_of_their_priority(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([NewRequest(b"first", b"fp", priority=-3, lane="example.com")])
        frontier.enqueue([NewRequest(b"p%d\x00\n" % i, b"fp%d" % i, priority=-3,
                                     lane="example.com") for i in range(3)])
        (member, entry) = client.zrange(crawl_keys.queue, 0, -1)
        assert split_member(member)[2] == b"first"
        assert entry == index_entry("example.com", priority_key(-3))
        assert client.lrange(crawl_keys.queue_list("example.com", priority_key(-3)), 0, -1) == [
            b"p0\x00\n", b"p1\x00\n", b"p2\x00\n"]
        assert client.hgetall(crawl_keys.queue_counts) == {b"requests": b"3", b"lists": b"1"}
        assert client.hgetall(crawl_keys.backlog) == {b"example.com": b"4"}
        assert client.zrange(crawl_keys.hosts, 0, -1) == [b"example.com"]
        assert frontier.upkeep.counts() == (4, 0)

    def test_a_request_leased_from_a_list_gets_an_order_key_and_its_member(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([NewRequest(b"\x00pay\nload%d" % i, b"fp%d" % i, priority=-3,
                                     lane="example.com") for i in range(4)])
        (lease,) = frontier.lease(1).leases
        assert len(lease.key) == ORDER_KEY_LENGTH
        assert lease.key.isdigit()
        member = client.hget(crawl_keys.inflight, lease.key).split(b"\n", 2)[2]
        lane, key, payload = split_member(member)
        assert (lane, key, payload) == ("example.com", lease.key, b"\x00pay\nload0")
        assert member == _member(b"\x00pay\nload0", lease.key, "example.com", -3)
        assert client.llen(crawl_keys.queue_list("example.com", priority_key(-3))) == 3
        assert client.hgetall(crawl_keys.queue_counts) == {b"requests": b"3", b"lists": b"1"}

    def test_unknown_order_is_refused(self, client: redis.Redis, crawl_keys: CrawlKeys) -> None:
        with pytest.raises(ValueError, match="order"):
            Frontier(client, crawl_keys, "w1", "random")


class TestPriorityKey:
    def test_sorts_higher_priorities_first(self) -> None:
        priorities = [2**40, 2**31 - 1, 1_000_000, 5, 1, 0, -1, -5, -(2**31), -(2**40)]
        keys = [priority_key(p) for p in priorities]
        assert all(len(key) == PRIORITY_KEY_LENGTH and key.isascii() for key in keys)
        assert all(":" <= key[0] <= "~" and min(key[1:]) >= "!" for key in keys)
        assert keys == sorted(keys)
        assert len(set(keys)) == len(keys) - 2, "beyond 32 bits priorities are clamped"

    def test_clamps_to_32_bits(self) -> None:
        assert priority_key(2**40) == priority_key(2**31 - 1) == ":!!!!"  # 0
        assert priority_key(-(2**40)) == priority_key(-(2**31)) == 'q""|J'  # 2**32 - 1
        assert priority_key(0) == "UPP}d"

    def test_every_key_sorts_as_its_number(self) -> None:
        priorities = sorted({*range(-300, 300), *(2**k for k in range(32)),
                             *(-(2**k) for k in range(32)), *(94**k - 1 for k in range(1, 5))},
                            reverse=True)
        keys = [priority_key(p) for p in priorities]
        assert keys == sorted(keys)
        assert len(set(keys)) == len(keys)

    def test_split_member_round_trip(self) -> None:
        key = "000000000000042"
        member = _member(b"\x00body\n", key, "h\u00e9.example", 9)
        assert split_member(member) == ("h\u00e9.example", key, b"\x00body\n")
        assert split_member(_member(b"", key)) == ("", key, b"")


class TestOrder:
    """Priority, then FIFO/LIFO, within one lane (all these requests share lane "")."""

    @pytest.fixture
    def frontier(self, wide: Frontier) -> Frontier:
        return wide

    def test_higher_priority_first(self, frontier: Frontier) -> None:
        frontier.enqueue(
            [
                NewRequest(b"p0", b"1", priority=0),
                NewRequest(b"p10", b"2", priority=10),
                NewRequest(b"p-5", b"3", priority=-5),
                NewRequest(b"p3", b"4", priority=3),
            ]
        )
        assert _payloads(frontier) == [b"p10", b"p3", b"p0", b"p-5"]

    @pytest.mark.parametrize(
        ("order", "first", "second"),
        [
            # Each time the batch the order alone would lease first holds the low priority.
            pytest.param("fifo", NewRequest(b"low", b"1", priority=-1),
                         NewRequest(b"high", b"2", priority=1), id="fifo"),
            pytest.param("lifo", NewRequest(b"high", b"1", priority=5),
                         NewRequest(b"low", b"2"), id="lifo"),
        ],
    )
    def test_priority_wins_across_batches(
        self, make_frontier: FrontierFactory, order: str, first: NewRequest, second: NewRequest
    ) -> None:
        frontier = make_frontier(order=order, concurrency=WIDE)
        frontier.enqueue([first])
        frontier.enqueue([second])
        assert _payloads(frontier, 1) == [b"high"]
        assert _payloads(frontier, 1) == [b"low"]

    @pytest.mark.parametrize(
        ("order", "expected"),
        [
            pytest.param("fifo", [b"a", b"b", b"c"], id="fifo"),
            pytest.param("lifo", [b"c", b"b", b"a"], id="lifo"),
        ],
    )
    def test_order_among_equal_priorities(
        self, make_frontier: FrontierFactory, order: str, expected: list[bytes]
    ) -> None:
        frontier = make_frontier(order=order, concurrency=WIDE)
        frontier.enqueue(_requests(b"a", b"b"))
        frontier.enqueue(_requests(b"c"))
        assert _payloads(frontier) == expected

    def test_order_survives_more_than_nine_requests(self, frontier: Frontier) -> None:
        # Order keys are zero-padded: "10" must not sort before "9".
        payloads = [f"r{i:03d}".encode() for i in range(25)]
        frontier.enqueue(_requests(*payloads))
        assert _payloads(frontier) == payloads

    def test_priority_orders_each_lane_on_its_own(self, frontier: Frontier) -> None:
        frontier.enqueue(
            [
                NewRequest(b"a-low", b"1", priority=-1, lane="a.example"),
                NewRequest(b"b-mid", b"2", priority=0, lane="b.example"),
                NewRequest(b"a-high", b"3", priority=9, lane="a.example"),
                NewRequest(b"b-high", b"4", priority=5, lane="b.example"),
                NewRequest(b"a-mid", b"5", priority=0, lane="a.example"),
                NewRequest(b"b-mid2", b"6", priority=0, lane="b.example"),
            ]
        )
        leases = frontier.lease(100).leases
        by_lane: dict[str, list[bytes]] = {}
        for lease in leases:
            by_lane.setdefault(lease.lane, []).append(lease.payload)
        assert by_lane == {
            "a.example": [b"a-high", b"a-mid", b"a-low"],
            "b.example": [b"b-high", b"b-mid", b"b-mid2"],
        }


class TestLease:
    def test_lease_moves_requests_to_inflight_and_leases_atomically(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = wide
        frontier.enqueue(_requests(b"a", b"b", b"c", lane="example.com"))
        before_ms = int(time.time() * 1000)
        batch = frontier.lease(2)
        after_ms = int(time.time() * 1000)

        assert [lease.payload for lease in batch.leases] == [b"a", b"b"]
        assert (batch.queued, batch.inflight, batch.malformed) == (1, 2, 0)
        assert queued_count(client, crawl_keys) == 1
        (token,) = {lease.token for lease in batch.leases}  # one token per lease call
        assert token.isdigit()
        for lease in batch.leases:
            assert len(lease.key) == ORDER_KEY_LENGTH
            assert lease.key.isdigit()
            assert lease.handle == (lease.key, token)
            assert lease.requeues == 0
            assert (lease.lane, lease.crawl_delay) == ("example.com", None)
            entry = client.hget(crawl_keys.inflight, lease.key)
            assert entry == f"w1\n{token}\n".encode() + _member(
                lease.payload, lease.key, "example.com"
            )
            leased_at = client.zscore(crawl_keys.leases, lease.key)
            assert leased_at is not None
            assert before_ms - 1000 <= leased_at <= after_ms + 1000
        assert client.zrange(crawl_keys.owned, 0, -1, withscores=True) == [
            (f"w1\n{lease.key}".encode(), 0.0) for lease in batch.leases
        ]
        assert not client.exists(crawl_keys.requeues)
        assert frontier.upkeep.counts() == (1, 2)
        assert _stats(client, crawl_keys)["leased"] == 2
        assert client.hgetall(crawl_keys.busy) == {b"example.com": b"2"}
        assert client.hgetall(crawl_keys.backlog) == {b"example.com": b"1"}

    def test_each_lease_call_gets_a_new_token(self, wide: Frontier) -> None:
        wide.enqueue(_requests(b"a", b"b"))
        (first,) = wide.lease(1).leases
        (second,) = wide.lease(1).leases
        assert first.token != second.token

    def test_entry_keeps_the_whole_queue_member(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([NewRequest(b"a", b"1", priority=4, lane="h.example")])
        first = frontier.lease(1).leases[0]
        frontier.release([first.handle])  # back in the queue as a member
        (member,) = client.zrange(crawl_keys.queue, 0, -1)
        (lease,) = frontier.lease(1).leases
        entry = client.hget(crawl_keys.inflight, lease.key)
        assert entry == f"w1\n{lease.token}\n".encode() + member
        assert member == _member(b"a", lease.key, "h.example", 4)

    def test_lease_carries_the_lanes_learned_crawl_delay(self, wide: Frontier) -> None:
        wide.enqueue(_requests(b"a", lane="slow.example") + _requests(b"b", lane="fast.example"))
        wide.set_crawl_delay("slow.example", 2.5)
        leases = {lease.lane: lease for lease in wide.lease(10).leases}
        assert leases["slow.example"].crawl_delay == 2.5
        assert leases["fast.example"].crawl_delay is None

    def test_lease_more_than_available(self, wide: Frontier) -> None:
        frontier = wide
        frontier.enqueue(_requests(b"a", b"b"))
        batch = frontier.lease(10)
        assert [lease.payload for lease in batch.leases] == [b"a", b"b"]
        assert (batch.queued, batch.inflight) == (0, 2)
        empty = frontier.lease(10)
        assert empty.leases == []
        assert (empty.queued, empty.inflight) == (0, 2)

    def test_lease_nothing_reports_counts(self, frontier: Frontier) -> None:
        frontier.enqueue(_requests(b"a"))
        batch = frontier.lease(0)
        assert batch.leases == []
        assert (batch.queued, batch.inflight) == (1, 0)

    def test_lease_on_an_empty_crawl(self, frontier: Frontier) -> None:
        batch = frontier.lease(5)
        assert (batch.leases, batch.queued, batch.inflight) == ([], 0, 0)

    def test_inflight_counts_are_fleet_wide(self, make_frontier: FrontierFactory) -> None:
        first = make_frontier("w1", concurrency=WIDE)
        second = make_frontier("w2", concurrency=WIDE)
        first.enqueue(_requests(b"a", b"b", b"c"))
        first.lease(1)
        batch = second.lease(1)
        assert (batch.queued, batch.inflight) == (1, 2)


class TestAck:
    def test_ack_by_owner(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = wide
        frontier.enqueue(_requests(b"a", b"b"))
        handles = [lease.handle for lease in frontier.lease(2).leases]
        assert frontier.ack(handles) == 2
        assert frontier.upkeep.counts() == (0, 0)
        assert _existing(
            client, crawl_keys.leases, crawl_keys.owned, crawl_keys.busy, crawl_keys.backlog,
            crawl_keys.hosts,
        ) == []
        assert _stats(client, crawl_keys)["acked"] == 2

    def test_ack_takes_handles_and_acks_with_a_rest(self, wide: Frontier) -> None:
        wide.enqueue(_requests(b"a", b"b", b"c"))
        a, b, c = wide.lease(3).leases
        assert wide.ack([a.handle, (b.key, b.token, 0), (c.key, c.token, 1)]) == 3

    def test_token_that_prefixes_the_real_one_cannot_ack(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue(_requests(b"a"))
        client.set(crawl_keys.seq, 100)  # the next token has three digits
        (lease,) = frontier.lease(1).leases
        assert lease.token == "101"
        for forged in ("10", "1", "", "1010", "101\n"):
            assert frontier.ack([(lease.key, forged)]) == 0, forged
        assert frontier.upkeep.counts() == (0, 1)
        assert frontier.ack([lease.handle]) == 1

    def test_ack_twice_counts_once(self, frontier: Frontier) -> None:
        lease = _leased(frontier)
        assert frontier.ack([lease.handle]) == 1
        assert frontier.ack([lease.handle]) == 0

    def test_ack_forgets_the_requeue_count(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        lease = _leased(frontier)
        again = _requeued_back_to(frontier, client, crawl_keys, lease)
        assert again.requeues == 1
        assert frontier.ack([again.handle]) == 1
        assert not client.exists(crawl_keys.requeues)

    def test_enqueue_children_and_ack_parent_in_one_call(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = wide
        parent = _leased(frontier, b"parent")
        result = frontier.enqueue(_requests(b"child1", b"child2", b"parent"), [parent.handle])
        assert result.statuses == "++d"
        assert result.acked == 1
        assert frontier.upkeep.counts() == (2, 0)
        assert client.hget(crawl_keys.inflight, parent.key) is None
        assert _payloads(frontier) == [b"child1", b"child2"]

    def test_enqueue_with_refused_ack_still_enqueues(self, make_frontier: FrontierFactory) -> None:
        owner, other = make_frontier("w1"), make_frontier("w2")
        parent = _leased(owner, b"parent")
        result = other.enqueue(_requests(b"child"), [parent.handle])
        assert (result.statuses, result.acked) == ("+", 0)
        assert owner.upkeep.counts() == (1, 1)


class TestRelease:
    def test_release_restores_priority_and_order(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = wide
        frontier.enqueue(
            [
                NewRequest(b"a", b"1"),
                NewRequest(b"b", b"2"),
                NewRequest(b"high", b"3", priority=1_000_000),
                NewRequest(b"low", b"4", priority=-7),
            ]
        )
        queue_before = {request[:3] for request in queued(client, crawl_keys)}
        leases = frontier.lease(2).leases  # high, a
        frontier.enqueue(_requests(b"c"))
        assert frontier.release([lease.handle for lease in leases]) == 2
        queue_after = {request[:3] for request in queued(client, crawl_keys)}
        assert queue_before <= queue_after
        assert frontier.upkeep.counts() == (5, 0)
        assert _existing(
            client, crawl_keys.inflight, crawl_keys.leases, crawl_keys.owned, crawl_keys.busy
        ) == []
        assert client.hgetall(crawl_keys.backlog) == {b"": b"5"}
        assert _payloads(frontier) == [b"high", b"a", b"b", b"c", b"low"]
        assert _stats(client, crawl_keys)["released"] == 2

    def test_release_keeps_the_order_key(self, frontier: Frontier) -> None:
        first = _leased(frontier)
        frontier.release([first.handle])
        (second,) = frontier.lease(1).leases
        assert (second.key, second.payload) == (first.key, first.payload)
        assert second.token != first.token
        assert second.requeues == 0, "a release is not a requeue"


class TestBury:
    def test_bury_moves_lease_to_dead_letters_with_reason(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([NewRequest(b"bad\npayload", b"1", priority=4, lane="h.example")])
        (lease,) = frontier.lease(1).leases
        assert frontier.bury(lease.handle, "does not\ndecode")
        entry = client.hget(crawl_keys.dead, lease.key)
        assert entry == b"does not decode\n" + _member(
            b"bad\npayload", lease.key, "h.example", 4
        )
        assert frontier.upkeep.counts() == (0, 0)
        # No busy: the lane's slot is free again; no host_next: nothing was fetched, no rest.
        assert _existing(
            client, crawl_keys.leases, crawl_keys.owned, crawl_keys.busy, crawl_keys.host_next
        ) == []
        assert _stats(client, crawl_keys)["dead_lettered"] == 1
        (letter,) = frontier.upkeep.dead_letters()
        assert (letter.field, letter.reason, letter.lane, letter.payload) == (
            lease.key, "does not decode", "h.example", b"bad\npayload",
        )


class TestEndingALease:
    """What ack, release and bury share: each ends only leases this worker holds."""

    @pytest.mark.parametrize("ending", _endings("ack", "release"))
    def test_ending_nothing(self, frontier: Frontier, ending: _Ending) -> None:
        assert ending.run(frontier, []) == 0

    @pytest.mark.parametrize("ending", _endings())
    def test_unknown_key_is_skipped(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, ending: _Ending
    ) -> None:
        lease = _leased(frontier)
        assert ending.run(frontier, [(UNKNOWN_KEY, lease.token)]) == 0
        _assert_held(client, crawl_keys, lease)
        assert ending.run(frontier, [lease.handle, (UNKNOWN_KEY, lease.token)]) == 1
        assert frontier.upkeep.counts() == ending.counts_after

    @pytest.mark.parametrize("ending", _endings())
    @pytest.mark.parametrize(
        "worker_ids",  # (owner, other)
        [
            pytest.param(("w1", "w2"), id="other-worker"),
            pytest.param(("w10", "w1"), id="id-prefixing-the-owners"),
        ],
    )
    def test_another_worker_with_the_right_token_is_refused(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys,
        ending: _Ending, worker_ids: tuple[str, str],
    ) -> None:
        owner_id, other_id = worker_ids
        owner, other = make_frontier(owner_id), make_frontier(other_id)
        lease = _leased(owner)
        _assert_refused_then_ended(
            client, crawl_keys, ending, by=other, handle=lease.handle, holder=owner, lease=lease
        )


class TestFencing:
    """A lease requeued behind its owner's back can no longer be touched with the old token.

    The dangerous case is the owner itself: a worker presumed dead (a long GC pause, a
    network partition) comes back under the same id, and may even have leased the same
    request again. Only the newest lease may ack, release or bury it.
    """

    @pytest.mark.parametrize("ending", _endings())
    def test_stale_token_of_the_same_worker_cannot_end_the_new_lease(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, ending: _Ending
    ) -> None:
        old = _leased(frontier)
        new = _requeued_back_to(frontier, client, crawl_keys, old)
        assert new.requeues == 1
        _assert_refused_then_ended(
            client, crawl_keys, ending, by=frontier, handle=old.handle, holder=frontier, lease=new
        )

    def test_stale_ack_sent_with_children_still_queues_them(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        old = _leased(frontier, b"parent")
        new = _requeued_back_to(frontier, client, crawl_keys, old)
        result = frontier.enqueue(_requests(b"child"), [old.handle])
        assert (result.statuses, result.acked) == ("+", 0)
        assert frontier.upkeep.counts() == (1, 1)
        assert frontier.ack([new.handle]) == 1

    def test_old_token_is_refused_while_the_request_waits_in_the_queue(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        old = _leased(frontier)
        assert _sweep_as_dead(frontier, client, crawl_keys) == 1
        for ending in ENDINGS:
            assert ending.run(frontier, [old.handle]) == 0, ending.name
        assert frontier.upkeep.counts() == (1, 0)
        assert not client.exists(crawl_keys.dead)


def _joined(registration: Registration) -> tuple[bool, int]:
    return registration.flushed, registration.alive


class TestWorkers:
    def test_register_adds_worker_and_crawl(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        assert _joined(frontier.register(flush=False, alive_ms=ALIVE_MS)) == (False, 0)
        assert client.zscore(crawl_keys.workers, "w1") is not None
        assert client.smembers(crawl_keys.crawls) == {b"test"}

    def test_register_counts_other_live_workers(self, make_frontier: FrontierFactory) -> None:
        make_frontier("w1").register(flush=False, alive_ms=ALIVE_MS)
        make_frontier("w2").register(flush=False, alive_ms=ALIVE_MS)
        assert _joined(make_frontier("w3").register(flush=False, alive_ms=ALIVE_MS)) == (False, 2)
        # Registering again does not count oneself.
        assert _joined(make_frontier("w3").register(flush=False, alive_ms=ALIVE_MS)) == (False, 2)

    @pytest.mark.parametrize(
        "returning",
        [
            pytest.param(False, id="newcomer"),
            # A worker re-registering under its old id, with an old heartbeat: the peer
            # must still count.
            pytest.param(True, id="own-stale-heartbeat"),
        ],
    )
    def test_flush_is_refused_while_another_worker_is_alive(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys,
        returning: bool,
    ) -> None:
        peer = make_frontier("peer")
        peer.register(flush=False, alive_ms=ALIVE_MS)
        peer.enqueue(_requests(b"a", b"b"))
        peer.lease(1)
        if returning:
            _declare_dead(client, crawl_keys, "late")
        late = make_frontier("late")
        assert _joined(late.register(flush=True, alive_ms=ALIVE_MS)) == (False, 1)
        assert peer.upkeep.counts() == (1, 1)
        assert client.scard(crawl_keys.seen) == 2

    def test_flush_when_no_other_worker_is_alive(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        old = make_frontier("w1")
        old.enqueue(_requests(b"a", b"b"))
        old.lease(1)
        _declare_dead(client, crawl_keys, "dead-worker")
        assert _joined(make_frontier("w2").register(flush=True, alive_ms=ALIVE_MS)) == (True, 0)
        assert _existing(client, *crawl_keys.all_crawl_keys()) == [
            crawl_keys.workers, crawl_keys.record, crawl_keys.starting,
        ], "a fresh crawl: its record and its one worker, which is starting"
        assert client.zrange(crawl_keys.workers, 0, -1) == [b"w2"]

    def test_register_without_flush_keeps_everything(
        self, frontier: Frontier
    ) -> None:
        frontier.enqueue(_requests(b"a"))
        frontier.register(flush=False, alive_ms=ALIVE_MS)
        assert frontier.upkeep.counts() == (1, 0)

    def test_heartbeat_and_leave(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.register(flush=False, alive_ms=ALIVE_MS)
        assert frontier.heartbeat().status == "ok"
        _declare_dead(client, crawl_keys, "w1")
        beat = frontier.heartbeat()
        assert beat.status == "ok", "silent for ages, but no sweep took it for dead"
        assert beat.late_ms >= 10 * ALIVE_MS - 5_000
        stamped = client.zscore(crawl_keys.workers, "w1")
        assert stamped is not None
        assert abs(stamped - time.time() * 1000) < 5_000
        frontier.leave()
        assert client.zscore(crawl_keys.workers, "w1") is None

    def test_heartbeat_of_a_swept_worker_says_so_and_registers_it(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.register(flush=False, alive_ms=ALIVE_MS)
        client.zrem(crawl_keys.workers, "w1")  # what a sweep does once it took its leases
        assert frontier.heartbeat().status == "swept"
        assert client.zscore(crawl_keys.workers, "w1") is not None
        assert frontier.heartbeat().status == "ok"


class TestPurge:
    @pytest.mark.parametrize(
        ("leased", "counts"),
        [pytest.param(0, (1, 0), id="queued"), pytest.param(1, (0, 1), id="in-flight")],
    )
    def test_purge_refused_while_a_request_is_left(
        self, frontier: Frontier, leased: int, counts: tuple[int, int]
    ) -> None:
        frontier.enqueue(_requests(b"a"))
        frontier.lease(leased)
        assert not frontier.upkeep.purge_if_done()
        assert frontier.upkeep.counts() == counts

    def test_purge_when_done_deletes_every_crawl_key(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = wide
        frontier.set_crawl_delay("example.com", 1.0)
        frontier.register(flush=False, alive_ms=ALIVE_MS)
        frontier.enqueue(_requests(b"a", b"b", b"start", is_start=True))
        leases = frontier.lease(3).leases
        assert frontier.bury(leases[0].handle, "bad")
        assert frontier.ack([(lease.key, lease.token, 5_000) for lease in leases[1:]]) == 2
        assert client.exists(crawl_keys.host_next)
        assert frontier.upkeep.purge_if_done()
        assert _existing(client, *crawl_keys.all_crawl_keys()) == []

    def test_purge_leaves_other_crawls_alone(
        self, frontier: Frontier, client: redis.Redis
    ) -> None:
        other = Frontier(client, CrawlKeys("redisspine", "other"), "w1")
        other.enqueue(_requests(b"a"))
        frontier.enqueue(_requests(b"b"))
        assert frontier.ack([lease.handle for lease in frontier.lease(1).leases]) == 1
        assert frontier.upkeep.purge_if_done()
        assert other.upkeep.counts() == (1, 0)

    def test_purge_removes_the_crawl_from_the_registry(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # keys.py: the crawls registry lists a crawl "until purged".
        frontier.register(flush=False, alive_ms=ALIVE_MS)
        assert frontier.upkeep.purge_if_done()
        assert b"test" not in client.smembers(crawl_keys.crawls)


    def test_two_workers_closing_at_once_leave_nothing_behind(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # Both run their purge before either leaves: the first must not count the
        # second as alive while the second counts the first (the record would stay).
        other = Frontier(client, crawl_keys, "w2")
        frontier.register(flush=False, alive_ms=ALIVE_MS)
        other.register(flush=False, alive_ms=ALIVE_MS)
        frontier.enqueue(_requests(b"a"))
        assert frontier.ack([lease.handle for lease in frontier.lease(1).leases]) == 1
        assert not frontier.upkeep.purge_if_done(frontier.epoch, ALIVE_MS), "w2 is alive"
        assert client.exists(crawl_keys.record), "kept for w2, which is about to close"
        assert other.upkeep.purge_if_done(other.epoch, ALIVE_MS)
        assert _existing(client, *crawl_keys.all_crawl_keys()) == []


class TestRobustness:
    def test_check_key_types_passes_on_empty_and_used_crawls(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = wide
        frontier.upkeep.check_key_types()
        frontier.register(flush=False, alive_ms=ALIVE_MS)
        frontier.enqueue(_requests(b"a", b"b", b"c", b"d", is_start=True))
        frontier.set_crawl_delay("", 1.0)
        leases = frontier.lease(2).leases
        assert frontier.bury(leases[0].handle, "bad")
        assert _sweep_as_dead(frontier, client, crawl_keys) == 1
        frontier.lease(1)
        later = frontier.lease(1).leases[0]
        assert frontier.ack([(later.key, later.token, 60_000)]) == 1  # a rest: host_next
        used = (
            crawl_keys.dead, crawl_keys.requeues, crawl_keys.owned, crawl_keys.inflight,
            crawl_keys.leases, crawl_keys.queue, crawl_keys.hosts, crawl_keys.busy,
            crawl_keys.backlog, crawl_keys.host_next, crawl_keys.host_delay,
        )
        assert _existing(client, *used) == list(used)
        frontier.upkeep.check_key_types()

    @pytest.mark.parametrize(
        "name",
        [
            "queue", "inflight", "seen", "workers", "stats", "owned", "requeues", "leases",
            "hosts", "busy", "backlog", "host_next", "host_delay",
        ],
    )
    def test_check_key_types_names_the_corrupt_key(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, name: str
    ) -> None:
        key = getattr(crawl_keys, name)
        client.set(key, b"not mine")
        with pytest.raises(CorruptKeyError, match=key.replace("{", r"\{").replace("}", r"\}")):
            frontier.upkeep.check_key_types()

    def test_check_key_types_names_the_found_type(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.rpush(crawl_keys.seq, b"x")
        with pytest.raises(CorruptKeyError, match="holds a list, expected a string"):
            frontier.upkeep.check_key_types()

    def test_binary_garbage_member_does_not_break_lease(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue(_requests(b"good"))
        # A foreign member, and with a score: lex ranges of the queue are unreliable
        # until it is gone.
        client.zadd(crawl_keys.queue, {b"\xff\xfe\x00 binary garbage": -100})
        batches = [frontier.lease(10), frontier.lease(10)]
        leased = [lease for batch in batches for lease in batch.leases]
        assert [lease.payload for lease in leased] == [b"good"]
        assert sum(batch.malformed for batch in batches) == 1
        assert client.hlen(crawl_keys.dead) == 1
        # Nothing is stranded in flight without its owner knowing the key.
        assert set(client.hkeys(crawl_keys.inflight)) == {lease.key.encode() for lease in leased}
        assert frontier.upkeep.counts() == (0, 1)

    def test_malformed_members_are_not_conflated(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # Two members that do not start with an order key, sharing 15 first bytes:
        # each must end up somewhere (in flight or dead), none silently vanish.
        client.zadd(crawl_keys.queue, {b"not-an-order-key-1": 0, b"not-an-order-key-2": 0})
        frontier.lease(10)
        located = (
            queued_count(client, crawl_keys)
            + client.hlen(crawl_keys.inflight)
            + client.hlen(crawl_keys.dead)
        )
        assert located == 2

    def test_scripts_reload_after_script_flush(
        self, wide: Frontier, client: redis.Redis
    ) -> None:
        frontier = wide
        frontier.enqueue(_requests(b"a", b"b"))
        assert _payloads(frontier, 1) == [b"a"]
        client.script_flush()
        assert _payloads(frontier, 1) == [b"b"]
        client.script_flush()
        assert frontier.enqueue(_requests(b"c")).statuses == "+"
        client.script_flush()
        assert _joined(frontier.register(flush=False, alive_ms=ALIVE_MS)) == (False, 0)

    def test_arbitrary_bytes_survive_every_move(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = wide
        payloads = [
            bytes(range(256)),
            b"\x00",
            b"\n\n",
            b"w1\n1\n0\n000000000000001",
            b"",
            b"\xff" * 1000,
            "h\u00e9llo \u2603".encode(),
        ]
        fingerprints = [bytes([i]) * 20 for i in range(len(payloads) - 1)] + [b"\x00\n" * 10]
        frontier.enqueue(
            [
                NewRequest(payload, fingerprint, priority=i)
                for i, (payload, fingerprint) in enumerate(zip(payloads, fingerprints, strict=True))
            ]
        )
        assert client.smembers(crawl_keys.seen) == {f[:14] for f in fingerprints}
        leased = frontier.lease(100).leases
        assert sorted(lease.payload for lease in leased) == sorted(payloads)
        assert frontier.release([lease.handle for lease in leased]) == len(payloads)
        leased = frontier.lease(100).leases
        assert [lease.payload for lease in leased] == payloads[::-1]
        assert _sweep_as_dead(frontier, client, crawl_keys) == len(payloads)
        leased = frontier.lease(100).leases
        assert [lease.payload for lease in leased] == payloads[::-1]
        assert frontier.bury(leased[0].handle, "reason")
        assert client.hget(crawl_keys.dead, leased[0].key) == b"reason\n" + _member(
            payloads[-1], leased[0].key, "", len(payloads) - 1
        )
        (letter,) = frontier.upkeep.dead_letters()
        assert (letter.lane, letter.payload) == ("", payloads[-1])
        assert frontier.ack([lease.handle for lease in leased[1:]]) == len(payloads) - 1


# -- many workers at once (real server only) --------------------------------------

N_REQUESTS = 2_000
N_LANES = 50


def _lease_until_empty(url: str, worker_id: str, batch: int) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        frontier = Frontier(
            client, CrawlKeys("redisspine", "test"), worker_id, concurrency=N_REQUESTS
        )
        leased: list[bytes] = []
        while True:
            leases = frontier.lease(batch).leases
            if not leases:
                return leased
            leased += [lease.payload for lease in leases]
    finally:
        client.close()


def _process_worker(
    url: str, worker_id: str, batch: int, start: Any, results: Any
) -> None:
    start.wait(30)
    results.put((worker_id, _lease_until_empty(url, worker_id, batch)))


def _fill(url: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        frontier = Frontier(
            client, CrawlKeys("redisspine", "test"), "seeder", concurrency=N_REQUESTS
        )
        payloads = [f"request-{i}".encode() for i in range(N_REQUESTS)]
        for first in range(0, N_REQUESTS, 500):
            frontier.push(
                [
                    NewRequest(payload, b"fp-" + payload, lane=f"host-{i % N_LANES}")
                    for i, payload in enumerate(payloads[first : first + 500], first)
                ]
            )
        return payloads
    finally:
        client.close()


def _check_exactly_once(
    url: str, payloads: list[bytes], by_worker: dict[str, list[bytes]]
) -> None:
    leased = Counter(p for worker_payloads in by_worker.values() for p in worker_payloads)
    duplicates = [p for p, n in leased.items() if n > 1]
    assert not duplicates, f"leased more than once: {duplicates[:5]}"
    assert set(leased) == set(payloads), "some requests were never leased"
    assert sum(1 for worker_payloads in by_worker.values() if worker_payloads) > 1
    client = redis.Redis.from_url(url)
    try:
        frontier = Frontier(client, CrawlKeys("redisspine", "test"), "checker")
        assert frontier.upkeep.counts() == (0, N_REQUESTS)
        owners = Counter(
            entry.split(b"\n", 1)[0].decode()
            for entry in client.hvals(frontier.keys.inflight)
        )
        assert owners == {worker: len(p) for worker, p in by_worker.items() if p}
    finally:
        client.close()


def test_concurrent_threads_lease_each_request_exactly_once(redis_url: str) -> None:
    payloads = _fill(redis_url)
    by_worker: dict[str, list[bytes]] = {}
    barrier = threading.Barrier(8)

    def run(worker_id: str, batch: int) -> None:
        barrier.wait(30)
        by_worker[worker_id] = _lease_until_empty(redis_url, worker_id, batch)

    threads = [
        threading.Thread(target=run, args=(f"thread-{i}", 1 + i % 4)) for i in range(8)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(by_worker) == 8, "a leasing thread failed"
    _check_exactly_once(redis_url, payloads, by_worker)


def test_concurrent_processes_lease_each_request_exactly_once(redis_url: str) -> None:
    payloads = _fill(redis_url)
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(4)
    results = context.Queue()
    processes = [
        context.Process(
            target=_process_worker, args=(redis_url, f"process-{i}", 1 + i, start, results)
        )
        for i in range(4)
    ]
    for process in processes:
        process.start()
    try:
        by_worker = dict(results.get(timeout=60) for _ in processes)
    finally:
        for process in processes:
            process.join(30)
            if process.is_alive():
                process.kill()
    assert all(process.exitcode == 0 for process in processes)
    _check_exactly_once(redis_url, payloads, by_worker)


def _as_old_member(member: bytes) -> bytes:
    """``member`` as the code before issue 19 wrote it: a 10-digit priority key (the
    payload stays: old map payloads are covered in test_payload_golden.py)."""
    sep = member.index(b"\0")
    key = member[sep + 1:sep + 6].decode()
    priority = next(p for p in range(-10, 11) if priority_key(p) == key)
    return member[:sep + 1] + b"%010d" % (2**31 - 1 - priority) + member[sep + 6:]


class TestMembersOfEarlierVersions:
    """A queue written before issue 19 (10-digit priority keys) beside new members:
    leased (old ones first, each kind in priority order), acked, requeued by a sweep
    and dead-lettered as members of its own lane, put back exactly as they were."""

    def _mixed(self, wide: Frontier, client: redis.Redis, keys: CrawlKeys) -> None:
        wide.enqueue([NewRequest(b"old-low", b"f1", priority=-1, lane="a.example"),
                      NewRequest(b"old-high", b"f2", priority=5, lane="a.example"),
                      NewRequest(b"new-low", b"f3", priority=-1, lane="a.example"),
                      NewRequest(b"new-high", b"f4", priority=5, lane="a.example")])
        # leased and put back: members of the queue ZSET, as earlier versions queued
        # every request (the lists are empty and gone)
        assert wide.release([lease.handle for lease in wide.lease(10).leases]) == 4
        for member in client.zrange(keys.queue, 0, -1):
            if b"old-" in member:  # same lane, order key and payload: the counts hold
                client.zrem(keys.queue, member)
                client.zadd(keys.queue, {_as_old_member(member): 0})

    def test_leased_old_first_then_acked(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        self._mixed(wide, client, crawl_keys)
        leases = wide.lease(10).leases
        assert [lease.payload for lease in leases] == [b"old-high", b"old-low", b"new-high",
                                                       b"new-low"]
        assert {lease.lane for lease in leases} == {"a.example"}
        assert wide.ack([lease.handle for lease in leases]) == 4
        assert queued_count(client, crawl_keys) == client.hlen(crawl_keys.inflight) == 0
        assert not client.hgetall(crawl_keys.backlog)

    def test_requeued_by_a_sweep_as_they_were(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        self._mixed(wide, client, crawl_keys)
        queued = sorted(client.zrange(crawl_keys.queue, 0, -1))
        assert sum(member.split(b"\0")[1][:10].isdigit() for member in queued) == 2
        wide.lease(10)
        assert _sweep_as_dead(wide, client, crawl_keys) == 4
        assert sorted(client.zrange(crawl_keys.queue, 0, -1)) == queued

    def test_dead_lettered_in_their_lane_released_and_reinjected_as_they_were(
        self, wide: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        self._mixed(wide, client, crawl_keys)
        queued = sorted(client.zrange(crawl_keys.queue, 0, -1))
        first, *rest = wide.lease(10).leases
        assert wide.bury(first.handle, BURY_REASON) == 1
        (letter,) = wide.upkeep.dead_letters()
        assert (letter.lane, letter.payload, letter.reason) == ("a.example", b"old-high",
                                                                 BURY_REASON)
        assert wide.release([lease.handle for lease in rest]) == 3
        assert sorted(client.zrange(crawl_keys.queue, 0, -1)) == [
            member for member in queued if b"old-high" not in member]
        assert wide.upkeep.reinject_dead([letter.field]) == 1
        assert sorted(client.zrange(crawl_keys.queue, 0, -1)) == queued
        assert [lease.payload for lease in wide.lease(10).leases][:1] == [b"old-high"]
