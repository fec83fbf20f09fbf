"""Fleet-wide AutoThrottle against a site that slows down under load.

The test site answers in ``--latency`` seconds plus ``--load-latency`` seconds for
every request the host is already serving. Two fleets of ``--workers`` real
``scrapy crawl`` workers crawl it, one after the other, each on a fresh site and a
fresh throwaway redis-server, allowed ``--concurrency`` requests per host at once:

- ``fixed``: no delay (``DOWNLOAD_DELAY = 0``), AutoThrottle off;
- ``adaptive``: ``AUTOTHROTTLE_ENABLED`` (target ``--target``, start delay
  ``--start-delay``), adapted fleet-wide by the plugin.

From the site's own request log, per ``--bin`` seconds since the first request: the
responses finished (rate, pages/s) and their mean latency (end - start, as the site
saw it). A fleet that backs off answers a rising latency with a lower rate. Prints a
markdown table and, when matplotlib is importable, writes ``--plot`` (PNG).

    .venv/bin/python benchmarks/autothrottle_backoff.py --plot benchmarks/autothrottle_backoff.png
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_redisspine.testing.redis_server import RedisServer  # noqa: E402
from scrapy_redisspine.testing.site import TestSite  # noqa: E402
from tests.integration.crawlproc import run_workers  # noqa: E402

PROJECT = ROOT / "tests" / "integration" / "project"
MODES = ("fixed", "adaptive")


def crawl(args: argparse.Namespace, mode: str) -> list[dict[str, Any]]:
    """One fleet's crawl; the site's log records of its pages."""
    with tempfile.TemporaryDirectory() as tmp, RedisServer() as server, TestSite(
        hosts=args.hosts, pages_per_host=args.pages, fanout=4, latency=args.latency,
        load_latency=args.load_latency, log_path=Path(tmp) / "site.jsonl",
    ) as site:
        settings: dict[str, Any] = {
            "REDISSPINE_REDIS_URL": server.url,
            "REDISSPINE_CRAWL_ID": f"backoff-{mode}-{time.time_ns()}",
            "LINKS_START_URLS": ",".join(site.start_urls()),
            "DOWNLOAD_DELAY": 0,
            "REDISSPINE_HOST_CONCURRENCY": args.concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": args.concurrency,
        }
        if mode == "adaptive":
            settings.update(AUTOTHROTTLE_ENABLED=True,
                            AUTOTHROTTLE_TARGET_CONCURRENCY=args.target,
                            AUTOTHROTTLE_START_DELAY=args.start_delay,
                            AUTOTHROTTLE_MAX_DELAY=10.0)
        results = run_workers(PROJECT, "links", args.workers, settings,
                              log_dir=Path(tmp) / "w", timeout=900)
        bad = [r for r in results if r.finish_reason != "finished"]
        if bad:
            raise SystemExit(f"{mode}: a worker did not finish: {bad[0].log[-2000:]}")
        records = [r for r in site.requests() if r.get("page") and "error" not in r]
        if {r["page"] for r in records} != site.all_urls():
            raise SystemExit(f"{mode}: not every page was fetched")
        return records


def series(records: list[dict[str, Any]], width: float) -> list[tuple[float, float, float]]:
    """(bin start s, pages/s, mean latency s) per bin of ``width`` seconds."""
    first = min(r["start"] for r in records)
    bins: dict[int, list[float]] = defaultdict(list)
    for record in records:
        bins[int((record["end"] - first) // width)].append(record["end"] - record["start"])
    return [(i * width, len(bins[i]) / width, statistics.fmean(bins[i]) if bins[i] else 0.0)
            for i in range(max(bins) + 1)]


def summary(records: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(span s, pages/s, mean latency s) of the whole crawl."""
    span = max(r["end"] for r in records) - min(r["start"] for r in records)
    latency = statistics.fmean(r["end"] - r["start"] for r in records)
    return span, len(records) / span, latency


def plot(path: Path, curves: dict[str, list[tuple[float, float, float]]]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    figure, (rate_axes, latency_axes) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    for mode, points in curves.items():
        times = [t for t, _, _ in points]
        rate_axes.plot(times, [r for _, r, _ in points], marker=".", label=mode)
        latency_axes.plot(times, [lat for _, _, lat in points], marker=".", label=mode)
    rate_axes.set_ylabel("pages/s (site log)")
    latency_axes.set_ylabel("mean latency, s")
    latency_axes.set_xlabel("seconds since the first request")
    rate_axes.legend()
    rate_axes.set_title("Fleet-wide AutoThrottle against a site that slows under load")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--pages", type=int, default=60, help="pages per host")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds, unloaded")
    parser.add_argument("--load-latency", type=float, default=0.15,
                        help="seconds more per request the host already serves")
    parser.add_argument("--concurrency", type=int, default=4, help="per host, fleet-wide")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--target", type=float, default=1.0,
                        help="AUTOTHROTTLE_TARGET_CONCURRENCY")
    parser.add_argument("--start-delay", type=float, default=0.05,
                        help="AUTOTHROTTLE_START_DELAY: start eager, so the back-off shows")
    parser.add_argument("--bin", type=float, default=2.0, help="seconds per table row")
    parser.add_argument("--plot", type=Path, default=None, help="PNG to write")
    args = parser.parse_args()
    curves = {}
    for mode in MODES:
        records = crawl(args, mode)
        span, rate, latency = summary(records)
        print(f"{mode}: {len(records)} pages in {span:.1f} s = {rate:.2f} pages/s, "
              f"mean latency {latency:.3f} s", flush=True)
        curves[mode] = series(records, args.bin)
    rows = max(len(points) for points in curves.values())
    print("\n| t (s) | " + " | ".join(f"{m} pages/s | {m} latency (s)" for m in MODES) + " |")
    print("|---|" + "---|---|" * len(MODES))
    for i in range(rows):
        cells = []
        for mode in MODES:
            points = curves[mode]
            cells += ([f"{points[i][1]:.1f}", f"{points[i][2]:.3f}"] if i < len(points)
                      else ["", ""])
        print(f"| {i * args.bin:.0f} | " + " | ".join(cells) + " |")
    if args.plot is not None:
        print(f"\nplot: {args.plot}" if plot(args.plot, curves) else
              "\nmatplotlib is not installed: no plot (the table above has the numbers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
