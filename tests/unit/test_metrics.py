"""``redisspine metrics``: the families built from ``status``, and served over HTTP."""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scrapy_redisspine import cli
from scrapy_redisspine.control import StatsPusher
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.metrics import FleetCollector, make_server, read_for
from scrapy_redisspine.status import read_status

if TYPE_CHECKING:
    from collections.abc import Iterator

pytestmark = pytest.mark.usefixtures("outside_any_project")

KEYS = CrawlKeys("redisspine", "books")


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.fixture
def crawl(real_redis: redis.Redis) -> Frontier:
    frontier = Frontier(real_redis, KEYS, "w1")
    frontier.register(flush=False, alive_ms=30_000)
    real_redis.sadd(KEYS.crawls, "books")
    frontier.enqueue([NewRequest(b"a%d" % i, b"fp-a%d" % i, lane="a.test") for i in range(3)]
                     + [NewRequest(b"b", b"fp-b", lane="b.test")])
    lease = frontier.lease(1).leases[0]
    frontier.ack([lease.handle])
    frontier.lease(1)
    StatsPusher(real_redis, KEYS, worker_id="w1").push({
        "response_received_count": 7, "item_scraped_count": 5, "log_count/ERROR": 2,
        "downloader/response_status_count/200": 6, "downloader/response_status_count/404": 1,
        "downloader/exception_type_count/twisted.internet.error.TimeoutError": 3,
        "spider_exceptions/KeyError": 1,
    })
    return frontier


def _exposition(client: redis.Redis, crawls: list[str]) -> str:
    registry = CollectorRegistry(auto_describe=False)
    read = read_for(client, timeout_ms=30_000, top_lanes=10, memory_budget_bytes=10**12)
    registry.register(FleetCollector(client, lambda crawl: CrawlKeys("redisspine", crawl),
                                     crawls, read))
    return generate_latest(registry).decode()


def test_the_metrics_are_the_numbers_of_status(crawl: Frontier, real_redis: redis.Redis) -> None:
    status = read_status(real_redis, KEYS, memory_budget_bytes=10**12)
    got = samples(_exposition(real_redis, []))  # no crawl named: every crawl
    books = (("crawl", "books"),)
    assert got[("redisspine_up", ())] == 1
    assert got[("redisspine_requests_queued", books)] == status["queued"] == 2
    assert got[("redisspine_requests_in_flight", books)] == status["in_flight"] == 1
    assert got[("redisspine_requests_done_total", books)] == status["done"] == 1
    assert got[("redisspine_dead_letters", books)] == 0
    assert got[("redisspine_workers_alive", books)] == status["workers_alive"] == 1
    assert got[("redisspine_workers_starting", books)] == status["workers_starting"]
    assert got[("redisspine_workers_cut_short", books)] == status["workers_cut_short"] == 0
    assert got[("redisspine_dedup_fingerprints", books)] == status["dedup"]["set_size"] == 4
    assert got[("redisspine_dedup_mode", (("crawl", "books"), ("mode", "set")))] == 1
    assert got[("redisspine_crawl_state", (("crawl", "books"), ("state", "running")))] == 1
    assert got[("redisspine_crawl_state", (("crawl", "books"), ("state", "paused")))] == 0
    lanes = {dict(labels)["lane"]: value for (name, labels), value in got.items()
             if name == "redisspine_lane_backlog_requests"}
    # (b.test has nothing queued but a request in flight: status lists busy lanes too)
    assert lanes == {h["lane"]: h["backlog"] for h in status["hosts"]} == {"a.test": 2,
                                                                          "b.test": 0}
    assert got[("redisspine_responses_total", (("crawl", "books"), ("status", "200")))] == 6
    assert got[("redisspine_responses_total", (("crawl", "books"), ("status", "404")))] == 1
    assert got[("redisspine_items_scraped_total", books)] == 5
    assert got[("redisspine_log_errors_total", books)] == 2
    assert got[("redisspine_download_errors_total", (
        ("crawl", "books"), ("type", "twisted.internet.error.TimeoutError")))] == 3
    assert got[("redisspine_spider_errors_total", (("crawl", "books"), ("type", "KeyError")))] == 1
    assert got[("redisspine_redis_memory_budget_bytes", ())] == 10**12
    assert got[("redisspine_redis_memory_used_bytes", ())] > 0
    assert ("redisspine_acks_per_second", books) not in got, "no rate sample yet"


def test_only_the_crawls_named(crawl: Frontier, real_redis: redis.Redis) -> None:
    Frontier(real_redis, CrawlKeys("redisspine", "other"), "w9").register(
        flush=False, alive_ms=30_000)
    real_redis.sadd(KEYS.crawls, "other")
    everything = {dict(labels).get("crawl") for _, labels in samples(
        _exposition(real_redis, []))}
    assert {"books", "other"} <= everything
    named = {dict(labels).get("crawl") for _, labels in samples(
        _exposition(real_redis, ["other"]))}
    assert named == {"other", None}


def test_a_redis_that_fails_mid_scrape_is_up_0_not_an_http_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    down = redis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=1)
    got = samples(_exposition(down, []))
    assert got == {("redisspine_up", ()): 0}
    assert "redisspine metrics: reading Redis failed: ConnectionError" in capsys.readouterr().err


@pytest.fixture
def served(real_redis: redis.Redis) -> Iterator[str]:
    """The metrics of every crawl served on a free port in a thread; its URL."""
    read = read_for(real_redis, timeout_ms=30_000, top_lanes=10)
    collector = FleetCollector(real_redis, lambda crawl: CrawlKeys("redisspine", crawl), [],
                               read)
    with make_server(collector, "127.0.0.1", 0) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.server_port}/metrics"
        server.shutdown()
        thread.join(10)


def test_served_over_http(crawl: Frontier, served: str) -> None:
    with urllib.request.urlopen(served, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        got = samples(response.read().decode())
    assert got[("redisspine_requests_queued", (("crawl", "books"),))] == 2


def test_an_unknown_crawl_is_exit_2_and_a_busy_port_one_line(
    crawl: Frontier, redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["metrics", "nope", "--redis-url", redis_url]) == cli.EXIT_USAGE
    assert "no crawl 'nope'" in capsys.readouterr().err
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert cli.main(["metrics", "books", "--redis-url", redis_url,
                         "--port", str(port)]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith(f"redisspine: cannot serve metrics on 127.0.0.1:{port}: ")
    assert err.count("\n") == 1


def _every_metric(real_redis: redis.Redis, crawl: Frontier) -> set[str]:
    """The names of an exposition in which every optional metric is present too."""
    now_s, micros = real_redis.time()
    now = int(now_s) * 1000 + int(micros) // 1000
    real_redis.zadd(KEYS.progress, {f"{now - 30_000}:w1:0:0": now - 30_000})
    real_redis.config_set("maxmemory", 10**10)
    try:
        text = _exposition(real_redis, ["books"])
    finally:
        real_redis.config_set("maxmemory", 0)
    names = {family.name + ("_total" if family.type == "counter" else "")
             for family in text_string_to_metric_families(text)}
    assert {"redisspine_eta_seconds", "redisspine_acks_per_second",
            "redisspine_redis_maxmemory_bytes"} <= names
    return names


def test_every_metric_is_in_the_docs_and_named_by_convention(
    crawl: Frontier, real_redis: redis.Redis
) -> None:
    page = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    for name in _every_metric(real_redis, crawl):
        assert f"| `{name}` |" in page, f"{name} is not in the table of docs/operations.md"
        assert name.startswith("redisspine_")


def test_the_grafana_dashboard_uses_only_metrics_that_exist(
    crawl: Frontier, real_redis: redis.Redis
) -> None:
    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana-dashboard.json")
                           .read_text())
    used = {name for panel in dashboard["panels"] for target in panel["targets"]
            for name in re.findall(r"redisspine_[a-z_]+", target["expr"])}
    exported = _every_metric(real_redis, crawl)
    assert used, "the dashboard charts something"
    assert used <= exported, used - exported
    assert {"redisspine_requests_queued", "redisspine_responses_total",
            "redisspine_lane_backlog_requests", "redisspine_redis_memory_used_bytes"} <= used
