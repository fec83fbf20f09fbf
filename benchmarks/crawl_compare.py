"""Crawl the same local site with plain Scrapy, scrapy-redis and scrapy_redisspine.

One command runs every configuration side by side, interleaved, several times, each
run on a fresh test site and a fresh throwaway redis-server, and prints the medians:

    .venv/bin/python benchmarks/crawl_compare.py

Configurations (``--modes``): ``scrapy`` (plain Scrapy, one process), ``spine1``,
``spine2``, ``spine4`` (K ``scrapy crawl`` workers with this plugin; ``spine2sync``
the same with ``REDISSPINE_REDIS_THREAD = False``, ``spine1thread`` with the Redis
calls on a thread rather than parked on the loop: ``REDISSPINE_REDIS_GREENLETS =
False``, ``spine1onelease`` with one lease on its way at a time:
``REDISSPINE_LEASE_ALONGSIDE = False``), ``redis1``
(scrapy-redis, one process). scrapy-redis runs from a separate virtualenv,
``benchmarks/.venv-bench`` (git-ignored), which is created on first use with::

    python3 -m venv benchmarks/.venv-bench
    benchmarks/.venv-bench/bin/pip install scrapy==<this venv's Scrapy> scrapy-redis redis -e .

It is never a dependency of the package. ``--rtt-ms 1`` adds, for every spine and
scrapy-redis mode, the same run with Redis behind a latency proxy (half the RTT
each way), reported as e.g. ``spine1@1ms`` next to its loopback twin.

Per run: pages fetched (from the site's own request log), duplicates (fetches beyond
the first of a page), missing pages, wall time (first worker started to last worker
exited, so it includes Scrapy's start-up), crawl span (first fetch started to last
fetch ended), pages/s over both, Redis round trips per page counted client-side by
``_worker.py`` (one per command or pipeline sent by redis-py; commands run inside Lua
scripts are not round trips), Redis commands executed per page (``INFO stats``
``total_commands_processed`` delta: includes the ones inside scripts), ``EVALSHA``
calls per page (``INFO commandstats``), and CPU seconds per page of the workers and of
redis-server (``INFO cpu`` delta). The workers' CPU is also split (in ``--json`` and
the per-run lines): the start-up's share (before the engine opened the spider) and
each thread's (the crawl's loop is ``MainThread``, the spine's Redis threads
``redisspine-redis`` and ``redisspine-upkeep``), so a difference can be placed.

Fairness: plain Scrapy allows ``CONCURRENT_REQUESTS_PER_DOMAIN`` (8 in the test
project) requests per host at once; the spine enforces its own fleet-wide limit, so
the spine modes set ``REDISSPINE_HOST_CONCURRENCY`` to the same value.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_redisspine.testing.latency_proxy import LatencyProxy  # noqa: E402
from scrapy_redisspine.testing.redis_server import RedisServer  # noqa: E402
from scrapy_redisspine.testing.site import TestSite  # noqa: E402
from tests.integration.crawlproc import crawl_command, parse_stats, worker_env  # noqa: E402

PROJECT = ROOT / "tests" / "integration" / "project"
BENCH_VENV = ROOT / "benchmarks" / ".venv-bench"
WORKER = ROOT / "benchmarks" / "_worker.py"
PER_HOST = 8  # the test project's CONCURRENT_REQUESTS_PER_DOMAIN
MODES = ("scrapy", "spine1", "spine2", "redis1")


def bench_python() -> str:
    """The bench venv's python, created with scrapy-redis on first use."""
    python = BENCH_VENV / "bin" / "python"
    if not python.exists():
        import scrapy

        print(f"creating {BENCH_VENV} (scrapy-redis, benchmarks only)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
        # Keep git and ruff out of it (Python < 3.13 venvs have no .gitignore).
        (BENCH_VENV / ".gitignore").write_text("*\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q",
                        f"scrapy=={scrapy.__version__}", "scrapy-redis", "redis",
                        "-e", str(ROOT)], check=True)
    return str(python)


def _info(client: Any) -> dict[str, Any]:
    info = client.info("all")
    return {
        "commands": int(info["total_commands_processed"]),
        "evalsha": int(info.get("cmdstat_evalsha", {}).get("calls", 0))
        + int(info.get("cmdstat_evalsha_ro", {}).get("calls", 0)),
        "cpu": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
    }


def mode_settings(mode: str, redis_url: str, site: TestSite, run_id: str) -> dict[str, Any]:
    settings: dict[str, Any] = {"LINKS_START_URLS": ",".join(site.start_urls())}
    if mode == "scrapy":
        settings["ADDONS"] = {}
    elif mode.startswith("spine"):
        settings.update({
            "REDISSPINE_REDIS_URL": redis_url,
            "REDISSPINE_CRAWL_ID": f"bench-{run_id}",
            "REDISSPINE_HOST_CONCURRENCY": PER_HOST,
        })
        if mode.endswith("sync"):  # e.g. spine2sync: every Redis call on the crawl's loop
            settings["REDISSPINE_REDIS_THREAD"] = False
        elif mode.endswith("thread"):  # e.g. spine1thread: off the loop on a thread
            settings["REDISSPINE_REDIS_GREENLETS"] = False
        elif mode.endswith("onelease"):  # e.g. spine1onelease: no lease alongside
            settings["REDISSPINE_LEASE_ALONGSIDE"] = False
    elif mode.startswith("redis"):
        settings.update({
            "ADDONS": {},
            "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
            "REDIS_URL": redis_url,
            "SCHEDULER_PERSIST": False,
            "SCHEDULER_QUEUE_KEY": f"bench-{run_id}:requests",
            "SCHEDULER_DUPEFILTER_KEY": f"bench-{run_id}:dupefilter",
        })
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return settings


def workers_of(mode: str) -> int:
    digits = "".join(ch for ch in mode if ch.isdigit())
    return int(digits) if digits else 1


def behind_proxy(
    server: RedisServer, rtt_ms: float, delay_ms: float | None
) -> tuple[LatencyProxy | None, str, float]:
    """(proxy, URL to use, measured RTT in ms): the server itself when ``rtt_ms`` is 0,
    else through a proxy delaying ``delay_ms`` (default: half the RTT) each way."""
    if not rtt_ms:
        return None, server.url, 0.0
    one_way = (delay_ms if delay_ms is not None else rtt_ms / 2) / 1000
    proxy = LatencyProxy(server.port or 0, one_way).start()
    return proxy, proxy.url, proxy.measured_rtt_ms()


def _worker_reports(tmp: Path, k: int, mode: str) -> dict[str, Any]:
    """The workers' finish reasons and ``_worker.py`` reports, summed: round trips,
    CPU seconds, start-up CPU (before the engine opened the spider) and CPU per
    thread name (``(rest)``: threads still running at exit)."""
    reasons, round_trips, worker_cpu, startup_cpu = [], 0, 0.0, 0.0
    thread_cpu: dict[str, float] = {}
    for index in range(k):
        stats = parse_stats((tmp / f"w{index}.log").read_text(errors="replace"))
        reasons.append(stats.get("finish_reason"))
        report_path = tmp / f"w{index}.json"
        if report_path.exists():
            report = json.loads(report_path.read_text())
            round_trips += report["round_trips"]
            worker_cpu += report["cpu"]
            startup_cpu += report.get("startup_cpu") or 0.0
            threads = report.get("thread_cpu", {})
            for name, seconds in threads.items():
                thread_cpu[name] = thread_cpu.get(name, 0.0) + seconds
            thread_cpu["(rest)"] = (thread_cpu.get("(rest)", 0.0) + report["cpu"]
                                    - sum(threads.values()))
        if stats.get("finish_reason") != "finished":
            tail = (tmp / f"w{index}.out").read_text(errors="replace")[-1500:]
            print(f"  {mode} worker {index}: finish_reason "
                  f"{stats.get('finish_reason')!r}\n{tail}", flush=True)
    return {"finished": all(reason == "finished" for reason in reasons),
            "round_trips": round_trips, "cpu": worker_cpu, "startup_cpu": startup_cpu,
            "thread_cpu": thread_cpu}


def one_run(mode: str, args: argparse.Namespace, run_id: str, rtt_ms: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp_name, RedisServer() as server, \
            TestSite(hosts=args.hosts, pages_per_host=args.pages, fanout=args.fanout,
                     latency=args.latency) as site:
        tmp = Path(tmp_name)
        proxy, url, measured_rtt = behind_proxy(
            server, rtt_ms, getattr(args, "proxy_delay_ms", None))
        try:
            client = server.client()
            before = _info(client)
            python = bench_python() if mode.startswith("redis") else sys.executable
            argv = crawl_command("links", mode_settings(mode, url, site, run_id))
            argv = [python, str(WORKER), *argv[3:]]  # [python -m scrapy] -> _worker.py
            k = workers_of(mode)
            started = time.monotonic()
            processes = []
            for index in range(k):
                env = worker_env({"BENCH_WORKER_REPORT": str(tmp / f"w{index}.json")})
                log = tmp / f"w{index}.log"
                with open(tmp / f"w{index}.out", "wb") as out:
                    processes.append(subprocess.Popen(
                        [*argv, "-s", f"LOG_FILE={log}", "-s", "LOG_FILE_APPEND=False"],
                        cwd=PROJECT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                        stderr=subprocess.STDOUT))
            for process in processes:
                try:
                    process.wait(timeout=args.timeout)
                except subprocess.TimeoutExpired:
                    for other in processes:
                        other.kill()
                    raise
            wall = time.monotonic() - started
            after = _info(client)
            client.close()
        finally:
            if proxy:
                proxy.stop()
        reports = _worker_reports(tmp, k, mode)
        records = [r for r in site.requests()
                   if r.get("page") and r["method"] == "GET" and r["status"] == 200
                   and "error" not in r]
        fetched = {r["page"] for r in records}
        expected = site.all_urls()
        pages = len(records)
        span = (max(r["end"] for r in records) - min(r["start"] for r in records)
                if records else float("nan"))
        per_page = max(len(fetched), 1)
        # The runner's own two INFO calls are not the workers'.
        commands = after["commands"] - before["commands"] - 1
        return {
            "mode": mode + (f"@{rtt_ms:g}ms" if rtt_ms else ""),
            "workers": k,
            "measured_rtt_ms": measured_rtt,
            "finished": reports["finished"],
            "expected": len(expected),
            "pages": pages,
            "duplicates": pages - len(fetched),
            "missing": len(expected - fetched),
            "wall_s": wall,
            "span_s": span,
            "pages_per_s_wall": len(fetched) / wall,
            "pages_per_s_span": len(fetched) / span,
            "round_trips_per_page": reports["round_trips"] / per_page,
            "redis_commands_per_page": commands / per_page,
            "evalsha_per_page": (after["evalsha"] - before["evalsha"]) / per_page,
            "worker_cpu_ms_per_page": 1000 * reports["cpu"] / per_page,
            "worker_startup_cpu_s": reports["startup_cpu"],
            "worker_thread_cpu_ms_per_page": {
                name: round(1000 * seconds / per_page, 3)
                for name, seconds in reports["thread_cpu"].items()},
            "redis_cpu_ms_per_page": 1000 * (after["cpu"] - before["cpu"]) / per_page,
        }


COLUMNS = [
    ("mode", "{}"), ("pages", "{:.0f}"), ("duplicates", "{:.0f}"), ("missing", "{:.0f}"),
    ("wall_s", "{:.2f}"), ("pages_per_s_wall", "{:.0f}"), ("span_s", "{:.2f}"),
    ("pages_per_s_span", "{:.0f}"), ("round_trips_per_page", "{:.2f}"),
    ("redis_commands_per_page", "{:.1f}"), ("evalsha_per_page", "{:.2f}"),
    ("worker_cpu_ms_per_page", "{:.2f}"), ("redis_cpu_ms_per_page", "{:.3f}"),
]


def summarize(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The median of every numeric column per mode, in first-seen order."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_mode.setdefault(result["mode"], []).append(result)
    rows = []
    for mode, runs in by_mode.items():
        row: dict[str, Any] = {"mode": mode, "runs": len(runs),
                               "all_finished": all(r["finished"] for r in runs)}
        for name, _ in COLUMNS[1:]:
            row[name] = statistics.median(r[name] for r in runs)
        row["max_duplicates"] = max(r["duplicates"] for r in runs)
        row["max_missing"] = max(r["missing"] for r in runs)
        rows.append(row)
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    names = [name for name, _ in COLUMNS]
    print("| " + " | ".join(names) + " |")
    print("|" + "---|" * len(names))
    for row in rows:
        print("| " + " | ".join(fmt.format(row[name]) for name, fmt in COLUMNS) + " |")


def print_ratios(results: list[dict[str, Any]], base: str = "scrapy") -> None:
    """Per repetition, each mode's pages/s over the base's in the same repetition."""
    reps: dict[int, dict[str, dict[str, Any]]] = {}
    for result in results:
        reps.setdefault(result["rep"], {})[result["mode"]] = result
    for key in ("pages_per_s_span", "pages_per_s_wall"):
        ratios: dict[str, list[float]] = {}
        for rep in reps.values():
            for mode, result in rep.items():
                if base in rep and mode != base:
                    ratios.setdefault(f"{mode}/{base}", []).append(
                        result[key] / rep[base][key])
                if "@" in mode and mode.split("@")[0] in rep:
                    ratios.setdefault(f"{mode}/{mode.split('@')[0]}", []).append(
                        result[key] / rep[mode.split("@")[0]][key])
        text = ", ".join(f"{name} {statistics.median(values):.2f}"
                         f" [{min(values):.2f}-{max(values):.2f}]"
                         for name, values in ratios.items())
        print(f"median ratios of {key} (same repetition): {text}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--pages", type=int, default=100, help="pages per host")
    parser.add_argument("--fanout", type=int, default=5)
    parser.add_argument("--latency", type=float, default=0.02, help="site seconds/response")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rtt-ms", default="",
                        help="also run the Redis modes with this RTT added by a proxy; "
                        "several, comma-separated (e.g. 1,5,20), run interleaved")
    parser.add_argument("--proxy-delay-ms", type=float, default=None,
                        help="the proxy's one-way delay (default: half of --rtt-ms); the "
                        "proxy itself adds ~0.25 ms per round trip, see measured_rtt_ms")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", help="write every run's numbers here")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    plan = [(mode, 0.0) for mode in modes]
    for rtt_ms in (float(value) for value in str(args.rtt_ms).split(",") if value):
        plan += [(mode, rtt_ms) for mode in modes if mode != "scrapy" and rtt_ms]
    results = []
    for rep in range(args.runs):
        for mode, rtt in plan:
            result = one_run(mode, args, f"{rep}-{mode}-{time.time_ns()}", rtt)
            result["rep"] = rep
            results.append(result)
            print(json.dumps(result), flush=True)
    rows = summarize(results)
    print(f"\nmedians of {args.runs} run(s); site: {args.hosts} hosts x {args.pages} pages, "
          f"fan-out {args.fanout}, {1000 * args.latency:g} ms per response")
    print_table(rows)
    print_ratios(results)
    if args.json:
        Path(args.json).write_text(json.dumps({"runs": results, "medians": rows}, indent=1))
    bad = [r for r in results if not r["finished"] or r["duplicates"] or r["missing"]]
    for result in bad:
        print(f"INCOMPLETE OR DUPLICATED: {result['mode']} rep {result['rep']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
