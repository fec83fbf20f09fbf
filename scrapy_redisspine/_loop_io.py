"""Redis calls on the crawl's own loop, without a thread: each waits for its socket as
the loop waits for a download's.

:class:`~scrapy_redisspine._redis_io.ThreadIO` keeps a frozen or far Redis from
stopping the crawl, but a second Python thread costs a CPU-bound worker more than its
calls do (benchmarks/RESULTS.md, sessions 9-11: each reply makes the loop thread give
up the GIL; the same calls made inline leave the worker within 2 % of plain Scrapy's
CPU, with the thread it is ~7 % above). :class:`LoopIO` has both: a call runs on the
loop's thread, inside a greenlet, and whenever its socket would block (a reply not in
yet, a full send buffer, a connect, a retry's back-off) the greenlet parks and the
loop runs on; the loop's own selector resumes it when the socket is ready or its
timeout is up. Nothing else changes: the same redis-py client, commands, scripts and
errors, results delivered later on the loop in submission order (as ThreadIO does),
so the guard, the breaker and the reconciliation of lost replies see the same thing.

How a synchronous client learns to park: the connections of a plain client (TCP, TLS
or a Unix socket; not Cluster or Sentinel, which keep the thread) are made by
:func:`cooperative_connection`, whose socket (:class:`CooperativeSocket`) is
non-blocking underneath. Used outside a call of :class:`LoopIO` (start-up, close, the
CLI, another thread) it waits in ``poll()`` exactly as a blocking socket would; used
inside one it parks the call's greenlet. The connect itself (DNS, TCP, a TLS
handshake) runs on a short-lived thread while the call parks, and the retry back-off
is slept the same way (:class:`CooperativeBackoff`).

Needs an asyncio loop to wait on (Scrapy's default asyncio reactor, or its
reactorless mode); with another Twisted reactor the worker keeps its thread.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import select
import ssl
import threading
import time
from typing import TYPE_CHECKING, Any, TypeVar

import greenlet
from redis.backoff import AbstractBackoff

from scrapy_redisspine._packing import hiredis_packed
from scrapy_redisspine._redis_io import SLOW_CALL_SECONDS, CallTimes, _deliver, call_now

if TYPE_CHECKING:
    import asyncio
    import socket
    from collections.abc import Callable

    from redis.connection import AbstractConnection
    from redis.retry import Retry
    from scrapy.statscollectors import StatsCollector

T = TypeVar("T")

_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError,
                ssl.SSLWantWriteError)


class _CallGreenlet(greenlet.greenlet):  # type: ignore[misc]
    """The greenlet that runs one LoopIO's calls; ``in_call`` while one runs."""

    io: LoopIO
    in_call = False


def _running_call() -> LoopIO | None:
    """The LoopIO whose call runs here and may park, or None (block as usual)."""
    current = greenlet.getcurrent()
    if isinstance(current, _CallGreenlet) and current.in_call:
        return current.io
    return None


def _poll(fd: int, write: bool, seconds: float | None) -> bool:
    """Block until ``fd`` is ready or ``seconds`` pass (None: no limit)."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    timeout_ms = None if seconds is None else max(0, int(seconds * 1000 + 0.999))
    return bool(poller.poll(timeout_ms))


class CooperativeSocket:
    """A socket that is non-blocking underneath and behaves as a blocking one with a
    timeout: inside a LoopIO call it parks the call while it waits, elsewhere it
    waits in ``poll()``. What redis-py's connections and parsers use of a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._timeout = sock.gettimeout()
        sock.setblocking(False)

    def __getattr__(self, name: str) -> Any:  # getsockname, shutdown, close, pending...
        return getattr(self._sock, name)

    def fileno(self) -> int:
        return self._sock.fileno()

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def setblocking(self, flag: bool) -> None:
        self._timeout = None if flag else 0.0

    def recv(self, size: int, flags: int = 0) -> bytes:
        return self._io(lambda: self._sock.recv(size, flags), write=False)

    def recv_into(self, buffer: Any, size: int = 0, flags: int = 0) -> int:
        return self._io(lambda: self._sock.recv_into(buffer, size, flags), write=False)

    def send(self, data: Any, flags: int = 0) -> int:
        return self._io(lambda: self._sock.send(data, flags), write=True)

    def sendall(self, data: Any, flags: int = 0) -> None:
        view = memoryview(data).cast("B")
        while view:
            sent: int = self._io(functools.partial(self._sock.send, view, flags), write=True)
            view = view[sent:]

    def _io(self, operation: Callable[[], T], *, write: bool) -> T:
        timeout = self._timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                return operation()
            except _WOULD_BLOCK as exc:
                if timeout == 0:
                    raise
                if isinstance(exc, ssl.SSLWantReadError):
                    wants_write = False
                elif isinstance(exc, ssl.SSLWantWriteError):
                    wants_write = True
                else:
                    wants_write = write
            if not _wait(self._sock.fileno(), wants_write, deadline):
                raise TimeoutError("timed out")


def _wait(fd: int, write: bool, deadline: float | None) -> bool:
    """Wait until ``fd`` is ready (True) or ``deadline`` (monotonic) passes (False)."""
    io = _running_call()
    if io is not None:
        return io.wait_fd(fd, write, deadline)
    return _poll(fd, write, None if deadline is None else deadline - time.monotonic())


class CooperativeConnection:
    """Marks the connection classes :func:`cooperative_connection` makes."""


@functools.cache
def cooperative_connection(base: type[AbstractConnection]) -> type[AbstractConnection]:
    """``base`` (redis-py's Connection, SSLConnection or UnixDomainSocketConnection)
    whose socket is a :class:`CooperativeSocket`, whose connect parks a LoopIO
    call instead of blocking the loop, and whose commands hiredis packs in one call
    (:mod:`scrapy_redisspine._packing`)."""

    class Cooperative(hiredis_packed(base), CooperativeConnection):  # type: ignore[misc]
        def _connect(self) -> Any:
            io = _running_call()
            connect = super()._connect
            sock = connect() if io is None else io.off_loop(connect)
            return CooperativeSocket(sock)

    Cooperative.__name__ = Cooperative.__qualname__ = f"Cooperative{base.__name__}"
    return Cooperative


def cooperative_retry(retry: Retry | None) -> Retry | None:
    """``retry`` (a client's, redis-py's default policy) with its back-off slept by
    parking a LoopIO call; None if the client has no retry or it cannot be read."""
    backoff = getattr(retry, "_backoff", None)
    if retry is None or not isinstance(backoff, AbstractBackoff):
        return retry
    wrapped = copy.copy(retry)
    wrapped._backoff = CooperativeBackoff(backoff)  # type: ignore[attr-defined]
    return wrapped


class CooperativeBackoff(AbstractBackoff):
    """redis-py's retry back-off, slept by parking a LoopIO call rather than in
    ``time.sleep`` on the loop (it then tells redis-py to sleep 0)."""

    def __init__(self, backoff: AbstractBackoff) -> None:
        self._backoff = backoff

    def reset(self) -> None:
        self._backoff.reset()  # type: ignore[no-untyped-call]

    def compute(self, failures: int) -> float:
        seconds = float(self._backoff.compute(failures))
        io = _running_call()
        if io is None or seconds <= 0:
            return seconds
        io.sleep(seconds)
        return 0.0


class LoopIO:
    """Calls on the loop's own thread, each parked while its socket waits; results
    delivered on the loop in submission order (the :class:`RedisIO` of a worker whose
    client is cooperative, see the module docstring).

    Invariant kept: one call of this LoopIO runs at a time, in submission order; each
    result is delivered exactly once, on the loop, after its call's ``submit`` returned.
    """

    background = True

    def __init__(
        self, stats: StatsCollector, loop: asyncio.AbstractEventLoop, *,
        slow_seconds: float = SLOW_CALL_SECONDS, name: str = "redisspine-redis",
    ) -> None:
        self._stats = stats
        self._loop = loop
        self._times = CallTimes(stats, slow_seconds)
        self._name = name
        self._main = greenlet.getcurrent()  # the loop thread's: parked calls return here
        self._jobs: collections.deque[tuple[str, Callable[[], Any], Callable[[Any], object],
                                            Callable[[Exception], object]]]
        self._jobs = collections.deque()
        self._results: collections.deque[tuple[str, tuple[bool, Any], float,
                                               Callable[[Any], object],
                                               Callable[[Exception], object]]]
        self._results = collections.deque()
        self._runner: _CallGreenlet | None = None
        self._delivery_due = False
        self._closed = False
        self._drain_deadline: float | None = None  # while drain() runs calls to the end
        self._wake_token: object | None = None  # the wait the runner is parked in

    @property
    def busy(self) -> bool:
        return self._times.pending > 0

    @property
    def near(self) -> bool:
        return self._times.near

    def submit(
        self, name: str, call: Callable[[], T], done: Callable[[T], object],
        failed: Callable[[Exception], object],
    ) -> None:
        if self._closed:  # a timer's last tick after the scheduler closed: at once
            call_now(name, self._stats, call, done, failed)
            return
        self._times.submitted()
        self._jobs.append((name, call, done, failed))
        if self._runner is None:
            self._runner = _CallGreenlet(self._run, parent=self._main)
            self._runner.io = self
            if greenlet.getcurrent() is self._main:
                self._runner.switch()  # runs until its first wait: the request is sent now
            else:
                self._loop.call_soon(self._start)

    def _start(self) -> None:
        runner = self._runner
        if runner is not None and not runner and not runner.dead:  # not started yet
            runner.switch()

    def _run(self) -> None:
        """The runner greenlet: every queued call, one by one, then it ends."""
        runner = self._runner
        assert runner is not None
        try:
            while self._jobs:
                name, call, done, failed = self._jobs.popleft()
                started = time.monotonic()
                runner.in_call = True
                try:
                    outcome: tuple[bool, Any] = (True, call())
                except Exception as exc:  # delivered to ``failed`` on the loop
                    outcome = (False, exc)
                finally:
                    runner.in_call = False
                self._results.append((name, outcome, time.monotonic() - started, done,
                                      failed))
                if not self._delivery_due:
                    self._delivery_due = True
                    self._loop.call_soon(self._deliver_ready)
        finally:
            self._runner = None

    # -- parking (runner greenlet) --------------------------------------------------

    def wait_fd(self, fd: int, write: bool, deadline: float | None) -> bool:
        """Park the running call until ``fd`` is ready (True) or ``deadline`` passes
        (False); while drain() runs calls to their end, block instead."""
        while True:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return False
            drain_by = self._drain_deadline
            if drain_by is not None and now < drain_by:
                until = drain_by if deadline is None else min(deadline, drain_by)
                if _poll(fd, write, until - now):
                    return True
                continue  # the socket's deadline (returns False) or drain's (park)
            token = self._arm()
            (self._loop.add_writer if write else self._loop.add_reader)(
                fd, self._resume, token, True)
            timer = (self._loop.call_later(deadline - now, self._resume, token, False)
                     if deadline is not None else None)
            try:
                ready = self._main.switch()
            finally:
                self._wake_token = None
                (self._loop.remove_writer if write else self._loop.remove_reader)(fd)
                if timer is not None:
                    timer.cancel()
            if ready:
                return True
            # the timer (the loop checks the deadline) or drain(): look again

    def sleep(self, seconds: float) -> None:
        """Park the running call for ``seconds`` (a retry's back-off)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            drain_by = self._drain_deadline
            if drain_by is not None and time.monotonic() < drain_by:
                time.sleep(min(left, drain_by - time.monotonic()))
                continue
            token = self._arm()
            self._park(self._loop.call_later(left, self._resume, token, False))

    def off_loop(self, function: Callable[[], T]) -> T:
        """``function()`` on a short-lived thread while the call parks (a connect:
        DNS, TCP and a TLS handshake would block the loop)."""
        outcome: list[tuple[bool, Any]] = []
        finished = threading.Event()
        token = self._arm()

        def run() -> None:
            try:
                outcome.append((True, function()))
            except BaseException as exc:  # raised again in the call
                outcome.append((False, exc))
            finished.set()
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                self._loop.call_soon_threadsafe(self._resume, token, True)

        threading.Thread(target=run, name=f"{self._name}-connect", daemon=True).start()
        while not finished.is_set():
            if self._drain_deadline is not None:
                finished.wait(max(0.0, self._drain_deadline - time.monotonic()))
                if finished.is_set():
                    break
            self._wake_token = token
            self._park(None)
        ok, value = outcome[0]
        if not ok:
            raise value
        return value  # type: ignore[no-any-return]

    def _arm(self) -> object:
        token = object()
        self._wake_token = token
        return token

    def _park(self, timer: asyncio.TimerHandle | None) -> None:
        try:
            self._main.switch()
        finally:
            self._wake_token = None
            if timer is not None:
                timer.cancel()

    def _resume(self, token: object, ready: bool) -> None:
        """(loop) The wait ``token`` is over: run the parked call on."""
        runner = self._runner
        if runner is not None and token is self._wake_token and runner:
            runner.switch(ready)

    # -- results (loop) ---------------------------------------------------------------

    def _deliver_ready(self) -> None:
        self._delivery_due = False
        while self._results:
            name, outcome, took, done, failed = self._results.popleft()
            self._times.delivered(name, took)
            _deliver(name, self._stats, outcome, done, failed)

    def drain(self, timeout: float) -> bool:
        """Run the calls submitted so far to their end here, blocking the loop for at
        most ``timeout`` seconds, and deliver their results (at close, or before a
        call that must follow them)."""
        if greenlet.getcurrent() is not self._main:
            return not self._times.pending
        deadline = time.monotonic() + timeout
        self._drain_deadline = deadline
        try:
            while self._runner is not None:
                if time.monotonic() >= deadline:
                    return False
                self._wake_token = None  # whatever it waits for, it now waits here
                self._runner.switch()
        finally:
            self._drain_deadline = None
        self._deliver_ready()
        return True

    def close(self) -> None:
        """Take no more calls (later ones run at once); the queued ones run on."""
        self._closed = True
