"""Run the example: a local multi-host site crawled by two workers at once.

    python run_example.py                       # embedded redis-server under .scrapy/
    python run_example.py --redis-url redis://127.0.0.1:6380/0

The outcome is judged from the site's own request log, not from the workers: every
page must have been fetched exactly once, fleet-wide, and every worker must close
with finish_reason ``finished``. The exit code is 0 only then.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

PROJECT_DIR = Path(__file__).resolve().parent
REPO_ROOT = PROJECT_DIR.parent
if (REPO_ROOT / "scrapy_redisspine").is_dir():
    sys.path.insert(0, str(REPO_ROOT))  # a checkout without `pip install -e .`

from scrapy_redisspine.connection import shutdown_embedded_if_unused  # noqa: E402
from scrapy_redisspine.testing.site import TestSite, count_page_fetches  # noqa: E402

STATS_MARKER = "Dumping Scrapy stats:"
EMBEDDED_DIR = PROJECT_DIR / ".scrapy" / "redisspine"
LOG_DIR = PROJECT_DIR / ".scrapy" / "example-logs"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--redis-url", help="use this Redis instead of the embedded one")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--pages", type=int, default=30, help="pages per host")
    parser.add_argument("--latency", type=float, default=0.0, help="site latency, seconds")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds for the crawl")
    return parser.parse_args()


def worker_command(index: int, site: TestSite, redis_url: str | None) -> list[str]:
    settings = {
        "REDISSPINE_FLUSH_ON_START": "True",
        "LOG_FILE": str(LOG_DIR / f"worker-{index}.log"),
        "LOG_FILE_APPEND": "False",
    }
    if redis_url:
        settings["REDISSPINE_REDIS_URL"] = redis_url
    else:
        settings["REDISSPINE_EMBEDDED_DIR"] = str(EMBEDDED_DIR)
    command = [sys.executable, "-m", "scrapy", "crawl", "example"]
    command += ["-a", "start_urls=" + ",".join(site.start_urls())]
    for name, value in settings.items():
        command += ["-s", f"{name}={value}"]
    return command


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("SCRAPY_SETTINGS_MODULE", None)  # use this project's scrapy.cfg
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return env


def run_workers(commands: list[list[str]], timeout: float) -> list[int | None]:
    """Start all workers at once; return their exit codes (None: killed on timeout)."""
    processes = [
        subprocess.Popen(command, cwd=PROJECT_DIR, env=worker_env(), stdin=subprocess.DEVNULL)
        for command in commands
    ]
    deadline = time.monotonic() + timeout
    codes: list[int | None] = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            codes.append(None)
    return codes


def final_stat(log: str, name: str) -> str | None:
    """One value from the stats Scrapy dumps when the spider closes."""
    dump = log.rfind(STATS_MARKER)
    if dump < 0:
        return None
    match = re.search(rf"'{re.escape(name)}': '?([^',}}]*)", log[dump:])
    return match.group(1) if match else None


def report(site: TestSite, codes: list[int | None]) -> bool:
    expected = site.all_urls()
    fetched = count_page_fetches(site.requests())
    duplicates = sum(count - 1 for count in fetched.values() if count > 1)
    missing = expected - set(fetched)
    print(f"pages expected:   {len(expected)}")
    print(f"pages fetched:    {len(fetched)} ({sum(fetched.values())} fetches)")
    print(f"duplicates:       {duplicates}")
    print(f"missing:          {len(missing)}")
    for url in sorted(missing)[:10]:
        print(f"  missing {url}")
    ok = not missing and not duplicates and set(fetched) == expected
    for index, code in enumerate(codes):
        log_path = LOG_DIR / f"worker-{index}.log"
        log = log_path.read_text(errors="replace") if log_path.exists() else ""
        reason = final_stat(log, "finish_reason")
        pages = final_stat(log, "item_scraped_count") or "0"
        print(f"worker {index}: exit {code}, finish_reason {reason}, pages {pages}  ({log_path})")
        ok = ok and code == 0 and reason == "finished"
    print("OK: every page fetched exactly once" if ok else "FAILED")
    return ok


def main() -> int:
    args = parse_args()
    LOG_DIR.mkdir(parents=True, exist_ok=True)
    site_log = LOG_DIR / "site.jsonl"
    site_log.unlink(missing_ok=True)
    with TestSite(args.hosts, args.pages, latency=args.latency, log_path=site_log) as site:
        print(f"test site on port {site.port}: {', '.join(site.start_urls())}")
        where = args.redis_url or f"embedded redis-server in {EMBEDDED_DIR}"
        print(f"starting {args.workers} workers against {where}")
        started = time.monotonic()
        commands = [worker_command(i, site, args.redis_url) for i in range(args.workers)]
        codes = run_workers(commands, args.timeout)
        print(f"crawl took {time.monotonic() - started:.1f}s")
        ok = report(site, codes)
    if not args.redis_url and EMBEDDED_DIR.is_dir() and shutdown_embedded_if_unused(EMBEDDED_DIR):
        print(f"stopped the embedded redis-server (its data stays in {EMBEDDED_DIR})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
