"""The worker harness must report how each worker ended, or every end-to-end test
built on it checks nothing. Checked here on plain Scrapy (no plugin) and on the
plugin with two workers sharing the test's Redis."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.crawlproc import (
    WorkersTimedOut,
    parse_stats,
    run_workers,
    start_workers,
    wait_workers,
)

if TYPE_CHECKING:
    from pathlib import Path

    from scrapy_redisspine.testing.site import TestSite

STATS_LOG = """\
2026-01-01 00:00:00 [scrapy.core.engine] INFO: Closing spider (finished)
2026-01-01 00:00:00 [scrapy.statscollectors] INFO: Dumping Scrapy stats:
{'downloader/request_count': 60,
 'elapsed_time_seconds': 1.25,
 'finish_reason': 'finished',
 'finish_time': datetime.datetime(2026, 1, 1, 0, 0, tzinfo=datetime.timezone.utc),
 'item_scraped_count': 60}
2026-01-01 00:00:00 [scrapy.core.engine] INFO: Spider closed (finished)
"""


def test_parse_stats_reads_the_last_dump() -> None:
    stats = parse_stats("Dumping Scrapy stats:\n{'finish_reason': 'shutdown'}\n" + STATS_LOG)
    assert stats["finish_reason"] == "finished"
    assert stats["item_scraped_count"] == 60
    assert stats["finish_time"].startswith("datetime.datetime(2026")


def test_parse_stats_without_a_dump_is_empty() -> None:
    assert parse_stats("2026-01-01 00:00:00 [scrapy] INFO: Scrapy started\n") == {}


def test_parse_stats_falls_back_to_simple_lines() -> None:
    log = STATS_LOG.replace("'item_scraped_count': 60}", "'odd': <object at 0x1>}")
    stats = parse_stats(log)
    assert stats["finish_reason"] == "finished"
    assert stats["downloader/request_count"] == 60


@pytest.mark.e2e
def test_links_spider_crawls_the_whole_site_with_plain_scrapy(
    project_dir: Path, test_site: TestSite, worker_log_dir: Path
) -> None:
    settings = {"ADDONS": {}, "LINKS_START_URLS": ",".join(test_site.start_urls())}
    [result] = run_workers(project_dir, "links", 1, settings, log_dir=worker_log_dir, timeout=60)
    assert (result.returncode, result.finish_reason) == (0, "finished"), result.log[-3000:]
    assert result.stats["item_scraped_count"] == len(test_site.all_urls())
    assert test_site.fetch_counts() == dict.fromkeys(test_site.all_urls(), 1)


@pytest.mark.e2e
def test_two_workers_share_one_frontier(
    project_dir: Path, test_site: TestSite, crawl_settings: dict[str, Any], worker_log_dir: Path
) -> None:
    results = run_workers(project_dir, "links", 2, crawl_settings, log_dir=worker_log_dir)
    for result in results:
        assert (result.returncode, result.finish_reason) == (0, "finished"), result.log[-3000:]
    assert test_site.fetch_counts() == dict.fromkeys(test_site.all_urls(), 1)
    assert sum(r.stats.get("item_scraped_count", 0) for r in results) == len(test_site.all_urls())


def test_workers_past_the_deadline_are_killed_and_reported(
    project_dir: Path, test_site: TestSite, worker_log_dir: Path
) -> None:
    settings = {"ADDONS": {}, "LINKS_START_URLS": ",".join(test_site.start_urls())}
    workers = start_workers(project_dir, "links", 2, settings, log_dir=worker_log_dir)
    with pytest.raises(WorkersTimedOut, match=r"(?s)worker 0 .*worker 1 "):
        wait_workers(workers, timeout=0.1)
    assert all(worker.process.returncode is not None for worker in workers)
