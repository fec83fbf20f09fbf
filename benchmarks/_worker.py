"""Run ``scrapy crawl`` with a client-side count of Redis round trips.

The crawl runner starts every worker through this file instead of ``scrapy``: it
counts each ``send_packed_command`` of redis-py (one request sent to Redis and
waited for: a single command, or a whole pipeline) and, at exit, writes that count
and the process's own CPU time as JSON to ``$BENCH_WORKER_REPORT``. Commands that
Lua scripts run inside Redis are not round trips and are not counted here.
"""

from __future__ import annotations

import atexit
import json
import os
import resource
import sys
from typing import Any

_sent = [0]


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
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(path, "w", encoding="utf-8") as out:
        json.dump({"round_trips": _sent[0], "cpu": usage.ru_utime + usage.ru_stime}, out)


def main() -> None:
    _install()
    atexit.register(_report)
    from scrapy.cmdline import execute

    sys.argv = ["scrapy", *sys.argv[1:]]
    execute()


if __name__ == "__main__":
    main()
