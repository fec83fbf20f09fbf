"""Fleet rate against the politeness limit: how busy do the workers keep the hosts?

With H hosts, a delay D counted from the end of each fetch, fetch time F and one
request per host at a time, no fleet can beat H / (D + F) pages per second. This
runs K real ``scrapy crawl`` workers against the local test site and a throwaway
redis-server and reports the achieved rate as a share of that limit (measured from
the site's own request log: first request start to last response end, the exact
limit for n pages per host being H * n / ((n - 1) * (D + F) + F)).

    .venv/bin/python benchmarks/politeness_rate.py --hosts 4 --pages 20 --delay 0.5 \
        --latency 0.1 --workers 3 --runs 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_redisspine.testing.redis_server import RedisServer  # noqa: E402
from scrapy_redisspine.testing.site import TestSite  # noqa: E402
from tests.integration.crawlproc import run_workers  # noqa: E402

PROJECT = ROOT / "tests" / "integration" / "project"


def one_run(args: argparse.Namespace, run: int) -> float:
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server, TestSite(
        hosts=args.hosts, pages_per_host=args.pages, fanout=3, latency=args.latency,
        log_path=Path(tmp) / "site.jsonl",
    ) as site:
        settings = {
            "REDISSPINE_REDIS_URL": server.url,
            "REDISSPINE_CRAWL_ID": f"rate-{run}-{time.time_ns()}",
            "LINKS_START_URLS": ",".join(site.start_urls()),
            "DOWNLOAD_DELAY": args.delay,
            "DOWNLOAD_DELAY_JITTER": 0,
        }
        results = run_workers(PROJECT, "links", args.workers, settings, log_dir=Path(tmp) / "w",
                              timeout=600)
        bad = [r for r in results if r.finish_reason != "finished"]
        if bad:
            raise SystemExit(f"a worker did not finish: {bad[0].log[-2000:]}")
        records = [r for r in site.requests() if r.get("page") and "error" not in r]
        if {r["page"] for r in records} != site.all_urls():
            raise SystemExit("not every page was fetched")
        span = max(r["end"] for r in records) - min(r["start"] for r in records)
        rate = len(records) / span
        n, fetch = args.pages, args.latency
        limit = args.hosts * n / ((n - 1) * (args.delay + fetch) + fetch)
        print(f"run {run}: {len(records)} pages in {span:.2f} s = {rate:.2f} pages/s; "
              f"limit {limit:.2f} pages/s; {100 * rate / limit:.1f} %", flush=True)
        return rate / limit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--pages", type=int, default=20, help="pages per host")
    parser.add_argument("--delay", type=float, default=0.5, help="D, seconds")
    parser.add_argument("--latency", type=float, default=0.1, help="F, seconds")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    shares = [one_run(args, run) for run in range(args.runs)]
    print(f"median share of the politeness limit: {100 * statistics.median(shares):.1f} % "
          f"over {args.runs} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
