"""Politeness across crawls on Redis Cluster, measured from the test site's own log.

Two crawls of ``--workers`` ``scrapy crawl`` workers each fetch the same ``--hosts``
hosts (``--pages`` pages each, every response after ``--latency`` s) with
``DOWNLOAD_DELAY = --delay`` and one request per host at a time, in these set-ups:

- ``one-redis``: one throwaway redis-server, both crawls in one politeness group
  (the reference: one atomic script takes a lane's request and its group budget);
- ``cluster``: a throwaway 3-master Redis Cluster, both crawls in one group, so both
  live in the group's slot (placement.py);
- ``cluster-shards``: the same with ``REDISSPINE_SHARDS = 3``: the group's lanes
  spread over three slots, each crawl's shard i beside the budget of its lanes;
- ``cluster-apart``: the cluster, each crawl in a group of its own (the control: the
  crawls ignore each other, as every crawl did on a cluster before).

For each: every fetch of a host against the one before it, whichever crawl made them:
the smallest end -> start gap, how many gaps are below the delay and how many fetches
overlap, and the rate (pages of both crawls / span of the site's log).

    .venv/bin/python benchmarks/cluster_groups.py --runs 2
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_redisspine.testing.redis_cluster import ClusterServers  # noqa: E402
from scrapy_redisspine.testing.redis_server import RedisServer  # noqa: E402
from scrapy_redisspine.testing.site import TestSite  # noqa: E402
from tests.integration.crawlproc import start_workers, wait_workers  # noqa: E402

PROJECT = ROOT / "tests" / "integration" / "project"
SETUPS = ("one-redis", "cluster", "cluster-shards", "cluster-apart")


def one_run(args: argparse.Namespace, setup: str, run: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        url = (stack.enter_context(RedisServer()).url if setup == "one-redis"
               else stack.enter_context(ClusterServers(masters=3)).url)
        site = stack.enter_context(TestSite(
            hosts=args.hosts, pages_per_host=args.pages, fanout=3, latency=args.latency,
            log_path=Path(tmp) / "site.jsonl"))
        crawl = f"groups-{run}-{time.time_ns()}"
        base: dict[str, Any] = {
            "LINKS_START_URLS": ",".join(site.start_urls()), "REDISSPINE_REDIS_URL": url,
            "DOWNLOAD_DELAY": args.delay, "RANDOMIZE_DOWNLOAD_DELAY": False,
            "REDISSPINE_HOST_CONCURRENCY": 1, "REDISSPINE_POLITENESS_GROUP": "shared",
            "REDISSPINE_SHARDS": 3 if setup == "cluster-shards" else 1,
        }
        crawls = [{**base, "REDISSPINE_CRAWL_ID": f"{crawl}-{side}"} for side in "ab"]
        if setup == "cluster-apart":
            for settings in crawls:
                settings["REDISSPINE_POLITENESS_GROUP"] = settings["REDISSPINE_CRAWL_ID"]
        workers = [worker for index, settings in enumerate(crawls)
                   for worker in start_workers(PROJECT, "links", args.workers, settings,
                                               log_dir=Path(tmp) / f"w{index}")]
        results = wait_workers(workers, timeout=900)
        bad = [r for r in results if r.finish_reason != "finished"]
        if bad:
            raise SystemExit(f"{setup}: a worker did not finish: {bad[0].log[-2000:]}")
        return _measure(site, args.delay)


def _measure(site: TestSite, delay: float) -> dict[str, float]:
    records = [r for r in site.requests() if r.get("page") and "error" not in r]
    by_host: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for record in records:
        by_host[record["host"]].append((record["start"], record["end"]))
    gaps = [later[0] - earlier[1] for times in by_host.values()
            for earlier, later in pairwise(sorted(times))]
    span = max(r["end"] for r in records) - min(r["start"] for r in records)
    return {"pages": len(records), "rate": len(records) / span, "smallest_gap": min(gaps),
            "below_delay": sum(gap < delay for gap in gaps),
            "overlaps": sum(gap < 0 for gap in gaps), "gaps": len(gaps)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--pages", type=int, default=12, help="pages per host")
    parser.add_argument("--delay", type=float, default=0.3, help="DOWNLOAD_DELAY, seconds")
    parser.add_argument("--latency", type=float, default=0.01, help="seconds per response")
    parser.add_argument("--workers", type=int, default=3, help="workers per crawl")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--setups", default=",".join(SETUPS))
    args = parser.parse_args()
    print("| setup | run | pages | pages/s | smallest gap (s) | gaps < delay | overlaps |")
    print("|---|---|---|---|---|---|---|")
    for run in range(args.runs):
        for setup in args.setups.split(","):
            m = one_run(args, setup, run)
            print(f"| {setup} | {run} | {m['pages']:.0f} | {m['rate']:.3f} | "
                  f"{m['smallest_gap']:.3f} | {m['below_delay']:.0f} of {m['gaps']:.0f} | "
                  f"{m['overlaps']:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
