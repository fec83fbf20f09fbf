"""Fixtures of the end-to-end tests: the test Scrapy project and worker settings."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.crawlproc import Fleet

if TYPE_CHECKING:
    from scrapy_redisspine.testing.site import TestSite

PROJECT_DIR = Path(__file__).resolve().parent / "project"


@pytest.fixture
def project_dir() -> Path:
    """The directory to run ``scrapy crawl links`` in (it holds scrapy.cfg)."""
    return PROJECT_DIR


@pytest.fixture
def worker_log_dir(tmp_path: Path) -> Path:
    """Where the workers of this test write their logs (kept by pytest on failure)."""
    path = tmp_path / "workers"
    path.mkdir()
    return path


@pytest.fixture
def crawl_settings(
    redis_url: str, test_site: TestSite, request: pytest.FixtureRequest
) -> dict[str, Any]:
    """``-s`` settings for workers crawling ``test_site`` through the test's Redis.

    The crawl id is unique per test, so a leftover key can never join two tests' crawls.
    """
    return {
        "REDISSPINE_REDIS_URL": redis_url,
        "REDISSPINE_CRAWL_ID": "test-" + re.sub(r"[^A-Za-z0-9_.-]+", "-", request.node.name),
        "LINKS_START_URLS": ",".join(test_site.start_urls()),
    }


@pytest.fixture
def fleet(project_dir: Path, crawl_settings: dict[str, Any], worker_log_dir: Path) -> Fleet:
    """``links`` workers of the test project on this test's crawl (``crawl_settings``),
    logging in ``worker_log_dir``."""
    return Fleet(project_dir, crawl_settings, worker_log_dir)
