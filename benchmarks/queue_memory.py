"""Redis memory per queued request, and what each byte is for (issue 19).

Enqueues N plain GETs (``http://h<i % hosts>.example/p/<i>``, as
``scheduler_micro.py`` does) through this plugin's scheduler on a throwaway
redis-server, then reports ``used_memory`` growth / N (the figure of
``scheduler_micro.py``), ``MEMORY USAGE`` of each key that grew, per request (a
queue's lists, one per lane and priority, summed as one line), and the sizes of
what a queued request is stored as: a list item (its payload) or a ZSET member. The
scripts are loaded before the measurement starts, so their cache (a fixed ~57 kB, not
a per-request cost) is left out; ``--cold`` keeps it in.

    .venv/bin/python benchmarks/queue_memory.py --n 100000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.scheduler_micro import _requests, _settings  # noqa: E402
from scrapy_redisspine.testing.engine import StandInEngine  # noqa: E402


def measure(n: int, hosts: int, cold: bool) -> dict[str, Any]:
    import scrapy
    from scrapy.utils.test import get_crawler

    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.scheduler import Scheduler
    from scrapy_redisspine.testing.redis_server import RedisServer

    class BenchSpider(scrapy.Spider):
        name = "bench"

    with RedisServer() as server:
        client = server.client()
        kwargs = client.connection_pool.connection_kwargs
        url = f"redis://{kwargs['host']}:{kwargs['port']}/0"
        crawler = get_crawler(BenchSpider, _settings("spine", url, ""))
        spider = BenchSpider.from_crawler(crawler)
        crawler.spider = spider
        scheduler = Scheduler.from_crawler(crawler, engine=StandInEngine())
        scheduler.open(spider)
        requests = _requests(n + 1, hosts)
        if not cold:  # load the enqueue script: its cache is no per-request cost
            scheduler.enqueue_request(requests.pop())
            scheduler.outbox.try_flush()
        keys_before = {key: client.memory_usage(key, samples=0) or 0 for key in client.scan_iter()}
        before = int(client.info("memory")["used_memory"])
        for request in requests[:n]:
            scheduler.enqueue_request(request)
        scheduler.outbox.try_flush()
        grown = int(client.info("memory")["used_memory"]) - before
        queue = CrawlKeys("redisspine", "micro").queue.encode()
        per_key: dict[str, dict[str, Any]] = {}
        items: list[bytes] = []
        for key in sorted(client.scan_iter()):
            size = (client.memory_usage(key, samples=0) or 0) - keys_before.get(key, 0)
            if not size:
                continue
            encoding = client.object("encoding", key).decode()
            if key.startswith(queue + b":"):  # one of the queue's lists
                name, items = "queue lists", items + client.lrange(key, 0, 99)
            else:
                name = key.decode().rsplit(":", 1)[-1]
            entry = per_key.setdefault(name, {"encoding": encoding, "keys": 0,
                                              "bytes_per_request": 0.0})
            entry["keys"] += 1
            entry["bytes_per_request"] += size / n
        members = client.zrange(queue, 0, -1)
        scheduler.close("finished")
        client.close()
    stored = items or members
    return {"n": n, "hosts": hosts, "used_memory_bytes_per_request": grown / n,
            "keys": per_key, "queue_zset_members": len(members),
            "stored_as": "list items" if items else "zset members",
            "stored_bytes_mean": statistics.mean(map(len, stored)),
            "stored_example": repr(stored[0])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--cold", action="store_true", help="count the script cache too")
    args = parser.parse_args()
    result = measure(args.n, args.hosts, args.cold)
    print(json.dumps(result))
    print(f"used_memory growth: {result['used_memory_bytes_per_request']:.1f} B per queued "
          f"request (N={args.n}, {args.hosts} hosts); stored as {result['stored_as']} of "
          f"{result['stored_bytes_mean']:.1f} B on average, e.g. {result['stored_example']}; "
          f"{result['queue_zset_members']} queue ZSET members")
    for name, key in result["keys"].items():
        print(f"  {name} ({key['keys']} key(s), {key['encoding']}): "
              f"{key['bytes_per_request']:.1f} B per request (MEMORY USAGE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
