"""Where the scheduler micro-benchmark's time goes, for the spine only.

Runs ``scheduler_micro.child("spine", ...)`` once on a throwaway redis-server with
timers around the parts that cost the most, and reads Redis's own account of its
script time (``INFO commandstats``), per request:

- ``fingerprint``, ``encode``, ``decode``: client work per request;
- ``send`` (enqueue phase) and ``send+lease`` (drain phase): wall time of the Redis
  calls, round trip and server time included;
- ``server``: EVALSHA time inside Redis (the scripts), per phase;
- ``other``: the rest of the scheduler's own Python.

    .venv/bin/python benchmarks/micro_breakdown.py --n 10000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _timed(owner: Any, name: str, totals: dict[str, float], label: str) -> None:
    original = getattr(owner, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter() - started

    setattr(owner, name, timed)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=10000)
    parser.add_argument("--hosts", type=int, default=100)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    import redis

    from benchmarks import scheduler_micro
    from scrapy_redisspine.dupefilter import RedisDupeFilter
    from scrapy_redisspine.frontier import Frontier
    from scrapy_redisspine.request_codec import RequestCodec
    from scrapy_redisspine.testing.redis_server import RedisServer

    totals: dict[str, float] = defaultdict(float)
    _timed(RedisDupeFilter, "fingerprint", totals, "fingerprint")
    _timed(RequestCodec, "encode", totals, "encode")
    _timed(RequestCodec, "decode", totals, "decode")
    _timed(Frontier, "enqueue", totals, "send")
    _timed(Frontier, "lease", totals, "send+lease")
    _timed(Frontier, "enqueue_and_lease", totals, "send+lease")
    server_us: dict[str, float] = {}
    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)
        result = scheduler_micro.child("spine", args.n, args.hosts, server.url)
        server_us["total"] = client.info("commandstats")["cmdstat_evalsha"]["usec"]
        client.close()
    enqueue_parts = totals["fingerprint"] + totals["encode"] + totals["send"]
    drain_parts = totals["decode"] + totals["send+lease"]
    per = 1e6 / args.n
    report = {
        "requests_per_s": round(result["requests_per_s"]),
        "enqueue_us": round(result["enqueue_s"] * per, 1),
        "drain_us": round(result["drain_s"] * per, 1),
        "fingerprint_us": round(totals["fingerprint"] * per, 1),
        "encode_us": round(totals["encode"] * per, 1),
        "send_us": round(totals["send"] * per, 1),
        "enqueue_other_us": round((result["enqueue_s"] - enqueue_parts) * per, 1),
        "decode_us": round(totals["decode"] * per, 1),
        "send_and_lease_us": round(totals["send+lease"] * per, 1),
        "drain_other_us": round((result["drain_s"] - drain_parts) * per, 1),
        "server_scripts_us": round(server_us["total"] / args.n, 1),
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
