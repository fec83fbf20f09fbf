"""Where the scheduler micro-benchmark's time goes, for the spine only.

Runs ``scheduler_micro.child("spine", ...)`` once on a throwaway redis-server with
timers around the parts that cost the most, and reads Redis's own account of its
script time (``INFO commandstats``), per request:

- ``fingerprint``, ``encode``, ``decode``: client work per request;
- ``send`` (enqueue phase) and ``send+lease`` (drain phase): wall time of the Redis
  calls, round trip and server time included;
- ``server``: EVALSHA time inside Redis (the scripts), per phase;
- ``other``: the rest of the scheduler's own Python.

With ``--by-script``, Redis logs every command it runs (``SLOWLOG``, threshold 0) and
the report adds each script's server µs per request (``lease``, ``enqueue``: the
enqueues and the acks) and, by name, the commands the scripts called (their time is
part of their script's); logging every command slows the run a little.

    .venv/bin/python benchmarks/micro_breakdown.py --n 10000
    .venv/bin/python benchmarks/micro_breakdown.py --n 10000 --by-script
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
    parser.add_argument("--by-script", action="store_true",
                        help="server µs per request of each script and command (SLOWLOG)")
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
        if args.by_script:
            client.config_set("slowlog-log-slower-than", 0)
            client.config_set("slowlog-max-len", 50 * args.n)
        result = scheduler_micro.child("spine", args.n, args.hosts, server.url)
        server_us["total"] = client.info("commandstats")["cmdstat_evalsha"]["usec"]
        by_script = _by_script(client.slowlog_get(50 * args.n), args.n) if args.by_script else {}
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
        **({"server_us_by_script": by_script} if args.by_script else {}),
    }
    print(json.dumps(report))
    return 0


def _by_script(log: list[dict[str, Any]], n: int) -> dict[str, float]:
    """Server µs per request of each script (by name) and each other command, from
    the SLOWLOG entries of a run of ``n`` requests, largest first."""
    import hashlib

    from scrapy_redisspine import scripts

    names = {hashlib.sha1(scripts.source(name).encode()).hexdigest(): name
             for name in scripts.SCRIPT_NAMES}
    totals: dict[str, float] = defaultdict(float)
    for entry in log:
        words = entry["command"].split(b" ")
        name = words[0].decode(errors="replace").upper()
        if name == "EVALSHA" and len(words) > 1:
            name = names.get(words[1].decode(errors="replace"), "EVALSHA ?")
        totals[name] += entry["duration"]
    return {name: round(us / n, 2)
            for name, us in sorted(totals.items(), key=lambda item: -item[1]) if us / n >= 0.05}


if __name__ == "__main__":
    sys.exit(main())
