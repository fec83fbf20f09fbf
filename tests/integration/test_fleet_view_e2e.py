"""Seeing the fleet, against real ``scrapy crawl`` workers: ``redisspine metrics``
scraped over HTTP, and ``redisspine dashboard`` loaded in a real headless Chromium,
give the numbers of ``redisspine status --json``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration import browser
from tests.integration.crawlproc import assert_finished, wait_for, wait_workers

if TYPE_CHECKING:
    from collections.abc import Iterator

    from tests.conftest import SiteFactory
    from tests.integration.crawlproc import Fleet

pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("outside_any_project")]

COMMAND = str(Path(sys.executable).with_name("redisspine"))  # the installed console script
FAST = {"REDISSPINE_HEARTBEAT_SECONDS": 0.3, "REDISSPINE_SWEEP_SECONDS": 1,
        "LOGSTATS_INTERVAL": 1}


def status_json(redis_url: str, crawl: str) -> dict[str, Any]:
    done = subprocess.run([COMMAND, "--redis-url", redis_url, "status", crawl, "--json"],
                          check=True, capture_output=True, text=True, timeout=30)
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture
def serve(redis_url: str) -> Iterator[Any]:
    """``serve(command, crawl)``: start ``redisspine <command> CRAWL --port 0`` and
    return the URL it announces; every server is stopped after the test."""
    started: list[subprocess.Popen[str]] = []

    def start(command: str, crawl: str) -> str:
        process = subprocess.Popen(
            [COMMAND, command, crawl, "--redis-url", redis_url, "--port", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        started.append(process)
        assert process.stdout is not None
        line = process.stdout.readline()
        assert " on http://" in line, (line, process.stderr.read() if process.stderr else "")
        return line.split(" on ", 1)[1].split()[0]

    yield start
    for process in started:
        process.terminate()
        process.communicate(timeout=10)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def by_label(got: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str,
             label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for (metric, labels), value in got.items()
            if metric == name}


def assert_metrics_match(got: dict[Any, float], status: dict[str, Any]) -> None:
    crawl = (("crawl", status["crawl"]),)
    for metric, key in (("redisspine_requests_queued", "queued"),
                        ("redisspine_requests_in_flight", "in_flight"),
                        ("redisspine_requests_done_total", "done"),
                        ("redisspine_dead_letters", "dead_letters"),
                        ("redisspine_workers_alive", "workers_alive")):
        assert got[(metric, crawl)] == status[key], metric
    assert got[("redisspine_dedup_fingerprints", crawl)] == status["dedup"]["set_size"]
    states = by_label(got, "redisspine_crawl_state", "state")
    assert [state for state, on in states.items() if on] == [status["state"]]
    fleet = status["fleet_stats"]
    prefix = "downloader/response_status_count/"
    assert by_label(got, "redisspine_responses_total", "status") == {
        name[len(prefix):]: value for name, value in fleet.items() if name.startswith(prefix)}
    assert got[("redisspine_items_scraped_total", crawl)] == fleet["item_scraped_count"]
    assert by_label(got, "redisspine_lane_backlog_requests", "lane") == {
        host["lane"]: host["backlog"] for host in status["hosts"]}


def test_metrics_over_http_match_status_json(
    fleet: Fleet, site_factory: SiteFactory, redis_url: str, serve: Any
) -> None:
    # ~6 s of pages: the pause (a CLI process to start) must land mid-crawl (at
    # pytest -n 4 the crawl of 0.05-s pages was once over before it)
    site = site_factory(hosts=3, pages_per_host=30, latency=0.2)
    crawl = fleet.keys.crawl_id
    workers = fleet.start(2, fleet.crawling(site, **FAST))
    try:
        wait_for(lambda: sum(site.fetch_counts().values()) >= 15, 30, "15 pages fetched")
        subprocess.run([COMMAND, "--redis-url", redis_url, "pause", crawl], check=True,
                       capture_output=True, timeout=30)
        time.sleep(3)  # a heartbeat to hear it, what was started finishes, totals pushed
        url = serve("metrics", crawl)
        paused = status_json(redis_url, crawl)
        got = scrape(url)
        assert paused["state"] == "paused"
        assert paused["queued"] > 0, "work left while paused"
        assert paused["hosts"], "lanes with a backlog"
        assert_metrics_match(got, paused)
        assert ("redisspine_eta_seconds", (("crawl", crawl),)) not in got, "no ETA while paused"
        subprocess.run([COMMAND, "--redis-url", redis_url, "resume", crawl], check=True,
                       capture_output=True, timeout=30)
        results = wait_workers(workers, timeout=60)
    finally:
        for worker in workers:
            worker.kill()
    assert_finished(results)
    finished = status_json(redis_url, crawl)
    got = scrape(url)
    assert finished["state"] == "finished"
    assert finished["done"] == len(site.all_urls())
    assert_metrics_match(got, finished)
    assert ("redisspine_acks_per_second", (("crawl", crawl),)) not in got, "finished: no rate"
    assert got[("redisspine_up", ())] == 1


def _text_of(dom: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert found, f"no #{element_id} in the page"
    return found.group(1)


def _points(dom: str, element_id: str) -> int:
    found = re.search(rf'<polyline id="{element_id}"[^>]*data-points="(\d+)"', dom)
    assert found, f"no #{element_id} line in the chart"
    return int(found.group(1))


def test_dashboard_in_a_real_browser_shows_the_numbers_of_status(
    fleet: Fleet, site_factory: SiteFactory, redis_url: str, serve: Any, tmp_path: Path
) -> None:
    browser.chromium()  # fails now, with how to install it, if there is none
    site = site_factory(hosts=3, pages_per_host=60, latency=0.1)  # paused mid-crawl
    crawl = fleet.keys.crawl_id
    workers = fleet.start(2, fleet.crawling(site, **FAST, DOWNLOAD_DELAY=0.2))
    try:
        wait_for(lambda: sum(site.fetch_counts().values()) >= 30, 30, "30 pages fetched")
        time.sleep(2)  # a few progress samples (one per sweep, each second)
        subprocess.run([COMMAND, "--redis-url", redis_url, "pause", crawl], check=True,
                       capture_output=True, timeout=30)
        time.sleep(3)  # a heartbeat to hear it, what was started finishes, totals pushed
        url = serve("dashboard", crawl)
        dom = browser.dump_dom(url)
        status = status_json(redis_url, crawl)
        # REDISSPINE_DASHBOARD_SCREENSHOT=docs/dashboard.png refreshes the docs' screenshot
        browser.screenshot(url, Path(os.environ.get("REDISSPINE_DASHBOARD_SCREENSHOT")
                                     or tmp_path / "dashboard.png"))
    finally:
        for worker in workers:
            worker.kill()
    assert 'data-loaded="1"' in dom, "the page loaded its data"
    assert _text_of(dom, "crawl") == crawl
    assert _text_of(dom, "state") == status["state"] == "paused"
    for element_id, key in (("queued", "queued"), ("in-flight", "in_flight"), ("done", "done"),
                            ("dead-letters", "dead_letters"),
                            ("workers-alive", "workers_alive")):
        assert int(_text_of(dom, element_id)) == status[key], element_id
    assert status["done"] >= 30
    assert _points(dom, "done-line") >= 2, "the chart has points"
    assert _points(dom, "queued-line") >= 1
    workers_rows = re.search(r'id="workers-rows">(.*?)</tbody>', dom, re.S)
    assert workers_rows, "a workers table"
    assert workers_rows.group(1).count("<tr>") == 1 + len(status["workers"]), "header + workers"
    lanes = re.findall(r"<td>(127\.0\.0\.\d+[^<]*)</td>", dom)
    assert sorted(lanes) == sorted(host["lane"] for host in status["hosts"])
    assert f"{status['dedup']['set_size']} fingerprints" in dom
    assert "Redis memory:" in dom
