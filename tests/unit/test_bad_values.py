"""Bad values in Redis are contained (issue 12; DESIGN.md invariant 7).

Garbage is written straight into a crawl key, as an operator, a bug or another tool
would, and then the operation that reads it runs. Each test checks that nothing
raises, nothing is lost (every request is queued, leased or dead-lettered), the
counts agree again, and the repair is reported in the result's ``repairs``. Every
test runs on fakeredis and on the real redis-server (the ``client`` fixture).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest
import redis

from scrapy_redisspine._results import count_result, enqueue_result, lease_batch
from scrapy_redisspine.dedup import MODE_BLOOM, Dedup, DedupParams
from scrapy_redisspine.frontier import Frontier, NewRequest, split_member
from scrapy_redisspine.status import read_status
from tests.queue_view import queued_count

if TYPE_CHECKING:
    from scrapy_redisspine._results import Repairs
    from scrapy_redisspine.keys import CrawlKeys
    from tests.unit.conftest import FrontierFactory

TIMEOUT_MS = 30_000
LANE, OTHER = "a.example", "b.example"
#: Values that are no count, time or delay, as tools and typos write them.
GARBAGE = ["abc", "", "1.5", "-3", "nan", "inf", "1e400", "12abc", "\x00\xff", "x" * 100]


def _request(payload: bytes, lane: str = LANE) -> NewRequest:
    return NewRequest(payload, b"fp-" + payload, lane=lane)


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _beat(client: redis.Redis, keys: CrawlKeys, worker: str, age_ms: int = 0) -> None:
    client.zadd(keys.workers, {worker: _server_ms(client) - age_ms})


def _sweep(frontier: Frontier, max_requeues: int = 5) -> Any:
    return frontier.upkeep.requeue_stale(
        timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=max_requeues
    )


def _where(client: redis.Redis, keys: CrawlKeys) -> tuple[int, int, int]:
    """(queued, in flight, dead): together, every request there is."""
    return (int(queued_count(client, keys)), int(client.hlen(keys.inflight)),
            int(client.hlen(keys.dead)))


def _repaired(repairs: Repairs, key: str, value: str = "") -> bool:
    """One of the repairs names ``key`` (and shows ``value``, when given)."""
    return any(repair.startswith(key + " ") and value in repair for repair in repairs)


def _hget(client: redis.Redis, key: str, field: str) -> bytes | None:
    value: bytes | None = client.hget(key, field)  # type: ignore[assignment]
    return value


@pytest.fixture
def frontier(make_frontier: FrontierFactory) -> Frontier:
    return make_frontier("w1")


# -- lane bookkeeping -------------------------------------------------------------------


class TestLaneCounts:
    @pytest.mark.parametrize("garbage", GARBAGE)
    def test_a_garbage_busy_count_neither_wedges_the_lane_nor_fails(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, garbage: str
    ) -> None:
        frontier.enqueue([_request(b"1"), _request(b"2", OTHER)])
        client.hset(crawl_keys.busy, LANE, garbage)

        batch = frontier.lease(2)

        assert sorted(lease.lane for lease in batch.leases) == [LANE, OTHER]
        assert _repaired(batch.repairs, crawl_keys.busy)
        assert _hget(client, crawl_keys.busy, LANE) == b"1"  # rewritten by the lease
        assert _where(client, crawl_keys) == (0, 2, 0)

    def test_a_repaired_busy_count_still_holds_the_lane_to_its_concurrency(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"1"), _request(b"2")])
        client.hset(crawl_keys.busy, LANE, "-5")  # would allow 6 at once if believed

        assert len(frontier.lease(5).leases) == 1

    @pytest.mark.parametrize("garbage", ["zz", "-1", "0.5"])
    def test_a_garbage_backlog_is_counted_again_from_the_queue(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, garbage: str
    ) -> None:
        frontier.enqueue([_request(b"1"), _request(b"2"), _request(b"3")])
        client.hset(crawl_keys.backlog, LANE, garbage)

        batch = frontier.lease(1)

        assert len(batch.leases) == 1
        assert _repaired(batch.repairs, crawl_keys.backlog)
        assert _hget(client, crawl_keys.backlog, LANE) == b"2"
        assert client.zscore(crawl_keys.hosts, LANE) is None  # busy: back when acked
        frontier.ack([(*batch.leases[0].handle, 0)])
        assert client.zscore(crawl_keys.hosts, LANE) is not None
        assert len(frontier.lease(1).leases) == 1

    def test_a_garbage_backlog_under_a_cap_is_counted_again(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        capped = make_frontier("w1", backlog_cap=2)
        capped.enqueue([_request(b"1")])
        client.hset(crawl_keys.backlog, LANE, "lots")

        result = capped.enqueue([_request(b"2"), _request(b"3")])

        assert result.statuses == "+c"  # one queued already, the cap is 2
        assert _repaired(result.repairs, crawl_keys.backlog, '"lots"')
        assert _hget(client, crawl_keys.backlog, LANE) == b"2"

    @pytest.mark.parametrize("garbage", ["soon", "nan", "inf"])
    def test_a_garbage_next_time_makes_the_lane_due(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, garbage: str
    ) -> None:
        frontier.enqueue([_request(b"1"), _request(b"2")])
        client.hset(crawl_keys.host_next, LANE, garbage)

        batch = frontier.lease(1)

        assert len(batch.leases) == 1
        assert _repaired(batch.repairs, crawl_keys.host_next)
        assert _hget(client, crawl_keys.host_next, LANE) is None
        # The lane rests a minute after this fetch: written by the ack as ever.
        assert frontier.enqueue((), [(*batch.leases[0].handle, 60_000)]).acked == 1
        assert float(_hget(client, crawl_keys.host_next, LANE) or 0) > _server_ms(client)

    def test_a_busy_count_with_nothing_in_flight_is_cleared(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"1")])
        client.hset(crawl_keys.busy, LANE, "7")  # a number, but nothing is in flight
        client.delete(crawl_keys.hosts)  # and the lane went out of the schedule

        first = frontier.lease(1)

        assert first.leases == []
        assert _repaired(first.repairs, crawl_keys.busy, "nothing in flight")
        assert len(frontier.lease(1).leases) == 1


# -- what a lease reply carries -------------------------------------------------------


class TestLeaseReply:
    @pytest.mark.parametrize("garbage", ["abc", "-1", "nan", "inf", "0x", ""])
    def test_a_garbage_crawl_delay_reads_as_none_and_the_leases_stay_whole(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, garbage: str
    ) -> None:
        frontier.enqueue([_request(b"1"), _request(b"2", OTHER)])
        client.hset(crawl_keys.host_delay, mapping={LANE: garbage, OTHER: "2.5"})

        batch = frontier.lease(2)

        delays = {lease.lane: lease.crawl_delay for lease in batch.leases}
        assert delays == {LANE: None, OTHER: 2.5}
        assert _where(client, crawl_keys) == (0, 2, 0)
        if garbage:
            assert _repaired(batch.repairs, crawl_keys.host_delay)
            assert _hget(client, crawl_keys.host_delay, LANE) is None

    def test_a_garbage_requeue_count_gives_a_fresh_budget(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"1"), _request(b"2", OTHER)])
        # leased and put back: queued as members that keep their order keys
        assert frontier.release([lease.handle for lease in frontier.lease(2).leases]) == 2
        keys = [split_member(member)[1] for member in client.zrange(crawl_keys.queue, 0, -1)]
        client.hset(crawl_keys.requeues, mapping={keys[0]: "many", keys[1]: "2"})

        batch = frontier.lease(2)

        assert sorted(lease.requeues for lease in batch.leases) == [0, 2]
        assert _repaired(batch.repairs, crawl_keys.requeues, '"many"')
        assert _hget(client, crawl_keys.requeues, keys[0]) is None


# -- seq --------------------------------------------------------------------------------


class TestSeq:
    @pytest.mark.parametrize("garbage", ["abc", "1e5", "-3", "007", "9999999999999999", " 4"])
    def test_a_garbage_seq_is_set_above_every_number_handed_out(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, garbage: str
    ) -> None:
        frontier.enqueue([_request(b"old", OTHER)])
        old = frontier.lease(1).leases[0]
        client.set(crawl_keys.seq, garbage)

        result = frontier.enqueue([_request(b"new")])  # (a lane's first: a member)
        batch = frontier.lease(1)

        assert result.statuses == "+"
        assert _repaired(result.repairs, crawl_keys.seq + " -")
        new = batch.leases[0]
        assert int(new.key) > max(int(old.key), 100_000)
        assert len(new.key) == 15
        assert int(new.token) > int(new.key)  # tokens come from the same counter
        assert frontier.ack([(*old.handle, 0), (*new.handle, 0)]) == 2

    def test_a_garbage_seq_does_not_fail_a_lease_after_it_took_requests(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"1")])
        client.set(crawl_keys.seq, "garbage")

        batch = frontier.lease(1)

        assert len(batch.leases) == 1
        assert _repaired(batch.repairs, crawl_keys.seq)
        assert frontier.ack([(*batch.leases[0].handle, 0)]) == 1
        assert _where(client, crawl_keys) == (0, 0, 0)

    def test_malformed_members_get_dead_letter_numbers_from_a_repaired_seq(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.zadd(crawl_keys.queue, {b"no lane here": 0})
        client.set(crawl_keys.seq, "garbage")

        batch = frontier.lease(1)

        assert batch.malformed == 1
        assert _repaired(batch.repairs, crawl_keys.seq)
        assert _where(client, crawl_keys) == (0, 0, 1)


# -- stats ------------------------------------------------------------------------------


class TestStats:
    def test_every_counter_of_every_script_tolerates_a_garbage_field(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier("w1", concurrency=100)
        fields = ["enqueued", "filtered", "leased", "acked", "released", "dead_lettered",
                  "requeued", "reinjected"]
        client.hset(crawl_keys.stats, mapping=dict.fromkeys(fields, "x"))
        repairs: list[str] = []

        repairs += frontier.enqueue([_request(b"%d" % i) for i in range(5)]).repairs
        repairs += frontier.enqueue([_request(b"0")]).repairs  # a duplicate: filtered
        leases = frontier.lease(5)
        repairs += leases.repairs
        first, second, third, fourth, fifth = leases.leases
        repairs += frontier.enqueue((), [(*first.handle, 0)]).repairs
        repairs += frontier.release([second.handle]).repairs
        repairs += frontier.bury(third.handle, "bad").repairs
        repairs += frontier.upkeep.reinject_dead([third.key]).repairs
        _beat(client, crawl_keys, "w1", age_ms=10 * TIMEOUT_MS)
        repairs += _sweep(frontier).repairs

        assert sorted(repair.split(" ")[1] for repair in repairs) == sorted(fields)
        assert frontier.upkeep.fleet_stats() == {
            "enqueued": 5, "filtered": 1, "leased": 5, "acked": 1, "released": 1,
            "dead_lettered": 1, "requeued": 2, "reinjected": 1,
        }
        assert {fourth.key, fifth.key} <= {
            split_member(member)[1] for member in client.zrange(crawl_keys.queue, 0, -1)
        }

    def test_the_fleet_counters_leave_out_a_garbage_field(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.hset(crawl_keys.stats, mapping={"acked": "x", "leased": "3"})

        assert frontier.upkeep.fleet_stats() == {"leased": 3}

    def test_a_stats_key_of_the_wrong_type_loses_counts_not_requests(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.rpush(crawl_keys.stats, "not a hash")

        result = frontier.enqueue([_request(b"1")])
        batch = frontier.lease(1)

        assert result.statuses == "+"
        assert _repaired(result.repairs, crawl_keys.stats, "not counted")
        assert len(batch.leases) == 1
        assert _repaired(batch.repairs, crawl_keys.stats, "not counted")


# -- every operation, with garbage in every number it reads ----------------------------


def _garble_lanes(client: redis.Redis, keys: CrawlKeys) -> None:
    for key in (keys.busy, keys.backlog, keys.host_next, keys.host_delay):
        client.hset(key, LANE, "garbage")


class TestEveryOperation:
    def test_release(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"1")])
        lease = frontier.lease(1).leases[0]
        _garble_lanes(client, crawl_keys)

        released = frontier.release([lease.handle])

        assert released == 1
        assert _repaired(released.repairs, crawl_keys.busy)
        assert _where(client, crawl_keys) == (1, 0, 0)
        assert _hget(client, crawl_keys.backlog, LANE) == b"1"
        assert len(frontier.lease(1).leases) == 1

    def test_bury(self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys) -> None:
        frontier.enqueue([_request(b"1"), _request(b"2")])
        lease = frontier.lease(1).leases[0]
        _garble_lanes(client, crawl_keys)

        buried = frontier.bury(lease.handle, "undecodable")

        assert buried == 1
        assert _repaired(buried.repairs, crawl_keys.backlog)
        assert _where(client, crawl_keys) == (1, 0, 1)
        assert len(frontier.lease(1).leases) == 1  # the lane's slot is free again

    def test_requeue_stale(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        dead, sweeper = make_frontier("dead"), make_frontier("sweeper")
        dead.enqueue([_request(b"1")])
        lease = dead.lease(1).leases[0]
        _garble_lanes(client, crawl_keys)
        client.hset(crawl_keys.requeues, lease.key, "garbage")
        _beat(client, crawl_keys, "dead", age_ms=10 * TIMEOUT_MS)

        result = _sweep(sweeper)

        assert (result.requeued, result.dead_lettered) == (1, 0)
        for key in (crawl_keys.busy, crawl_keys.host_delay, crawl_keys.requeues):
            assert _repaired(result.repairs, key)
        assert _where(client, crawl_keys) == (1, 0, 0)
        assert _hget(client, crawl_keys.requeues, lease.key) == b"1"
        assert sweeper.lease(1).leases[0].requeues == 1

    def test_reinject_dead(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"1")])
        lease = frontier.lease(1).leases[0]
        frontier.bury(lease.handle, "bad")
        _garble_lanes(client, crawl_keys)
        client.hset(crawl_keys.dead, "no-newline", "garbage without a member")

        reinjected = frontier.upkeep.reinject_dead([lease.key, "no-newline"])

        assert reinjected == 1
        assert _repaired(reinjected.repairs, crawl_keys.backlog)
        assert _where(client, crawl_keys) == (1, 0, 1)  # the garbage letter stays dead
        assert len(frontier.lease(1).leases) == 1

    def test_release_orphans(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"1")])
        frontier.lease(1)  # the reply "was lost": the worker knows of no lease
        _garble_lanes(client, crawl_keys)

        released = frontier.release_orphans([])

        assert released == 1
        assert _repaired(released.repairs, crawl_keys.busy)
        assert _where(client, crawl_keys) == (1, 0, 0)

    def test_enqueue_with_acks(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"parent")])
        lease = frontier.lease(1).leases[0]
        _garble_lanes(client, crawl_keys)
        client.set(crawl_keys.seq, "garbage")

        result = frontier.enqueue([_request(b"child")], [(*lease.handle, 0)])

        assert (result.statuses, result.acked) == ("+", 1)
        for key in (crawl_keys.busy, crawl_keys.backlog, crawl_keys.host_next,
                    crawl_keys.seq):
            assert _repaired(result.repairs, key)
        assert _where(client, crawl_keys) == (1, 0, 0)
        assert _hget(client, crawl_keys.backlog, LANE) == b"1"
        assert len(frontier.lease(1).leases) == 1


# -- malformed in-flight entries ------------------------------------------------------


class TestMalformedEntries:
    def test_a_sweep_dead_letters_an_entry_it_cannot_read(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        sweeper = make_frontier("sweeper")
        client.hset(crawl_keys.inflight, "000000000000042", "no separators")
        client.zadd(crawl_keys.owned, {"dead\n000000000000042": 0})
        client.zadd(crawl_keys.leases, {"000000000000042": 1})
        _beat(client, crawl_keys, "dead", age_ms=10 * TIMEOUT_MS)

        result = _sweep(sweeper)

        assert (result.requeued, result.dead_lettered, result.workers_removed) == (0, 1, 1)
        assert _repaired(result.repairs, crawl_keys.inflight, "no separators")
        assert _where(client, crawl_keys) == (0, 0, 1)
        assert client.zcard(crawl_keys.owned) == client.zcard(crawl_keys.leases) == 0

    def test_release_orphans_dead_letters_an_entry_it_cannot_read(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.hset(crawl_keys.inflight, "000000000000042", "garbage")
        client.zadd(crawl_keys.owned, {"w1\n000000000000042": 0})

        released = frontier.release_orphans([])

        assert released == 0
        assert _repaired(released.repairs, crawl_keys.inflight)
        assert _where(client, crawl_keys) == (0, 0, 1)

    def test_release_orphans_leaves_another_workers_lease_alone(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        mine, theirs = make_frontier("w1"), make_frontier("w2")
        mine.enqueue([_request(b"1")])
        lease = theirs.lease(1).leases[0]
        client.zadd(crawl_keys.owned, {f"w1\n{lease.key}": 0})  # a stale index entry

        assert mine.release_orphans([]) == 0
        assert _where(client, crawl_keys) == (0, 1, 0)
        assert client.zscore(crawl_keys.owned, f"w1\n{lease.key}") is None
        assert theirs.ack([(*lease.handle, 0)]) == 1


# -- in-flight entries without their index entries -----------------------------------


def _repair_pass(frontier: Frontier, limit: int = 100) -> dict[str, Any]:
    """repair_unindexed from cursor "0" until the pass is done; the totals."""
    totals: dict[str, Any] = {"steps": 0, "requeued": 0, "dead_lettered": 0,
                              "reindexed": 0, "removed": 0, "repairs": ()}
    cursor = "0"
    while True:
        step = frontier.upkeep.repair_unindexed(
            cursor, limit, timeout_ms=TIMEOUT_MS, max_requeues=5
        )
        totals["steps"] += 1
        for name in ("requeued", "dead_lettered", "reindexed", "removed"):
            totals[name] += getattr(step, name)
        totals["repairs"] += step.repairs
        cursor = step.cursor
        if cursor == "0":
            return totals
        assert totals["steps"] < 1000


def _unindex(client: redis.Redis, keys: CrawlKeys, owner: str, key: str) -> None:
    client.zrem(keys.leases, key)
    client.zrem(keys.owned, f"{owner}\n{key}")


class TestRepairUnindexed:
    def test_a_live_owners_entry_is_indexed_again(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"1"), _request(b"2", OTHER)])
        lost, kept = frontier.lease(2).leases
        _beat(client, crawl_keys, "w1")
        _unindex(client, crawl_keys, "w1", lost.key)

        totals = _repair_pass(frontier)

        assert (totals["reindexed"], totals["requeued"], totals["removed"]) == (1, 0, 0)
        assert client.zscore(crawl_keys.leases, lost.key) is not None
        assert client.zscore(crawl_keys.owned, f"w1\n{lost.key}") is not None
        # Indexed again, it is found like any lease: by its owner's orphan check ...
        assert frontier.release_orphans([kept.key]) == 1
        assert _where(client, crawl_keys) == (1, 1, 0)

    def test_a_dead_owners_entry_is_requeued_with_its_lane(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        dead, sweeper = make_frontier("dead"), make_frontier("sweeper")
        dead.enqueue([_request(b"1"), _request(b"2")])
        lease = dead.lease(1).leases[0]
        _beat(client, crawl_keys, "dead", age_ms=10 * TIMEOUT_MS)
        _unindex(client, crawl_keys, "dead", lease.key)
        assert _sweep(sweeper).requeued == 0  # no sweep finds it

        totals = _repair_pass(sweeper)

        assert (totals["requeued"], totals["reindexed"]) == (1, 0)
        assert _where(client, crawl_keys) == (2, 0, 0)
        assert _hget(client, crawl_keys.busy, LANE) is None
        assert _hget(client, crawl_keys.requeues, lease.key) == b"1"
        assert len(sweeper.lease(1).leases) == 1  # the lane's slot came back

    def test_an_owner_that_never_heartbeated_counts_as_dead(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"1")])
        lease = frontier.lease(1).leases[0]
        client.zrem(crawl_keys.owned, f"w1\n{lease.key}")  # one index entry is enough

        assert _repair_pass(frontier)["requeued"] == 1
        assert _where(client, crawl_keys) == (1, 0, 0)

    def test_index_entries_pointing_to_no_lease_are_removed(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue([_request(b"1")])
        lease = frontier.lease(1).leases[0]
        _beat(client, crawl_keys, "w1")
        client.zadd(crawl_keys.leases, {"000000000000999": 1})
        client.zadd(crawl_keys.owned, {"w1\n000000000000999": 0, "w9\n" + lease.key: 0,
                                       "no separator": 0})

        totals = _repair_pass(frontier)

        assert (totals["removed"], totals["requeued"], totals["reindexed"]) == (4, 0, 0)
        assert client.zrange(crawl_keys.leases, 0, -1) == [lease.key.encode()]
        assert client.zrange(crawl_keys.owned, 0, -1) == [f"w1\n{lease.key}".encode()]

    def test_an_unreadable_entry_is_dead_lettered(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.hset(crawl_keys.inflight, "000000000000042", "garbage")

        totals = _repair_pass(frontier)

        assert totals["dead_lettered"] == 1
        assert _repaired(totals["repairs"], crawl_keys.inflight)
        assert _where(client, crawl_keys) == (0, 0, 1)

    def test_the_work_is_bounded_by_the_cursor_the_caller_keeps(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier("w1", concurrency=1000)
        frontier.enqueue([_request(b"%d" % i) for i in range(600)])
        leases = frontier.lease(600).leases
        _beat(client, crawl_keys, "w1")
        for lease in leases[::3]:
            _unindex(client, crawl_keys, "w1", lease.key)

        totals = _repair_pass(frontier, limit=50)

        assert totals["reindexed"] == 200
        assert totals["steps"] > 3  # several steps per structure, each bounded
        assert client.zcard(crawl_keys.leases) == client.zcard(crawl_keys.owned) == 600


# -- a key of the wrong type fails a script before it wrote anything ----------------


class TestWrongTypeWritesNothing:
    @pytest.mark.parametrize("name", ["leases", "owned", "backlog", "host_next", "dead"])
    def test_lease(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, name: str
    ) -> None:
        frontier.enqueue([_request(b"1")])
        if name == "dead":  # only a malformed member goes there
            client.zadd(crawl_keys.queue, {b"a.example\x00!sorts first, no order key": 0})
        client.set(getattr(crawl_keys, name), "a string")
        queue = client.zrange(crawl_keys.queue, 0, -1)

        # Named by the check (lib/keytypes.lua), or WRONGTYPE from a read before any
        # write (the lanes' HASHes are read before the leases are written).
        with pytest.raises(redis.ResponseError, match=r"WRONGTYPE|expected a"):
            frontier.lease(2)

        assert client.zrange(crawl_keys.queue, 0, -1) == queue
        assert client.hlen(crawl_keys.inflight) == 0

    @pytest.mark.parametrize("name", ["leases", "owned", "hosts", "queue", "starts", "seen"])
    def test_enqueue_with_acks(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys, name: str
    ) -> None:
        frontier.enqueue([_request(b"parent")])
        lease = frontier.lease(1).leases[0]
        if name == "queue":
            client.delete(crawl_keys.queue)
        client.set(getattr(crawl_keys, name), "a string")
        seen_before = client.type(crawl_keys.seen)

        with pytest.raises(redis.ResponseError, match=re.escape(getattr(crawl_keys, name))):
            frontier.enqueue([NewRequest(b"child", b"fp-child", is_start=True, lane=LANE)],
                             [(*lease.handle, 0)])

        assert client.hexists(crawl_keys.inflight, lease.key)  # the ack was not applied
        assert client.type(crawl_keys.seen) == seen_before
        if name != "seen":
            assert not client.sismember(crawl_keys.seen, b"fp-child"[:14])
        if name != "starts":
            assert not client.sismember(crawl_keys.starts, b"fp-child")

    @pytest.mark.parametrize("operation", ["release", "bury", "sweep", "orphans"])
    def test_the_cold_scripts(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys,
        operation: str,
    ) -> None:
        frontier = make_frontier("w1")
        frontier.enqueue([_request(b"1")])
        lease = frontier.lease(1).leases[0]
        client.set(crawl_keys.dead if operation in ("bury", "sweep") else crawl_keys.queue,
                   "a string")
        _beat(client, crawl_keys, "w1", age_ms=10 * TIMEOUT_MS)
        run = {
            "release": lambda: frontier.release([lease.handle]),
            "bury": lambda: frontier.bury(lease.handle, "bad"),
            "sweep": lambda: _sweep(frontier),
            "orphans": lambda: frontier.release_orphans([]),
        }[operation]

        with pytest.raises(redis.ResponseError, match="expected a"):
            run()

        assert client.hexists(crawl_keys.inflight, lease.key)
        assert client.zscore(crawl_keys.leases, lease.key) is not None
        assert client.zscore(crawl_keys.owned, f"w1\n{lease.key}") is not None


# -- dedup counters ---------------------------------------------------------------------


def test_a_garbage_bloom_layer_count_takes_the_layer_as_full(
    frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    params = DedupParams(set_max_fingerprints=0, backend="bitmap", capacity=2000,
                         error_rate=0.0001, chunk_size=50)
    record = Dedup(client, crawl_keys, params)
    record.open()
    assert record.maintain().mode == MODE_BLOOM
    client.hset(crawl_keys.dedup, "count:1", "garbage")
    assert record.state().layer_counts == (2000,)  # the Python side reads it so too

    result = frontier.enqueue([NewRequest(b"1", bytes(range(20)), lane=LANE)])

    assert result.statuses == "+"
    assert _repaired(result.repairs, crawl_keys.dedup, "count:1")
    assert record.state().active_layers == 2  # taken as full: the filter grew
    assert frontier.enqueue([NewRequest(b"1", bytes(range(20)), lane=LANE)]).statuses == "d"


# -- tools reading the same keys ---------------------------------------------------------


def test_status_shows_garbage_as_zero(
    frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    frontier.enqueue([_request(b"1")])
    _garble_lanes(client, crawl_keys)
    client.hset(crawl_keys.stats, "acked", "x")

    status = read_status(client, crawl_keys)

    assert status["hosts"][0]["backlog"] == 0
    assert status["hosts"][0]["crawl_delay_seconds"] == 0
    assert status["counters"]["acked"] == 0


# -- reading replies never raises ---------------------------------------------------------


class TestReplies:
    @pytest.mark.parametrize("reply", [None, 7, b"x", [], [None] * 9, [[b"x"], b"t"]])
    def test_a_lease_reply_of_any_shape_reads(self, reply: Any) -> None:
        batch = lease_batch(reply)
        assert batch.leases == [] or batch.repairs

    def test_a_lease_reply_with_odd_elements_keeps_what_it_can(self) -> None:
        member = b"a.example\x00" + b"0" * 10 + b"000000000000001" + b"payload"
        reply = [[member, b"no nul", 5], b"12", [b"x"], [b"abc"], b"q", None, 0, -1, b"",
                 [b"r"]]

        batch = lease_batch(reply)

        assert [(lease.key, lease.token, lease.requeues, lease.crawl_delay)
                for lease in batch.leases] == [("000000000000001", "12", 0, None)]
        assert batch.repairs[0] == "r"
        assert len(batch.repairs) == 3  # and the two members it could not read
        assert (batch.queued, batch.inflight, batch.wait_ms) == (0, 0, -1)

    @pytest.mark.parametrize("reply", [None, b"+", [b"+d"], [b"+", b"x", b"oops"]])
    def test_an_enqueue_reply_of_any_shape_reads(self, reply: Any) -> None:
        result = enqueue_result(reply)
        assert isinstance(result.statuses, str)
        assert isinstance(result.acked, int)

    @pytest.mark.parametrize("reply", [None, 3, [b"2"], [2, [b"r"]], [b"x", b"y"]])
    def test_a_count_reply_of_any_shape_reads(self, reply: Any) -> None:
        count = count_result(reply)
        assert count in (0, 2)
        assert isinstance(count.repairs, tuple)
