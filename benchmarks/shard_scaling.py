"""Does sharding one crawl divide its Redis load over the masters? (issue 15)

One crawl is driven through the core directly (``ShardedFrontier``, no Scrapy) by
``--workers`` processes, each looping: lease ``--batch`` requests, ack them, each
ack bringing one new request of its lane (a steady crawl of ``--lanes`` lanes, one
request in flight per lane). Side by side in one run, interleaved ``--reps`` times:

- ``single``: one redis-server, the crawl unsharded (REDISSPINE_SHARDS = 1);
- ``cluster``: a 3-master Redis Cluster on loopback, the crawl over ``--shards``
  shards (6 by default). Which master a shard's tag ``{C/i}`` lands on follows from
  the crawl id; ``--placement even`` (the default) takes ids whose shards spread two
  per master, ``--placement any`` the first ids however they fall (a master holding
  more shards carries that much more of the load).

For each: pages (acks) per second, and Redis CPU per page on each master (the
delta of ``INFO cpu`` used_cpu_sys + used_cpu_user over the run, divided by the
pages the whole fleet acked). What sharding must show is the busiest master's CPU
per page falling by about the number of masters: one master then carries that
share of the fleet. On 2 shared cores the absolute rates are small (the workers,
the masters and the client libraries share them), so the ratios are the result.

    .venv/bin/python benchmarks/shard_scaling.py --seconds 5 --reps 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _worker(job: dict[str, Any], done: Any) -> None:
    """One worker process: lease, ack with one child each, until the time is up."""
    from scrapy_redisspine.connection import client_from_url, is_cluster
    from scrapy_redisspine.frontier import NewRequest
    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.sharded import ShardedFrontier

    url, crawl, shards, worker = job["url"], job["crawl"], job["shards"], job["worker"]
    seconds, batch, start_at = job["seconds"], job["batch"], job["start_at"]
    client = client_from_url(url)
    keys = CrawlKeys("bench", crawl, cluster=is_cluster(client), shards=shards)
    frontier = ShardedFrontier(client, keys, worker, concurrency=1)
    frontier.register(flush=False, alive_ms=60_000, spider="bench")
    serial = iter(range(10**9))
    while time.time() < start_at:
        time.sleep(0.001)
    pages, held = 0, frontier.lease(batch).leases
    until = start_at + seconds
    while time.time() < until:
        children = []
        for lease in held:
            url = b"http://%s/%s/%d" % (lease.lane.encode(), worker.encode(), next(serial))
            children.append(NewRequest(url, hashlib.sha1(url).digest(), lane=lease.lane))
        sent, batch_ = frontier.enqueue_and_lease(children, [lease.handle for lease in held],
                                                  batch)
        assert not isinstance(sent, Exception), sent
        pages += sent.acked
        held = batch_.leases
    frontier.release([lease.handle for lease in held])
    client.close()
    done.put(pages)


def _cpu(port: int) -> float:
    import redis

    with redis.Redis(port=port) as node:
        info = node.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _run(url: str, ports: list[int], crawl: str, shards: int, args: argparse.Namespace
         ) -> dict[str, Any]:
    from scrapy_redisspine.connection import client_from_url, is_cluster
    from scrapy_redisspine.frontier import NewRequest
    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.sharded import ShardedFrontier

    client = client_from_url(url)
    seeder = ShardedFrontier(client, CrawlKeys("bench", crawl, cluster=is_cluster(client),
                                               shards=shards), "seeder", concurrency=1)
    seeder.register(flush=True, alive_ms=60_000, spider="bench")
    seeder.enqueue([NewRequest(b"http://h%d.example/" % lane, b"seed-%d" % lane,
                               lane=f"h{lane}.example") for lane in range(args.lanes)])
    seeder.leave()
    context = multiprocessing.get_context("spawn")
    done = context.Queue()
    start_at = time.time() + 3.0  # every process imported and registered by then
    processes = [context.Process(target=_worker, args=(
        {"url": url, "crawl": crawl, "shards": shards, "worker": f"w{i}",
         "seconds": args.seconds, "batch": args.batch, "start_at": start_at}, done))
        for i in range(args.workers)]
    for process in processes:
        process.start()
    while time.time() < start_at:
        time.sleep(0.001)
    before = [_cpu(port) for port in ports]
    pages = sum(done.get(timeout=args.seconds + 60) for _ in processes)
    after = [_cpu(port) for port in ports]
    for process in processes:
        process.join()
    # Each page brought one request: the crawl holds as many as it was seeded with.
    left = seeder.collect()
    client.close()
    cpu = [b - a for a, b in zip(before, after, strict=True)]
    return {
        "left_queued_inflight": [left.queued, left.inflight],
        "pages_per_second": pages / args.seconds,
        "cpu_us_per_page_per_master": [1e6 * c / max(pages, 1) for c in cpu],
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from scrapy_redisspine.testing.redis_cluster import ClusterServers
    from scrapy_redisspine.testing.redis_server import RedisServer

    runs: dict[str, list[dict[str, Any]]] = {"single": [], "cluster": []}
    with RedisServer() as server, ClusterServers(masters=3) as cluster:
        assert server.port is not None
        masters = [int(master.port) for master in cluster.masters if master.port]
        crawls = _crawl_ids(args.reps, args.shards, args.placement)
        for rep in range(args.reps):  # interleaved: a busy moment hurts both alike
            runs["single"].append(_run(server.url, [server.port], f"single-{rep}", 1, args))
            runs["cluster"].append(_run(cluster.url, masters, crawls[rep], args.shards, args))
    summary = _summary(runs, args)
    summary["cluster_crawls_shards_per_master"] = {
        crawl: _placement(crawl, args.shards) for crawl in crawls}
    return summary


def _placement(crawl: str, shards: int) -> list[int]:
    """How many of the crawl's shards each master holds (ClusterServers splits the
    slots evenly over 3 masters, in order)."""
    from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

    from scrapy_redisspine.keys import CrawlKeys

    count = [0, 0, 0]
    for view in CrawlKeys("bench", crawl, cluster=True, shards=shards).shard_views():
        count[key_slot(view.queue.encode()) * 3 // REDIS_CLUSTER_HASH_SLOTS] += 1
    return count


def _crawl_ids(reps: int, shards: int, placement: str) -> list[str]:
    """Crawl ids for the cluster runs. The masters a crawl's shards land on follow
    from its id (CRC16 of each ``{C/i}`` tag): "even" takes ids whose shards spread
    as evenly as they can (what the per-master division is about), "any" the first
    ids, however they fall (what an id picked blindly gets)."""
    found: list[str] = []
    for n in range(10_000):
        crawl = f"sharded-{n}"
        spread = _placement(crawl, shards)
        if placement == "any" or max(spread) - min(spread) <= (1 if shards % 3 else 0):
            found.append(crawl)
        if len(found) == reps:
            return found
    raise AssertionError("no crawl id with an even placement")


def _summary(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace
             ) -> dict[str, Any]:
    def median(name: str, pick: Any) -> float:
        return statistics.median(pick(run) for run in runs[name])

    single_rate = median("single", lambda r: r["pages_per_second"])
    cluster_rate = median("cluster", lambda r: r["pages_per_second"])
    single_cpu = median("single", lambda r: r["cpu_us_per_page_per_master"][0])
    busiest = median("cluster", lambda r: max(r["cpu_us_per_page_per_master"]))
    per_master = [round(statistics.median(run["cpu_us_per_page_per_master"][i]
                                          for run in runs["cluster"]), 1) for i in range(3)]
    return {
        "workers": args.workers, "batch": args.batch, "lanes": args.lanes,
        "seconds": args.seconds, "reps": args.reps, "shards": args.shards,
        "pages_per_second_median": {"single": round(single_rate),
                                    "cluster": round(cluster_rate)},
        "redis_cpu_us_per_page": {"single_master": round(single_cpu, 1),
                                  "cluster_per_master": per_master,
                                  "cluster_busiest_master": round(busiest, 1),
                                  "cluster_sum": round(sum(per_master), 1)},
        "ratio_busiest_master_cluster_to_single": round(busiest / single_cpu, 3),
        "pages_per_second_one_master_at_full_cpu": {
            "single": round(1e6 / single_cpu), "cluster_busiest": round(1e6 / busiest)},
        "all": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--lanes", type=int, default=400)
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument("--placement", choices=("even", "any"), default="even",
                        help="cluster crawl ids whose shards spread evenly, or any")
    args = parser.parse_args()
    print(json.dumps(measure(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
