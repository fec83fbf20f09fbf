"""Fleet-wide politeness, checked from the test site's own request log.

Three ``scrapy crawl`` workers share each host's budget through Redis: with delay D
and concurrency 1 no two fetches of a host overlap and no gap between them is
below D, whichever workers made them.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.crawlproc import run_workers

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from scrapy_redisspine.testing.site import TestSite
    from tests.integration.crawlproc import WorkerResult

pytestmark = pytest.mark.e2e

# Clocks: the site stamps with time.time(), the lane's rest starts at Redis TIME
# when the ack arrives (after the response ended), both on this machine.
CLOCK_SLACK = 0.005


def _by_host(site: TestSite) -> dict[str, list[tuple[float, float]]]:
    fetches: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for record in site.requests():
        if record.get("page") and "error" not in record:
            fetches[record["host"]].append((record["start"], record["end"]))
    return {host: sorted(times) for host, times in fetches.items()}


def _most_at_once(times: list[tuple[float, float]]) -> int:
    events = sorted([(start, 1) for start, _ in times] + [(end, -1) for _, end in times])
    most = current = 0
    for _, step in events:
        current += step
        most = max(most, current)
    return most


def _finished(results: list[WorkerResult]) -> None:
    for result in results:
        assert (result.returncode, result.finish_reason) == (0, "finished"), result.log[-3000:]


def _settings(crawl_settings: dict[str, Any], site: TestSite, **extra: Any) -> dict[str, Any]:
    return {**crawl_settings, "LINKS_START_URLS": ",".join(site.start_urls()), **extra}


@pytest.mark.compat
def test_three_workers_keep_every_hosts_delay_with_no_overlap(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    delay = 0.4
    site = site_factory(hosts=3, pages_per_host=6, fanout=3, latency=0.05)
    results = run_workers(
        project_dir, "links", 3, _settings(crawl_settings, site, DOWNLOAD_DELAY=delay),
        log_dir=worker_log_dir,
    )
    _finished(results)
    assert set(site.fetch_counts()) == site.all_urls()
    for host, times in _by_host(site).items():
        gaps = [later[0] - earlier[1] for earlier, later in pairwise(times)]
        assert min(gaps) >= -CLOCK_SLACK, f"{host}: two fetches overlapped"
        assert min(gaps) >= delay - CLOCK_SLACK, f"{host}: gap {min(gaps):.3f} s < {delay} s"
    # All three workers really took part, so the gaps held across processes.
    assert all(r.stats.get("downloader/request_count", 0) > 0 for r in results)


def test_host_concurrency_two_is_never_exceeded_fleet_wide(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=2, pages_per_host=12, fanout=4, latency=0.25)
    settings = _settings(crawl_settings, site, REDISSPINE_HOST_CONCURRENCY=2)
    _finished(run_workers(project_dir, "links", 3, settings, log_dir=worker_log_dir))
    most = {host: _most_at_once(times) for host, times in _by_host(site).items()}
    assert max(most.values()) == 2, most


def test_a_host_with_a_deep_backlog_does_not_delay_the_others(
    project_dir: Path, site_factory: Callable[..., TestSite], crawl_settings: dict[str, Any],
    worker_log_dir: Path,
) -> None:
    site = site_factory(hosts=3, pages_per_host=15, fanout=3, latency=0.02)
    slow_host = "127.0.0.10"
    # The slow host rests 0.5 s between fetches and so keeps a deep backlog; the
    # other two rest 0.05 s and must finish long before it.
    settings = _settings(
        crawl_settings, site, DOWNLOAD_DELAY=0.05,
        REDISSPINE_HOST_DELAYS={slow_host: 0.5},
    )
    _finished(run_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir))
    fetches = _by_host(site)
    slow_done = fetches[slow_host][-1][1]
    for host, times in fetches.items():
        if host == slow_host:
            continue
        assert times[-1][1] < slow_done - 3.0, f"{host} waited for the slow host's backlog"
        busy_time = times[-1][1] - times[0][0]
        assert busy_time < len(times) * (0.05 + 0.02 + 0.15), f"{host} was held back"
