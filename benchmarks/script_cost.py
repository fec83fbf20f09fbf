"""What each frontier script costs Redis per request: enqueue, lease and ack apart.

Drives the core (``Frontier``) on a throwaway redis-server, no Scrapy: ``--n``
requests over ``--hosts`` lanes enqueued in batches of 100, then, round after round,
``--lease`` requests leased per call (six calls) and acked in calls of the same size.
For each phase, from ``INFO commandstats`` (reset before each phase): the server time
of the scripts (``evalsha`` µs, which includes the commands they call), the time of
the commands they call, and how many commands per request. What is left of a
script's time after its commands is the Lua code itself (parsing members, building
tables and replies).

    .venv/bin/python benchmarks/script_cost.py --rounds 10
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_redisspine.frontier import Frontier, NewRequest  # noqa: E402
from scrapy_redisspine.keys import CrawlKeys  # noqa: E402
from scrapy_redisspine.testing.redis_server import RedisServer  # noqa: E402

_NOT_INNER = {"cmdstat_evalsha", "cmdstat_config|resetstat", "cmdstat_info",
              "cmdstat_script|load"}


class Phase:
    """One phase's totals over the rounds: requests, script µs, inner µs and calls."""

    def __init__(self) -> None:
        self.requests = 0
        self.script_us = 0
        self.inner_us = 0
        self.inner_calls = 0

    def add(self, info: dict[str, Any], requests: int) -> None:
        self.requests += requests
        self.script_us += info.get("cmdstat_evalsha", {}).get("usec", 0)
        inner = [value for name, value in info.items() if name not in _NOT_INNER]
        self.inner_us += sum(value["usec"] for value in inner)
        self.inner_calls += sum(value["calls"] for value in inner)

    def row(self) -> dict[str, float]:
        per = max(self.requests, 1)
        return {"requests": self.requests, "script_us": round(self.script_us / per, 2),
                "commands_us": round(self.inner_us / per, 2),
                "lua_us": round((self.script_us - self.inner_us) / per, 2),
                "commands": round(self.inner_calls / per, 2)}


def _requests(n: int, hosts: int, start: int) -> list[NewRequest]:
    return [NewRequest(f"http://h{i % hosts}.example/p/{i}".encode(),
                       hashlib.sha1(str(i).encode()).digest(), lane=f"h{i % hosts}.example")
            for i in range(start, start + n)]


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    phases = {name: Phase() for name in ("enqueue", "lease", "ack")}
    with RedisServer() as server:
        client = server.client()
        frontier = Frontier(client, CrawlKeys("bench", "scripts"), "w1", concurrency=1)
        frontier.register(flush=False, alive_ms=60_000, spider="bench")
        for round_ in range(args.rounds):
            client.config_resetstat()
            new = _requests(args.n, args.hosts, round_ * args.n)
            for i in range(0, len(new), 100):
                frontier.enqueue(new[i:i + 100])
            phases["enqueue"].add(client.info("commandstats"), len(new))
            while True:
                client.config_resetstat()
                handles = [lease.handle for _ in range(6)
                           for lease in frontier.lease(args.lease).leases]
                phases["lease"].add(client.info("commandstats"), len(handles))
                if not handles:
                    break
                client.config_resetstat()
                for i in range(0, len(handles), args.lease):
                    frontier.ack(handles[i:i + args.lease])
                phases["ack"].add(client.info("commandstats"), len(handles))
        left = (client.zcard(frontier.keys.queue), client.hlen(frontier.keys.inflight))
    report = {name: phase.row() for name, phase in phases.items()}
    report["left_queued_inflight"] = {"queued": left[0], "inflight": left[1]}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1600, help="requests per round")
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--lease", type=int, default=16, help="requests per lease call")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    report = measure(args)
    if args.json:
        print(json.dumps(report))
        return 0
    print("| phase | requests | script µs / request | of which commands | Lua code | "
          "commands / request |")
    print("|---|---|---|---|---|---|")
    for name in ("enqueue", "lease", "ack"):
        row = report[name]
        print(f"| {name} | {row['requests']:.0f} | {row['script_us']} | {row['commands_us']} | "
              f"{row['lua_us']} | {row['commands']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
