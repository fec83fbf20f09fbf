"""Lanes by IP: one resolution per hostname and worker, cached; requests of a name not
resolved yet wait for it together; acks wait with them (Outbox.hold)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy import Request
from twisted.internet import defer
from twisted.python.failure import Failure

from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.ip_lanes import IpLanes
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.politeness import make_lane_function
from tests.queue_view import queued_count

if TYPE_CHECKING:
    import pytest
    import redis

    from scrapy_redisspine._outbox import Outbox


class FakeResolver:
    """Names resolve when the test says so; counts every query."""

    def __init__(self) -> None:
        self.pending: dict[str, defer.Deferred[str]] = {}
        self.queries: list[str] = []

    def __call__(self, name: str) -> defer.Deferred[str]:
        self.queries.append(name)
        deferred: defer.Deferred[str] = defer.Deferred()
        self.pending[name] = deferred
        return deferred

    def answer(self, name: str, address: str) -> None:
        self.pending.pop(name).callback(address)

    def fail(self, name: str) -> None:
        self.pending.pop(name).errback(Failure(OSError("no such host")))


def test_one_resolution_serves_every_waiting_request_and_later_ones() -> None:
    resolver = FakeResolver()
    lanes = IpLanes(resolver)
    got: list[str] = []
    assert lanes.lane("a.test") is None
    for _ in range(3):
        lanes.later("a.test", got.append)
    assert resolver.queries == ["a.test"], "one query for all three"
    resolver.answer("a.test", "127.0.0.10")
    assert got == ["127.0.0.10"] * 3
    assert lanes.lane("a.test") == "127.0.0.10"
    assert resolver.queries == ["a.test"], "no query per request"


def test_names_of_one_address_share_its_lane() -> None:
    resolver = FakeResolver()
    lanes = IpLanes(resolver)
    got: list[str] = []
    lanes.later("a.test", got.append)
    lanes.later("b.test", got.append)
    resolver.answer("b.test", "127.0.0.10")
    resolver.answer("a.test", "127.0.0.10")
    assert got == ["127.0.0.10", "127.0.0.10"]


def test_the_resolvers_own_cache_is_read_first() -> None:
    resolver = FakeResolver()
    lanes = IpLanes(resolver, peek={"a.test": "127.0.0.12"}.get)
    assert lanes.lane("a.test") == "127.0.0.12"
    assert resolver.queries == []


def test_an_address_is_its_own_lane() -> None:
    resolver = FakeResolver()
    lanes = IpLanes(resolver)
    assert lanes.lane("127.0.0.10") == "127.0.0.10"
    assert lanes.lane("::1") == "::1"
    assert resolver.queries == []


def test_a_name_that_does_not_resolve_keeps_its_own_lane_and_is_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    resolver = FakeResolver()
    failures: list[str] = []
    lanes = IpLanes(resolver, on_failure=lambda name, _: failures.append(name))
    got: list[str] = []
    lanes.later("gone.test", got.append)
    resolver.fail("gone.test")
    assert got == ["gone.test"]
    assert failures == ["gone.test"]
    assert "gone.test does not resolve" in caplog.text
    assert lanes.lane("gone.test") is None, "not cached: asked again next time"


def test_a_failing_waiter_does_not_strand_the_others() -> None:
    resolver = FakeResolver()
    lanes = IpLanes(resolver, on_failure=lambda *_: None)
    got: list[str] = []

    def broken(_: str) -> None:
        raise RuntimeError("bug")

    lanes.later("a.test", broken)
    lanes.later("a.test", got.append)
    resolver.answer("a.test", "127.0.0.10")
    assert got == ["127.0.0.10"]


def test_the_cache_is_bounded() -> None:
    resolver = FakeResolver()
    lanes = IpLanes(resolver, cache_size=2)
    for i, name in enumerate(("a.test", "b.test", "c.test")):
        lanes.later(name, lambda _: None)
        resolver.answer(name, f"127.0.0.{10 + i}")
    assert lanes.lane("a.test") is None
    assert lanes.lane("c.test") == "127.0.0.12"


def test_tools_resolve_with_the_system_resolver() -> None:
    lane = make_lane_function("ip")
    assert lane("http://localhost:8080/x") == "127.0.0.1"
    assert lane("http://127.0.0.10/p") == "127.0.0.10"


class TestAcksWaitForRequestsWithoutALane:
    """A child whose host is being resolved is not in the outbox yet: its parent's
    ack (which the engine adds after the child was handed over) must not leave first,
    or a crash in between would lose the child."""

    @staticmethod
    def _outbox(client: redis.Redis) -> tuple[Outbox, Frontier]:
        from scrapy.statscollectors import MemoryStatsCollector
        from scrapy.utils.test import get_crawler
        from twisted.internet import task

        from scrapy_redisspine._guard import RedisGuard
        from scrapy_redisspine._outbox import Outbox

        frontier = Frontier(client, CrawlKeys("redisspine", "ip"), "w1")
        stats = MemoryStatsCollector(get_crawler())
        clock = task.Clock()
        outbox = Outbox(frontier, RedisGuard(stats, clock.seconds), stats, clock,
                        batch_size=100, cache_size=0, on_sent=lambda _: None,
                        on_duplicate=lambda _: None, on_dropped=lambda _: None)
        return outbox, frontier

    def test_the_parents_ack_waits_for_the_child_and_leaves_after_it(
        self, client: redis.Redis
    ) -> None:
        outbox, frontier = self._outbox(client)
        frontier.enqueue([NewRequest(b"parent", b"p" * 20, lane="127.0.0.10")])
        (parent,) = frontier.lease(1).leases
        outbox.hold()  # the child's host is being resolved
        outbox.add_ack((parent.key, parent.token), 0, within=0.0)
        assert not outbox.empty
        assert not outbox.sendable
        assert outbox.try_flush() is False
        assert client.hlen(frontier.keys.inflight) == 1, "the parent is still in flight"
        outbox.add(NewRequest(b"child", b"c" * 20, lane="127.0.0.10"), Request("http://x/"),
                   within=10.0)
        outbox.release_hold()  # flushes at once: the child first, the ack with it
        assert client.hlen(frontier.keys.inflight) == 0
        assert queued_count(client, frontier.keys) == 1
        assert outbox.empty

    def test_requests_still_go_while_acks_wait(self, client: redis.Redis) -> None:
        outbox, frontier = self._outbox(client)
        outbox.hold()
        outbox.add(NewRequest(b"other", b"o" * 20, lane="127.0.0.11"), Request("http://y/"),
                   within=0.0)
        assert queued_count(client, frontier.keys) == 1
        assert not outbox.empty, "the hold itself is pending work"
