"""Fleet-wide per-host politeness: lanes, slots, rests, backlog caps, and their adapters.

The frontier tests run on fakeredis and on the real redis-server (``client``). A lane
is a politeness unit (host or registered domain); with concurrency C at most C of its
requests are in flight fleet-wide, and after each ack the lane rests ``rest_ms``.
Rests are checked with long values (a minute) against the server clock, and with short
ones (a few hundred ms) where the lane must become leasable again.
"""

from __future__ import annotations

import email.utils
import hashlib
import threading
import time
from collections import Counter
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.http import Response
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_redisspine.frontier import Frontier, Lease, NewRequest, split_member
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.middleware import Politeness, parse_retry_after
from scrapy_redisspine.politeness import DelayPolicy, make_lane_function, url_hostname
from scrapy_redisspine.settings import ConfigError, load_config
from tests.queue_view import queued as queued_requests
from tests.unit.conftest import engine_of, finish, next_request

if TYPE_CHECKING:
    from collections.abc import Callable

    import redis
    from twisted.internet import task

    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import FrontierFactory, MakeScheduler

TIMEOUT_MS = 30_000
REST_MS = 60_000  # a rest no test outlives
KEYS = CrawlKeys("redisspine", "test")


def _new(payload: bytes, lane: str, priority: int = 0, **kwargs: Any) -> NewRequest:
    """A request whose fingerprint is a digest, as Scrapy's are (dedup keeps 14 bytes)."""
    fingerprint = hashlib.sha1(payload).digest()
    return NewRequest(payload, fingerprint, priority=priority, lane=lane, **kwargs)


def _lane_requests(lane: str, count: int, prefix: str | None = None) -> list[NewRequest]:
    return [_new(f"{prefix or lane}-{i}".encode(), lane) for i in range(count)]


def _server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _lanes(frontier: Frontier, count: int = 100) -> list[str]:
    return [lease.lane for lease in frontier.lease(count).leases]


def _hash(client: redis.Redis, key: str) -> dict[str, int]:
    return {name.decode(): int(float(value)) for name, value in client.hgetall(key).items()}


def _silence(client: redis.Redis, worker_id: str) -> None:
    client.zadd(KEYS.workers, {worker_id: _server_ms(client) - 10 * TIMEOUT_MS})


def _assert_lane_bookkeeping(client: redis.Redis, keys: CrawlKeys, concurrency: int) -> None:
    """backlog, busy and hosts agree with what the queue and in-flight really hold."""
    queued = Counter(request.lane for request in queued_requests(client, keys))
    held = Counter(
        split_member(entry.split(b"\n", 2)[2])[0] for entry in client.hvals(keys.inflight)
    )
    assert _hash(client, keys.backlog) == dict(queued)
    assert _hash(client, keys.busy) == dict(held)
    next_at = _hash(client, keys.host_next)
    scheduled = {
        lane.decode(): score for lane, score in client.zrange(keys.hosts, 0, -1, withscores=True)
    }
    assert set(scheduled) == {lane for lane in queued if held[lane] < concurrency}
    # A lane is due at its next time, or later: when it was freed (so the lanes due
    # at once go in the order they were freed).
    late = {lane: score for lane, score in scheduled.items() if score < next_at.get(lane, 0)}
    assert not late, f"lanes scheduled before their rest ends: {late} (rests: {next_at})"


def _resting_lane_with_a_lease_left(make_frontier: FrontierFactory) -> tuple[Frontier, Lease]:
    """Lane a.example (two slots) was leased twice: one fetch was acked with a long
    rest (:data:`REST_MS`), the other lease is still held and is returned."""
    frontier = make_frontier(concurrency=2)
    frontier.enqueue(_lane_requests("a.example", 3))
    fetched, held = frontier.lease(10).leases
    assert frontier.ack([(fetched.key, fetched.token, REST_MS)]) == 1
    return frontier, held


# -- one lane, many workers: the slots ----------------------------------------------------


class TestSlots:
    def test_concurrency_one_gives_one_lease_per_lane_across_workers(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        w1, w2, w3 = make_frontier("w1"), make_frontier("w2"), make_frontier("w3")
        w1.enqueue(_lane_requests("a.example", 5) + _lane_requests("b.example", 1))
        batch = w1.lease(10)
        assert sorted(lease.lane for lease in batch.leases) == ["a.example", "b.example"]
        assert w2.lease(10).leases == [], "both lanes hold their one slot"
        assert w3.lease(10).leases == []
        assert _hash(client, crawl_keys.busy) == {"a.example": 1, "b.example": 1}
        assert _hash(client, crawl_keys.backlog) == {"a.example": 4}
        assert client.zcard(crawl_keys.hosts) == 0, "no lane has a free slot"

        (a_lease,) = [lease for lease in batch.leases if lease.lane == "a.example"]
        assert w1.ack([a_lease.handle]) == 1
        assert _lanes(w2) == ["a.example"]
        assert w3.lease(10).leases == []

    def test_concurrency_two_allows_exactly_two(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        w1 = make_frontier("w1", concurrency=2)
        w2 = make_frontier("w2", concurrency=2)
        w1.enqueue(_lane_requests("a.example", 5))
        first = w1.lease(1).leases
        second = w2.lease(10).leases
        assert len(first) == len(second) == 1
        assert w1.lease(10).leases == []
        assert w2.lease(10).leases == []
        assert _hash(client, crawl_keys.busy) == {"a.example": 2}
        assert w2.ack([second[0].handle]) == 1
        assert len(w1.lease(10).leases) == 1, "one slot freed, one more lease"
        assert w2.lease(10).leases == []

    def test_one_lease_call_fills_every_free_slot_of_a_lane(
        self, make_frontier: FrontierFactory
    ) -> None:
        frontier = make_frontier(concurrency=3)
        frontier.enqueue(_lane_requests("a.example", 5))
        assert [lease.payload for lease in frontier.lease(10).leases] == [
            b"a.example-0", b"a.example-1", b"a.example-2",
        ]

    def test_lease_count_bounds_the_slots_taken(self, make_frontier: FrontierFactory) -> None:
        frontier = make_frontier(concurrency=3)
        frontier.enqueue(_lane_requests("a.example", 5))
        assert len(frontier.lease(2).leases) == 2
        assert len(frontier.lease(2).leases) == 1, "the third slot"
        assert frontier.lease(2).leases == []

    def test_release_frees_the_slot_without_rest(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        w1, w2 = make_frontier("w1"), make_frontier("w2")
        w1.enqueue(_lane_requests("a.example", 2))
        (lease,) = w1.lease(10).leases
        assert w1.release([lease.handle]) == 1
        assert not client.exists(crawl_keys.busy)
        assert not client.exists(crawl_keys.host_next), "nothing was fetched: no rest"
        (again,) = w2.lease(10).leases
        assert (again.key, again.payload) == (lease.key, lease.payload)

    def test_release_keeps_an_earlier_rest(self, make_frontier: FrontierFactory) -> None:
        # A rest from the previous fetch still holds after an unstarted lease returns.
        frontier, unstarted = _resting_lane_with_a_lease_left(make_frontier)
        assert frontier.release([unstarted.handle]) == 1
        assert frontier.lease(10).leases == []

    def test_bury_frees_the_slot_without_rest(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier()
        frontier.enqueue(_lane_requests("a.example", 2))
        (lease,) = frontier.lease(10).leases
        assert frontier.bury(lease.handle, "undecodable")
        assert not client.exists(crawl_keys.busy)
        assert [lease.payload for lease in frontier.lease(10).leases] == [b"a.example-1"]

    def test_release_orphans_frees_the_slots(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier()
        frontier.enqueue(_lane_requests("a.example", 1) + _lane_requests("b.example", 1))
        assert len(frontier.lease(10).leases) == 2  # ... and the reply was lost
        assert frontier.release_orphans([]) == 2
        assert not client.exists(crawl_keys.busy)
        assert _hash(client, crawl_keys.backlog) == {"a.example": 1, "b.example": 1}
        assert sorted(_lanes(frontier)) == ["a.example", "b.example"]

    def test_empty_lane_is_a_lane_like_any_other(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        w1, w2 = make_frontier("w1"), make_frontier("w2")
        w1.enqueue(_lane_requests("", 2, prefix="data"))
        assert client.zrange(crawl_keys.hosts, 0, -1) == [b""]
        (lease,) = w1.lease(10).leases
        assert lease.lane == ""
        assert w2.lease(10).leases == []
        assert _hash(client, crawl_keys.busy) == {"": 1}
        assert _hash(client, crawl_keys.backlog) == {"": 1}
        assert w1.ack([lease.handle]) == 1
        (second,) = w2.lease(10).leases
        assert (second.lane, second.payload) == ("", b"data-1")
        assert w2.ack([second.handle]) == 1
        assert not client.exists(crawl_keys.busy)
        assert not client.exists(crawl_keys.backlog)
        assert not client.exists(crawl_keys.hosts)


def test_many_workers_never_hold_two_leases_of_one_lane(
    make_client: Callable[[], redis.Redis], crawl_keys: CrawlKeys
) -> None:
    lanes = [f"host-{i}.example" for i in range(4)]
    seeder = Frontier(make_client(), crawl_keys, "seeder")
    seeder.enqueue([r for lane in lanes for r in _lane_requests(lane, 15)])
    guard = threading.Lock()
    in_flight: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    fetched: list[bytes] = []
    errors: list[BaseException] = []

    deadline = time.monotonic() + 30

    def work(worker_id: str) -> None:
        client = make_client()
        frontier = Frontier(client, crawl_keys, worker_id)
        try:
            while time.monotonic() < deadline:
                leases = frontier.lease(3).leases
                if not leases:
                    if frontier.upkeep.counts() == (0, 0):
                        return
                    time.sleep(0.001)
                    continue
                with guard:
                    for lease in leases:
                        in_flight[lease.lane] += 1
                        peak[lease.lane] = max(peak[lease.lane], in_flight[lease.lane])
                        fetched.append(lease.payload)
                time.sleep(0.001)  # the "download"
                with guard:
                    for lease in leases:
                        in_flight[lease.lane] -= 1
                assert frontier.ack([lease.handle for lease in leases]) == len(leases)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
        finally:
            client.close()

    threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    assert sorted(fetched) == sorted(f"{lane}-{i}".encode() for lane in lanes for i in range(15))
    assert set(peak.values()) == {1}, f"a lane had two requests in flight: {peak}"
    assert seeder.upkeep.counts() == (0, 0)


# -- rests ----------------------------------------------------------------------------------


class TestRest:
    def test_acked_lane_rests_while_others_are_served(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier()
        frontier.enqueue(_lane_requests("a.example", 2) + _lane_requests("b.example", 2))
        leases = {lease.lane: lease for lease in frontier.lease(10).leases}
        a, b = leases["a.example"], leases["b.example"]
        before = _server_ms(client)
        assert frontier.ack([(a.key, a.token, REST_MS), (b.key, b.token, 0)]) == 2
        after = _server_ms(client)

        next_at = int(client.hget(crawl_keys.host_next, "a.example"))
        assert before + REST_MS <= next_at <= after + REST_MS
        assert client.zscore(crawl_keys.hosts, "a.example") == next_at
        batch = frontier.lease(10)
        assert [lease.payload for lease in batch.leases] == [b"b.example-1"]
        assert REST_MS - 5_000 <= batch.wait_ms <= REST_MS, "until a.example is due"
        assert make_frontier("w2").lease(10).leases == [], "the rest is fleet-wide"

    def test_rested_lane_is_leasable_once_the_rest_is_over(
        self, make_frontier: FrontierFactory
    ) -> None:
        frontier = make_frontier()
        frontier.enqueue(_lane_requests("a.example", 2))
        (lease,) = frontier.lease(10).leases
        assert frontier.ack([(lease.key, lease.token, 300)]) == 1
        batch = frontier.lease(10)
        assert batch.leases == []
        assert 0 < batch.wait_ms <= 300
        time.sleep(batch.wait_ms / 1000 + 0.05)
        assert [lease.payload for lease in frontier.lease(10).leases] == [b"a.example-1"]

    def test_ack_without_a_rest_leaves_the_lane_due_at_once(
        self, make_frontier: FrontierFactory
    ) -> None:
        frontier = make_frontier()
        frontier.enqueue(_lane_requests("a.example", 2))
        (lease,) = frontier.lease(10).leases
        assert frontier.ack([lease.handle]) == 1
        assert len(frontier.lease(10).leases) == 1

    def test_a_shorter_rest_never_cuts_a_longer_one(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # e.g. a Retry-After block from one fetch, then a plain delay from another
        frontier, plain = _resting_lane_with_a_lease_left(make_frontier)
        blocked_until = int(client.hget(crawl_keys.host_next, "a.example"))
        assert frontier.ack([(plain.key, plain.token, 10)]) == 1
        assert int(client.hget(crawl_keys.host_next, "a.example")) == blocked_until
        assert frontier.lease(10).leases == []

    def test_lanes_are_served_oldest_due_first(self, make_frontier: FrontierFactory) -> None:
        frontier = make_frontier()
        frontier.enqueue(_lane_requests("a.example", 2) + _lane_requests("z.example", 2))
        leases = {lease.lane: lease for lease in frontier.lease(10).leases}
        a, z = leases["a.example"], leases["z.example"]
        assert frontier.ack([(z.key, z.token, 0)]) == 1
        assert frontier.ack([(a.key, a.token, 100)]) == 1
        time.sleep(0.2)  # both due now; z.example has waited longer
        assert _lanes(frontier, 1) == ["z.example"]
        assert _lanes(frontier, 1) == ["a.example"]

    def test_wait_ms_says_none_is_scheduled(self, frontier: Frontier) -> None:
        assert frontier.lease(10).wait_ms == -1
        frontier.enqueue(_lane_requests("a.example", 1))
        batch = frontier.lease(10)
        assert len(batch.leases) == 1
        assert batch.wait_ms == -1, "the only lane is busy: nothing is scheduled"

    def test_wait_ms_is_zero_when_a_due_lane_was_left_over(
        self, make_frontier: FrontierFactory
    ) -> None:
        frontier = make_frontier()
        frontier.enqueue(_lane_requests("a.example", 1) + _lane_requests("b.example", 1))
        batch = frontier.lease(1)
        assert len(batch.leases) == 1
        assert batch.wait_ms == 0


class TestRestFromTheEndOfTheFetch:
    """An ack tells how long ago its fetch ended (ms): the rest starts then, credited
    up to the rest itself, and a value that is no elapsed time counts as 0."""

    def _acked(
        self, make_frontier: FrontierFactory, client: redis.Redis, rest_ms: int, elapsed: Any
    ) -> tuple[int, int, Any]:
        """Ack a lease of a.example with this rest and elapsed; (server ms before,
        after, the enqueue result)."""
        frontier = make_frontier()
        frontier.enqueue(_lane_requests("a.example", 2))
        (lease,) = frontier.lease(10).leases
        before = _server_ms(client)
        result = frontier.enqueue((), [(lease.key, lease.token, rest_ms, -1, 0, elapsed)])
        after = _server_ms(client)
        assert result.acked == 1
        return before, after, result

    def test_the_rest_starts_when_the_fetch_ended(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        before, after, result = self._acked(make_frontier, client, REST_MS, 20_000)
        next_at = int(client.hget(crawl_keys.host_next, "a.example"))
        assert before + REST_MS - 20_000 <= next_at <= after + REST_MS - 20_000
        assert client.zscore(crawl_keys.hosts, "a.example") == next_at
        assert result.repairs == ()

    def test_the_credit_is_capped_at_the_rest(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # A stale ack (sent long after its fetch: an outage) makes the lane due now,
        # never in the past, where it would jump the lanes freed before it.
        before, after, _ = self._acked(make_frontier, client, 1_000, 3_600_000)
        assert not client.hexists(crawl_keys.host_next, "a.example")
        due = client.zscore(crawl_keys.hosts, "a.example")
        assert due is not None
        assert before <= due <= after

    def test_a_credit_never_cuts_an_earlier_longer_rest(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier, held = _resting_lane_with_a_lease_left(make_frontier)
        blocked_until = int(client.hget(crawl_keys.host_next, "a.example"))
        assert frontier.enqueue((), [(held.key, held.token, 500, -1, 0, 400)]).acked == 1
        assert int(client.hget(crawl_keys.host_next, "a.example")) == blocked_until
        assert frontier.lease(10).leases == []

    @pytest.mark.parametrize("garbage", ["-5", "x", "nan", "inf", ""])
    def test_garbage_counts_as_no_credit_and_is_recorded(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys,
        garbage: str,
    ) -> None:
        before, after, result = self._acked(make_frontier, client, REST_MS, garbage)
        next_at = int(client.hget(crawl_keys.host_next, "a.example"))
        assert before + REST_MS <= next_at <= after + REST_MS, "the whole rest, from now"
        (repair,) = result.repairs
        assert repair.startswith("ack ")
        assert repair.endswith("-> 0 (elapsed)")

    def test_the_worker_logs_and_counts_a_garbage_credit(
        self, make_frontier: FrontierFactory, client: redis.Redis,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        from scrapy.statscollectors import MemoryStatsCollector

        from scrapy_redisspine._guard import RedisGuard

        _, _, result = self._acked(make_frontier, client, 500, "-1")
        stats = MemoryStatsCollector(get_crawler(Spider))
        guard = RedisGuard(stats, time.monotonic)
        with caplog.at_level("WARNING", logger="scrapy_redisspine"):
            guard.repaired("enqueue", result.repairs)
        assert stats.get_value("redisspine/repaired") == 1
        assert [r.getMessage() for r in caplog.records if "(elapsed)" in r.getMessage()]


class TestRoundRobin:
    def test_a_huge_lane_does_not_starve_small_ones(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier()
        frontier.enqueue(_lane_requests("a-huge.example", 1000))
        frontier.enqueue(
            _lane_requests("b.example", 1) + _lane_requests("c.example", 1)
            + _lane_requests("d.example", 1)
        )
        assert _hash(client, crawl_keys.backlog)["a-huge.example"] == 1000
        assert sorted(_lanes(frontier, 4)) == [
            "a-huge.example", "b.example", "c.example", "d.example",
        ]

    def test_a_lane_with_free_slots_takes_them_all_in_its_turn(
        self, make_frontier: FrontierFactory
    ) -> None:
        # "one per free slot of each due lane": concurrency 2 gives the huge lane two
        frontier = make_frontier(concurrency=2)
        frontier.enqueue(_lane_requests("a-huge.example", 100) + _lane_requests("b.example", 1))
        assert Counter(_lanes(frontier, 10)) == {"a-huge.example": 2, "b.example": 1}


# -- crash recovery -------------------------------------------------------------------------


class TestRequeueStale:
    def test_frees_the_dead_workers_slots_and_rests_the_lanes(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        dead, live = make_frontier("dead"), make_frontier("live")
        dead.enqueue(_lane_requests("a.example", 2) + _lane_requests("b.example", 2))
        held = dead.lease(10).leases
        assert len(held) == 2
        assert live.lease(10).leases == []
        _silence(client, "dead")
        before = _server_ms(client)
        result = live.upkeep.requeue_stale(
            timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=3, rest_ms=REST_MS
        )
        assert (result.requeued, result.workers_removed) == (2, 1)
        assert not client.exists(crawl_keys.busy)
        assert _hash(client, crawl_keys.backlog) == {"a.example": 2, "b.example": 2}
        for lane in ("a.example", "b.example"):
            score = client.zscore(crawl_keys.hosts, lane)
            assert score is not None
            assert score >= before + REST_MS, "the dead worker may have been fetching"
        batch = live.lease(10)
        assert batch.leases == []
        assert REST_MS - 5_000 <= batch.wait_ms <= REST_MS

    def test_without_rest_the_requeued_requests_are_leased_at_once(
        self, make_frontier: FrontierFactory, client: redis.Redis
    ) -> None:
        dead, live = make_frontier("dead"), make_frontier("live")
        dead.enqueue(_lane_requests("a.example", 2) + _lane_requests("b.example", 2))
        held = {lease.key for lease in dead.lease(10).leases}
        _silence(client, "dead")
        assert live.upkeep.requeue_stale(
            timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=3
        ).requeued == 2
        assert {lease.key for lease in live.lease(10).leases} == held

    def test_dead_lettering_frees_the_slot(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        dead, live = make_frontier("dead"), make_frontier("live")
        dead.enqueue(_lane_requests("a.example", 2))
        dead.lease(10)
        _silence(client, "dead")
        result = live.upkeep.requeue_stale(timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=0)
        assert (result.requeued, result.dead_lettered) == (0, 1)
        assert not client.exists(crawl_keys.busy)
        assert [lease.payload for lease in live.lease(10).leases] == [b"a.example-1"]

    def test_reinjected_dead_letter_is_scheduled_in_its_lane(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier()
        frontier.enqueue(_lane_requests("a.example", 1))
        (lease,) = frontier.lease(10).leases
        assert frontier.bury(lease.handle, "bad")
        assert not client.exists(crawl_keys.hosts)
        assert frontier.upkeep.reinject_dead([lease.key]) == 1
        assert _hash(client, crawl_keys.backlog) == {"a.example": 1}
        (again,) = frontier.lease(10).leases
        assert (again.key, again.lane) == (lease.key, "a.example")


# -- backlog cap ----------------------------------------------------------------------------


class TestBacklogCap:
    def test_requests_past_the_cap_are_dropped_even_within_one_batch(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier(backlog_cap=2)
        result = frontier.enqueue(
            _lane_requests("a.example", 3) + _lane_requests("b.example", 1)
        )
        assert result.statuses == "++c+"
        assert result.enqueued == 3
        assert _hash(client, crawl_keys.backlog) == {"a.example": 2, "b.example": 1}
        assert frontier.upkeep.counts() == (3, 0)
        stats = _hash(client, crawl_keys.stats)
        assert (stats["enqueued"], stats["filtered"]) == (3, 1)
        assert frontier.enqueue(_lane_requests("a.example", 1, prefix="late")).statuses == "c"

    def test_a_capped_request_is_not_recorded_as_seen(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier(backlog_cap=1)
        first, capped = _lane_requests("a.example", 2)
        start = _new(b"start", "a.example", is_start=True, dont_filter=True)
        assert frontier.enqueue([first, capped, start]).statuses == "+cc"
        assert client.scard(crawl_keys.seen) == 1
        assert not client.exists(crawl_keys.starts)
        (lease,) = frontier.lease(10).leases  # the lane's backlog is free again
        assert frontier.enqueue([capped], [lease.handle]).statuses == "+", (
            "not a duplicate: it was never queued"
        )
        assert client.scard(crawl_keys.seen) == 2
        frontier.lease(10)
        assert frontier.enqueue([capped, start]).statuses == "d+"

    def test_in_flight_requests_do_not_count_against_the_cap(
        self, make_frontier: FrontierFactory
    ) -> None:
        frontier = make_frontier(backlog_cap=1)
        frontier.enqueue(_lane_requests("a.example", 1))
        assert len(frontier.lease(10).leases) == 1
        assert frontier.enqueue(_lane_requests("a.example", 2, prefix="more")).statuses == "+c"

    def test_no_cap_by_default(self, frontier: Frontier) -> None:
        assert frontier.enqueue(_lane_requests("a.example", 50)).enqueued == 50


# -- bad data ---------------------------------------------------------------------------------


class TestRepair:
    def test_garbage_without_a_lane_is_dead_lettered_and_does_not_stall(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        client.zadd(crawl_keys.queue, {b"garbage without a lane": 0, b"\xff\xfe": 0})
        frontier.enqueue(_lane_requests("a.example", 1))
        leased: list[bytes] = []
        malformed = 0
        for _ in range(3):
            batch = frontier.lease(10)
            malformed += batch.malformed
            leased += [lease.payload for lease in batch.leases]
            frontier.ack([lease.handle for lease in batch.leases])
        assert leased == [b"a.example-0"]
        assert malformed == 2
        assert frontier.upkeep.counts() == (0, 0)
        reasons = {letter.reason for letter in frontier.upkeep.dead_letters()}
        assert reasons == {"malformed queue member"}

    def test_lane_counts_lost_are_rebuilt(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.enqueue(_lane_requests("a.example", 2) + _lane_requests("b.example", 1))
        client.delete(crawl_keys.hosts, crawl_keys.backlog)
        assert frontier.lease(10).leases == []  # repaired here ...
        assert sorted(_lanes(frontier)) == ["a.example", "b.example"]  # ... served here
        assert _hash(client, crawl_keys.backlog) == {"a.example": 1}

    def test_garbage_in_a_lanes_range_does_not_strand_the_lane(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # A foreign member sorting first in lane a.example's range, while another
        # worker holds a lease of lane b.example (so the idle-crawl repair cannot run).
        w1, w2 = make_frontier("w1"), make_frontier("w2")
        w1.enqueue(_lane_requests("b.example", 1))
        (held,) = w2.lease(10).leases
        w1.enqueue(_lane_requests("a.example", 2))
        client.zadd(crawl_keys.queue, {b"a.example\x00\x00 foreign": 0})
        leased: list[bytes] = []
        for _ in range(4):
            batch = w1.lease(10)
            leased += [lease.payload for lease in batch.leases]
            w1.ack([lease.handle for lease in batch.leases])
        assert client.hlen(crawl_keys.dead) == 1
        assert leased == [b"a.example-0", b"a.example-1"], (
            "a.example's second request stranded: its backlog count was decremented for "
            "the foreign member, which was never counted"
        )
        assert w2.ack([held.handle]) == 1

    def test_member_with_a_non_zero_score_does_not_stall_the_fleet(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # Lex ranges assume every member of the queue has score 0. One foreign member
        # with a negative score empties every lane's range; a lane found empty loses its
        # schedule, and while anything is in flight the repair cannot run.
        w1, w2 = make_frontier("w1"), make_frontier("w2")
        w1.enqueue(_lane_requests("a.example", 1) + _lane_requests("b.example", 1))
        (held,) = w2.lease(1).leases
        client.zadd(crawl_keys.queue, {b"foreign": -1})
        batches = [w1.lease(10) for _ in range(3)]
        leased = [lease.payload for batch in batches for lease in batch.leases]
        assert len(leased) == 1, (
            "the other lane's request was never leased: its range looked empty, so the "
            "lane lost its schedule"
        )
        assert sum(batch.malformed for batch in batches) == 1
        assert w2.ack([held.handle]) == 1


# -- priority within a lane, and a whole crawl ------------------------------------------------


def test_priority_is_honoured_within_a_lane(frontier: Frontier) -> None:
    frontier.enqueue(
        [
            _new(b"low", "a.example", -5),
            _new(b"high", "a.example", 7),
            _new(b"mid", "a.example", 0),
            _new(b"other", "b.example", 100),
        ]
    )
    order: list[bytes] = []
    while leases := frontier.lease(10).leases:
        order += [lease.payload for lease in leases if lease.lane == "a.example"]
        frontier.ack([lease.handle for lease in leases])
    assert order == [b"high", b"mid", b"low"]


def test_a_sweep_rests_each_lane_for_its_own_delay(
    make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    # The dead worker may have been fetching: a requeued request's lane rests the
    # sweep's default, its own delay (REDISSPINE_HOST_DELAYS) or its robots.txt
    # Crawl-delay, whichever is longest; the no-host lane never rests.
    dead, sweeper = make_frontier("dead"), make_frontier("sweeper")
    lanes = ["plain.example", "override.example", "robots.example", ""]
    dead.enqueue([_new(f"{lane}/1".encode(), lane) for lane in lanes])
    dead.set_crawl_delay("robots.example", 30.0)
    dead.set_crawl_delay("", 30.0)  # ignored for the no-host lane
    assert len(dead.lease(10).leases) == 4
    _silence(client, "dead")
    before = _server_ms(client)
    result = sweeper.upkeep.requeue_stale(
        timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=3, rest_ms=5_000,
        lane_rests={"override.example": 60_000},
    )
    assert result.requeued == 4
    due = {lane.decode(): int(score) - before
           for lane, score in client.zrange(crawl_keys.hosts, 0, -1, withscores=True)}
    assert 4_000 <= due["plain.example"] <= 5_100
    assert 59_000 <= due["override.example"] <= 60_100
    assert 29_000 <= due["robots.example"] <= 30_100
    assert due[""] <= 100
    assert _lanes(sweeper) == [""], "only the no-host lane is due"
    _assert_lane_bookkeeping(client, crawl_keys, 1)


def test_new_requests_from_a_lower_concurrency_leave_a_due_lane_due(
    make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    # A push from outside the crawl (concurrency 1) into a lane that has one of its
    # two slots taken must not take the lane out of `hosts`.
    worker = make_frontier("w1", concurrency=2)
    worker.enqueue(_lane_requests("a.example", 3))
    assert len(worker.lease(1).leases) == 1
    assert client.zscore(crawl_keys.hosts, "a.example") is not None
    pusher = make_frontier("push", concurrency=1)
    assert pusher.push([_new(b"pushed", "a.example")]).statuses == "+"
    assert client.zscore(crawl_keys.hosts, "a.example") is not None
    assert len(worker.lease(5).leases) == 1, "its second slot is still free"
    _assert_lane_bookkeeping(client, crawl_keys, 2)


def test_batches_wider_than_one_redis_call_keep_the_books(
    make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    # The hot scripts write a whole batch per call in chunks of 1000 arguments
    # (lib/batch.lua, lib/lanes.lua): 1,200 lanes in one enqueue, lease and ack.
    frontier = make_frontier("w1")
    lanes = [f"h{i}.example" for i in range(1200)]
    statuses = frontier.enqueue(
        [_new(f"{lane}/{n}".encode(), lane) for n in range(2) for lane in lanes]
    ).statuses
    assert statuses == "+" * 2400
    _assert_lane_bookkeeping(client, crawl_keys, 1)
    leases = frontier.lease(5000).leases
    assert sorted(lease.lane for lease in leases) == sorted(lanes), "one per lane"
    _assert_lane_bookkeeping(client, crawl_keys, 1)
    assert frontier.ack([(lease.key, lease.token, REST_MS) for lease in leases]) == 1200
    _assert_lane_bookkeeping(client, crawl_keys, 1)
    assert client.hlen(crawl_keys.host_next) == 1200
    assert not frontier.lease(5000).leases, "every lane rests"
    assert client.zcard(crawl_keys.hosts) == 1200


def test_lane_bookkeeping_is_empty_after_a_whole_crawl(
    make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    lanes = ["", "a.example", "b.example", "c.example"]
    w1, w2 = make_frontier("w1", concurrency=2), make_frontier("w2", concurrency=2)

    def check() -> None:
        _assert_lane_bookkeeping(client, crawl_keys, 2)

    w1.enqueue([_new(f"seed-{lane}".encode(), lane, priority=3) for lane in lanes])
    check()
    # paths that put requests back: release, bury + reinject, a sweep, lost replies
    first = w1.lease(2).leases
    check()
    assert w1.release([lease.handle for lease in first]) == 2
    check()
    (buried,) = w1.lease(1).leases
    assert w1.bury(buried.handle, "bad")
    check()
    assert w1.upkeep.reinject_dead([buried.key]) == 1
    check()
    w2.lease(3)
    _silence(client, "w2")
    assert w1.upkeep.requeue_stale(
        timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=3, rest_ms=1
    ).requeued == 3
    check()
    time.sleep(0.01)  # past the 1 ms rest of the swept lanes
    w1.lease(2)
    assert w1.release_orphans([]) == 2
    check()

    fetched = 0
    workers = [w1, w2]
    for turn in range(200):
        frontier = workers[turn % 2]
        leases = frontier.lease(3).leases
        if not leases and frontier.upkeep.counts() == (0, 0):
            break
        children = [
            _new(f"{lease.payload.decode()}/{i}".encode(), lanes[(fetched + i) % 4])
            for lease in leases
            for i in range(2)
            if lease.payload.count(b"/") < 2
        ]
        check()
        acks = [(lease.key, lease.token, 0) for lease in leases]
        assert frontier.enqueue(children, acks).acked == len(leases)
        check()
        fetched += len(leases)
    assert fetched == 4 * (1 + 2 + 4)
    for key in (crawl_keys.busy, crawl_keys.backlog, crawl_keys.hosts, crawl_keys.queue,
                crawl_keys.inflight, crawl_keys.leases, crawl_keys.owned):
        assert not client.exists(key), key
    # Only lanes that had to rest (here: the 1 ms of the sweep) have a next time; it
    # is kept for the whole crawl. Acks with no rest write nothing.
    rested = set(_hash(client, crawl_keys.host_next))
    assert rested, "kept for the whole crawl"
    assert rested <= set(lanes)


# -- DelayPolicy ----------------------------------------------------------------------------


class TestDelayPolicy:
    def test_default_and_overrides(self) -> None:
        policy = DelayPolicy(1.5, {"slow.example": 5.0, "fast.example": 0.0}, jitter=0)
        assert policy.next_delay_ms("any.example") == 1_500
        assert policy.next_delay_ms("slow.example") == 5_000
        assert policy.next_delay_ms("fast.example") == 0

    def test_learned_crawl_delay_is_capped_and_only_raises_the_delay(self) -> None:
        policy = DelayPolicy(2.0, {"slow.example": 9.0}, jitter=0, max_crawl_delay_seconds=10)
        assert not policy.knows("a.example")
        assert policy.learn("a.example", 3600) == 10.0
        assert policy.knows("a.example")
        assert policy.next_delay_ms("a.example") == 10_000
        assert policy.learn("b.example", 0.5) == 0.5
        assert policy.next_delay_ms("b.example") == 2_000, "never below DOWNLOAD_DELAY"
        assert policy.learn("slow.example", 4) == 4
        assert policy.next_delay_ms("slow.example") == 9_000
        assert policy.learn("c.example", -1) == 0.0
        assert policy.next_delay_ms("other.example") == 2_000

    def test_jitter_spreads_over_one_to_one_and_a_half_times(self) -> None:
        draws = iter([0.0, 0.5, 0.999999])
        policy = DelayPolicy(2.0, jitter=0.5, rng=lambda: next(draws))
        assert [policy.next_delay_ms("a.example") for _ in range(3)] == [2_000, 2_500, 2_999]

    def test_random_delays_never_fall_below_the_delay(self) -> None:
        policy = DelayPolicy(1.0)
        delays = [policy.next_delay_ms("a.example") for _ in range(200)]
        assert all(1_000 <= delay <= 1_500 for delay in delays)
        assert len(set(delays)) > 1, "randomized by default"

    def test_no_jitter_without_a_delay(self) -> None:
        policy = DelayPolicy(0.0, rng=lambda: pytest.fail("no draw without a delay"))
        assert policy.next_delay_ms("a.example") == 0

    def test_no_host_lane_is_never_delayed(self) -> None:
        policy = DelayPolicy(5.0, {"": 3.0}, rng=lambda: 1.0)
        policy.learn("", 30)
        assert policy.base_seconds("") == 0.0
        assert policy.next_delay_ms("") == 0


# -- lanes ------------------------------------------------------------------------------------


class TestLaneFunction:
    @pytest.mark.parametrize(
        ("url", "host", "domain"),
        [
            ("http://a.example.co.uk/x", "a.example.co.uk", "example.co.uk"),
            ("https://B.Example.CO.UK:8443/y?q=1", "b.example.co.uk", "example.co.uk"),
            ("http://example.com/", "example.com", "example.com"),
            ("http://deep.sub.example.com/", "deep.sub.example.com", "example.com"),
            ("http://192.168.0.10:8080/", "192.168.0.10", "192.168.0.10"),
            ("http://[2001:db8::1]/", "2001:db8::1", "2001:db8::1"),
            ("http://localhost:5000/", "localhost", "localhost"),
            ("data:text/plain,hello", "", ""),
            ("file:///etc/hosts", "", ""),
            ("http://[not-closed/", "", ""),
        ],
    )
    def test_host_and_domain_lanes(self, url: str, host: str, domain: str) -> None:
        assert make_lane_function("host")(url) == host
        assert make_lane_function("domain")(url) == domain

    def test_subdomains_share_a_domain_lane_only(self) -> None:
        host, domain = make_lane_function("host"), make_lane_function("domain")
        urls = ("http://a.example.co.uk/", "http://b.example.co.uk/")
        assert len({host(url) for url in urls}) == 2
        assert {domain(url) for url in urls} == {"example.co.uk"}
        assert domain("http://other.co.uk/") != domain(urls[0])


# -- Retry-After ------------------------------------------------------------------------------


NOW = 1_445_412_480.0  # Wed, 21 Oct 2015 07:28:00 GMT


class TestParseRetryAfter:
    @pytest.mark.parametrize(
        ("value", "seconds"),
        [
            ("120", 120.0),
            (b"0", 0.0),
            (b" 7 ", 7.0),
            ("Wed, 21 Oct 2015 07:29:30 GMT", 90.0),
            (b"Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
            ("Wed, 21 Oct 2015 07:00:00 GMT", 0.0),  # in the past: no wait
        ],
    )
    def test_seconds_and_http_dates(self, value: str | bytes, seconds: float) -> None:
        assert parse_retry_after(value, now=NOW) == seconds

    @pytest.mark.parametrize(
        "value", ["Wed, 21 Oct 2015 07:29:30 -0000", "Wed, 21 Oct 2015 07:29:30"]
    )
    def test_http_date_without_a_zone_is_gmt(
        self, value: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        # not the machine's local time, whatever TZ says
        monkeypatch.setenv("TZ", "America/New_York")
        time.tzset()
        try:
            assert parse_retry_after(value, now=NOW) == 90.0
        finally:
            monkeypatch.undo()
            time.tzset()

    def test_http_date_is_relative_to_now(self) -> None:
        value = email.utils.formatdate(time.time() + 60, usegmt=True)
        assert 55 <= (parse_retry_after(value) or 0) <= 61

    @pytest.mark.parametrize(
        "value", [None, "", "soon", b"-5", "1.5", "Wed, 32 Oct 2015 07:28:00 GMT", b"\xff\xfe"]
    )
    def test_garbage_is_none(self, value: str | bytes | None) -> None:
        assert parse_retry_after(value, now=NOW) is None

    @pytest.mark.parametrize("value", [b"\xb2", b"\xb9\xb2", "1\u00b2"])
    def test_non_ascii_digits_are_garbage_not_an_error(self, value: str | bytes) -> None:
        # b"\xb2" decodes (latin-1) to "²", which str.isdigit() accepts and float() refuses.
        assert parse_retry_after(value, now=NOW) is None


# -- the Politeness middleware -------------------------------------------------------------


class StubHosts:
    """The host policy as the middleware sees it (through the worker's view)."""

    def __init__(self) -> None:
        self.blocks: list[tuple[Request, float]] = []
        self.learned: list[tuple[str, float]] = []
        self.arrivals: list[Request] = []

    def received(self, request: Request) -> None:
        self.arrivals.append(request)

    def block_host(self, request: Request, seconds: float) -> None:
        self.blocks.append((request, seconds))

    def learn_crawl_delay(self, url: str, seconds: float) -> None:
        self.learned.append((url, seconds))


class StubRobotParser:
    def __init__(self, delay: Any = None, error: Exception | None = None) -> None:
        self.delay = delay
        self.error = error
        self.asked: list[str] = []

    def crawl_delay(self, user_agent: str) -> Any:
        self.asked.append(user_agent)
        if self.error is not None:
            raise self.error
        return self.delay


def _middleware(**settings: Any) -> tuple[Politeness, StubHosts]:
    middleware = Politeness(
        load_config({"REDISSPINE_MAX_RETRY_AFTER_SECONDS": 100, **settings}), "testbot"
    )
    hosts = StubHosts()
    middleware.worker_opened(SimpleNamespace(hosts=hosts))  # type: ignore[arg-type]
    return middleware, hosts


def _response(request: Request, status: int, **headers: str) -> Response:
    return Response(request.url, status=status, headers=headers, request=request)


class TestPolitenessMiddleware:
    @pytest.mark.parametrize(("status", "header", "blocked"), [
        (429, "30", 30.0),
        (503, "30", 30.0),
        (429, "5000", 100.0),  # capped
        (429, "Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date long past
    ])
    def test_retry_after_blocks_the_host(
        self, status: int, header: str, blocked: float
    ) -> None:
        middleware, hosts = _middleware()
        request = Request("http://a.example/page")
        response = _response(request, status, **{"Retry-After": header})
        assert middleware.process_response(request, response) is response
        assert hosts.blocks == [(request, blocked)]

    @pytest.mark.parametrize(("status", "headers"), [
        (200, {"Retry-After": "30"}),
        (500, {"Retry-After": "30"}),
        (301, {"Retry-After": "30", "Location": "/x"}),
        (429, {}),
        (503, {"Retry-After": "later"}),
    ])
    def test_other_answers_block_nothing(self, status: int, headers: dict[str, str]) -> None:
        middleware, hosts = _middleware()
        request = Request("http://a.example/page")
        response = _response(request, status, **headers)
        assert middleware.process_response(request, response, Spider("s")) is response
        assert hosts.blocks == []
        assert hosts.arrivals == [request], "every response's arrival is noted (its rest)"

    def test_before_the_worker_opened_nothing_happens(self) -> None:
        middleware = Politeness(load_config({}))
        request = Request("http://a.example/")
        response = _response(request, 429, **{"Retry-After": "30"})
        assert middleware.process_response(request, response) is response
        middleware.robots_parsed(StubRobotParser(5), request)

    def test_robots_crawl_delay_is_learned(self) -> None:
        middleware, hosts = _middleware()
        parser = StubRobotParser(delay=4)
        request = Request("http://a.example/robots.txt")
        middleware.robots_parsed(parser, request)
        assert hosts.learned == [("http://a.example/robots.txt", 4.0)]
        assert parser.asked == ["testbot"]

    @pytest.mark.parametrize("parser", [
        StubRobotParser(delay=None), StubRobotParser(delay=0),
        StubRobotParser(error=AttributeError("no crawl_delay")),
    ])
    def test_no_crawl_delay_learns_nothing(self, parser: StubRobotParser) -> None:
        middleware, hosts = _middleware()
        middleware.robots_parsed(parser, Request("http://a.example/robots.txt"))
        assert hosts.learned == []

    def test_from_crawler_uses_the_robots_user_agent(self) -> None:
        crawler = get_crawler(Spider, {"ROBOTSTXT_USER_AGENT": "robobot", "USER_AGENT": "ua"})
        assert Politeness.from_crawler(crawler).user_agent == "robobot"
        crawler = get_crawler(Spider, {"USER_AGENT": "ua"})
        assert Politeness.from_crawler(crawler).user_agent == "ua"


# -- settings ----------------------------------------------------------------------------------


class TestPolitenessSettings:
    def test_defaults(self) -> None:
        config = load_config({})
        assert (config.host_concurrency, config.politeness_key, config.host_delays) == (
            1, "host", (),
        )
        assert (config.max_crawl_delay_seconds, config.max_retry_after_seconds) == (60.0, 600.0)
        assert config.host_backlog_cap == 0

    def test_host_delays_from_a_dict_or_json(self) -> None:
        expected = (("slow.example", 5.0), ("b.example", 0.5))
        assert load_config(
            {"REDISSPINE_HOST_DELAYS": {"Slow.Example": 5, "b.example": "0.5"}}
        ).host_delays == expected
        assert load_config(
            {"REDISSPINE_HOST_DELAYS": '{"slow.example": 5, "b.example": 0.5}'}
        ).host_delays == expected

    @pytest.mark.parametrize(("name", "value"), [
        ("REDISSPINE_HOST_DELAYS", "not json"),
        ("REDISSPINE_HOST_DELAYS", ["a.example"]),
        ("REDISSPINE_HOST_DELAYS", {"a.example": -1}),
        ("REDISSPINE_HOST_DELAYS", {"a.example": "slow"}),
        ("REDISSPINE_HOST_CONCURRENCY", 0),
        ("REDISSPINE_POLITENESS_KEY", "url"),
        ("REDISSPINE_HOST_BACKLOG_CAP", -1),
        ("REDISSPINE_MAX_CRAWL_DELAY_SECONDS", -1),
        ("REDISSPINE_MAX_RETRY_AFTER_SECONDS", "forever"),
    ])
    def test_bad_values_name_the_setting(self, name: str, value: Any) -> None:
        with pytest.raises(ConfigError, match=name):
            load_config({name: value})

    def test_scrapy_settings_randomize_off_means_no_jitter(self) -> None:
        # Scrapy 2.19 has both RANDOMIZE_DOWNLOAD_DELAY (deprecated) and
        # DOWNLOAD_DELAY_JITTER in its defaults; a project that turns randomizing off
        # the old way gets no jitter from Scrapy, and must get none from the fleet.
        settings = Settings()
        settings.set("RANDOMIZE_DOWNLOAD_DELAY", False, priority="project")
        assert load_config(settings).download_delay_jitter == 0.0

    def test_scrapy_settings_jitter_wins_when_set_explicitly(self) -> None:
        settings = Settings()
        settings.set("DOWNLOAD_DELAY", 2, priority="project")
        settings.set("DOWNLOAD_DELAY_JITTER", 0.2, priority="project")
        config = load_config(settings)
        assert (config.download_delay, config.download_delay_jitter) == (2.0, 0.2)


# -- the scheduler --------------------------------------------------------------------------


class PoliteSpider(Spider):
    name = "polite"

    def parse(self, response: Any) -> None:
        pass


class TestTakeOverDownloadDelay:
    """Opening the scheduler makes Scrapy's download delay the fleet's default (the
    spider's own ``download_delay`` first) and turns Scrapy's per-process delay off."""

    @pytest.mark.parametrize(
        ("setting", "spiders_own", "fleet_default"),
        [
            pytest.param(2, None, 2.0, id="the-setting"),
            pytest.param(2, 3.5, 3.5, id="the-spiders-own-wins"),
            pytest.param(None, 1.25, 1.25, id="the-spiders-own-alone"),
        ],
    )
    def test_open_takes_it_over(
        self, make_scheduler: MakeScheduler, setting: float | None, spiders_own: float | None,
        fleet_default: float,
    ) -> None:
        spider = PoliteSpider()
        if spiders_own is not None:
            spider.download_delay = spiders_own  # type: ignore[attr-defined]
        settings = {} if setting is None else {"DOWNLOAD_DELAY": setting}
        scheduler = make_scheduler(spider=spider, **settings)
        assert spider.download_delay == 0  # type: ignore[attr-defined]
        assert scheduler.hosts.delays.default_seconds == fleet_default
        assert scheduler.hosts.delays.next_delay_ms("a.example") == fleet_default * 1000


class TestSchedulerPoliteness:
    def test_ack_rests_the_host_for_the_delay(
        self, make_scheduler: MakeScheduler, client: redis.Redis
    ) -> None:
        scheduler = make_scheduler(DOWNLOAD_DELAY=60)
        for url in ("http://a.example/1", "http://a.example/2", "http://b.example/1"):
            scheduler.enqueue_request(Request(url))
        first = next_request(scheduler)
        assert first is not None
        host = first.url.split("/")[2]
        before = _server_ms(client)
        finish(scheduler, first)
        assert scheduler.outbox.try_flush()  # the ack waits for a lease or the flush timer
        assert int(client.hget(KEYS.host_next, host)) >= before + 60_000
        rest = [r.url for r in iter(lambda: next_request(scheduler, 3), None)]
        assert first.url not in rest
        assert all(host not in url for url in rest), f"{host} was fetched again at once"

    def test_retry_after_block_outlasts_the_delay(
        self, make_scheduler: MakeScheduler, client: redis.Redis
    ) -> None:
        scheduler = make_scheduler(DOWNLOAD_DELAY=1)
        scheduler.enqueue_request(Request("http://a.example/1"))
        request = next_request(scheduler)
        assert request is not None
        scheduler.hosts.block_host(request, 120)
        before = _server_ms(client)
        finish(scheduler, request)
        assert scheduler.outbox.try_flush()
        assert int(client.hget(KEYS.host_next, "a.example")) >= before + 120_000
        assert scheduler.stats.get_value("redisspine/politeness/retry_after") == 1

    def test_block_of_a_request_not_handed_out_is_ignored(
        self, make_scheduler: MakeScheduler
    ) -> None:
        scheduler = make_scheduler()
        scheduler.hosts.block_host(Request("http://a.example/robots.txt"), 120)
        assert scheduler.stats.get_value("redisspine/politeness/retry_after") is None

    def test_no_host_lane_is_not_rested(self, make_scheduler: MakeScheduler) -> None:
        scheduler = make_scheduler(DOWNLOAD_DELAY=60)
        scheduler.enqueue_request(Request("data:,one"))
        scheduler.enqueue_request(Request("data:,two"))
        first = next_request(scheduler)
        assert first is not None
        finish(scheduler, first)
        second = next_request(scheduler)
        assert second is not None
        assert {first.url, second.url} == {"data:,one", "data:,two"}

    def test_learned_crawl_delay_is_shared_with_the_fleet(
        self, make_scheduler: MakeScheduler, client: redis.Redis
    ) -> None:
        learner = make_scheduler("w1", REDISSPINE_MAX_CRAWL_DELAY_SECONDS=30)
        learner.hosts.learn_crawl_delay("http://a.example/robots.txt", 500)
        learner.hosts.learn_crawl_delay("http://a.example/robots.txt", 5)  # known: ignored
        learner.hosts.learn_crawl_delay("data:,robots", 5)  # no host: ignored
        assert client.hgetall(KEYS.host_delay) == {b"a.example": b"30"}
        assert learner.stats.get_value("redisspine/politeness/crawl_delays_learned") == 1
        assert learner.hosts.delays.next_delay_ms("a.example") == 30_000

        other = make_scheduler("w2")
        assert not other.hosts.delays.knows("a.example")
        other.enqueue_request(Request("http://a.example/page"))
        request = next_request(other)
        assert request is not None
        assert other.hosts.delays.knows("a.example"), "learned from the lease"
        before = _server_ms(client)
        finish(other, request)
        assert other.outbox.try_flush()
        assert int(client.hget(KEYS.host_next, "a.example")) >= before + 30_000

    def test_host_concurrency_setting(self, make_scheduler: MakeScheduler) -> None:
        scheduler = make_scheduler(REDISSPINE_HOST_CONCURRENCY=2)
        for i in range(3):
            scheduler.enqueue_request(Request(f"http://a.example/{i}"))
        got = [next_request(scheduler, 3) for _ in range(3)]
        assert [request is not None for request in got] == [True, True, False]

    def test_domain_lanes_share_one_slot(
        self, make_scheduler: MakeScheduler, client: redis.Redis
    ) -> None:
        scheduler = make_scheduler(REDISSPINE_POLITENESS_KEY="domain")
        scheduler.enqueue_request(Request("http://a.example.co.uk/"))
        scheduler.enqueue_request(Request("http://b.example.co.uk/"))
        assert next_request(scheduler, 3) is not None
        assert next_request(scheduler, 3) is None
        assert client.hgetall(KEYS.busy) == {b"example.co.uk": b"1"}

    def test_backlog_cap_is_counted(self, make_scheduler: MakeScheduler) -> None:
        scheduler = make_scheduler(REDISSPINE_HOST_BACKLOG_CAP=1)
        scheduler.enqueue_request(Request("http://a.example/1"))
        scheduler.enqueue_request(Request("http://a.example/2"))
        scheduler.enqueue_request(Request("http://b.example/1"))
        assert scheduler.outbox.try_flush()
        assert scheduler.stats.get_value("redisspine/scheduler/backlog_capped") == 1
        assert scheduler.stats.get_value("scheduler/enqueued") == 2


class TestWakeWhenDue:
    @pytest.fixture
    def scheduler(self, make_scheduler: MakeScheduler) -> Scheduler:
        return make_scheduler(REDISSPINE_IDLE_POLL_SECONDS=0.5)

    @staticmethod
    def _wake_calls(scheduler: Scheduler, clock: task.Clock) -> list[Any]:
        return [call for call in clock.getDelayedCalls()
                if call.active() and call.func == scheduler.leaser.wake]

    @pytest.mark.parametrize("wait_ms", [-1, 500, 60_000])
    def test_no_call_when_nothing_is_due_soon(
        self, scheduler: Scheduler, clock: task.Clock, wait_ms: int
    ) -> None:
        scheduler.leaser.wake_when_due(wait_ms)
        assert self._wake_calls(scheduler, clock) == []

    def test_wakes_exactly_when_the_next_lane_is_due(
        self, scheduler: Scheduler, clock: task.Clock
    ) -> None:
        scheduler.leaser.wake_when_due(200)
        (call,) = self._wake_calls(scheduler, clock)
        assert call.getTime() == pytest.approx(clock.seconds() + 0.2)
        scheduler.leaser.wake_when_due(300)
        assert self._wake_calls(scheduler, clock) == [call], "one pending wake-up is enough"
        # A lane due sooner (an ack just rested it for less) moves the one timer: it
        # is not served late, waiting for the lane the timer was set for.
        scheduler.leaser.wake_when_due(10)
        (sooner,) = self._wake_calls(scheduler, clock)
        assert sooner.getTime() == pytest.approx(clock.seconds() + 0.01)
        wakes = engine_of(scheduler).wakes
        clock.advance(0.01)
        assert engine_of(scheduler).wakes == wakes + 1
        clock.advance(0.3)
        assert engine_of(scheduler).wakes == wakes + 1, "the 200 ms timer was moved, not kept"

    def test_wake_resets_the_empty_lease_back_off(
        self, scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        leases: list[int] = []
        lease = scheduler.frontier.lease
        monkeypatch.setattr(scheduler.frontier, "lease",
                            lambda count: leases.append(count) or lease(count))
        assert scheduler.next_request() is None
        assert scheduler.next_request() is None
        assert len(leases) == 1, "an empty lease backs off until the idle poll"
        scheduler.wake()
        assert scheduler.next_request() is None
        assert len(leases) == 2, "woken: leases again at once"


class TestDownloadSlots:
    """Scrapy's DOWNLOAD_SLOTS and meta["download_slot"] are lanes, fleet-wide."""

    def test_a_slot_of_its_own_gets_its_concurrency_across_workers(
        self, make_scheduler: MakeScheduler, client: redis.Redis
    ) -> None:
        slots = {"wide.example": {"concurrency": 3}}
        first = make_scheduler("w1", DOWNLOAD_SLOTS=slots, free_slots=5)
        second = make_scheduler("w2", DOWNLOAD_SLOTS=slots, free_slots=5)
        for i in range(6):
            first.enqueue_request(Request(f"http://wide.example/{i}"))
            first.enqueue_request(Request(f"http://narrow.example/{i}"))
        assert first.outbox.try_flush()
        taken = [request for scheduler in (first, second)
                 for request in iter(lambda s=scheduler: next_request(s, 2), None)]
        hosts = Counter(request.url.split("/")[2] for request in taken)
        assert hosts == {"wide.example": 3, "narrow.example": 1}, "3 wide, 1 by default"
        assert client.hgetall(KEYS.lane_limits) == {b"wide.example": b"3"}

    def test_a_slot_delay_rests_its_lane(
        self, make_scheduler: MakeScheduler, client: redis.Redis
    ) -> None:
        scheduler = make_scheduler(DOWNLOAD_SLOTS={"slow.example": {"delay": 60}})
        scheduler.enqueue_request(Request("http://slow.example/1"))
        request = next_request(scheduler)
        assert request is not None
        before = _server_ms(client)
        finish(scheduler, request)
        assert scheduler.outbox.try_flush()
        assert int(client.hget(KEYS.host_next, "slow.example")) >= before + 60_000

    def test_meta_download_slot_names_the_lane(
        self, make_scheduler: MakeScheduler, client: redis.Redis
    ) -> None:
        scheduler = make_scheduler(free_slots=5)
        for host in ("a.example", "b.example"):
            scheduler.enqueue_request(Request(f"http://{host}/", meta={"download_slot": "shared"}))
        assert next_request(scheduler) is not None
        assert next_request(scheduler, 2) is None, "one slot: the two hosts share it"
        assert client.hgetall(KEYS.busy) == {b"shared": b"1"}

    @pytest.mark.parametrize("slots", [
        {"a": 3}, {"a": {"concurrency": 0}}, {"a": {"delay": -1}}, "not json",
    ])
    def test_bad_slots_are_refused_naming_the_setting(self, slots: Any) -> None:
        with pytest.raises(ConfigError, match="DOWNLOAD_SLOTS"):
            load_config({"DOWNLOAD_SLOTS": slots})


# url_hostname's regex path must give urlsplit's hostname exactly: a lane is a key in
# Redis, and a persisted crawl's lanes were named by urlsplit.
_HOST_URLS = ["http://h42.example/p/1", "HTTP://A.Example:8080/x", "http://a.b:/x",
              "http://a.b?q", "http://a.b#f", "http://a.b", "http://u@a.b/x",
              "http://[::1]:80/x", "http://a\t.b/x", " http://a.b/x", "http://a.b:80x/y",
              "http:///x", "mailto:x@a.b", "data:,x", "http://é.b/x", "http://a_b.c./x",
              "http://a.b\\c/x", "http://%61.b/x", "ftp://A.B"]


def _split_hostname(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:
        return None


@pytest.mark.parametrize("url", _HOST_URLS)
def test_url_hostname_is_urlsplits(url: str) -> None:
    assert url_hostname(url) == _split_hostname(url)


@settings(max_examples=2000, deadline=None)
@given(st.text(alphabet="hHtTpP:/.?#@[]% \t\n-_aAé0189\\", max_size=24))
def test_url_hostname_is_urlsplits_on_any_text(tail: str) -> None:
    for url in (tail, "http://" + tail, "Http://a" + tail):
        assert url_hostname(url) == _split_hostname(url)
