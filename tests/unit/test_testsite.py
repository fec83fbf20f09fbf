"""The test site is the referee of every end-to-end test, so it is tested itself:
its graph must be reproducible, every page reachable through the HTML it serves,
and its request log complete and accurate."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from html.parser import HTMLParser
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit, urlunsplit

import pytest

from scrapy_redisspine.testing.linkgraph import LinkGraph, page_url
from scrapy_redisspine.testing.site import TestSite, count_page_fetches, read_log

if TYPE_CHECKING:
    from pathlib import Path

    from tests.conftest import SiteFactory


class _Hrefs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.hrefs += [value for name, value in attrs if tag == "a" and name == "href" and value]


def fetch(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def links_of(url: str) -> list[str]:
    status, body = fetch(url)
    assert status == 200, url
    parser = _Hrefs()
    parser.feed(body.decode())
    return [urljoin(url, href) for href in parser.hrefs]


def canonical(url: str) -> str:
    return urlunsplit(urlsplit(url)._replace(query="", fragment=""))


def crawl(start_urls: list[str]) -> tuple[set[str], int]:
    """BFS over the served HTML: (canonical pages reached, links seen)."""
    seen = {canonical(url) for url in start_urls}
    queue = deque(seen)
    links = 0
    while queue:
        for url in links_of(queue.popleft()):
            links += 1
            if canonical(url) not in seen:
                seen.add(canonical(url))
                queue.append(canonical(url))
    return seen, links


def test_graph_depends_only_on_its_parameters() -> None:
    graph, same = LinkGraph(4, 15, 5, seed=7), LinkGraph(4, 15, 5, seed=7)
    other = LinkGraph(4, 15, 5, seed=8)
    pages = [(host, page) for host in range(4) for page in range(15)]
    assert [graph.links(*p) for p in pages] == [same.links(*p) for p in pages]
    assert [graph.links(*p) for p in pages] != [other.links(*p) for p in pages]


def test_graph_mixes_cross_host_links_duplicates_and_href_forms() -> None:
    graph = LinkGraph(3, 20, 4, seed=0)
    links = [(host, page, graph.links(host, page)) for host in range(3) for page in range(20)]
    assert any(link.host != host for host, _, page_links in links for link in page_links)
    assert any(
        len({(link.host, link.page) for link in page_links}) < len(page_links)
        for _, _, page_links in links
    )
    forms = {link.form for _, _, page_links in links for link in page_links}
    assert forms == {"absolute", "root", "relative", "scheme-relative"}
    assert all(len(page_links) >= 4 for _, _, page_links in links)
    assert not any(link.tracking for _, _, page_links in links for link in page_links)


def test_every_page_is_reachable_through_the_served_html(test_site: TestSite) -> None:
    reached, links = crawl(test_site.start_urls())
    assert reached == test_site.all_urls()
    assert len(reached) == 3 * 20
    assert links > len(reached)  # duplicates and back-links exist
    assert all(record["status"] == 200 for record in test_site.requests())


def test_tracking_params_are_variants_of_the_same_pages(site_factory: SiteFactory) -> None:
    site = site_factory(hosts=2, pages_per_host=15, tracking_params=True)
    hrefs = [url for page in sorted(site.all_urls()) for url in links_of(page)]
    assert any(url.endswith("?utm_source=x") for url in hrefs)
    reached, _ = crawl(site.start_urls())
    assert reached == site.all_urls()
    status, _ = fetch(site.start_urls()[0] + "?utm_source=x")
    assert status == 200
    assert site.requests()[-1]["page"] == site.start_urls()[0]


def test_log_records_each_request_in_memory_and_in_the_file(test_site: TestSite) -> None:
    before = time.time()
    page = test_site.start_urls()[1]
    fetch(page)
    fetch(f"http://127.0.0.10:{test_site.port}/robots.txt")
    records = test_site.requests()
    assert [(r["host"], r["path"], r["method"], r["status"]) for r in records] == [
        ("127.0.0.11", "/p/0", "GET", 200),
        ("127.0.0.10", "/robots.txt", "GET", 404),
    ]
    assert all(before <= r["start"] <= r["end"] <= time.time() for r in records)
    assert records[0]["page"] == page
    assert records[1]["page"] is None
    assert test_site.log_path is not None
    assert read_log(test_site.log_path) == records
    assert count_page_fetches(records) == {page: 1}


def test_read_log_ignores_a_line_still_being_written(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps({"page": "a"}) + "\n" + '{"page": "b", "st')
    assert read_log(path) == [{"page": "a"}]


def test_latency_delays_responses_but_not_concurrent_ones(site_factory: SiteFactory) -> None:
    site = site_factory(hosts=2, pages_per_host=10, latency=0.2)
    urls = [page_url(host, page, site.port) for host in (0, 1) for page in range(5)]
    started = time.monotonic()
    with ThreadPoolExecutor(len(urls)) as pool:
        statuses = list(pool.map(lambda url: fetch(url)[0], urls))
    elapsed = time.monotonic() - started
    assert statuses == [200] * len(urls)
    assert 0.2 <= elapsed < 1.0  # served in parallel, not one after another
    assert all(r["end"] - r["start"] >= 0.19 for r in site.requests())


def test_load_latency_grows_with_what_the_host_already_serves(
    site_factory: SiteFactory,
) -> None:
    site = site_factory(hosts=2, pages_per_host=10, latency=0.3, load_latency=0.2)
    fetch(page_url(0, 0, site.port))
    alone = site.requests()[-1]
    assert 0.3 <= alone["end"] - alone["start"] < 0.5, "nothing else served: no extra"
    urls = [page_url(0, page, site.port) for page in range(1, 4)]
    with ThreadPoolExecutor(len(urls)) as pool:
        list(pool.map(fetch, urls))
    took = sorted(r["end"] - r["start"] for r in site.requests()[1:])
    # three at once (each takes 0.3 s: they overlap): the 2nd and 3rd arrivals wait
    # 0.2 s and 0.4 s more
    assert took[-1] >= 0.3 + 0.4 - 0.01, took
    fetch(page_url(1, 0, site.port))
    other = site.requests()[-1]
    assert other["end"] - other["start"] < 0.5, "another host's load is its own"


def test_slow_paths_get_their_own_latency(site_factory: SiteFactory) -> None:
    site = site_factory(hosts=2, slow_paths={"/p/1", "127.0.0.11/p/2"}, slow_latency=0.3)
    for url, slow in [("127.0.0.10:{}/p/1", True), ("127.0.0.10:{}/p/2", False),
                      ("127.0.0.11:{}/p/2", True), ("127.0.0.11:{}/p/3", False)]:
        started = time.monotonic()
        fetch("http://" + url.format(site.port))
        assert (time.monotonic() - started >= 0.3) is slow, url


def test_unknown_pages_and_hosts_get_404(test_site: TestSite) -> None:
    assert fetch(f"http://127.0.0.10:{test_site.port}/p/20")[0] == 404
    assert fetch(f"http://127.0.0.10:{test_site.port}/")[0] == 404
    with pytest.raises(urllib.error.URLError):
        fetch(f"http://127.0.0.13:{test_site.port}/p/0")


def test_two_sites_get_different_ports(site_factory: SiteFactory) -> None:
    assert site_factory().port != site_factory().port


def test_command_line_serves_until_sigterm(tmp_path: Path) -> None:
    log = tmp_path / "cli.jsonl"
    command = [sys.executable, "-m", "scrapy_redisspine.testing.site", "--hosts", "2",
               "--pages", "5", "--log", str(log)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline())
        assert fetch(ready["start_urls"][1])[0] == 200
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=5) == 0
    assert [r["host"] for r in read_log(log)] == ["127.0.0.11"]
    printed = subprocess.run(
        [*command[:-2], "--port", str(ready["port"]), "--print-urls"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    assert set(printed) == TestSite(2, 5, port=ready["port"]).all_urls()
