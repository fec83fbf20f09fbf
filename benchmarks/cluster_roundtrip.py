"""What the worker's acks-then-lease step costs on Redis Cluster (issue 15).

On one server a worker sends its acks (with the children they bring) and its next
lease as two scripts in one pipeline: one round trip. The cluster client refuses
scripts in a pipeline, so on a cluster the two go one after the other: two round
trips. This measures, side by side in one run, batches per second of the same step:

- ``single_pipelined``: one redis-server, ``enqueue_and_lease`` (one round trip);
- ``single_two_calls``: the same server, ``enqueue`` then ``lease`` (what the cluster
  path does, on the same server: the cost of the second round trip alone);
- ``cluster``: a 3-master cluster on loopback, ``enqueue_and_lease`` (two calls, plus
  the cluster client's own routing);
- ``proxied_pipelined`` / ``proxied_two_calls``: the first two through
  ``scrapy_redisspine.testing.latency_proxy`` (``--delay`` each way, ~1 ms round
  trip by default), where a round trip costs what it costs on a network. (The
  cluster cannot sit behind the proxy: its nodes announce their own ports and the
  client follows them.)

Each step acks ``--batch`` leases (each bringing one new request of its lane) and
leases ``--batch`` more; ``--lanes`` lanes, one request in flight per lane.

    .venv/bin/python benchmarks/cluster_roundtrip.py --steps 2000 --reps 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _step_rate(client: Any, crawl: str, steps: int, batch: int, *, lanes: int,
               pipelined: bool) -> float:
    from scrapy_redisspine.frontier import Frontier, NewRequest
    from scrapy_redisspine.keys import CrawlKeys

    frontier = Frontier(client, CrawlKeys("bench", crawl), "w1", concurrency=1)
    frontier.register(flush=True, alive_ms=30_000, spider="bench")
    serial = iter(range(10**9))

    def new(lane: int) -> NewRequest:
        n = next(serial)
        return NewRequest(b"http://h%d.example/p/%d" % (lane, n), b"fp-%d" % n,
                          lane=f"h{lane}")

    frontier.enqueue([new(i % lanes) for i in range(lanes * 2)])
    held = frontier.lease(batch).leases
    started = time.perf_counter()
    for _ in range(steps):
        children = [new(int(lease.lane[1:])) for lease in held]
        acks = [(lease.key, lease.token) for lease in held]
        if pipelined:
            _, leased = frontier.enqueue_and_lease(children, acks, batch)
        else:
            frontier.enqueue(children, acks)
            leased = frontier.lease(batch)
        held = leased.leases
        assert len(held) == batch, f"only {len(held)} leased: raise --lanes"
    return steps / (time.perf_counter() - started)


def measure(steps: int, reps: int, batch: int, lanes: int, delay: float) -> dict[str, Any]:
    from scrapy_redisspine.connection import client_from_url
    from scrapy_redisspine.testing.latency_proxy import LatencyProxy
    from scrapy_redisspine.testing.redis_cluster import ClusterServers
    from scrapy_redisspine.testing.redis_server import RedisServer

    rates: dict[str, list[float]] = {name: [] for name in (
        "single_pipelined", "single_two_calls", "cluster",
        "proxied_pipelined", "proxied_two_calls")}
    with RedisServer() as server, ClusterServers(masters=3) as cluster:
        assert server.port is not None
        proxy = LatencyProxy(server.port, delay).start()
        clients = {"single": client_from_url(server.url),
                   "cluster": client_from_url(cluster.url),
                   "proxied": client_from_url(proxy.url)}
        runs = [("single_pipelined", "single", True), ("single_two_calls", "single", False),
                ("cluster", "cluster", True), ("proxied_pipelined", "proxied", True),
                ("proxied_two_calls", "proxied", False)]
        try:
            for rep in range(reps):  # interleaved: a busy moment hurts every run alike
                for name, which, pipelined in runs:
                    rates[name].append(_step_rate(clients[which], f"{name}-{rep}", steps,
                                                  batch, lanes=lanes, pipelined=pipelined))
            rtt_ms = proxy.measured_rtt_ms()
        finally:
            for client in clients.values():
                client.close()
            proxy.stop()
    median = {name: statistics.median(values) for name, values in rates.items()}
    return {
        "steps": steps, "reps": reps, "batch": batch, "lanes": lanes,
        "proxy_delay_each_way_s": delay, "proxy_ping_rtt_ms": round(rtt_ms, 3),
        "steps_per_second_median": {k: round(v) for k, v in median.items()},
        "ratio_loopback_two_calls_to_pipelined": round(
            median["single_two_calls"] / median["single_pipelined"], 3),
        "ratio_loopback_cluster_to_single": round(
            median["cluster"] / median["single_pipelined"], 3),
        "ratio_proxied_two_calls_to_pipelined": round(
            median["proxied_two_calls"] / median["proxied_pipelined"], 3),
        "all": {k: [round(v) for v in values] for k, values in rates.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--lanes", type=int, default=100)
    parser.add_argument("--delay", type=float, default=0.0005,
                        help="latency proxy delay, seconds each way")
    args = parser.parse_args()
    print(json.dumps(measure(args.steps, args.reps, args.batch, args.lanes, args.delay),
                     indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
