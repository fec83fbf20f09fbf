"""What Redis's packed encodings cost the frontier's per-lane keys, per call.

A crawl keeps, per lane (host): its place in ``hosts`` (a ZSET of due lanes), its
counts in ``busy``, ``backlog``, ``host_next`` and ``group_busy`` (HASHes), and an
index entry in the queue (a ZSET read by lex range). Redis keeps a ZSET or HASH of at
most ``zset-max-listpack-entries`` / ``hash-max-listpack-entries`` entries (128 by
default) packed in one listpack, where each member is found by a scan; past that,
in a skiplist or hash table. A crawl of 16-128 hosts therefore pays a scan for
every lane it touches. This times, on a throwaway redis-server, in one script of
``--rounds`` rounds (server µs per call from ``INFO commandstats``):

- ``ZADD`` of ``--touched`` lanes to a ZSET holding ``--lanes`` - ``--touched``
  others, and their ``ZREM`` (an ack puts its lanes back in ``hosts``, a lease takes
  them out);
- ``HMGET`` of ``--touched`` fields of a HASH of ``--lanes`` fields (a lease or an
  ack reads its lanes' counts);

once with Redis's defaults and once with the thresholds of 16 (Operations).

    .venv/bin/python benchmarks/packed_costs.py            # 100 lanes, 16 touched
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_redisspine.testing.redis_server import RedisServer  # noqa: E402

THRESHOLDS_16 = ["--hash-max-listpack-entries", "16", "--zset-max-listpack-entries", "16"]

SCRIPT = """
local touched, rounds = tonumber(ARGV[1]), tonumber(ARGV[2])
for r = 1, rounds do
    local pairs_ = {}
    for i = 1, touched do -- freed now: after the lanes due before (the ZSET's end)
        pairs_[#pairs_ + 1] = 1800000000000 + r * 100 + i
        pairs_[#pairs_ + 1] = "h" .. i .. ".example"
    end
    redis.call("ZADD", KEYS[1], unpack(pairs_))
    local lanes = {}
    for i = 1, touched do
        lanes[i] = "h" .. i .. ".example"
    end
    redis.call("ZREM", KEYS[1], unpack(lanes))
    redis.call("HMGET", KEYS[2], unpack(lanes))
end
"""


def measure(lanes: int, touched: int, rounds: int, config: list[str]) -> dict[str, Any]:
    with RedisServer(extra_args=config) as server:
        client = server.client()
        others = {f"h{i}.example": 1_700_000_000_000 + i for i in range(touched + 1, lanes + 1)}
        if others:
            client.zadd("hosts", others)
        for i in range(1, lanes + 1):  # one at a time, as lanes come: Redis converts
            client.hset("busy", f"h{i}.example", 1)  # at the threshold, as in a crawl
        encodings = (client.object("encoding", "hosts"), client.object("encoding", "busy"))
        client.config_resetstat()
        client.eval(SCRIPT, 2, "hosts", "busy", touched, rounds)
        stats = client.info("commandstats")
        version = client.info("server").get("redis_version", "?")
        client.close()
    per_call = {name: round(float(stats[f"cmdstat_{name}"]["usec_per_call"]), 2)
                for name in ("zadd", "zrem", "hmget")}
    return {"server": f"{server.binary} ({version})",
            "redis_config": " ".join(config) or "defaults", "lanes": lanes, "touched": touched,
            "encodings": [str(e, "ascii") if isinstance(e, bytes) else str(e) for e in encodings],
            "usec_per_call": per_call}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--lanes", type=int, default=100)
    parser.add_argument("--touched", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    if not 0 < args.touched <= args.lanes:
        parser.error("--touched must be between 1 and --lanes")
    results = [measure(args.lanes, args.touched, args.rounds, config)
               for config in ([], THRESHOLDS_16)]
    for result in results:
        print(json.dumps(result))
    print(f"\n{results[0]['server']}: {args.touched} of {args.lanes} lanes a call, "
          f"{args.rounds} rounds; server µs per call")
    print("| Redis | encodings (hosts, busy) | ZADD | ZREM | HMGET |")
    print("|---|---|---|---|---|")
    for result in results:
        cost = result["usec_per_call"]
        print(f"| {result['redis_config']} | {', '.join(result['encodings'])} | {cost['zadd']} "
              f"| {cost['zrem']} | {cost['hmget']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
