"""Scrapy's everyday commands in a project whose settings.py enables the add-on.

Only ``scrapy crawl`` and ``scrapy runspider`` join the crawl in Redis; the commands
that look at a page or two (shell, fetch, view, parse, check, bench) run with
Scrapy's own scheduler and must give what plain Scrapy gives, not hang or print
nothing. Each test runs the real command in the test project.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest

from tests.integration.crawlproc import worker_env

if TYPE_CHECKING:
    from pathlib import Path

    from scrapy_redisspine.testing.site import TestSite

pytestmark = pytest.mark.e2e


def _scrapy(project_dir: Path, *args: str, redis_url: str,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "scrapy", *args, "-s", f"REDISSPINE_REDIS_URL={redis_url}"]
    return subprocess.run(command, cwd=project_dir, env=worker_env(env), capture_output=True,
                          text=True, timeout=120, check=False, stdin=subprocess.DEVNULL)


def _says_it_runs_alone(done: subprocess.CompletedProcess[str], command: str) -> None:
    assert f"`scrapy {command}` runs on its own" in done.stderr, done.stderr[-3000:]


def test_fetch_prints_the_page(project_dir: Path, test_site: TestSite, redis_url: str) -> None:
    url = test_site.start_urls()[0]
    done = _scrapy(project_dir, "fetch", url, redis_url=redis_url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "<html" in done.stdout
    _says_it_runs_alone(done, "fetch")


def test_shell_evaluates_and_exits(
    project_dir: Path, test_site: TestSite, redis_url: str
) -> None:
    url = test_site.start_urls()[0]
    done = _scrapy(project_dir, "shell", url, "-c", "(response.status, len(response.body))",
                   redis_url=redis_url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().startswith("(200, "), done.stdout


def test_parse_shows_the_items(project_dir: Path, test_site: TestSite, redis_url: str) -> None:
    url = test_site.start_urls()[0]
    done = _scrapy(project_dir, "parse", "--spider", "links", "-c", "parse", url,
                   redis_url=redis_url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"'url': '{url}'" in done.stdout, done.stdout[-3000:]


def test_check_runs_the_contracts(project_dir: Path, redis_url: str) -> None:
    done = _scrapy(project_dir, "check", "contracted", redis_url=redis_url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Ran 3 contracts" in done.stderr, done.stderr[-3000:]
    assert "OK" in done.stderr


def test_view_hands_the_page_to_a_browser(
    project_dir: Path, test_site: TestSite, redis_url: str, tmp_path: Path
) -> None:
    opened = tmp_path / "opened"
    done = _scrapy(project_dir, "view", test_site.start_urls()[0], redis_url=redis_url,
                   env={"BROWSER": f"{sys.executable} -c \"import sys; open({str(opened)!r}, 'w')"
                                   f".write(sys.argv[1])\" %s"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert opened.exists(), done.stderr[-3000:]


def test_bench_crawls_its_own_site(project_dir: Path, redis_url: str) -> None:
    done = _scrapy(project_dir, "bench", "-s", "CLOSESPIDER_TIMEOUT=2", redis_url=redis_url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "'finish_reason': 'closespider_timeout'" in done.stderr, done.stderr[-3000:]
    assert "'response_received_count'" in done.stderr
    _says_it_runs_alone(done, "bench")


def test_runspider_joins_the_fleet(
    project_dir: Path, test_site: TestSite, redis_url: str, tmp_path: Path
) -> None:
    spider_file = tmp_path / "single.py"
    spider_file.write_text(
        "import scrapy\n\n"
        "class Single(scrapy.Spider):\n"
        "    name = 'single'\n\n"
        "    async def start(self):\n"
        f"        yield scrapy.Request({test_site.start_urls()[0]!r})\n\n"
        "    def parse(self, response):\n"
        "        yield {'url': response.url}\n"
    )
    done = _scrapy(project_dir, "runspider", str(spider_file), redis_url=redis_url)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "joined crawl 'single'" in done.stderr, done.stderr[-3000:]
    assert "'item_scraped_count': 1" in done.stderr
    assert "'finish_reason': 'finished'" in done.stderr
