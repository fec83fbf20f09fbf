"""Scheduler micro-benchmark: enqueue, lease and ack N requests, no downloader.

Drives the scheduler objects directly, as Scrapy's engine would, for Scrapy's own
memory queue (``scrapy``: its classic ``ScrapyPriorityQueue``, the issue's baseline),
its memory queue as a project has it by default since Scrapy 2.14
(``scrapy-default``: ``DownloaderAwarePriorityQueue``, which asks a real Scrapy
``Downloader``, standing in for the running engine's, for each request's download
slot and each slot's active downloads; nothing is downloaded, so none is active),
its disk queue (``scrapy-disk``, a ``JOBDIR``),
scrapy-redis's priority queue (``scrapy-redis``, from ``benchmarks/.venv-bench``, see
``crawl_compare.py``) and this plugin (``spine``). N requests spread over ~100 hosts
(``http://h<i % hosts>.example/p/<i>``, all new), all enqueued first, then taken one
by one with ``next_request()``; for the spine each taken request is reported done as
the engine does (through the scheduler's engine port: its ack waits in the outbox and travels with
the next lease), with 16 free download slots so a lease takes up to 16 requests in
one round trip. Redis memory per queued request is
the ``used_memory`` growth after the enqueue phase, divided by N.

    .venv/bin/python benchmarks/scheduler_micro.py             # N=20000, 5 runs
    .venv/bin/python benchmarks/scheduler_micro.py --rtt-ms 1  # also Redis ~1 ms away
    .venv/bin/python benchmarks/scheduler_micro.py --rtt-ms 1 --proxy-delay-ms 0.3  # calibrated

Every implementation runs in its own process, interleaved, on a fresh redis-server.

``--mode inline`` (the default, the issue's figure) calls the scheduler in a plain
loop, the spine with every Redis call on this thread and waited for: client and
server time add up. ``--mode loop`` drives it as a crawl's engine does, on a running
asyncio loop (Scrapy's reactorless mode; the asyncio reactor runs the same loop) with
the spine's default settings, so its Redis calls park on the loop in greenlets: the
driver enqueues a page's worth of links (100) per turn of the loop, and takes up to
16 requests per turn (its free download slots), reporting each done at once. Redis
works while the driver's Python runs, as in a crawl. Its result also counts the
drain's turns of the loop (``drain_turns``) and those in which nothing was ready
(``idle_turns``: the driver waited for a lease; many of them mean that Redis, not
the worker's Python, sets the pace).

    .venv/bin/python benchmarks/scheduler_micro.py --impls scrapy,spine --mode loop
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
IMPLS = ("scrapy", "scrapy-default", "scrapy-disk", "scrapy-redis", "spine")
REDIS_IMPLS = ("scrapy-redis", "spine")  # the schedulers with a Redis of their own
SLOTS = 16


def _requests(n: int, hosts: int) -> list[Any]:
    import scrapy

    return [scrapy.Request(f"http://h{i % hosts}.example/p/{i}") for i in range(n)]


def _settings(impl: str, redis_url: str, extra: str, mode: str = "inline") -> dict[str, Any]:
    # Scrapy's default DownloaderAwarePriorityQueue needs a running engine's
    # downloader; the classic per-priority queue does not. ``scrapy-default`` keeps the
    # default and gets a Downloader (_open), with no download handler to load.
    settings: dict[str, Any] = {"LOG_LEVEL": "ERROR", "TELNETCONSOLE_ENABLED": False,
                                "SCHEDULER_PRIORITY_QUEUE": "scrapy.pqueues.ScrapyPriorityQueue"}
    if impl == "scrapy-default":
        del settings["SCHEDULER_PRIORITY_QUEUE"]
        settings["DOWNLOAD_HANDLERS"] = {"http": None, "https": None}
    elif impl == "scrapy-disk":
        settings["JOBDIR"] = tempfile.mkdtemp(prefix="micro-")
    elif impl == "scrapy-redis":
        settings.update({"REDIS_URL": redis_url,
                         "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
                         "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter"})
    elif impl == "spine":
        settings.update({"REDISSPINE_REDIS_URL": redis_url, "REDISSPINE_CRAWL_ID": "micro",
                         "ADDONS": {"scrapy_redisspine.Addon": 0}})
        if mode == "inline":
            # No crawl's loop runs to take the Redis calls' replies: the scheduler's
            # own cost is measured with every call on this thread.
            settings["REDISSPINE_REDIS_THREAD"] = False
        settings.update(dict(item.split("=", 1) for item in extra.split(",") if item))
    return settings


def child(
    impl: str, n: int, hosts: int, redis_url: str, *, extra: str = "", mode: str = "inline"
) -> dict[str, Any]:
    """Run one implementation in this process; return its timings."""
    if mode == "loop":
        import asyncio

        async def on_loop() -> dict[str, Any]:
            return await _measure_on_loop(impl, n, hosts, redis_url, extra)

        return asyncio.run(on_loop())
    scheduler, engine, memory_of, cpu_of = _open(impl, redis_url, extra, mode)
    requests = _requests(n, hosts)
    memory_before = memory_of()
    started = time.perf_counter()
    for request in requests:
        scheduler.enqueue_request(request)
    if impl == "spine":
        scheduler.outbox.try_flush()  # the outbox's last partial batch
    enqueued = time.perf_counter()
    memory = memory_of() - memory_before
    cpu_before = cpu_of()
    taken = 0
    while True:
        request = scheduler.next_request()
        if request is None:
            break
        taken += 1
        if impl == "spine":
            engine.done(request)
    done = time.perf_counter()
    redis_cpu = cpu_of() - cpu_before
    scheduler.close("finished")
    return {**_result(impl, n, taken, (enqueued - started, done - enqueued), memory, mode=mode),
            **_spine_extras(scheduler, impl, redis_cpu)}


async def _measure_on_loop(
    impl: str, n: int, hosts: int, redis_url: str, extra: str
) -> dict[str, Any]:
    """``--mode loop``: the scheduler opened and driven on the running asyncio loop,
    a turn of the loop after each page's links and after each round of free slots."""
    import asyncio

    scheduler, engine, memory_of, cpu_of = _open(impl, redis_url, extra, "loop")
    spine = impl == "spine"
    if spine:
        await _settled(scheduler)  # joined the crawl
    requests = _requests(n, hosts)
    memory_before = memory_of()
    started = time.perf_counter()
    for first in range(0, n, PAGE_LINKS):
        for request in requests[first:first + PAGE_LINKS]:
            scheduler.enqueue_request(request)
        await asyncio.sleep(0)
    if spine:
        scheduler.outbox.try_flush()  # the outbox's last partial batch
        await _settled(scheduler)  # every enqueue answered
    enqueued = time.perf_counter()
    memory = memory_of() - memory_before
    cpu_before = cpu_of()
    taken, idle_since = 0, time.monotonic()
    turns = idle_turns = 0  # turns of the loop; those that found nothing ready
    while taken < n and time.monotonic() - idle_since < STALL_SECONDS:
        turns += 1
        for slot in range(SLOTS):
            request = scheduler.next_request()
            if request is None:
                idle_turns += slot == 0
                break
            taken += 1
            idle_since = time.monotonic()
            if spine:
                engine.done(request)
        else:
            await asyncio.sleep(0)
            continue
        if not spine:
            break  # Scrapy's memory queue is empty
        await asyncio.sleep(0)  # a lease on its way
    done = time.perf_counter()
    redis_cpu = cpu_of() - cpu_before
    scheduler.close("finished")
    if spine:
        await _settled(scheduler)
    return {**_result(impl, n, taken, (enqueued - started, done - enqueued), memory, mode="loop"),
            **_spine_extras(scheduler, impl, redis_cpu),
            "drain_turns": turns, "idle_turns": idle_turns}


PAGE_LINKS = 100  # requests enqueued per turn of the loop in --mode loop
STALL_SECONDS = 30.0  # --mode loop gives up after this long without a request


async def _settled(scheduler: Any) -> None:
    """Turn the loop until the spine's outbox is empty and no Redis call is pending."""
    import asyncio

    deadline = time.monotonic() + STALL_SECONDS
    while (not scheduler.outbox.empty or scheduler.io.busy) and time.monotonic() < deadline:
        await asyncio.sleep(0)


def _open(impl: str, redis_url: str, extra: str, mode: str) -> tuple[Any, Any, Any, Any]:
    """The opened scheduler, its engine stand-in (the spine's), and readings of
    Redis's ``used_memory`` and of its CPU seconds (user + system)."""
    import redis
    import scrapy
    from scrapy.utils.test import get_crawler

    class BenchSpider(scrapy.Spider):
        name = "bench"

        def parse(self, response: Any) -> None:
            pass

    settings = _settings(impl, redis_url, extra, mode)
    crawler = get_crawler(BenchSpider, settings)
    spider = BenchSpider.from_crawler(crawler)
    crawler.spider = spider
    engine = None
    if impl == "scrapy-redis":
        from scrapy_redis.scheduler import (  # type: ignore[import-not-found]
            Scheduler as RedisScheduler,
        )

        scheduler: Any = RedisScheduler.from_crawler(crawler)
    elif impl == "spine":
        from scrapy_redisspine.scheduler import Scheduler as SpineScheduler
        from scrapy_redisspine.testing.engine import StandInEngine

        engine = StandInEngine(SLOTS)
        scheduler = SpineScheduler.from_crawler(crawler, engine=engine)
    else:
        from scrapy.core.scheduler import Scheduler as ScrapyScheduler

        if impl == "scrapy-default":
            from types import SimpleNamespace

            from scrapy.core.downloader import Downloader

            # what DownloaderAwarePriorityQueue reads of the running engine
            crawler.engine = SimpleNamespace(downloader=Downloader(crawler))
        scheduler = ScrapyScheduler.from_crawler(crawler)
    scheduler.open(spider)
    queue = type(getattr(scheduler, "mqs", None)).__name__
    if impl == "scrapy-default" and queue != "DownloaderAwarePriorityQueue":
        raise SystemExit(f"scrapy-default: Scrapy's default memory queue is {queue} here")
    client = redis.Redis.from_url(redis_url)

    def memory_of() -> int:
        return int(client.info("memory")["used_memory"])

    def cpu_of() -> float:
        cpu = client.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    return scheduler, engine, memory_of, cpu_of


def _spine_extras(scheduler: Any, impl: str, redis_cpu: float) -> dict[str, Any]:
    """How the spine made its Redis calls (inline, greenlets or threads), how many of
    its leases went alongside another, and Redis's CPU seconds during the drain (of
    a Redis scheduler; Redis's busy share of the drain is this over ``drain_s``)."""
    stats = getattr(scheduler, "stats", None)
    spine = impl == "spine" and stats is not None
    return {
        "redis_calls": stats.get_value("redisspine/redis/calls") if spine else None,
        "leases_alongside": (stats.get_value("redisspine/scheduler/leases_alongside", 0)
                             if spine else None),
        "redis_cpu_drain_s": redis_cpu if impl in REDIS_IMPLS else None,
    }


def _result(
    impl: str, n: int, taken: int, seconds: tuple[float, float], memory: int, *, mode: str
) -> dict[str, Any]:
    enqueue_s, drain_s = seconds
    return {
        "impl": impl,
        "mode": mode,
        "n": n,
        "taken": taken,
        "enqueue_s": enqueue_s,
        "drain_s": drain_s,
        "requests_per_s": n / (enqueue_s + drain_s),
        "redis_bytes_per_request": memory / n if impl in REDIS_IMPLS else None,
    }


def _child_env() -> dict[str, str]:
    """The child imports this checkout's package, not whichever one is installed (a
    tree run beside another, for a side-by-side comparison, measures itself)."""
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), path)))}


def redis_config_args(config: str) -> list[str]:
    """``--redis-config "name value, name value"`` as redis-server arguments."""
    args: list[str] = []
    for pair in filter(None, (part.strip() for part in config.split(","))):
        name, _, value = pair.partition(" ")
        args += [f"--{name}", value.strip()]
    return args


def commandstats(client: Any, top: int = 8) -> dict[str, dict[str, float]]:
    """The commands Redis spent most time in over the whole run (the scripts' own
    time is ``evalsha``'s, the commands they call are counted apart): calls and µs
    per call of the ``top`` ones, from ``INFO commandstats``."""
    stats = client.info("commandstats")
    ranked = sorted(stats.items(), key=lambda item: -float(item[1]["usec"]))[:top]
    return {name.removeprefix("cmdstat_"): {"calls": int(entry["calls"]),
                                             "usec_per_call": float(entry["usec_per_call"])}
            for name, entry in ranked}


def run_child(impl: str, args: argparse.Namespace, rtt_ms: float) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from benchmarks.crawl_compare import behind_proxy, bench_python
    from scrapy_redisspine.testing.redis_server import RedisServer

    with RedisServer(extra_args=redis_config_args(args.redis_config)) as server:
        proxy, url, measured_rtt = behind_proxy(server, rtt_ms, args.proxy_delay_ms)
        python = bench_python() if impl == "scrapy-redis" else sys.executable
        try:
            out = subprocess.run(
                [python, __file__, "--child", impl, "--n", str(args.n), "--settings", args.settings,
                 "--hosts", str(args.hosts), "--redis-url", url, "--mode", args.mode],
                check=True, capture_output=True, text=True, timeout=args.timeout,
                cwd=tempfile.gettempdir(), env=_child_env(),
            )
        except subprocess.CalledProcessError as exc:
            raise SystemExit(f"{impl} failed:\n{exc.stderr[-3000:]}") from None
        finally:
            if proxy:
                proxy.stop()
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        if args.commandstats and impl in REDIS_IMPLS:
            client = server.client()
            result["commandstats"] = commandstats(client)
            client.close()
    if rtt_ms:
        result["impl"] += f"@{rtt_ms:g}ms"
        result["measured_rtt_ms"] = measured_rtt
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--impls", default=",".join(IMPLS))
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rtt-ms", type=float, default=0.0,
                        help="also run the Redis schedulers with this RTT added by a proxy")
    parser.add_argument("--proxy-delay-ms", type=float, default=None,
                        help="the proxy's one-way delay (default: half of --rtt-ms); the "
                        "proxy itself adds ~0.25 ms per round trip, see measured_rtt_ms")
    parser.add_argument("--settings", default="",
                        help="extra settings for the spine, NAME=VALUE,... (e.g. "
                        "REDISSPINE_LOCAL_REQUEST_CACHE=0)")
    parser.add_argument("--mode", choices=("inline", "loop"), default="inline",
                        help="inline: every call waited for on this thread (the issue's "
                        "figure); loop: driven on an asyncio loop, Redis calls parked in "
                        "greenlets as in a crawl")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--redis-config", default="",
                        help="the throwaway redis-server's settings, 'name value, ...' "
                             "(e.g. 'hash-max-listpack-entries 16, zset-max-listpack-entries 16')")
    parser.add_argument("--commandstats", action="store_true",
                        help="add each Redis scheduler run's most costly commands "
                             "(INFO commandstats: calls, µs per call)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--redis-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.n, args.hosts, args.redis_url,
                               extra=args.settings, mode=args.mode)))
        return 0
    impls = [impl for impl in args.impls.split(",") if impl]
    plan = [(impl, 0.0) for impl in impls]
    if args.rtt_ms:
        plan += [(impl, args.rtt_ms) for impl in impls if impl in REDIS_IMPLS]
    results: dict[str, list[dict[str, Any]]] = {}
    for run in range(args.runs):
        for impl, rtt in plan:
            result = run_child(impl, args, rtt)
            if result["taken"] != args.n:
                print(f"{result['impl']}: took {result['taken']} of {args.n}!", flush=True)
            print(json.dumps({"run": run, **result}), flush=True)
            results.setdefault(result["impl"], []).append(result)
    print(f"\nmedians of {args.runs} run(s), N={args.n} over {args.hosts} hosts, "
          f"--mode {args.mode}" + (f", Redis: {args.redis_config}" if args.redis_config else ""))
    print("| scheduler | requests/s (enqueue+lease+ack) | enqueue s | lease+ack s "
          "| Redis busy in lease+ack | Redis bytes/queued request | vs scrapy "
          "| vs scrapy-default |")
    print("|---|---|---|---|---|---|---|---|")
    bases = {name: statistics.median(r["requests_per_s"] for r in results[name])
             for name in ("scrapy", "scrapy-default") if name in results}
    for impl, runs in results.items():
        rate = statistics.median(r["requests_per_s"] for r in runs)
        memories = [r["redis_bytes_per_request"] for r in runs if r["redis_bytes_per_request"]]
        memory = f"{statistics.median(memories):.0f}" if memories else "-"
        ratio, ratio_default = (f"{rate / bases[name]:.2f}" if name in bases else "-"
                                for name in ("scrapy", "scrapy-default"))
        shares = [r["redis_cpu_drain_s"] / r["drain_s"] for r in runs
                  if r.get("redis_cpu_drain_s") is not None and r["drain_s"] > 0]
        busy = f"{statistics.median(shares):.0%}" if shares else "-"
        print(f"| {impl} | {rate:,.0f} | {statistics.median(r['enqueue_s'] for r in runs):.3f} "
              f"| {statistics.median(r['drain_s'] for r in runs):.3f} | {busy} | {memory} "
              f"| {ratio} | {ratio_default} |")
    for impl, runs in results.items():
        if "commandstats" in runs[-1]:
            print(f"\n{impl}, last run: Redis's most costly commands (calls, µs per call)")
            print("| command | calls | µs per call |")
            print("|---|---|---|")
            for name, entry in runs[-1]["commandstats"].items():
                print(f"| {name} | {entry['calls']:,} | {entry['usec_per_call']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
