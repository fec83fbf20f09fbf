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
    .venv/bin/python benchmarks/script_cost.py --rounds 10 --floor

``--floor`` runs the same workload, in the same process right after, through a
*floor*: three scripts written here (not the product's) that keep only what every
crash-safe, polite frontier must do per request: a dedup SET, a list per lane, a ZSET
of due lanes, a SET of busy lanes (one request a lane at a time, as
``REDISSPINE_HOST_CONCURRENCY = 1``) and one in-flight HASH entry (owner, time, lane,
payload) per leased request, removed by its ack. No priorities, counts, groups,
limits, fencing tokens, repairs or refusals. What the product's scripts cost above
it is what their features and checks cost; the floor bounds what any redesign of the
keys could save.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_redisspine.frontier import Frontier, NewRequest  # noqa: E402
from scrapy_redisspine.keys import CrawlKeys  # noqa: E402
from scrapy_redisspine.testing.redis_server import RedisServer  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Callable

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


def workload_requests(n: int, hosts: int, start: int) -> list[NewRequest]:
    """``n`` new plain GETs over ``hosts`` lanes, numbered from ``start``."""
    return [NewRequest(f"http://h{i % hosts}.example/p/{i}".encode(),
                       hashlib.sha1(str(i).encode()).digest(), lane=f"h{i % hosts}.example")
            for i in range(start, start + n)]


def add_workload_arguments(parser: argparse.ArgumentParser, *, rounds: int) -> None:
    """The options of :func:`drive`'s workload, shared by the benchmarks that run it
    (this one, ``lua_profile.py``, ``script_instructions.py``)."""
    parser.add_argument("--n", type=int, default=1600, help="requests per round")
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--lease", type=int, default=16, help="requests per lease call")
    parser.add_argument("--rounds", type=int, default=rounds)


def drive(
    frontier: Frontier, args: argparse.Namespace,
    before: Callable[[], object] = lambda: None,
    after: Callable[[str, int], object] = lambda phase, requests: None,
) -> None:
    """The workload (the module docstring) through ``frontier``; ``before()`` and
    ``after(phase, requests)`` around each phase: the enqueue of a round, each lease
    of six calls, the acks of what it leased."""
    for round_ in range(args.rounds):
        before()
        new = workload_requests(args.n, args.hosts, round_ * args.n)
        for i in range(0, len(new), 100):
            frontier.enqueue(new[i:i + 100])
        after("enqueue", len(new))
        while True:
            before()
            handles = [lease.handle for _ in range(6)
                       for lease in frontier.lease(args.lease).leases]
            after("lease", len(handles))
            if not handles:
                break
            before()
            for i in range(0, len(handles), args.lease):
                frontier.ack(handles[i:i + args.lease])
            after("ack", len(handles))


def measure(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    phases = {name: Phase() for name in ("enqueue", "lease", "ack")}
    with RedisServer() as server:
        client = server.client()
        frontier = Frontier(client, CrawlKeys("bench", "scripts"), "w1", concurrency=1)
        frontier.register(flush=False, alive_ms=60_000, spider="bench")
        drive(frontier, args, client.config_resetstat,
              lambda phase, requests: phases[phase].add(client.info("commandstats"), requests))
        left = (client.zcard(frontier.keys.queue), client.hlen(frontier.keys.inflight))
    report = {name: phase.row() for name, phase in phases.items()}
    report["left_queued_inflight"] = {"queued": left[0], "inflight": left[1]}
    return report


FLOOR_ENQUEUE = r"""
-- KEYS: seen, due, busy; ARGV: lane list prefix, now, then (fingerprint, lane, payload)*
local seen, due, busy = KEYS[1], KEYS[2], KEYS[3]
local prefix, now, added = ARGV[1], ARGV[2], 0
for i = 3, #ARGV, 3 do
    if redis.call("SADD", seen, ARGV[i]) == 1 then
        local lane = ARGV[i + 1]
        if redis.call("RPUSH", prefix .. lane, ARGV[i + 2]) == 1
                and redis.call("SISMEMBER", busy, lane) == 0 then
            redis.call("ZADD", due, now, lane)
        end
        added = added + 1
    end
end
return added
"""

FLOOR_LEASE = r"""
-- KEYS: due, busy, inflight, seq; ARGV: lane list prefix, owner, now, count
local due, busy, inflight, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, owner, now = ARGV[1], ARGV[2], ARGV[3]
local lanes = redis.call("ZRANGEBYSCORE", due, "-inf", now, "LIMIT", 0, tonumber(ARGV[4]))
if #lanes == 0 then
    return {}
end
redis.call("ZREM", due, unpack(lanes))
redis.call("SADD", busy, unpack(lanes))
local first = redis.call("INCRBY", seq, #lanes) - #lanes
local entries, out = {}, {}
for i, lane in ipairs(lanes) do
    local payload = redis.call("LPOP", prefix .. lane)
    local key = tostring(first + i)
    entries[#entries + 1] = key
    entries[#entries + 1] = owner .. "\n" .. now .. "\n" .. lane .. "\n" .. payload
    out[#out + 1] = key
    out[#out + 1] = payload
end
redis.call("HSET", inflight, unpack(entries))
return out
"""

FLOOR_ACK = r"""
-- KEYS: inflight, busy, due; ARGV: lane list prefix, now, owner, then keys
local inflight, busy, due = KEYS[1], KEYS[2], KEYS[3]
local prefix, now, owner = ARGV[1], ARGV[2], ARGV[3]
local entries = redis.call("HMGET", inflight, unpack(ARGV, 4))
local done, lanes = {}, {}
for i, entry in ipairs(entries) do
    local held_by, lane = string.match(entry or "", "^([^\n]*)\n[^\n]*\n([^\n]*)\n")
    if held_by == owner then
        done[#done + 1] = ARGV[i + 3]
        lanes[#lanes + 1] = lane
    end
end
if #done > 0 then
    redis.call("HDEL", inflight, unpack(done))
    redis.call("SREM", busy, unpack(lanes))
    for _, lane in ipairs(lanes) do
        if redis.call("LLEN", prefix .. lane) > 0 then
            redis.call("ZADD", due, now, lane)
        end
    end
end
return #done
"""


def measure_floor(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """The same phases through the floor scripts (the module docstring)."""
    phases = {name: Phase() for name in ("enqueue", "lease", "ack")}
    prefix, keys = "F:q:", ("F:seen", "F:due", "F:busy", "F:inflight", "F:seq")
    seen, due, busy, inflight, seq = keys
    with RedisServer() as server:
        client = server.client()
        enqueue, lease, ack = (client.register_script(source)
                               for source in (FLOOR_ENQUEUE, FLOOR_LEASE, FLOOR_ACK))
        for round_ in range(args.rounds):
            client.config_resetstat()
            new = workload_requests(args.n, args.hosts, round_ * args.n)
            for i in range(0, len(new), 100):
                batch: list[Any] = [prefix, 0]
                for request in new[i:i + 100]:
                    batch += [request.fingerprint[:14], request.lane, request.payload]
                enqueue(keys=[seen, due, busy], args=batch)
            phases["enqueue"].add(client.info("commandstats"), len(new))
            while True:
                client.config_resetstat()
                taken = [reply[0] for _ in range(6)
                         for reply in _pairs(lease(keys=[due, busy, inflight, seq],
                                                   args=[prefix, "w1", 0, args.lease]))]
                phases["lease"].add(client.info("commandstats"), len(taken))
                if not taken:
                    break
                client.config_resetstat()
                for i in range(0, len(taken), args.lease):
                    ack(keys=[inflight, busy, due],
                        args=[prefix, 0, "w1", *taken[i:i + args.lease]])
                phases["ack"].add(client.info("commandstats"), len(taken))
        queued = sum(client.llen(f"{prefix}h{i}.example") for i in range(args.hosts))
        left = (queued, client.hlen(inflight))
    report = {name: phase.row() for name, phase in phases.items()}
    report["left_queued_inflight"] = {"queued": left[0], "inflight": left[1]}
    return report


def _pairs(reply: list[Any]) -> list[tuple[Any, Any]]:
    return list(zip(reply[::2], reply[1::2], strict=True))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_workload_arguments(parser, rounds=10)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--floor", action="store_true",
                        help="also run the workload through the floor scripts")
    args = parser.parse_args()
    report = measure(args)
    reports = {"frontier": report, **({"floor": measure_floor(args)} if args.floor else {})}
    if args.json:
        print(json.dumps(report if not args.floor else reports))
        return 0
    print("| scripts | phase | requests | script µs / request | of which commands | Lua code | "
          "commands / request |")
    print("|---|---|---|---|---|---|---|")
    for which, each in reports.items():
        for name in ("enqueue", "lease", "ack"):
            row = each[name]
            print(f"| {which} | {name} | {row['requests']:.0f} | {row['script_us']} | "
                  f"{row['commands_us']} | {row['lua_us']} | {row['commands']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
