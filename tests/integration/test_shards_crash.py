"""A sharded crawl driven by several worker processes through the core, one of them
SIGKILLed while it holds leases in several shards: its leases come back from every
shard, every page of the link graph is processed exactly once (from the workers'
own logs of what they processed), and the fleet ends only when the work is done
(the double collect), on one redis-server (3 shards) and on a 3-master cluster (6)."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine.connection import client_from_url, is_cluster
from scrapy_redisspine.frontier import NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.sharded import ShardedFrontier
from scrapy_redisspine.testing.redis_cluster import ClusterServers
from scrapy_redisspine.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from collections.abc import Iterator

PAGES = 400
LANES = 23
TIMEOUT_MS = 1500
ALIVE_MS = 1500


def _links(page: int) -> list[int]:
    """Every page is reachable from page 0 (page + 1), and most are linked more than
    once (dedup in each lane's shard)."""
    return [(page + 1) % PAGES, (page * 7 + 3) % PAGES, (page * 13 + 5) % PAGES]


def _request(page: int) -> NewRequest:
    url = f"http://h{page % LANES}.test/{page}".encode()
    return NewRequest(url, hashlib.sha1(url).digest(), lane=f"h{page % LANES}.test")


def _page(payload: bytes) -> int:
    return int(payload.rsplit(b"/", 1)[1])


def _frontier(url: str, crawl: str, shards: int, worker: str) -> ShardedFrontier:
    client = client_from_url(url)
    keys = CrawlKeys("crash", crawl, cluster=is_cluster(client), shards=shards)
    return ShardedFrontier(client, keys, worker, concurrency=2)


def _work(job: dict[str, Any]) -> None:
    """A worker: lease, log each page processed, ack it with its links; sweep dead
    workers now and then; stop when the fleet has nothing left. ``die_after``: after
    that many pages, lease once more and SIGKILL itself holding the leases."""
    frontier = _frontier(job["url"], job["crawl"], job["shards"], job["worker"])
    frontier.register(flush=False, alive_ms=ALIVE_MS, spider="crash")
    frontier.done_starting()
    done, swept_at = 0, 0.0
    with open(job["log"], "a", encoding="ascii") as log:
        while True:
            frontier.heartbeat()
            dying = job["die_after"] and done >= job["die_after"]
            # One shard holds at most ~16 free slots: a batch of 40 spans shards.
            batch = frontier.lease(40 if dying else 5).leases
            if dying and len({lease.key.split("/")[0] for lease in batch}) > 1:
                os.kill(os.getpid(), signal.SIGKILL)
            if time.monotonic() - swept_at > 0.3:
                frontier.upkeep.requeue_stale(timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=5,
                                       as_worker=True)
                swept_at = time.monotonic()
            if not batch:
                counts = frontier.fleet_counts(ALIVE_MS)
                if counts.ever and not counts.has_work:
                    break
                time.sleep(0.02)
                continue
            children = []
            for lease in batch:
                log.write(f"{_page(lease.payload)}\n")
                children += [_request(page) for page in _links(_page(lease.payload))]
            log.flush()
            sent = frontier.enqueue(children, [lease.handle for lease in batch])
            assert sent.acked == len(batch), sent
            done += len(batch)
    frontier.leave()


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterServers]:
    with ClusterServers(masters=3) as servers:
        yield servers


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as one:
        yield one


@pytest.mark.e2e
@pytest.mark.parametrize(("where", "shards"), [("server", 3), ("cluster", 6)])
def test_a_killed_worker_of_a_sharded_crawl_loses_nothing(
    where: str, shards: int, request: pytest.FixtureRequest, tmp_path: Path,
) -> None:
    url = request.getfixturevalue(where).url
    crawl = f"crash-{where}"
    seeder = _frontier(url, crawl, shards, "seeder")
    seeder.register(flush=True, alive_ms=ALIVE_MS, spider="crash")
    seeder.enqueue([_request(0)])
    seeder.leave()
    context = multiprocessing.get_context("spawn")
    jobs = [{"url": url, "crawl": crawl, "shards": shards, "worker": f"w{i}",
             "log": str(tmp_path / f"w{i}.log"), "die_after": 10 if i == 0 else 0}
            for i in range(3)]
    processes = [context.Process(target=_work, args=(job,)) for job in jobs]
    # The victim first: it processes some pages alone, then dies holding leases of
    # several shards (always: nobody else takes them first); the others start then.
    processes[0].start()
    processes[0].join(timeout=120)
    for process in processes[1:]:
        process.start()
    for process in processes[1:]:
        process.join(timeout=180)
    assert [process.exitcode for process in processes] == [-signal.SIGKILL, 0, 0]
    processed = [int(line) for job in jobs
                 for line in Path(job["log"]).read_text(encoding="ascii").split()]
    left = seeder.collect()
    assert sorted(processed) == list(range(PAGES)), "each page processed exactly once"
    assert left.idle, left
    for view in seeder.keys.shard_views():
        assert not seeder.client.exists(view.dead)
    # The sweep that took its leases may have seen it stale in some shards only (its
    # heartbeat aged past the timeout between two shards' calls): it stays listed,
    # holding nothing, until a sweep finds it stale in every shard.
    seeder.upkeep.requeue_stale(timeout_ms=TIMEOUT_MS, ceiling_ms=0, max_requeues=5)
    assert seeder.client.zscore(seeder.keys.workers, "w0") is None
