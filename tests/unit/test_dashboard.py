"""``redisspine dashboard``: the page and its data, through the WSGI app itself."""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

import redis

from scrapy_redisspine.control import record_progress
from scrapy_redisspine.dashboard_app import Dashboard, progress_series
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.status import Sample, read_status

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pytest

KEYS = CrawlKeys("redisspine", "books")


def test_progress_series_gives_acks_per_minute_over_the_30_s_before_each_point() -> None:
    samples = [Sample(70_000, "w2", 0, 130), Sample(10_000, "w1", 0, 10),
               Sample(40_000, "w1", 0, 70), Sample(10_500, "w2", 0, 11)]
    assert progress_series(samples) == [
        {"ms": 10_000, "done": 10, "acks_per_minute": None},
        {"ms": 10_500, "done": 11, "acks_per_minute": None},  # under a second: no rate
        {"ms": 40_000, "done": 70, "acks_per_minute": 120.0},
        {"ms": 70_000, "done": 130, "acks_per_minute": 120.0},
    ]
    assert progress_series([]) == []


def call(app: Dashboard, path: str) -> tuple[str, dict[str, str], bytes]:
    replies: list[Any] = []

    def start_response(status: str, headers: list[tuple[str, str]], *_: Any) -> Any:
        replies.append((status, dict(headers)))

    body: Iterable[bytes] = app({"PATH_INFO": path, "REQUEST_METHOD": "GET"},
                                start_response)  # type: ignore[arg-type]
    status, headers = replies[0]
    return status, headers, b"".join(body)


def _app(client: redis.Redis) -> Dashboard:
    frontier = Frontier(client, KEYS, "dashboard")
    return Dashboard(frontier, lambda: read_status(client, KEYS))


def test_the_page_ships_everything_it_needs(real_redis: redis.Redis) -> None:
    status, headers, body = call(_app(real_redis), "/")
    page = body.decode()
    assert status == "200 OK"
    assert headers["Content-Type"].startswith("text/html")
    assert "<svg" in page
    assert "<script>" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "nothing from a CDN"
    assert "fetch(\"api/status\"" in page


def test_the_data_is_status_progress_and_dead_letters_with_reasons(
    real_redis: redis.Redis,
) -> None:
    frontier = Frontier(real_redis, KEYS, "w1", concurrency=2)
    frontier.register(flush=False, alive_ms=30_000)
    frontier.enqueue([NewRequest(b"a", b"fp-a", lane="a.test"),
                      NewRequest(b"b", b"fp-b", lane="b.test")])
    first, second = frontier.lease(2).leases
    frontier.ack([first.handle])
    assert frontier.bury(second.handle, "spider bug: KeyError")
    record_progress(real_redis, KEYS, "w1", 1, 1)
    status, headers, body = call(_app(real_redis), "/api/status")
    assert status == "200 OK"
    assert headers["Content-Type"] == "application/json"
    data = json.loads(body)
    expected = read_status(real_redis, KEYS)
    for key in ("queued", "in_flight", "done", "dead_letters", "workers_alive", "state"):
        assert data["status"][key] == expected[key], key
    assert [point["done"] for point in data["progress"]] == [1]
    [letter] = data["dead_letters"]
    assert letter["reason"] == "spider bug: KeyError"
    assert letter["lane"] == "b.test"
    assert letter["id"] == second.key


def test_a_failing_redis_is_a_503_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    down = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
    status, _, body = call(_app(down), "/api/status")
    assert status == "503 Service Unavailable"
    assert json.loads(body)["error"].startswith("ConnectionError: ")
    assert capsys.readouterr().err.count("\n") == 1


def test_anything_else_is_404(real_redis: redis.Redis) -> None:
    assert call(_app(real_redis), "/etc/passwd")[0] == "404 Not Found"
