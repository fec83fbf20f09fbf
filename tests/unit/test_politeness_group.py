"""Politeness across crawls: the crawls of one politeness group share each lane's budget.

Two crawls on one Redis (fakeredis and the real redis-server, ``client``) fetch the
same lane. Each keeps its own queue, ``hosts`` and ``busy``; the lane's in-flight count
(``group_busy``) and rest (``host_next``) are the group's. A lane that one crawl holds
is skipped by the other without spinning (it moves a re-check ahead) and leased by
it once the holder's ack (or a sweep, a purge, a flush) frees it.
"""

from __future__ import annotations

import hashlib
import time
from typing import TYPE_CHECKING

from scrapy_redisspine.frontier import GROUP_RECHECK_MS, Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.status import read_status
from tests.queue_view import queued_count

if TYPE_CHECKING:
    import redis

TIMEOUT_MS = 30_000
REST_MS = 60_000  # a rest no test outlives
CRAWL_A = CrawlKeys("redisspine", "a")
CRAWL_B = CrawlKeys("redisspine", "b")
LANE = "shop.example"


def _requests(crawl: str, count: int, lane: str = LANE) -> list[NewRequest]:
    payloads = [f"{crawl}-{lane}-{i}".encode() for i in range(count)]
    return [NewRequest(p, hashlib.sha1(p).digest(), lane=lane) for p in payloads]


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _two_crawls(
    client: redis.Redis, concurrency: int = 1, b_keys: CrawlKeys = CRAWL_B
) -> tuple[Frontier, Frontier]:
    a = Frontier(client, CRAWL_A, "wa", concurrency=concurrency)
    b = Frontier(client, b_keys, "wb", concurrency=concurrency)
    a.enqueue(_requests("a", 3))
    b.enqueue(_requests("b", 3))
    return a, b


def _wait_recheck() -> None:
    time.sleep(GROUP_RECHECK_MS / 1000 + 0.05)


class TestSharedSlots:
    def test_a_lane_held_by_one_crawl_is_not_leased_by_the_other(
        self, client: redis.Redis
    ) -> None:
        a, b = _two_crawls(client)
        assert [lease.lane for lease in a.lease(10).leases] == [LANE]
        before = _server_ms(client)
        batch = b.lease(10)
        assert batch.leases == []
        assert client.hget(CRAWL_A.group_busy, LANE) == b"1"
        assert not client.exists(CRAWL_B.busy), "crawl b holds nothing"
        # Not spinning: the lane stays in b's hosts, a re-check ahead, and b is told
        # to come back then (not at once).
        score = client.zscore(CRAWL_B.hosts, LANE)
        assert score is not None
        assert score >= before + GROUP_RECHECK_MS
        assert GROUP_RECHECK_MS - 100 <= batch.wait_ms <= GROUP_RECHECK_MS
        assert b.lease(10).leases == [], "not due again before the re-check"

    def test_the_other_crawl_leases_the_lane_once_the_ack_freed_it(
        self, client: redis.Redis
    ) -> None:
        a, b = _two_crawls(client)
        (held,) = a.lease(10).leases
        assert b.lease(10).leases == []
        assert a.ack([(held.key, held.token, 0)]) == 1
        assert not client.exists(CRAWL_A.group_busy)
        _wait_recheck()
        assert [lease.lane for lease in b.lease(10).leases] == [LANE]
        assert a.lease(10).leases == [], "now crawl b holds the lane"
        assert client.hget(CRAWL_A.group_busy, LANE) == b"1"

    def test_the_rest_after_one_crawls_fetch_holds_for_the_other(
        self, client: redis.Redis
    ) -> None:
        a, b = _two_crawls(client)
        (held,) = a.lease(10).leases
        b.lease(10)
        before = _server_ms(client)
        a.ack([(held.key, held.token, REST_MS)])
        _wait_recheck()
        batch = b.lease(10)
        assert batch.leases == [], "the lane rests, whichever crawl fetched it"
        score = client.zscore(CRAWL_B.hosts, LANE)
        assert score is not None
        assert score >= before + REST_MS, "moved to the end of the group's rest"
        assert REST_MS - 5_000 <= batch.wait_ms <= REST_MS

    def test_a_short_rest_ends_for_the_other_crawl_too(self, client: redis.Redis) -> None:
        a, b = _two_crawls(client)
        (held,) = a.lease(10).leases
        a.ack([(held.key, held.token, 300)])
        assert b.lease(10).leases == []
        time.sleep(0.35)
        assert [lease.lane for lease in b.lease(10).leases] == [LANE]

    def test_concurrency_counts_both_crawls(self, client: redis.Redis) -> None:
        a, b = _two_crawls(client, concurrency=3)
        assert len(a.lease(2).leases) == 2
        assert len(b.lease(10).leases) == 1, "3 slots, 2 held by crawl a"
        assert b.lease(10).leases == []
        assert client.hget(CRAWL_A.group_busy, LANE) == b"3"
        assert client.hget(CRAWL_A.busy, LANE) == b"2"
        assert client.hget(CRAWL_B.busy, LANE) == b"1"

    def test_a_lane_full_of_the_crawls_own_leases_leaves_its_hosts(
        self, client: redis.Redis
    ) -> None:
        a, _ = _two_crawls(client)
        (held,) = a.lease(10).leases
        assert client.zscore(CRAWL_A.hosts, LANE) is None, "its own ack puts it back"
        a.ack([(held.key, held.token, 0)])
        assert client.zscore(CRAWL_A.hosts, LANE) is not None

    def test_crawls_of_different_groups_do_not_share(self, client: redis.Redis) -> None:
        a, b = _two_crawls(client, b_keys=CrawlKeys("redisspine", "b", "other"))
        assert len(a.lease(10).leases) == 1
        assert len(b.lease(10).leases) == 1


class TestFreedByUpkeep:
    def test_a_swept_dead_worker_frees_the_group_slot(self, client: redis.Redis) -> None:
        a, b = _two_crawls(client)
        a_live = Frontier(client, CRAWL_A, "wa2")
        a.heartbeat()
        a_live.heartbeat()
        assert len(a.lease(10).leases) == 1
        client.zadd(CRAWL_A.workers, {"wa": _server_ms(client) - 10 * TIMEOUT_MS})
        assert b.lease(10).leases == []
        result = a_live.upkeep.requeue_stale(
            timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=3
        )
        assert result.requeued == 1
        assert not client.exists(CRAWL_A.group_busy)
        _wait_recheck()
        assert [lease.lane for lease in b.lease(10).leases] == [LANE]

    def test_a_purge_with_leases_in_flight_frees_the_group_slots(
        self, client: redis.Redis
    ) -> None:
        a, b = _two_crawls(client, concurrency=2)
        assert len(a.lease(10).leases) == 2
        assert b.lease(10).leases == []
        a.upkeep.purge()
        assert not client.exists(CRAWL_A.group_busy)
        _wait_recheck()
        assert len(b.lease(10).leases) == 2

    def test_a_purge_leaves_the_other_crawls_counts(self, client: redis.Redis) -> None:
        a, b = _two_crawls(client, concurrency=2)
        a.lease(1)
        b.lease(1)
        a.upkeep.purge()
        assert client.hget(CRAWL_A.group_busy, LANE) == b"1"
        assert client.hget(CRAWL_B.busy, LANE) == b"1"

    def test_a_flush_on_register_frees_the_group_slots(self, client: redis.Redis) -> None:
        a, b = _two_crawls(client)
        a.lease(10)
        client.zadd(CRAWL_A.workers, {"wa": _server_ms(client) - 10 * TIMEOUT_MS})
        fresh = Frontier(client, CRAWL_A, "wa3")
        assert fresh.register(flush=True, alive_ms=TIMEOUT_MS).flushed
        assert not client.exists(CRAWL_A.group_busy)
        _wait_recheck()
        assert len(b.lease(10).leases) == 1


def test_status_shows_the_groups_count_beside_the_crawls(client: redis.Redis) -> None:
    a, b = _two_crawls(client, concurrency=2)
    assert len(a.lease(1).leases) == len(b.lease(1).leases) == 1
    rows = {row["lane"]: row for row in read_status(client, CRAWL_B)["hosts"]}
    assert (rows[LANE]["busy"], rows[LANE]["group_busy"]) == (1, 2)


def test_the_lease_repair_of_counts_with_nothing_in_flight_spares_the_other_crawls(
    client: redis.Redis,
) -> None:
    """Crawl a's busy count says 2 with nothing in flight (garbage, or counts gone
    wrong): the lease's repair drops it, and takes exactly those 2 out of the group,
    leaving crawl b's lease counted."""
    a, b = _two_crawls(client, concurrency=3)
    b.lease(1)
    client.hset(CRAWL_A.busy, LANE, 2)
    client.hincrby(CRAWL_A.group_busy, LANE, 2)
    client.delete(CRAWL_A.hosts)  # no lane scheduled: the repair's case
    assert a.lease(10).leases == []  # nothing due: the repair runs
    assert client.hget(CRAWL_A.busy, LANE) is None
    assert client.hget(CRAWL_A.group_busy, LANE) == b"1", "crawl b's lease is still counted"
    assert len(a.lease(10).leases) == 2, "rescheduled: 3 slots, 1 held by crawl b"


class TestDeadCrawlsOfTheGroup:
    """A crawl whose workers all died holds the group's lane slots: the group's other
    crawls find it in the group's registry and sweep it (extension.Recovery)."""

    def test_the_other_crawl_sweeps_a_crawl_whose_workers_died(
        self, client: redis.Redis
    ) -> None:
        a, b = _two_crawls(client)
        a.register(flush=False, alive_ms=TIMEOUT_MS, spider="s")
        b.register(flush=False, alive_ms=TIMEOUT_MS, spider="s")
        assert len(a.lease(10).leases) == 1
        assert b.lease(10).leases == []  # the lane's one slot is a's
        assert b.upkeep.group_crawls(10) == ["a"]
        other = b.upkeep.of_crawl("a")
        assert other is not None
        # Silent for 2x the timeout: not yet (another crawl is swept at 3x, see
        # Recovery); then long enough.
        client.zadd(CRAWL_A.workers, {"wa": _server_ms(client) - 2 * TIMEOUT_MS})
        assert other.requeue_stale(timeout_ms=3 * TIMEOUT_MS, ceiling_ms=0,
                                   max_requeues=3).requeued == 0
        client.zadd(CRAWL_A.workers, {"wa": _server_ms(client) - 4 * TIMEOUT_MS})
        assert other.requeue_stale(timeout_ms=3 * TIMEOUT_MS, ceiling_ms=0,
                                   max_requeues=3).requeued == 1
        assert not client.exists(CRAWL_A.group_busy)
        assert queued_count(client, CRAWL_A) == 3  # back in a's own queue
        _wait_recheck()
        assert [lease.lane for lease in b.lease(10).leases] == [LANE]

    def test_a_purged_or_vanished_crawl_leaves_the_registry_untouched_otherwise(
        self, client: redis.Redis
    ) -> None:
        a, b = _two_crawls(client)
        a.register(flush=False, alive_ms=TIMEOUT_MS, spider="s")
        b.register(flush=False, alive_ms=TIMEOUT_MS, spider="s")
        a.upkeep.purge()
        assert b.upkeep.group_crawls(10) == []  # purge takes it out
        client.sadd(CRAWL_A.group_crawls, "a")  # a registry entry left by a crash
        assert b.upkeep.of_crawl("a") is None  # no record: nothing to sweep, no write
        assert b.upkeep.group_crawls(10) == []
        assert not client.exists(CRAWL_A.queue)

    def test_crawls_of_another_group_are_not_in_the_registry(
        self, client: redis.Redis
    ) -> None:
        elsewhere = CrawlKeys("redisspine", "c", "news")
        a = Frontier(client, CRAWL_A, "wa")
        c = Frontier(client, elsewhere, "wc")
        a.register(flush=False, alive_ms=TIMEOUT_MS, spider="s")
        c.register(flush=False, alive_ms=TIMEOUT_MS, spider="s")
        assert a.upkeep.group_crawls(10) == []
        assert c.upkeep.group_crawls(10) == []


def test_a_lease_writes_each_lanes_own_counts_when_a_due_lane_is_held_back(
    client: redis.Redis,
) -> None:
    # lease.lua writes the picked lanes' counts from what pick read of every due lane:
    # with a lane held back between two picked ones, each picked lane must still get
    # its own busy and group counts, not its neighbour's.
    b = Frontier(client, CRAWL_B, "wb", concurrency=2)
    lanes = ["one.example", "held.example", "three.example"]
    b.enqueue([*_requests("b", 1, lanes[0]), *_requests("b", 1, lanes[1]),
               *_requests("b", 2, lanes[2])])
    client.zadd(CRAWL_B.hosts, {lanes[0]: 2**50, lanes[1]: 2**50})
    assert [lease.lane for lease in b.lease(1).leases] == [lanes[2]]
    client.zadd(CRAWL_B.hosts, {lanes[0]: 1, lanes[1]: 2, lanes[2]: 3})  # due in this order
    rest_end = _server_ms(client) + REST_MS  # another crawl of the group fetched it
    client.hset(CRAWL_B.host_next, lanes[1], rest_end)
    assert sorted(lease.lane for lease in b.lease(10).leases) == [lanes[0], lanes[2]]
    assert client.hgetall(CRAWL_B.busy) == {lanes[0].encode(): b"1", lanes[2].encode(): b"2"}
    assert client.hgetall(CRAWL_B.group_busy) == {
        lanes[0].encode(): b"1", lanes[2].encode(): b"2"}
    assert int(client.hget(CRAWL_B.host_next, lanes[1]) or 0) == rest_end
    assert client.zscore(CRAWL_B.hosts, lanes[1]) == rest_end, "held back to its rest's end"
    assert client.zscore(CRAWL_B.hosts, lanes[2]) is None, "both of its slots are taken"
