"""A TCP proxy on loopback that delays every byte by a fixed time each way.

Puts Redis "1 ms away" without a network namespace: with ``--delay 0.0005`` every
chunk read from either side is forwarded 0.5 ms after it arrived, so a round trip
costs about 1 ms more, while pipelined bytes are not serialized behind each other
(each chunk carries its own deadline). One thread per direction per connection,
because ``time.sleep`` is precise to tens of microseconds here while an asyncio
timer waits on ``epoll`` with millisecond granularity.

    python benchmarks/latency_proxy.py --target-port 6380 --delay 0.0005
    # prints {"port": N}; clients connect to 127.0.0.1:N
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import signal
import socket
import sys
import threading
import time

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
