"""``redisspine dashboard``: a live page of one crawl, served from the package.

The page (``dashboard/index.html``) polls ``api/status`` every 2 s: the crawl's
status (the same bounded reads as ``redisspine status``), its progress over the
last five minutes (the ``progress`` samples the workers record, at most
``MAX_SAMPLES``) and its first dead letters with their reasons. It draws the chart
itself (inline SVG); nothing is fetched from anywhere else, and there is no build.

Keys read: those of ``status.read_status``, progress, dead.
"""

from __future__ import annotations

import json
import sys
from importlib.resources import files
from typing import TYPE_CHECKING, Any

import redis

from scrapy_redisspine.cli_output import describe_payload
from scrapy_redisspine.status import Sample

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from _typeshed.wsgi import StartResponse, WSGIEnvironment

    from scrapy_redisspine.sharded import AnyFrontier

MAX_SAMPLES = 5000
MAX_DEAD_LETTERS = 20
RATE_WINDOW_MS = 30_000  # acks per minute at a point: over the 30 s before it


def progress_series(samples: Sequence[Sample]) -> list[dict[str, Any]]:
    """The fleet's acks over time, one point per sample (time order), each with the
    acks per minute over the ``RATE_WINDOW_MS`` before it (None for the first ones)."""
    ordered = sorted(samples, key=lambda sample: sample.ms)
    points: list[dict[str, Any]] = []
    first = 0
    for sample in ordered:
        while ordered[first].ms < sample.ms - RATE_WINDOW_MS:
            first += 1
        oldest = ordered[first]
        span = sample.ms - oldest.ms
        rate = (sample.fleet_acks - oldest.fleet_acks) * 60_000 / span if span >= 1000 else None
        points.append({"ms": sample.ms, "done": sample.fleet_acks,
                       "acks_per_minute": None if rate is None else round(max(rate, 0.0), 1)})
    return points


class Dashboard:
    """The WSGI app: ``/`` is the page, ``/api/status`` its data (503 with a one-line
    ``error`` when Redis fails: the page says so and keeps polling)."""

    def __init__(self, frontier: AnyFrontier, read: Callable[[], dict[str, Any]]) -> None:
        self.frontier = frontier
        self.read = read
        self.page = files("scrapy_redisspine.dashboard").joinpath("index.html").read_bytes()

    def data(self) -> dict[str, Any]:
        keys, client = self.frontier.keys, self.frontier.client
        status = self.read()
        raw = client.zrangebyscore(keys.progress, "-inf", "+inf", 0, MAX_SAMPLES)
        samples = [s for s in map(Sample.parse, raw) if s is not None]  # type: ignore[arg-type]
        letters = self.frontier.upkeep.dead_letters(MAX_DEAD_LETTERS)
        return {
            "status": status,
            "progress": progress_series(samples),
            "dead_letters": [{"id": letter.field, "lane": letter.lane, "reason": letter.reason,
                              "request": describe_payload(letter.payload)}
                             for letter in letters],
        }

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse
                 ) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path in ("/", "/index.html"):
            return self._reply(start_response, "200 OK", "text/html; charset=utf-8", self.page)
        if path == "/api/status":
            try:
                body, code = json.dumps(self.data()).encode(), "200 OK"
            except redis.RedisError as exc:
                message = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                print(f"redisspine dashboard: reading Redis failed: {message}", file=sys.stderr)
                body, code = json.dumps({"error": message}).encode(), "503 Service Unavailable"
            return self._reply(start_response, code, "application/json", body)
        return self._reply(start_response, "404 Not Found", "text/plain", b"not found\n")

    @staticmethod
    def _reply(start_response: StartResponse, code: str, kind: str, body: bytes
               ) -> list[bytes]:
        start_response(code, [("Content-Type", kind), ("Content-Length", str(len(body))),
                              ("Cache-Control", "no-store")])
        return [body]
