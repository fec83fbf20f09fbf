"""Run ``scrapy crawl`` with a client-side count of Redis round trips.

The crawl runner starts every worker through this file instead of ``scrapy``: it
counts each ``send_packed_command`` of redis-py (one request sent to Redis and
waited for: a single command, or a whole pipeline) and, at exit, writes that count
and the process's own CPU time as JSON to ``$BENCH_WORKER_REPORT``. Commands that
Lua scripts run inside Redis are not round trips and are not counted here.

``BENCH_PIN_CPU=N`` keeps the worker and its threads on CPU N.

The CPU is also split, so a difference between two set-ups can be placed: the part
spent before the engine opened the spider (start-up: imports, settings, joining the
crawl), and each thread's own CPU time by thread name (the crawl's loop is
``MainThread``; a thread's time is taken when its ``run()`` returns, or at exit).
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import sys
import threading
import time
from typing import Any

_sent = [0]
_startup_cpu: list[float] = []
_thread_cpu: dict[str, float] = {}


def _usage() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _install_splits() -> None:
    from scrapy.core.engine import ExecutionEngine

    # Scrapy 2.13+ opens through open_spider_async; older ones through open_spider.
    name = "open_spider_async" if hasattr(ExecutionEngine, "open_spider_async") else "open_spider"
    open_spider = getattr(ExecutionEngine, name)

    def timed_open(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _startup_cpu:
            _startup_cpu.append(_usage())
        return open_spider(self, *args, **kwargs)

    setattr(ExecutionEngine, name, timed_open)
    run = threading.Thread.run

    def timed_run(self: threading.Thread) -> None:
        try:
            run(self)
        finally:
            name = self.name.split(" ")[0].rstrip("0123456789-_")
            _thread_cpu[name] = _thread_cpu.get(name, 0.0) + time.thread_time()

    threading.Thread.run = timed_run  # type: ignore[method-assign]


def _install() -> None:
    try:
        from redis.connection import AbstractConnection as Base
    except ImportError:  # older redis-py
        from redis.connection import Connection as Base  # type: ignore[assignment]
    original = Base.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        _sent[0] += 1
        original(self, command, check_health)

    Base.send_packed_command = counted  # type: ignore[method-assign]


def _report() -> None:
    path = os.environ.get("BENCH_WORKER_REPORT")
    if not path:
        return
    threads = dict(_thread_cpu, MainThread=time.thread_time())
    with open(path, "w", encoding="utf-8") as out:
        json.dump({"round_trips": _sent[0], "cpu": _usage(),
                   "startup_cpu": _startup_cpu[0] if _startup_cpu else None,
                   "thread_cpu": threads}, out)


def main() -> None:
    # BENCH_PIN_CPU=N: the worker (and every thread it starts) runs on CPU N only, to
    # tell what hand-offs between threads on two CPUs cost (RESULTS.md, session 11).
    if os.environ.get("BENCH_PIN_CPU"):
        os.sched_setaffinity(0, {int(os.environ["BENCH_PIN_CPU"])})
    _install()
    _install_splits()
    atexit.register(_report)
    from scrapy.cmdline import execute

    sys.argv = ["scrapy", *sys.argv[1:]]
    execute()


if __name__ == "__main__":
    main()
