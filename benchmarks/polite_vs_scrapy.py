"""A fixed-delay fleet against plain Scrapy on the same polite crawl.

Both crawl the same local test site (``--hosts`` hosts, ``--pages`` pages each, every
response after ``--latency`` seconds) with ``DOWNLOAD_DELAY = --delay`` (no jitter)
and one request per host at a time:

- ``scrapy``: plain Scrapy, one process, no add-on (``CONCURRENT_REQUESTS_PER_DOMAIN
  = 1``; its delay counts from the start of the previous request of the slot);
- ``fleet``: ``--workers`` ``scrapy crawl`` workers with the add-on
  (``REDISSPINE_HOST_CONCURRENCY = 1``; the delay counts from the end of the previous
  fetch, fleet-wide), on a fresh throwaway redis-server.

Runs alternate (scrapy, fleet, scrapy, fleet ...), each on a fresh site; the rate is
pages / crawl span from the site's own log (first request start to last response
end). Prints each run and the medians, and the ratio fleet / scrapy. Politeness is
checked too: the smallest gap between two fetches of one host, for each mode.

    .venv/bin/python benchmarks/polite_vs_scrapy.py --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_redisspine.testing.redis_server import RedisServer  # noqa: E402
from scrapy_redisspine.testing.site import TestSite  # noqa: E402
from tests.integration.crawlproc import run_workers  # noqa: E402

PROJECT = ROOT / "tests" / "integration" / "project"


def one_run(args: argparse.Namespace, mode: str, run: int) -> tuple[float, float]:
    """(pages/s, smallest end -> start gap of one host) of one crawl."""
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server, TestSite(
        hosts=args.hosts, pages_per_host=args.pages, fanout=3, latency=args.latency,
        log_path=Path(tmp) / "site.jsonl",
    ) as site:
        settings: dict[str, Any] = {
            "LINKS_START_URLS": ",".join(site.start_urls()),
            "DOWNLOAD_DELAY": args.delay,
            "DOWNLOAD_DELAY_JITTER": 0,
            "RANDOMIZE_DOWNLOAD_DELAY": False,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
        }
        if mode == "scrapy":
            settings["ADDONS"] = {}
            workers = 1
        else:
            settings.update(REDISSPINE_REDIS_URL=server.url,
                            REDISSPINE_CRAWL_ID=f"polite-{run}-{time.time_ns()}",
                            REDISSPINE_HOST_CONCURRENCY=1)
            workers = args.workers
        results = run_workers(PROJECT, "links", workers, settings, log_dir=Path(tmp) / "w",
                              timeout=900)
        bad = [r for r in results if r.finish_reason != "finished"]
        if bad:
            raise SystemExit(f"{mode}: a worker did not finish: {bad[0].log[-2000:]}")
        records = [r for r in site.requests() if r.get("page") and "error" not in r]
        if {r["page"] for r in records} != site.all_urls():
            raise SystemExit(f"{mode}: not every page was fetched")
        span = max(r["end"] for r in records) - min(r["start"] for r in records)
        by_host: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for record in records:
            by_host[record["host"]].append((record["start"], record["end"]))
        gap = min(later[0] - earlier[1] for times in by_host.values()
                  for earlier, later in pairwise(sorted(times)))
        rate = len(records) / span
        print(f"run {run} {mode}: {len(records)} pages in {span:.2f} s = {rate:.3f} pages/s; "
              f"smallest gap {gap:.3f} s", flush=True)
        return rate, gap


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--pages", type=int, default=15, help="pages per host")
    parser.add_argument("--delay", type=float, default=0.5, help="DOWNLOAD_DELAY, seconds")
    parser.add_argument("--latency", type=float, default=0.01, help="seconds per response")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    rates: dict[str, list[float]] = {"scrapy": [], "fleet": []}
    gaps: dict[str, list[float]] = {"scrapy": [], "fleet": []}
    for run in range(args.runs):
        for mode in ("scrapy", "fleet"):
            rate, gap = one_run(args, mode, run)
            rates[mode].append(rate)
            gaps[mode].append(gap)
    scrapy, fleet = (statistics.median(rates[m]) for m in ("scrapy", "fleet"))
    print(f"median pages/s: scrapy {scrapy:.3f}, fleet {fleet:.3f}; "
          f"fleet / scrapy = {fleet / scrapy:.3f} over {args.runs} run(s) each")
    print(f"smallest gap: scrapy {min(gaps['scrapy']):.3f} s, fleet {min(gaps['fleet']):.3f} s "
          f"(delay {args.delay} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
