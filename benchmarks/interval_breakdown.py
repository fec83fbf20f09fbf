"""Where the time between two fetches of one host goes, in a polite fleet crawl.

The crawl of ``polite_vs_scrapy.py`` (``--hosts`` hosts, ``DOWNLOAD_DELAY = --delay``,
no jitter, one request per host at a time, ``--workers`` workers), fleet only, with
the workers instrumented by ``benchmarks/interval_trace.patch`` (not part of the
package: apply it to a scratch copy, run, throw it away). Each worker then writes a
JSON line per event, wall-clock stamped like the test site's log: a response came
in (``recv``), the engine was done with it (``done``), acks sent (``send``, with the
rest each leaves after the credit), leases received (``leased``) and lease attempts
(``lease_try``). For each pair of consecutive fetches of a host, from the site's log
and those events, it prints the median and mean of each step:

    git apply benchmarks/interval_trace.patch
    .venv/bin/python benchmarks/interval_breakdown.py --pages 40 --latency 0.01
    git apply -R benchmarks/interval_trace.patch
"""

from __future__ import annotations

import argparse
import json
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


def crawl(args: argparse.Namespace, out: Path) -> list[dict[str, Any]]:
    """Run the instrumented fleet; the site's page records."""
    with RedisServer() as server, TestSite(
        hosts=args.hosts, pages_per_host=args.pages, fanout=3, latency=args.latency,
        log_path=out / "site.jsonl",
    ) as site:
        settings: dict[str, Any] = {
            "LINKS_START_URLS": ",".join(site.start_urls()),
            "DOWNLOAD_DELAY": args.delay, "DOWNLOAD_DELAY_JITTER": 0,
            "RANDOMIZE_DOWNLOAD_DELAY": False, "CONCURRENT_REQUESTS_PER_DOMAIN": 1,
            "REDISSPINE_REDIS_URL": server.url,
            "REDISSPINE_CRAWL_ID": f"breakdown-{time.time_ns()}",
            "REDISSPINE_HOST_CONCURRENCY": 1,
        }
        if args.parse_sleep:
            settings["LINKS_PARSE_SLEEP_SECONDS"] = args.parse_sleep
        results = run_workers(PROJECT, "links", args.workers, settings, log_dir=out / "w",
                              timeout=900, env={"SPINE_TRACE": str(out / "trace")})
        if any(r.finish_reason != "finished" for r in results):
            raise SystemExit("a worker did not finish")
        return [r for r in site.requests() if r.get("page") and "error" not in r]


def events(out: Path) -> list[dict[str, Any]]:
    found = []
    for path in out.glob("trace.*"):
        pid = path.suffix[1:]
        for line in path.read_text().splitlines():
            event = json.loads(line)
            event["pid"] = pid
            found.append(event)
    if not found:
        raise SystemExit("no trace events: apply benchmarks/interval_trace.patch first")
    return sorted(found, key=lambda e: e["t"])


def index(evs: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, float],
                                              dict[str, tuple[float, int]],
                                              dict[str, tuple[float, float]]]:
    """By page URL: when its response came in, when it was done, when its ack was
    sent (and the rest it left), when it was leased (and that lease's attempt)."""
    recv: dict[str, float] = {}
    done: dict[str, float] = {}
    url_of: dict[str, str] = {}
    for e in evs:
        if e["ev"] == "recv":
            recv.setdefault(e["url"], e["t"])
        elif e["ev"] == "done":
            done.setdefault(e["url"], e["t"])
            url_of[e["key"]] = e["url"]
    sent: dict[str, tuple[float, int]] = {}
    leased: dict[str, tuple[float, float]] = {}  # url -> (lease reply, lease attempt)
    tried: dict[str, float] = {}
    for e in evs:
        if e["ev"] == "send":
            for key, rest_ms in e["acks"]:
                if key in url_of:
                    sent.setdefault(url_of[key], (e["t"], rest_ms))
        elif e["ev"] == "lease_try":
            tried[e["pid"]] = e["t"]
        elif e["ev"] == "leased":
            for key, _ in e["keys"]:
                if key in url_of:
                    leased.setdefault(url_of[key], (e["t"], tried.get(e["pid"], e["t"])))
    return recv, done, sent, leased


def breakdown(records: list[dict[str, Any]], evs: list[dict[str, Any]],
              delay: float) -> dict[str, list[float]]:
    recv, done, sent, leased = index(evs)
    steps: dict[str, list[float]] = defaultdict(list)
    by_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_host[record["host"]].append(record)
    for fetches in by_host.values():
        fetches.sort(key=lambda r: r["start"])
        for a, b in pairwise(fetches):
            url, following = a["page"], b["page"]
            if not (url in recv and url in done and url in sent and following in leased):
                continue
            sent_at, rest_ms = sent[url]
            due = sent_at + rest_ms / 1000
            leased_at, tried_at = leased[following]
            steps["gap end -> start, less the delay"].append(b["start"] - a["end"] - delay)
            steps["site end -> worker receives"].append(recv[url] - a["end"])
            steps["receives -> done (callback, pipeline)"].append(done[url] - recv[url])
            steps["done -> ack sent"].append(sent_at - done[url])
            steps["credited (delay - rest sent)"].append(delay - rest_ms / 1000)
            steps["lane due -> lease attempt"].append(tried_at - due)
            steps["lease attempt -> lease reply"].append(leased_at - tried_at)
            steps["lease reply -> site start"].append(b["start"] - leased_at)
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--pages", type=int, default=40, help="pages per host")
    parser.add_argument("--delay", type=float, default=0.5)
    parser.add_argument("--latency", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--parse-sleep", type=float, default=0.0,
                        help="LINKS_PARSE_SLEEP_SECONDS: a slow callback")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        records = crawl(args, out)
        steps = breakdown(records, events(out), args.delay)
    for name, values in steps.items():
        print(f"{name:40s} median {statistics.median(values) * 1000:7.1f} ms, "
              f"mean {statistics.mean(values) * 1000:7.1f} ms (n={len(values)})")
    span = max(r["end"] for r in records) - min(r["start"] for r in records)
    print(f"{len(records)} pages in {span:.2f} s = {len(records) / span:.3f} pages/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
