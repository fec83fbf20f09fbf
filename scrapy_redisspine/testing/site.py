"""A local multi-host web site for end-to-end tests, benchmarks and the example.

Host ``i`` listens on ``127.0.0.(10+i)``, all hosts on one shared port, so Scrapy sees
several distinct hosts (and download slots) with no DNS and no internet. The pages
come from a deterministic :class:`~scrapy_redisspine.testing.linkgraph.LinkGraph`.

The site is the referee of a crawl: it logs every request it serves (host, path,
method, start and end time, status) in memory and, optionally, as JSON lines in a
file that other processes read with :func:`read_log`. Tests check "every page
fetched exactly once" and "no two fetches of a host overlap" from this log, not from
what the crawler believes it did.

Stdlib only, so it starts in milliseconds and runs wherever the package does::

    python -m scrapy_redisspine.testing.site --hosts 3 --pages 20 --log site.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import re
import signal
import socketserver
import sys
import threading
import time
from collections import Counter
from email.utils import formatdate
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy_redisspine.testing._service import Service
from scrapy_redisspine.testing.linkgraph import LinkGraph, host_address, page_url
from scrapy_redisspine.testing.requestlog import RequestLog, count_page_fetches, read_log

__all__ = ["TestSite", "count_page_fetches", "main", "read_log"]

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

_PAGE_PATH = re.compile(r"^/p/(\d+)$")
_BIND_ATTEMPTS = 10
_POLL_SECONDS = 0.05


class _HostServer(ThreadingHTTPServer):
    """One host of the site; many connections at once, none of them outliving us."""

    daemon_threads = True
    request_queue_size = 128  # several crawler processes connect at once

    def __init__(self, address: tuple[str, int], site: TestSite, host: int) -> None:
        self.site = site
        self.host_index = host
        super().__init__(address, _PageHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the address with getfqdn(), a reverse DNS
        # lookup that can take seconds on a machine without DNS.
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name = str(host)
        self.server_port = int(port)


class _PageHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps connections alive, as a real site would for Scrapy.
    protocol_version = "HTTP/1.1"
    timeout = 60
    server: _HostServer

    def do_GET(self) -> None:
        self.server.site._serve(self)

    def do_HEAD(self) -> None:
        self.server.site._serve(self)

    def log_message(self, format: str, *args: Any) -> None:
        """Silenced: the site keeps its own structured log."""


class TestSite(Service):
    """A running multi-host site; see the module docstring.

    ``latency`` delays every response; paths in ``slow_paths`` (``"/p/3"`` on any
    host, or ``"127.0.0.11/p/3"`` on one) are delayed by ``slow_latency`` instead.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(
        self,
        hosts: int = 3,
        pages_per_host: int = 20,
        fanout: int = 4,
        seed: int = 0,
        *,
        latency: float = 0.0,
        tracking_params: bool = False,
        log_path: str | Path | None = None,
        slow_paths: Iterable[str] = (),
        slow_latency: float = 1.0,
        busy_paths: Mapping[str, float] | None = None,
        robots_txt: str | None = None,
        port: int = 0,
        load_latency: float = 0.0,
    ) -> None:
        self.graph = LinkGraph(hosts, pages_per_host, fanout, seed, tracking_params)
        self.latency = latency
        # Seconds more per request the host is already serving: a server that slows
        # down under load (what AutoThrottle must back off from).
        self.load_latency = load_latency
        self._serving: Counter[str] = Counter()
        self._serving_lock = threading.Lock()
        self.slow_paths = frozenset(slow_paths)
        self.slow_latency = slow_latency
        # "127.0.0.10/p/2" -> seconds: answered once with 429 and that Retry-After.
        self.busy_paths = dict(busy_paths or {})
        self._busy_served: set[str] = set()
        self._busy_lock = threading.Lock()
        self.robots_txt = robots_txt  # served at /robots.txt by every host (else 404)
        self.log_path = Path(log_path) if log_path is not None else None
        self._wanted_port = port
        self._port: int | None = None
        self._servers: list[_HostServer] = []
        self._threads: list[threading.Thread] = []
        self.log = RequestLog(log_path)

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> TestSite:
        if self._servers:
            raise RuntimeError("the test site is already running")
        self._servers = self._bind_all()
        self.log.open()
        self._port = self._servers[0].server_port
        for server in self._servers:
            thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": _POLL_SECONDS},
                name=f"test-site-{server.server_name}",
                daemon=True,
            )
            thread.start()
            self._threads.append(thread)
        return self

    def _bind_all(self) -> list[_HostServer]:
        """Bind every host on one port; retry with a new port if one is taken."""
        attempts = 1 if self._wanted_port else _BIND_ATTEMPTS
        for attempt in range(attempts):
            servers: list[_HostServer] = []
            try:
                port = self._wanted_port
                for host in range(self.graph.hosts):
                    servers.append(_HostServer((host_address(host), port), self, host))
                    port = servers[0].server_port
                return servers
            except OSError as exc:
                for server in servers:
                    server.server_close()
                if exc.errno != errno.EADDRINUSE or attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._servers.clear()
        self._threads.clear()
        self.log.close()

    # -- what the site contains -------------------------------------------------

    @property
    def port(self) -> int:
        port = self._port or self._wanted_port
        if not port:
            raise RuntimeError("the test site has no port until it is started")
        return port

    def start_urls(self) -> list[str]:
        return [page_url(host, page, self.port) for host, page in self.graph.start_pages()]

    def all_urls(self) -> set[str]:
        """Every page reachable from the start URLs, as canonical URLs."""
        return {page_url(host, page, self.port) for host, page in self.graph.reachable()}

    def requests(self) -> list[dict[str, Any]]:
        """A copy of the request log, in the order the responses finished."""
        return self.log.records()

    def fetch_counts(self) -> Counter[str]:
        return count_page_fetches(self.requests())

    # -- serving ----------------------------------------------------------------

    def _serve(self, handler: _PageHandler) -> None:
        start = time.time()
        server = handler.server
        page, response = self._response_for(server.host_index, handler)
        self._delay(server.server_name, urlsplit(handler.path).path)
        record: dict[str, Any] = {
            "host": server.server_name,
            "host_header": handler.headers.get("Host", ""),
            "path": handler.path,
            "page": page,
            "method": handler.command,
            "start": start,
            "status": int(response[9:12]),  # from "HTTP/1.1 200 OK"
        }
        try:
            # Hold back the last byte until the request is logged: whoever has a
            # complete response can rely on finding it in the log.
            handler.wfile.write(response[:-1])
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError) as exc:
            record["error"] = type(exc).__name__  # the crawler went away (killed?)
        record["end"] = time.time()
        self.log.append(record)
        if "error" not in record:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                handler.wfile.write(response[-1:])
                handler.wfile.flush()

    def _response_for(self, host: int, handler: _PageHandler) -> tuple[str | None, bytes]:
        """(canonical page URL or None for a 404/429, raw HTTP response)."""
        head_only = handler.command == "HEAD"
        busy = f"{handler.server.server_name}{urlsplit(handler.path).path}"
        if busy in self.busy_paths:
            with self._busy_lock:
                first = busy not in self._busy_served
                self._busy_served.add(busy)
            if first:
                seconds = f"{self.busy_paths[busy]:.0f}"
                return None, _response_bytes(429, "text/plain; charset=utf-8", b"slow down\n",
                                             head_only, {"Retry-After": seconds})
        if self.robots_txt is not None and urlsplit(handler.path).path == "/robots.txt":
            body = self.robots_txt.encode()
            return None, _response_bytes(200, "text/plain; charset=utf-8", body, head_only)
        match = _PAGE_PATH.match(urlsplit(handler.path).path)
        if match and self.graph.has_page(host, int(match.group(1))):
            page = int(match.group(1))
            body = self._render(host, page).encode()
            html = _response_bytes(200, "text/html; charset=utf-8", body, head_only)
            return page_url(host, page, self.port), html
        return None, _response_bytes(404, "text/plain; charset=utf-8", b"not found\n", head_only)

    def _delay(self, host: str, path: str) -> None:
        slow = path in self.slow_paths or f"{host}{path}" in self.slow_paths
        seconds = self.slow_latency if slow else self.latency
        if not self.load_latency:
            if seconds > 0:
                time.sleep(seconds)
            return
        with self._serving_lock:
            seconds += self.load_latency * self._serving[host]
            self._serving[host] += 1
        try:
            time.sleep(seconds)
        finally:
            with self._serving_lock:
                self._serving[host] -= 1

    def _render(self, host: int, page: int) -> str:
        port = self.port
        anchors = "".join(
            f'<a href="{link.href(port)}">{host_address(link.host)} page {link.page}</a>\n'
            for link in self.graph.links(host, page)
        )
        return f"<html><body>\n{anchors}</body></html>\n"


def _response_bytes(
    status: int, ctype: str, body: bytes, head_only: bool, extra: Mapping[str, str] | None = None
) -> bytes:
    extra_lines = "".join(f"{name}: {value}\r\n" for name, value in (extra or {}).items())
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        f"Date: {formatdate(usegmt=True)}\r\n"
        f"Content-Type: {ctype}\r\n"
        f"{extra_lines}"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + (b"" if head_only else body)


# -- command line -------------------------------------------------------------


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--pages", type=int, default=20, help="pages per host")
    parser.add_argument("--fanout", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per response")
    parser.add_argument("--tracking-params", action="store_true",
                        help="add ?utm_source=x to some links")
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    parser.add_argument("--log", help="append a JSON line per request to this file")
    parser.add_argument("--print-urls", action="store_true",
                        help="print every reachable page URL for --port and exit")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    site = TestSite(args.hosts, args.pages, args.fanout, args.seed, latency=args.latency,
                    tracking_params=args.tracking_params, log_path=args.log, port=args.port)
    if args.print_urls:
        if not args.port:
            print("--print-urls needs --port (the port of the site)", file=sys.stderr)
            return 2
        for url in sorted(site.all_urls()):
            print(url)
        return 0
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    with site:
        print(json.dumps({"port": site.port, "start_urls": site.start_urls()}), flush=True)
        while not stopping.wait(0.5):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
