"""Redis calls parked on the crawl's own loop (LoopIO): the loop never waits for Redis.

:class:`~scrapy_redisspine._loop_io.LoopIO` replaces ThreadIO's thread with a greenlet
on the loop's thread, so everything ThreadIO promises must hold again, now with no
thread to hide a blocking socket behind:

- the RedisIO contract: calls run one at a time in submission order, each result is
  delivered exactly once, on the loop (its thread, its main greenlet), and only after
  ``submit`` returned; an error reaches ``failed``; ``busy``, ``drain``, ``close`` and
  the slow-call stats behave as ThreadIO's;
- the point of parking: while a call waits for a reply (a slow script, a frozen
  Redis, a big write, a slow connect, a retry's back-off) the loop runs on, which a
  timer ticking every 10 ms shows (no gap near the wait's length); a frozen Redis
  still ends the call at its socket timeout, and the client works again after;
- nothing else changes: the same cooperative client blocks as usual in plain code and
  other threads (its ``socket_timeout`` still applies there), and ``is_cooperative``
  tells which clients may use a LoopIO.

Everything runs against a real redis-server (freezing, restarting and stopping one
of the test's own) and a real asyncio loop, because the behaviour under test is
that of real sockets on a real selector. Bounds on time are generous; no speed is
asserted, only that nothing waits for the length of the fault.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import fakeredis
import greenlet
import pytest
import redis
import redis.connection
import redis.retry
from redis.backoff import ConstantBackoff
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from scrapy_redisspine._loop_io import CooperativeSocket, LoopIO, cooperative_retry
from scrapy_redisspine.connection import client_from_url, is_cooperative
from scrapy_redisspine.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.timeout(60)

NAME = "redisspine-test"

#: Keeps the server busy for ARGV[1] microseconds, then answers "done". Redis 8 and
#: Valkey freeze TIME for the length of a script (it would spin for ever there) and
#: offer os.clock, the server's CPU time, which a busy loop advances; Redis 6.2 and
#: 7.0 have no os, and a TIME that moves.
BUSY_SCRIPT = """
local has_clock, clock = pcall(function() return os.clock end)
local function now_us()
  if has_clock and clock then
    return clock() * 1000000
  end
  local t = redis.call('TIME')
  return t[1] * 1000000 + t[2]
end
local start = now_us()
repeat until now_us() - start >= tonumber(ARGV[1])
return 'done'
"""


def running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def run_until(loop: asyncio.AbstractEventLoop, condition: Callable[[], bool],
              timeout: float = 5.0) -> None:
    """Run ``loop`` until ``condition()`` holds; fail after ``timeout`` seconds."""

    async def wait() -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "timed out waiting on the loop"
            await asyncio.sleep(0.005)

    loop.run_until_complete(wait())


def run_a_while(loop: asyncio.AbstractEventLoop, seconds: float = 0.05) -> None:
    loop.run_until_complete(asyncio.sleep(seconds))


class Ticker:
    """The loop's other work (downloads, callbacks): a timer every 10 ms noting when it
    ran. A loop blocked by a Redis call shows as a long gap between two ticks."""

    def __init__(self, loop: asyncio.AbstractEventLoop, interval: float = 0.01) -> None:
        self.times: list[float] = []
        self._loop = loop
        self._interval = interval
        self._handle: asyncio.Handle = loop.call_soon(self._tick)

    def _tick(self) -> None:
        self.times.append(time.monotonic())
        self._handle = self._loop.call_later(self._interval, self._tick)

    def stop(self) -> None:
        """Stop ticking; a block just before this counts as a gap too."""
        self._handle.cancel()
        self.times.append(time.monotonic())

    def ticks_before(self, moment: float) -> int:
        return sum(1 for tick in self.times if tick < moment)

    @property
    def longest_gap(self) -> float:
        return max((later - earlier for earlier, later in itertools.pairwise(self.times)),
                   default=float("inf"))


class Outcomes:
    """What came to ``done`` and ``failed``, in order, with when and where it came."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.got: list[tuple[str, Any]] = []
        self.at: list[float] = []
        self.on_loop: list[bool] = []

    def done(self, value: object) -> None:
        self._note("done", value)

    def failed(self, exc: Exception) -> None:
        self._note("failed", exc)

    def _note(self, kind: str, value: object) -> None:
        self.got.append((kind, value))
        self.at.append(time.monotonic())
        self.on_loop.append(running_loop() is self._loop)

    @property
    def values(self) -> list[Any]:
        return [value for kind, value in self.got if kind == "done"]

    @property
    def errors(self) -> list[Exception]:
        return [value for kind, value in self.got if kind == "failed"]


@contextlib.contextmanager
def frozen(server: RedisServer) -> Iterator[None]:
    """The server stopped dead (SIGSTOP): connections stay open, nothing answers."""
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def watched_fds(loop: asyncio.AbstractEventLoop, client: redis.Redis) -> list[int]:
    """The fds of ``client``'s connections the loop still watches (and stops watching
    them): none once every call ended, or a later wait on a reused fd is confused."""
    pool = client.connection_pool
    left = []
    for connection in [*pool._available_connections, *pool._in_use_connections]:
        sock = connection._sock
        if sock is not None:
            fd = sock.fileno()
            if loop.remove_reader(fd) | loop.remove_writer(fd):
                left.append(fd)
    return left


def sockets_of(client: redis.Redis) -> list[object]:
    pool = client.connection_pool
    return [connection._sock for connection in
            [*pool._available_connections, *pool._in_use_connections]
            if connection._sock is not None]


@pytest.fixture
def stats() -> MemoryStatsCollector:
    return MemoryStatsCollector(get_crawler())


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    yield event_loop
    event_loop.close()


MakeIO = Callable[..., LoopIO]


@pytest.fixture
def make_io(stats: MemoryStatsCollector,
            loop: asyncio.AbstractEventLoop) -> Iterator[MakeIO]:
    """``make_io(name=NAME)``: a LoopIO (slow calls from 0.2 s), made when called.

    A LoopIO must be made on the greenlet that runs its loop (parked calls switch
    back to it), as the scheduler makes it; under pytest-twisted a test's body runs
    on another greenlet than its fixtures, so each test makes its own."""
    made: list[LoopIO] = []

    def make(name: str = NAME) -> LoopIO:
        parked = LoopIO(stats, loop, slow_seconds=0.2, name=name)
        made.append(parked)
        return parked

    yield make
    for parked in made:
        parked.close()


MakeClient = Callable[..., redis.Redis]


@pytest.fixture
def make_client() -> Iterator[MakeClient]:
    """``make_client(url, timeout=5.0)``: a cooperative client, as the worker makes it;
    closed after the test."""
    made: list[redis.Redis] = []

    def make(url: str, timeout: float = 5.0) -> redis.Redis:
        client = client_from_url(url, cooperative=True, socket_timeout=timeout,
                                 socket_connect_timeout=timeout)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close()


@pytest.fixture
def client(make_client: MakeClient, redis_url: str) -> redis.Redis:
    """A cooperative client of the session's server (emptied for this test)."""
    return make_client(redis_url)


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A redis-server of this test's own, to freeze, restart or stop."""
    with RedisServer() as server:
        yield server


# -- the RedisIO contract -----------------------------------------------------------


def test_calls_run_one_at_a_time_in_order_and_each_reply_comes_once_on_the_loop(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, client: redis.Redis
) -> None:
    io = make_io()
    main, thread = greenlet.getcurrent(), threading.get_ident()
    events: list[tuple[str, int]] = []
    delivered: list[tuple[int, str, Any]] = []
    where: list[tuple[bool, bool, bool]] = []  # on the loop, its thread, main greenlet
    returned: set[int] = set()  # calls whose submit returned
    after_submit: list[bool] = []

    def call(number: int) -> Callable[[], object]:
        def run() -> object:
            events.append(("start", number))
            client.rpush("log", number)  # parks: another call could slip in here
            if number == 3:
                client.execute_command("NO-SUCH-COMMAND")  # a ResponseError
            result = client.get("missing") if number == 5 else client.incr("counter")
            events.append(("end", number))
            return result
        return run

    def reply(number: int, kind: str) -> Callable[[Any], None]:
        def note(value: Any) -> None:
            delivered.append((number, kind, value))
            where.append((running_loop() is loop, threading.get_ident() == thread,
                          greenlet.getcurrent() is main))
            after_submit.append(number in returned)
        return note

    def submit(number: int) -> None:
        io.submit(f"call-{number}", call(number), reply(number, "done"),
                  reply(number, "failed"))
        returned.add(number)

    for number in range(4):  # plain code on the loop's thread, the loop not running
        submit(number)
        assert delivered == []  # replies come on the loop, never inside submit
    came_inside_submit: list[bool] = []

    def submit_rest() -> None:  # from a callback of the running loop
        for number in range(4, 8):
            submit(number)
            came_inside_submit.append(any(n == number for n, _, _ in delivered))

    loop.call_soon(submit_rest)
    run_until(loop, lambda: len(delivered) == 8)
    run_a_while(loop)  # nothing comes twice

    assert [number for number, _, _ in delivered] == list(range(8))
    assert [(number, kind) for number, kind, _ in delivered if kind == "failed"] == [
        (3, "failed")]
    assert isinstance(delivered[3][2], redis.ResponseError)
    assert [value for _, kind, value in delivered if kind == "done"] == [
        1, 2, 3, 4, None, 5, 6]
    assert where == [(True, True, True)] * 8
    assert all(after_submit)
    assert came_inside_submit == [False] * 4
    # one call at a time: each ran from start to end before the next began
    expected = [(kind, number) for number in range(8) for kind in ("start", "end")
                if (kind, number) != ("end", 3)]
    assert events == expected
    assert client.lrange("log", 0, -1) == [str(number).encode() for number in range(8)]
    assert not io.busy
    assert watched_fds(loop, client) == []


def test_a_raising_callback_is_logged_and_counted_and_the_next_reply_still_comes(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, client: redis.Redis,
    stats: MemoryStatsCollector, caplog: pytest.LogCaptureFixture,
) -> None:
    io = make_io()
    outcomes = Outcomes(loop)

    def broken(_: object) -> None:
        raise RuntimeError("bug in a reply handler")

    io.submit("lease", lambda: client.execute_command("NO-SUCH-COMMAND"), outcomes.done,
              outcomes.failed)
    io.submit("enqueue", client.ping, broken, outcomes.failed)
    io.submit("heartbeat", lambda: client.incr("beat"), outcomes.done, outcomes.failed)
    with caplog.at_level(logging.ERROR, logger="scrapy_redisspine.scheduler"):
        run_until(loop, lambda: len(outcomes.got) == 2)
    assert [type(exc) for exc in outcomes.errors] == [redis.ResponseError]
    assert outcomes.values == [1]  # the next reply still came
    assert stats.get_value("redisspine/errors/enqueue") == 1
    assert any("handling the reply of enqueue failed" in r.getMessage()
               and "bug in a reply handler" in r.getMessage() for r in caplog.records)
    assert not io.busy


def test_busy_while_a_call_is_pending_and_not_once_it_is_delivered(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, client: redis.Redis
) -> None:
    io = make_io()
    outcomes = Outcomes(loop)
    assert not io.busy
    io.submit("wait", lambda: client.blpop(["nothing"], 0.2), outcomes.done,
              outcomes.failed)
    assert io.busy
    seen: list[bool] = []
    loop.call_later(0.05, lambda: seen.append(io.busy))  # while the call is parked
    run_until(loop, lambda: bool(outcomes.got))
    assert seen == [True]
    assert outcomes.values == [None]
    assert not io.busy
    io.submit("at once", lambda: 7, outcomes.done, outcomes.failed)  # ends in submit...
    assert outcomes.values == [None]  # ...but its reply comes later, on the loop
    assert io.busy  # until then
    run_until(loop, lambda: len(outcomes.got) == 2)
    assert outcomes.values == [None, 7]
    assert not io.busy


def test_drain_runs_the_calls_to_their_end_and_delivers_them_before_it_returns(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, client: redis.Redis
) -> None:
    io = make_io()
    outcomes = Outcomes(loop)
    io.submit("wait", lambda: client.blpop(["nothing"], 0.2), outcomes.done,
              outcomes.failed)
    io.submit("count", lambda: client.incr("n"), outcomes.done, outcomes.failed)
    io.submit("bad", lambda: client.execute_command("NO-SUCH-COMMAND"), outcomes.done,
              outcomes.failed)
    assert outcomes.got == []
    assert io.drain(5.0)  # plain code on the loop's thread: the loop does not run
    assert [kind for kind, _ in outcomes.got] == ["done", "done", "failed"]
    assert outcomes.values == [None, 1]
    assert isinstance(outcomes.errors[0], redis.ResponseError)
    assert not io.busy
    run_a_while(loop)  # the delivery the loop had scheduled finds nothing left
    assert len(outcomes.got) == 3

    # from a callback of the running loop, before a call that must follow them
    io.submit("wait", lambda: client.blpop(["nothing"], 0.2), outcomes.done,
              outcomes.failed)
    io.submit("count", lambda: client.incr("n"), outcomes.done, outcomes.failed)
    drained: list[tuple[bool, int]] = []
    loop.call_soon(lambda: drained.append((io.drain(5.0), len(outcomes.got))))
    run_until(loop, lambda: bool(drained))
    assert drained == [(True, 5)]
    assert outcomes.values == [None, 1, None, 2]
    run_a_while(loop)
    assert len(outcomes.got) == 5
    assert not io.busy
    assert watched_fds(loop, client) == []


def test_a_closed_loop_io_calls_at_once_and_the_queued_calls_run_on(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, client: redis.Redis
) -> None:
    io = make_io()
    queued = Outcomes(loop)
    io.submit("queued", lambda: client.blpop(["nothing"], 0.2), queued.done, queued.failed)
    io.close()
    late = Outcomes(loop)
    io.submit("late tick", lambda: client.incr("ticks"), late.done, late.failed)
    assert late.values == [1]  # at once, before submit returned (a timer's last tick)
    assert late.on_loop == [False]
    io.submit("late error", lambda: client.execute_command("NO-SUCH-COMMAND"), late.done,
              late.failed)
    assert isinstance(late.errors[0], redis.ResponseError)
    assert queued.got == []
    assert io.busy  # the queued call is still on its way
    run_until(loop, lambda: bool(queued.got))
    assert queued.values == [None]
    assert not io.busy


def test_a_slow_call_is_counted_and_said_once_with_its_time(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, client: redis.Redis,
    stats: MemoryStatsCollector, caplog: pytest.LogCaptureFixture,
) -> None:
    io = make_io()
    outcomes = Outcomes(loop)
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine.scheduler"):
        for _ in range(2):  # slow_seconds is 0.2; the reply takes 0.3 s or more
            io.submit("lease", lambda: client.blpop(["nothing"], 0.3), outcomes.done,
                      outcomes.failed)
        io.submit("ping", client.ping, outcomes.done, outcomes.failed)  # a fast one
        run_until(loop, lambda: len(outcomes.got) == 3)
    assert outcomes.values == [None, None, True]
    assert stats.get_value("redisspine/redis/slow_calls") == 2
    assert stats.get_value("redisspine/redis/slowest_call_ms") >= 250
    lines = [r.getMessage() for r in caplog.records if "Redis is slow" in r.getMessage()]
    assert len(lines) == 1
    assert "lease took" in lines[0]
    assert " ms " in lines[0]


# -- the loop runs on while a call waits ----------------------------------------------


def test_the_loop_runs_on_while_a_call_waits_for_its_reply(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, client: redis.Redis
) -> None:
    io = make_io()
    outcomes = Outcomes(loop)
    ticker = Ticker(loop)
    started = time.monotonic()
    io.submit("busy server", lambda: client.eval(BUSY_SCRIPT, 0, 500_000), outcomes.done,
              outcomes.failed)
    assert time.monotonic() - started < 0.3  # submit sent it and returned
    run_until(loop, lambda: bool(outcomes.got))
    ticker.stop()
    assert outcomes.values == [b"done"]
    assert outcomes.on_loop == [True]
    assert outcomes.at[0] - started >= 0.45
    assert ticker.ticks_before(outcomes.at[0]) >= 15  # every 10 ms for 0.5 s
    assert ticker.longest_gap < 0.3
    assert watched_fds(loop, client) == []


def test_a_frozen_redis_never_stops_the_loop_and_the_call_times_out(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, own_server: RedisServer,
    make_client: MakeClient,
) -> None:
    io = make_io()
    client = make_client(own_server.url, timeout=1.0)
    assert client.ping()
    outcomes = Outcomes(loop)
    submitted: list[float] = []
    with frozen(own_server):
        ticker = Ticker(loop)

        def submit() -> None:
            submitted.append(time.monotonic())
            io.submit("lease", client.ping, outcomes.done, outcomes.failed)

        loop.call_soon(submit)
        run_until(loop, lambda: bool(outcomes.got))
        ticker.stop()
    took = outcomes.at[0] - submitted[0]
    assert outcomes.values == []
    assert isinstance(outcomes.errors[0], redis.TimeoutError | redis.ConnectionError)
    assert outcomes.on_loop == [True]
    assert 0.8 <= took < 3.0  # its socket timeout, 1 s
    assert ticker.longest_gap < 0.3
    assert ticker.ticks_before(outcomes.at[0]) >= 30
    assert watched_fds(loop, client) == []
    io.submit("lease", client.ping, outcomes.done, outcomes.failed)  # thawed: works again
    run_until(loop, lambda: len(outcomes.got) == 2)
    assert outcomes.values == [True]


#: The client's timeout in the frozen write's test (a blocked write stops the loop
#: this long).
TIMEOUT = 3.0


def test_a_write_to_a_frozen_redis_parks_too(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, own_server: RedisServer,
    make_client: MakeClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    io = make_io()
    client = make_client(own_server.url, timeout=TIMEOUT)
    assert client.ping()
    waits: list[bool] = []  # write?, for each time the call parked
    wait_fd = io.wait_fd

    def noted(fd: int, write: bool, deadline: float | None) -> bool:
        waits.append(write)
        return wait_fd(fd, write, deadline)

    monkeypatch.setattr(io, "wait_fd", noted)
    payload = bytes(32 << 20)  # more than the socket buffers of both ends hold
    outcomes = Outcomes(loop)
    with frozen(own_server):
        ticker = Ticker(loop)
        loop.call_soon(lambda: io.submit("enqueue", lambda: client.set("big", payload),
                                         outcomes.done, outcomes.failed))
        run_until(loop, lambda: bool(outcomes.got))
        ticker.stop()
    assert isinstance(outcomes.errors[0], redis.TimeoutError | redis.ConnectionError)
    assert True in waits  # it waited for the socket to take more
    # A write that blocked would stop the loop for the client's whole timeout;
    # parked, the loop ticks on. Packing and handing 32 MB to the socket take a turn
    # of their own, which CI's loaded machine stretched to 0.76 s once: the timeout
    # is long enough that half of it tells the two apart with room to spare.
    assert ticker.longest_gap < TIMEOUT / 2
    assert watched_fds(loop, client) == []
    io.submit("ping", client.ping, outcomes.done, outcomes.failed)
    run_until(loop, lambda: len(outcomes.got) == 2)
    assert outcomes.values == [True]


def test_a_value_larger_than_the_socket_buffers_goes_and_comes_back_whole(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, client: redis.Redis
) -> None:
    io = make_io()
    payload = os.urandom(16 << 20)
    outcomes = Outcomes(loop)
    io.submit("set", lambda: client.set("big", payload), outcomes.done, outcomes.failed)
    io.submit("get", lambda: client.get("big"), outcomes.done, outcomes.failed)
    run_until(loop, lambda: len(outcomes.got) == 2, timeout=10.0)
    assert outcomes.errors == []
    assert outcomes.values[0] is True
    assert outcomes.values[1] == payload


def test_drain_gives_up_after_its_timeout_on_a_frozen_redis_and_the_call_goes_on(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, own_server: RedisServer,
    make_client: MakeClient,
) -> None:
    io = make_io()
    client = make_client(own_server.url, timeout=3.0)
    assert client.ping()
    outcomes = Outcomes(loop)
    with frozen(own_server):
        io.submit("lease", client.ping, outcomes.done, outcomes.failed)
        started = time.monotonic()
        assert not io.drain(0.3)
        waited = time.monotonic() - started
        assert outcomes.got == []
        assert io.busy
    assert 0.25 <= waited < 1.5
    run_until(loop, lambda: bool(outcomes.got))  # thawed: the loop resumes the call
    assert outcomes.values == [True]
    assert outcomes.on_loop == [True]
    assert not io.busy
    assert io.drain(0.0)
    assert watched_fds(loop, client) == []


def test_after_a_restart_the_next_call_reconnects_off_the_loop(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, own_server: RedisServer,
    make_client: MakeClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    io = make_io()
    client = make_client(own_server.url)
    outcomes = Outcomes(loop)
    io.submit("ping", client.ping, outcomes.done, outcomes.failed)
    run_until(loop, lambda: bool(outcomes.got))
    assert outcomes.values == [True]
    own_server.restart()  # the pooled connection is dead now
    connects: list[str] = []
    connect = redis.connection.Connection._connect

    def slow_connect(self: redis.connection.Connection) -> Any:  # a far Redis, a slow DNS
        connects.append(threading.current_thread().name)
        time.sleep(0.3)
        return connect(self)

    monkeypatch.setattr(redis.connection.Connection, "_connect", slow_connect)
    ticker = Ticker(loop)
    loop.call_soon(lambda: io.submit("set", lambda: client.set("after", b"restart"),
                                     outcomes.done, outcomes.failed))
    run_until(loop, lambda: len(outcomes.got) == 2)
    ticker.stop()
    assert outcomes.errors == []
    assert outcomes.values == [True, True]
    assert connects == [f"{NAME}-connect"]  # once, on its short-lived thread
    assert ticker.longest_gap < 0.25
    assert ticker.ticks_before(outcomes.at[1]) >= 10
    assert all(isinstance(sock, CooperativeSocket) for sock in sockets_of(client))
    assert client.get("after") == b"restart"


def test_a_call_waiting_when_redis_restarts_fails_at_once(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, own_server: RedisServer,
    make_client: MakeClient,
) -> None:
    io = make_io()
    client = make_client(own_server.url)
    outcomes = Outcomes(loop)
    io.submit("lease", lambda: client.blpop(["nothing"], 3), outcomes.done, outcomes.failed)
    # Restart only once Redis holds the call: restarted sooner, the call would connect
    # to the new server and rightly wait out its 3 s (a loaded CI machine did that).
    with redis.Redis.from_url(own_server.url) as watcher:
        run_until(loop, lambda: int(watcher.info("clients")["blocked_clients"]) == 1)
    own_server.restart()  # its connection closes under the parked call
    started = time.monotonic()
    run_until(loop, lambda: bool(outcomes.got))
    assert time.monotonic() - started < 1.5  # not the blpop's 3 s, nor the timeout's 5
    assert isinstance(outcomes.errors[0], redis.ConnectionError)
    io.submit("ping", client.ping, outcomes.done, outcomes.failed)
    run_until(loop, lambda: len(outcomes.got) == 2)
    assert outcomes.values == [True]


def test_a_retry_back_off_parks_the_call_instead_of_sleeping_on_the_loop(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, own_server: RedisServer,
    make_client: MakeClient, monkeypatch: pytest.MonkeyPatch,
) -> None:
    io = make_io()
    client = make_client(own_server.url, timeout=1.0)
    assert client.ping()
    retry = cooperative_retry(redis.retry.Retry(ConstantBackoff(0.3), 2))
    assert retry is not None
    client.set_retry(retry)
    slept: list[float] = []

    def noted_sleep(seconds: float) -> None:  # redis-py's back-off sleep (time.sleep)
        slept.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(redis.retry, "sleep", noted_sleep)
    own_server.stop()
    outcomes = Outcomes(loop)
    submitted: list[float] = []
    ticker = Ticker(loop)

    def submit() -> None:
        submitted.append(time.monotonic())
        io.submit("lease", client.ping, outcomes.done, outcomes.failed)

    loop.call_soon(submit)
    run_until(loop, lambda: bool(outcomes.got))
    ticker.stop()
    took = outcomes.at[0] - submitted[0]
    assert isinstance(outcomes.errors[0], redis.ConnectionError)
    assert 0.55 <= took < 4.0  # its two back-offs of 0.3 s were waited out...
    assert slept == []  # ...parked, not in redis-py's time.sleep
    assert ticker.longest_gap < 0.25
    assert ticker.ticks_before(outcomes.at[0]) >= 20


def test_two_loop_ios_on_one_loop_and_client_do_not_wait_for_each_other(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, client: redis.Redis
) -> None:
    io = make_io()
    upkeep = make_io("redisspine-upkeep")  # as the scheduler has two
    leases, sweeps = Outcomes(loop), Outcomes(loop)
    io.submit("lease", lambda: client.blpop(["nothing"], 0.5), leases.done, leases.failed)
    upkeep.submit("heartbeat", client.ping, sweeps.done, sweeps.failed)
    run_until(loop, lambda: bool(sweeps.got))
    assert sweeps.values == [True]
    assert leases.got == []  # still parked on its own connection
    run_until(loop, lambda: bool(leases.got))
    assert leases.values == [None]

    # a call submitted from inside another LoopIO's call starts on the loop, later
    order: list[str] = []

    def inner() -> int:
        order.append("inner runs")
        return int(client.incr("inner"))

    def outer() -> int:
        upkeep.submit("sweep", inner, sweeps.done, sweeps.failed)
        order.append("outer submitted")
        return int(client.incr("outer"))

    io.submit("lease", outer, leases.done, leases.failed)
    assert order == ["outer submitted"]
    run_until(loop, lambda: len(leases.got) == 2 and len(sweeps.got) == 2)
    assert order == ["outer submitted", "inner runs"]
    assert leases.values == [None, 1]
    assert sweeps.values == [True, 1]
    assert sweeps.on_loop == [True, True]
    assert not io.busy
    assert not upkeep.busy


# -- the same client, outside any LoopIO call ------------------------------------------


def test_outside_a_call_the_client_works_as_a_plain_one(
    make_io: MakeIO, loop: asyncio.AbstractEventLoop, client: redis.Redis
) -> None:
    io = make_io()
    outcomes = Outcomes(loop)
    io.submit("lease", lambda: client.blpop(["nothing"], 1.0), outcomes.done,
              outcomes.failed)  # parked on one connection of the pool
    started = time.monotonic()
    assert client.set("plain", b"main")  # plain code on the loop's main greenlet
    assert client.get("plain") == b"main"
    assert time.monotonic() - started < 0.8  # it did not wait for the parked call
    in_thread: list[object] = []

    def elsewhere() -> None:
        try:
            in_thread.append(client.set("thread", b"other"))
            in_thread.append(client.get("thread"))
        except Exception as exc:
            in_thread.append(exc)

    other = threading.Thread(target=elsewhere)
    other.start()
    other.join(5.0)
    assert in_thread == [True, b"other"]
    assert outcomes.got == []
    run_until(loop, lambda: bool(outcomes.got))
    assert outcomes.values == [None]
    sockets = sockets_of(client)  # the parked call's, and the one plain code used
    assert len(sockets) == 2
    assert all(isinstance(sock, CooperativeSocket) for sock in sockets)


def test_outside_a_call_a_frozen_redis_still_times_out(
    own_server: RedisServer, make_client: MakeClient
) -> None:
    client = make_client(own_server.url, timeout=0.5)
    assert client.ping()
    in_thread: list[tuple[object, float]] = []

    def elsewhere() -> None:
        started = time.monotonic()
        try:
            in_thread.append((client.ping(), time.monotonic() - started))
        except Exception as exc:
            in_thread.append((exc, time.monotonic() - started))

    with frozen(own_server):
        other = threading.Thread(target=elsewhere)
        other.start()
        started = time.monotonic()
        with pytest.raises(redis.TimeoutError):
            client.ping()
        took = time.monotonic() - started
        other.join(5.0)
    assert 0.4 <= took < 3.0
    assert len(in_thread) == 1
    assert isinstance(in_thread[0][0], redis.TimeoutError)
    assert 0.4 <= in_thread[0][1] < 3.0
    assert all(isinstance(sock, CooperativeSocket) for sock in sockets_of(client))
    assert client.ping()


@pytest.mark.parametrize(("make", "cooperative"), [
    (lambda: client_from_url("redis://127.0.0.1:1/0", cooperative=True), True),
    (lambda: client_from_url("redis://127.0.0.1:1/0"), False),
    (lambda: client_from_url("rediss://127.0.0.1:1/0", cooperative=True), True),
    (lambda: client_from_url("rediss://127.0.0.1:1/0"), False),
    (lambda: client_from_url("unix:///tmp/redisspine-none.sock", cooperative=True), True),
    (lambda: client_from_url("redis+sentinel://127.0.0.1:1/primary", cooperative=True),
     False),
    (fakeredis.FakeRedis, False),
], ids=["tcp", "tcp-plain", "tls", "tls-plain", "unix", "sentinel", "fakeredis"])
def test_is_cooperative(make: Callable[[], redis.Redis], cooperative: bool) -> None:
    client = make()  # no connection is made to tell
    try:
        assert is_cooperative(client) is cooperative
    finally:
        client.close()
