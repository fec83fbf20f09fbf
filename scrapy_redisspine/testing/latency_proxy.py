"""A TCP proxy on loopback that delays every byte by a fixed time each way.

Used by the benchmarks (``crawl_compare.py --rtt-ms``) and by the test suite
(``REDISSPINE_TEST_RTT_MS``: the end-to-end crawls with Redis a few milliseconds away).

Puts Redis "1 ms away" without a network namespace: with ``--delay 0.0005`` every
chunk read from either side is forwarded 0.5 ms after it arrived, so a round trip
costs about 1 ms more, while pipelined bytes are not serialized behind each other
(each chunk carries its own deadline). One thread per direction per connection,
because ``time.sleep`` is precise to tens of microseconds here while an asyncio
timer waits on ``epoll`` with millisecond granularity.

    python -m scrapy_redisspine.testing.latency_proxy --target-port 6380 --delay 0.0005
    # prints {"port": N}; clients connect to 127.0.0.1:N

:class:`LatencyProxy` runs it in a process of its own (it must not share the GIL of
the process it measures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

from scrapy_redisspine.testing._service import Service

_CHUNK = 65536


def _pump(src: socket.socket, dst: socket.socket, delay: float) -> None:
    pending: queue.Queue[tuple[float, bytes]] = queue.Queue()

    def forward() -> None:
        while True:
            deadline, data = pending.get()
            wait = deadline - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    writer = threading.Thread(target=forward, daemon=True)
    writer.start()
    while True:
        try:
            data = src.recv(_CHUNK)
        except OSError:
            data = b""
        pending.put((time.monotonic() + delay, data))
        if not data:
            break
    writer.join()


def _serve_client(client: socket.socket, target: tuple[str, int], delay: float) -> None:
    try:
        upstream = socket.create_connection(target)
    except OSError:
        client.close()
        return
    for sock in (client, upstream):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pump, args=(upstream, client, delay), daemon=True)
    back.start()
    _pump(client, upstream, delay)
    back.join()
    client.close()
    upstream.close()


class LatencyProxy(Service):
    """The proxy in its own process, in front of ``target_port`` on loopback, adding
    ``delay`` seconds each way (a round trip costs ``2 * delay`` more)."""

    def __init__(self, target_port: int, delay: float) -> None:
        self.target_port = target_port
        self.delay = delay
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> LatencyProxy:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "scrapy_redisspine.testing.latency_proxy",
             "--target-port", str(self.target_port), "--delay", str(self.delay)],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert self._process.stdout is not None
        self.port = int(json.loads(self._process.stdout.readline())["port"])
        return self

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def measured_rtt_ms(self, pings: int = 200) -> float:
        """The median PING round trip through the proxy (its own overhead included)."""
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port)
        try:
            client.ping()
            times = []
            for _ in range(pings):
                started = time.perf_counter()
                client.ping()
                times.append(time.perf_counter() - started)
        finally:
            client.close()
        return 1000 * statistics.median(times)

    def stop(self) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            self._process = None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--target-host", default="127.0.0.1")
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--listen-port", type=int, default=0)
    parser.add_argument("--delay", type=float, default=0.0005, help="seconds, each way")
    args = parser.parse_args()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", args.listen_port))
    listener.listen(128)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(json.dumps({"port": listener.getsockname()[1]}), flush=True)
    target = (args.target_host, args.target_port)
    while True:
        client, _ = listener.accept()
        threading.Thread(target=_serve_client, args=(client, target, args.delay),
                         daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
