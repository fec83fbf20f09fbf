"""The worker's Redis thread: calls off the loop, replies back on it, in order."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
import types
from typing import TYPE_CHECKING, Any

import pytest
import redis
from scrapy import Request
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler
from twisted.internet.task import Clock

from scrapy_redisspine._guard import RedisGuard
from scrapy_redisspine._outbox import Outbox
from scrapy_redisspine._redis_io import InlineIO, ThreadIO
from scrapy_redisspine._results import EnqueueResult
from scrapy_redisspine.frontier import NewRequest
from scrapy_redisspine.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


class Loop:
    """The crawl's loop, as ThreadIO sees it: a thread-safe ``deliver`` and a thread
    (this test's) that runs what was delivered."""

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[Callable[[], object]] = queue.SimpleQueue()
        self.thread = threading.get_ident()

    def deliver(self, function: Callable[[], object]) -> None:
        self.inbox.put(function)

    def run_pending(self) -> None:
        """One turn of the loop: run what was delivered so far, without waiting."""
        while True:
            try:
                function = self.inbox.get_nowait()
            except queue.Empty:
                return
            function()

    def run_until(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            left = deadline - time.monotonic()
            assert left > 0, "timed out waiting on the loop"
            with contextlib.suppress(queue.Empty):
                self.inbox.get(timeout=left)()


@pytest.fixture
def stats() -> MemoryStatsCollector:
    return MemoryStatsCollector(get_crawler())


@pytest.fixture
def loop() -> Loop:
    return Loop()


@pytest.fixture
def io(stats: MemoryStatsCollector, loop: Loop) -> Iterator[ThreadIO]:
    threaded = ThreadIO(stats, loop.deliver, slow_seconds=0.2)
    yield threaded
    threaded.close()


def test_calls_run_off_the_loop_and_replies_come_back_on_it_in_order(
    io: ThreadIO, loop: Loop
) -> None:
    ran_on: list[int] = []
    replies: list[tuple[int, int]] = []
    for number in range(20):
        def call(number: int = number) -> int:
            ran_on.append(threading.get_ident())
            return number * 2
        io.submit("call", call, lambda value: replies.append((value, threading.get_ident())),
                  pytest.fail)
    assert io.busy
    loop.run_until(lambda: len(replies) == 20)
    assert [value for value, _ in replies] == [number * 2 for number in range(20)]
    assert {thread for _, thread in replies} == {loop.thread}
    assert loop.thread not in ran_on
    assert not io.busy


def test_submit_returns_while_a_call_is_still_in_the_air(io: ThreadIO, loop: Loop) -> None:
    release = threading.Event()
    replies: list[str] = []
    started = time.monotonic()
    io.submit("slow", lambda: release.wait(5) and "answered", replies.append, pytest.fail)
    io.submit("next", lambda: "second", replies.append, pytest.fail)
    assert time.monotonic() - started < 1.0
    assert replies == []
    assert io.busy
    release.set()
    loop.run_until(lambda: len(replies) == 2)
    assert replies == ["answered", "second"]  # the second waited for the first


def test_an_exception_reaches_failed_and_a_raising_callback_is_logged_and_counted(
    io: ThreadIO, loop: Loop, stats: MemoryStatsCollector, caplog: pytest.LogCaptureFixture
) -> None:
    errors: list[Exception] = []

    def refuse() -> None:
        raise redis.ConnectionError("refused")

    def broken(_: object) -> None:
        raise RuntimeError("bug in a reply handler")

    io.submit("lease", refuse, pytest.fail, errors.append)
    io.submit("enqueue", lambda: 1, broken, errors.append)
    after: list[int] = []
    io.submit("heartbeat", lambda: 2, after.append, errors.append)
    with caplog.at_level(logging.ERROR, logger="scrapy_redisspine.scheduler"):
        loop.run_until(lambda: bool(after))
    assert [type(exc) for exc in errors] == [redis.ConnectionError]
    assert after == [2]  # the next reply still came
    assert stats.get_value("redisspine/errors/enqueue") == 1
    assert any("handling the reply of enqueue failed" in r.getMessage()
               and "bug in a reply handler" in r.getMessage() for r in caplog.records)


def test_drain_delivers_on_the_calling_thread_and_gives_up_after_its_timeout(
    io: ThreadIO,
) -> None:
    replies: list[int] = []
    for number in range(5):
        io.submit("call", lambda number=number: number, replies.append, pytest.fail)
    assert io.drain(5.0)
    assert replies == [0, 1, 2, 3, 4]
    assert not io.busy
    release = threading.Event()
    io.submit("frozen", lambda: release.wait(5), replies.append, pytest.fail)
    started = time.monotonic()
    assert not io.drain(0.3)
    assert 0.25 <= time.monotonic() - started < 2.0
    release.set()
    assert io.drain(5.0)
    assert replies[-1] is True


def test_a_slow_call_is_counted_and_said_once_with_its_time(
    io: ThreadIO, loop: Loop, stats: MemoryStatsCollector, caplog: pytest.LogCaptureFixture
) -> None:
    replies: list[None] = []
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine.scheduler"):
        for _ in range(2):
            io.submit("lease", lambda: time.sleep(0.25), replies.append, pytest.fail)
        loop.run_until(lambda: len(replies) == 2)
    assert stats.get_value("redisspine/redis/slow_calls") == 2
    assert stats.get_value("redisspine/redis/slowest_call_ms") >= 250
    lines = [r.getMessage() for r in caplog.records if "Redis is slow" in r.getMessage()]
    assert len(lines) == 1
    assert "lease took" in lines[0]
    assert " ms " in lines[0]


def test_a_closed_io_calls_at_once(stats: MemoryStatsCollector, loop: Loop) -> None:
    # a timer's last tick after the scheduler closed still gets its answer
    closed = ThreadIO(stats, loop.deliver)
    closed.close()
    replies: list[int] = []
    closed.submit("sweep", lambda: 1, replies.append, pytest.fail)
    assert replies == [1]
    assert not closed.busy


def test_inline_io_answers_before_submit_returns(stats: MemoryStatsCollector) -> None:
    inline = InlineIO(stats)
    replies: list[int] = []
    inline.submit("call", lambda: 7, replies.append, pytest.fail)
    assert replies == [7]
    assert not inline.busy
    assert not inline.background
    assert inline.drain(0)


def test_a_frozen_redis_never_blocks_the_loop_and_its_call_times_out(
    io: ThreadIO, loop: Loop
) -> None:
    with RedisServer() as server:
        client = server.client(socket_timeout=0.5, socket_connect_timeout=0.5)
        assert client.ping()
        pid = server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            errors: list[Exception] = []
            started = time.monotonic()
            io.submit("lease", client.ping, pytest.fail, errors.append)
            ticks = 0
            while not errors:  # the loop keeps running meanwhile
                ticks += 1
                loop.run_pending()
                time.sleep(0.01)
                assert time.monotonic() - started < 5.0
            took = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
        assert isinstance(errors[0], redis.TimeoutError)
        assert 0.4 <= took < 3.0
        assert ticks > 10
        assert client.ping()


class ManualIO:
    """Calls run and replies come back only when the test says: a send "in the air"."""

    background = True

    def __init__(self) -> None:
        self.waiting: list[tuple[Callable[[], object], Callable[[object], object],
                                 Callable[[Exception], object]]] = []

    @property
    def busy(self) -> bool:
        return bool(self.waiting)

    def submit(self, name: str, call: Callable[[], object], done: Callable[[object], object],
               failed: Callable[[Exception], object]) -> None:
        self.waiting.append((call, done, failed))

    def answer(self) -> None:
        call, done, failed = self.waiting.pop(0)
        try:
            reply = call()
        except Exception as exc:
            failed(exc)
        else:
            done(reply)

    def drain(self, timeout: float) -> bool:
        while self.waiting:
            self.answer()
        return True

    def close(self) -> None:
        return None


class RecordingFrontier:
    """The outbox's frontier: records what each send carried; Redis "takes" all."""

    def __init__(self) -> None:
        self.sends: list[tuple[list[bytes], list[str]]] = []
        self.fail_next: Exception | None = None

    def enqueue(self, requests: Any, acks: Any = (), items: Any = (),
                loose: Any = ()) -> EnqueueResult:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        self.sends.append(([entry.payload for entry in requests], [ack[0] for ack in acks]))
        return EnqueueResult("+" * len(requests), len(acks))

    def injected_starts(self, fingerprints: Any) -> list[bool]:
        return [False for _ in fingerprints]

    def add_shed(self, shed: int) -> None:
        return None


def _outbox(io: ManualIO, frontier: RecordingFrontier,
            stats: MemoryStatsCollector) -> tuple[Outbox, list[EnqueueResult]]:
    clock = Clock()
    sent: list[EnqueueResult] = []
    outbox = Outbox(frontier, RedisGuard(stats, clock.seconds), stats, clock, batch_size=100,
                    cache_size=0, on_sent=sent.append, on_duplicate=lambda request: None,
                    on_dropped=lambda request: None, io=io)
    return outbox, sent


def test_what_joins_the_outbox_while_a_send_is_in_the_air_goes_with_the_next_one(
    stats: MemoryStatsCollector,
) -> None:
    io, frontier = ManualIO(), RecordingFrontier()
    outbox, sent = _outbox(io, frontier, stats)
    outbox.add(NewRequest(b"child-1"), Request("http://a.test/1"), within=1.0)
    outbox.add_ack(("k1", "t1"), rest_ms=0, within=1.0)
    assert not outbox.try_flush()  # on its way
    assert not outbox.sendable
    assert outbox.in_flight
    assert not outbox.try_flush()  # no second send of the same entries
    assert len(io.waiting) == 1
    # the next page's children and ack arrive while the first send is in the air
    outbox.add(NewRequest(b"child-2"), Request("http://a.test/2"), within=1.0)
    outbox.add_ack(("k2", "t2"), rest_ms=0, within=1.0)
    io.answer()
    assert frontier.sends == [([b"child-1"], ["k1"])]
    assert len(outbox) == 1
    assert outbox.acks == 1
    assert outbox.try_flush() is False
    io.answer()
    assert frontier.sends[1] == ([b"child-2"], ["k2"])
    assert outbox.empty
    assert len(sent) == 2


def test_a_send_that_fails_in_the_air_keeps_everything_for_the_next_one(
    stats: MemoryStatsCollector,
) -> None:
    io, frontier = ManualIO(), RecordingFrontier()
    outbox, _ = _outbox(io, frontier, stats)
    outbox.add(NewRequest(b"child-1"), Request("http://a.test/1"), within=1.0)
    outbox.add_ack(("k1", "t1"), rest_ms=0, within=1.0)
    outbox.try_flush()
    outbox.add_ack(("k2", "t2"), rest_ms=0, within=1.0)
    frontier.fail_next = redis.ConnectionError("reset")
    io.answer()
    assert frontier.sends == []
    assert not outbox.in_flight
    assert len(outbox) == 1
    assert outbox.acks == 2
    assert stats.get_value("redisspine/redis_errors/enqueue") == 1


def test_redis_is_near_while_calls_are_fast_and_none_is_overdue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What ``near`` says (the scheduler waits for a lease reply at the start, and
    leases alongside, only while it holds): the calls' moving average under
    NEAR_SECONDS, and no call on its way for OVERDUE_SECONDS or more."""
    from scrapy_redisspine import _redis_io

    now = [100.0]  # the module's clock only, not every caller of time.monotonic
    monkeypatch.setattr(_redis_io, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    times = _redis_io.CallTimes(MemoryStatsCollector(get_crawler()), slow_seconds=0.5)
    assert times.near, "no call yet"
    for _ in range(20):
        times.submitted()
        times.delivered("lease", 0.001)
    assert times.near
    times.submitted()
    now[0] += _redis_io.OVERDUE_SECONDS - 0.001
    assert times.near, "on its way, not overdue yet"
    now[0] += 0.002
    assert not times.near, "a call on its way is overdue: Redis may have frozen"
    times.delivered("lease", 0.001)
    assert times.near
    for _ in range(20):
        times.submitted()
        times.delivered("lease", 2 * _redis_io.NEAR_SECONDS)
    assert not times.near, "calls take longer than NEAR_SECONDS lately"
    for _ in range(40):
        times.submitted()
        times.delivered("lease", 0.001)
    assert times.near, "the moving average came back down"
