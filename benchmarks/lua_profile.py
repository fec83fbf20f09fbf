"""Where a frontier script's time goes, section by section: a checkpoint profile.

Redis has no profiler for Lua, and a script's ``INFO commandstats`` time is one
number (``script_cost.py`` splits it into the commands it calls and the rest). This
runs ``script_cost.py``'s workload (``--n`` requests over ``--hosts`` lanes enqueued
in batches of 100, then ``--lease`` requests per lease call, six calls, acked in
calls of the same size, for ``--rounds`` rounds) on a throwaway redis-server, with
``lease.lua`` and ``enqueue.lua`` (which carries the acks) instrumented: a mark
before each section (below, ``MARKS``) reads ``TIME`` and adds the µs since the
previous mark to that section's total, kept in a ``prof:<script>`` HASH. Each mark
costs about a microsecond of its own (a ``TIME`` call), so the sections' sum is a
little above the uninstrumented script's time (``script_cost.py``).

    .venv/bin/python benchmarks/lua_profile.py                # lease 16, 5 rounds
    .venv/bin/python benchmarks/lua_profile.py --lease 1      # per-call costs

``libraries`` is the time to run the included libraries' definitions, which Redis
does on every call (each ``local function`` is a new closure).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.script_cost import add_workload_arguments, drive  # noqa: E402
from scrapy_redisspine import scripts  # noqa: E402
from scrapy_redisspine.frontier import Frontier  # noqa: E402
from scrapy_redisspine.keys import CrawlKeys  # noqa: E402
from scrapy_redisspine.testing.redis_server import RedisServer  # noqa: E402

PRELUDE = """
local __p = { prof = {}, order = {} } -- one local: the scripts' main chunks are near 200
function __p.t(label)
    local t = redis.call("TIME")
    local now = t[1] * 1000000 + t[2]
    if __p.last then
        if not __p.prof[label] then
            __p.order[#__p.order + 1] = label
            __p.prof[label] = 0
        end
        __p.prof[label] = __p.prof[label] + now - __p.last
    end
    __p.last = now
end
function __p.flush(name)
    __p.t("tail")
    for _, label in ipairs(__p.order) do
        redis.call("HINCRBY", "prof:" .. name, label, __p.prof[label])
    end
    redis.call("HINCRBY", "prof:" .. name, "#calls", 1)
end
__p.t("start")
"""

#: Per script: (a line of its text, the section that ends right before it). The
#: section named is what ran since the previous mark.
MARKS: dict[str, list[tuple[str, str]]] = {
    "lease": [
        ("local queue, inflight, leases, stats = KEYS[1]", "libraries"),
        ("local now_ms = clock_ms()", "refusal, close order, page budget"),
        ("acks_init(inflight, leases, owned, requeues)\nfor i", "clock, lanes_init"),
        ("local members, requeued, delays = {}, {}, {}", "acks (none: this workload acks apart)"),
        ("-- Every member has score 0", "key_exists x2, local functions"),
        ("if count > 0 then\n    local due", "ZCOUNT x2 (odd scores)"),
        ("    local recount = lease_picked(pick(due))", "ZRANGEBYSCORE due lanes"),
        ("    local limit_of = lanes_limit_of(due)", "pick: HMGET busy group next"),
        ("    due_busy, due_group, due_next, due_limit = busy_of", "pick: limits"),
        ("    return picked\nend", "pick: per lane"),
        ("    local held = hmget_in_chunks(inflight, member_keys)", "lease_picked: member keys"),
        ("    local taken, seen_keys, recount = {}, {}, {}", "HMGET inflight"),
        ("    local taken_members, member_taken_keys, lanes, moved", "member checks"),
        ("    local times = any_requeues and", "group by lane"),
        ("    keys_expect(leases, \"zset\", owned, \"zset\")", "lanes read"),
        ("    token = seq_take(seq, 1 + from_lists)", "ZREM, LTRIM, list counts"),
        ("    call_in_chunks(\"HSET\", inflight, inflight_pairs)", "seq, members built"),
        ("    lanes_write(lanes, lanes_before, moved, took, nil, false)",
         "HSET inflight, ZADD leases, owned"),
        ("    move_held_lanes()", "lanes_write"),
        ("-- Repair: members no scheduled", "held lanes, page limit, recounts"),
        ("if #members > 0 then\n    stats_add", "repair check"),
    ],
    "enqueue": [
        ("local queue, seq, starts = KEYS[1]", "libraries"),
        ("local n_requests = (#ARGV - first_request + 1) / 5", "arguments, refusal"),
        ("-- Acks (lib/acks.lua)", "key checks"),
        ("-- Start requests and requests that skip dedup", "acks"),
        ("-- Items: after the acks' writes", "full-Redis path"),
        ("local statuses = {}", "items"),
        ("-- With a cap, one request at a time", "dedup"),
        ("if #to_add > 0 then", "capped path"),
        ("local filtered = n_requests - #to_add", "queue writes, lanes"),
    ],
}
_FINAL = {"lease": "return { members, token, requeued, delays, lists_size(queue),",
          "enqueue": "return { table.concat(statuses), acked, items_written,"}


def instrument(name: str, text: str) -> str:
    """``text`` (the expanded ``name``.lua) with the marks and the final flush."""
    header_end = text.index("]]") + 2
    text = text[:header_end] + "\n" + PRELUDE + text[header_end:]
    for anchor, label in MARKS[name]:
        if text.count(anchor) != 1:
            raise SystemExit(f"{name}.lua: the mark {anchor!r} is not found once; update MARKS")
        text = text.replace(anchor, f'__p.t("{label}")\n{anchor}')
    if text.count(_FINAL[name]) != 1:
        raise SystemExit(f"{name}.lua: its final return is not found once; update _FINAL")
    return text.replace(_FINAL[name], f'__p.flush("{name}")\n{_FINAL[name]}')


def measure(args: argparse.Namespace) -> dict[str, Any]:
    plain = scripts.source

    def instrumented(name: str) -> str:
        # the marks are found by lines of the text as written, comments included
        return instrument(name, scripts.annotated(name)) if name in MARKS else plain(name)

    scripts.source = instrumented  # ScriptSet registers source(name)
    try:
        with RedisServer() as server:
            client = server.client()
            frontier = Frontier(client, CrawlKeys("bench", "profile"), "w1", concurrency=1)
            frontier.register(flush=False, alive_ms=60_000, spider="bench")
            requests = {"lease": 0, "enqueue": 0, "ack": 0}

            def count(phase: str, n: int) -> None:
                requests[phase] += n

            drive(frontier, args, after=count)
            report: dict[str, Any] = {}
            for name in MARKS:
                raw = {k.decode(): int(v) for k, v in client.hgetall(f"prof:{name}").items()}
                calls = raw.pop("#calls")
                report[name] = {"calls": calls, "requests": requests[name], "sections": {
                    label: {"us_per_call": round(us / calls, 1),
                            "us_per_request": round(us / max(requests[name], 1), 2)}
                    for label, us in raw.items()}}
            client.close()
    finally:
        scripts.source = plain
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_workload_arguments(parser, rounds=5)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    report = measure(args)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for name, part in report.items():
        print(f"\n{name}.lua: {part['calls']} calls, {part['requests']} requests "
              f"(enqueue: new requests; its calls also carry the acks)")
        print("| section | µs per call | µs per request |")
        print("|---|---|---|")
        for label, row in part["sections"].items():
            print(f"| {label} | {row['us_per_call']} | {row['us_per_request']} |")
        total = sum(row["us_per_call"] for row in part["sections"].values())
        per_request = sum(row["us_per_request"] for row in part["sections"].values())
        print(f"| **total** | {total:.1f} | {per_request:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
