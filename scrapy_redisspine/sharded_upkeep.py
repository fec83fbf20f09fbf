"""The upkeep of a sharded crawl: sweeps, dead letters, counts and purges that span
its shards (``sharded.py``), built from each shard's ``FrontierUpkeep`` and the one on
the crawl-wide keys.

Dead letters of a sharded crawl are named ``"<shard>/<order key>"``, as its leases
are: each shard numbers its own.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

from scrapy_redisspine._frontier_upkeep import (
    PURGED,
    SHARDS_LEFT,
    DeadLetter,
    FrontierUpkeep,
    MemoryReading,
)
from scrapy_redisspine._results import Count, SweepResult, UnindexedResult, number
from scrapy_redisspine.connection import routed_to

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    import redis

    from scrapy_redisspine.keys import CrawlKeys


logger = logging.getLogger("scrapy_redisspine.scheduler")


def _split(name: str) -> tuple[int, str]:
    shard, slash, own = name.partition("/")
    if not slash or not shard.isdigit():
        raise ValueError(f"{name!r} names no shard (expected 'shard/order key')")
    return int(shard), own


class ShardedUpkeep:
    """The upkeep calls of one worker (or tool) on a sharded crawl.

    Keys touched: every shard's (sweeps, dead letters, purge) and the crawl-wide
    ``workers`` (a dead worker leaves it once every shard's sweep took its leases).
    """

    def __init__(self, keys: CrawlKeys, crawl: FrontierUpkeep,
                 shards: list[FrontierUpkeep]) -> None:
        self.keys = keys
        self.crawl = crawl
        self.shards = shards

    @property
    def client(self) -> redis.Redis:
        return self.crawl.client

    @property
    def epoch(self) -> str:
        return self.crawl.epoch

    @property
    def worker_id(self) -> str:
        return self.crawl.worker_id

    def requeue_stale(self, *, timeout_ms: int, ceiling_ms: int, max_requeues: int,
                      limit: int = 1000, as_worker: bool = False, rest_ms: int = 0,
                      lane_rests: Mapping[str, int] | None = None) -> SweepResult:
        """Sweep every shard (``FrontierUpkeep.requeue_stale``, ``limit`` per shard).

        A dead worker leaves ``workers`` only once every shard's sweep took all its
        leases there (forget_workers.lua): one removed after the first shard's sweep
        would look like no worker to the next shards', its leases there stuck. On
        Redis Cluster each shard's sweep reads a copy of the heartbeats made just
        before (copy_workers.lua): a worker that beats between the copy and the sweep
        may be taken for dead, and its leases fetched again; none is lost.
        """
        if self.keys.cluster and self.keys.shards > 1:
            beats: list[tuple[bytes, float]] = self.crawl.client.zrange(  # type: ignore[assignment]
                self.keys.workers, 0, -1, withscores=True)
            pairs: list[bytes | str | int] = []
            for member, score in beats:
                pairs += [member, int(score)]
            for shard in self.shards:
                shard.run_script("copy_workers", pairs)
        results = [shard.requeue_stale(timeout_ms=timeout_ms, ceiling_ms=ceiling_ms,
                                       max_requeues=max_requeues, limit=limit,
                                       as_worker=as_worker, remove=False, rest_ms=rest_ms,
                                       lane_rests=lane_rests)
                   for shard in self.shards]
        everywhere = set(results[0].swept).intersection(*(r.swept for r in results[1:]))
        removed = 0
        if everywhere:
            removed = number(self.crawl.run_script(
                "forget_workers", [timeout_ms, *sorted(everywhere)]))
        return SweepResult(
            sum(r.requeued for r in results), sum(r.dead_lettered for r in results), removed,
            tuple(repair for r in results for repair in r.repairs), tuple(sorted(everywhere)))

    def counts(self) -> tuple[int, int]:
        """(queued, in flight), summed over the shards: for display, not a snapshot
        (termination reads the double collect: ``ShardedFrontier.collect``)."""
        totals = [shard.counts() for shard in self.shards]
        return sum(q for q, _ in totals), sum(i for _, i in totals)

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` dead letters of all shards, each field naming its shard."""
        letters: list[DeadLetter] = []
        for index, shard in enumerate(self.shards):
            for letter in shard.dead_letters(limit - len(letters)):
                letters.append(DeadLetter(f"{index}/{letter.field}", letter.reason,
                                          letter.lane, letter.payload))
            if len(letters) >= limit:
                break
        return letters

    def dead_letter_names(self, limit: int) -> list[str]:
        """Up to ``limit`` dead-letter names of all shards (``shard/field``)."""
        names: list[str] = []
        for index, shard in enumerate(self.shards):
            names += [f"{index}/{name}" for name in shard.dead_letter_names(limit - len(names))]
            if len(names) >= limit:
                break
        return names

    def reinject_dead(self, names: Iterable[str]) -> Count:
        """Put dead letters back in their shards' queues: how many."""
        return self._by_shard(names, lambda shard, own: shard.reinject_dead(own))

    def drop_dead(self, names: Iterable[str]) -> Count:
        return self._by_shard(names, lambda shard, own: shard.drop_dead(own))

    def _by_shard(self, names: Iterable[str], call: Callable[[FrontierUpkeep, list[str]],
                                                               Count]) -> Count:
        grouped: dict[int, list[str]] = {}
        for name in names:
            index, own = _split(name)
            grouped.setdefault(index, []).append(own)
        counts = [call(self.shards[index], own) for index, own in grouped.items()]
        return Count(sum(counts), tuple(r for count in counts for r in count.repairs))

    def check_key_types(self) -> None:
        """Every shard's keys and the crawl-wide ones (CorruptKeyError names one)."""
        self.crawl.check_key_types()
        for shard in self.shards:
            shard.check_key_types()

    def purge(self) -> int:
        """Delete the crawl: on one server one script (the crawl-wide view names every
        shard's keys); on a cluster the crawl's slot, then each shard's, each left
        with a tombstone so its workers' writes there are refused too."""
        deleted = self.crawl.purge()
        if self.keys.cluster and self.keys.shards > 1:
            for shard in self.shards:
                view = shard.keys
                named = (view.record, view.busy, view.group_busy)
                deleted += shard.purge_keys(
                    [*named, *(key for key in view.shard_keys() if key not in named)])
        return deleted

    def purge_if_done(self, epoch: str = "", alive_ms: int = 30_000) -> bool:
        """Delete the finished crawl (persistence off): True when nothing of it is
        left. On one server, one script checks every shard and deletes them all
        (FrontierUpkeep.purge_if_done). On a cluster the shards lie in other slots:
        the crawl's keys go first, but for its record, marked ``purging_ms`` in that
        same step; then each shard (:meth:`finish_purge`). A worker that registers
        before the record goes finishes the purge first (register.lua "purging"), so
        no worker ever joins a half-deleted crawl."""
        if not (self.keys.cluster and self.keys.shards > 1):
            return self.crawl.purge_if_done(epoch, alive_ms)
        step = self.crawl.purge_if_done_step(epoch, alive_ms, keep_record=True)
        return step == SHARDS_LEFT and self.finish_purge(epoch, alive_ms)

    def finish_purge(self, epoch: str, alive_ms: int = 30_000) -> bool:
        """Delete the shards of a crawl marked ``purging_ms``, then its record: by its
        last worker, or by a worker registering after that one died or froze midway.
        Each shard goes only while its record copy holds ``epoch`` (purge_shard.lua),
        so a late call never deletes the work of a crawl started afresh. A shard
        that holds work (a request pushed meanwhile) is kept, and so is the crawl:
        its mark cleared, its work there for the next run (the shards checked first,
        so that this leaves the crawl whole but in a race with a push)."""
        checks = [shard.purge_shard(epoch, check=True) for shard in self.shards]
        if 0 not in checks:
            checks = [shard.purge_shard(epoch) for shard in self.shards]
        if 0 in checks:
            self.client.hdel(self.keys.record, "purging_ms")
            logger.warning(
                "redisspine: crawl %r not deleted (persistence off): a shard holds "
                "requests pushed while it was finishing; they stay for the next run",
                self.keys.crawl_id)
            return False
        return self.crawl.purge_if_done_step(epoch, alive_ms) == PURGED

    def repair_unindexed(self, cursor: str = "0", limit: int = 100, *, timeout_ms: int,
                         max_requeues: int, rest_ms: int = 0,
                         lane_rests: Mapping[str, int] | None = None) -> UnindexedResult:
        """One bounded step of ``FrontierUpkeep.repair_unindexed``, through the shards
        one after the other: the cursor is ``"<shard>:<shard's cursor>"`` ("0": start
        at shard 0; the result's "0": a pass over every shard is done). A cursor that
        is not one (another layout's) starts a pass again."""
        shard, _, own = cursor.partition(":")
        index = int(shard) if shard.isdigit() and own else 0
        if index >= len(self.shards):
            index, own = 0, "0"
        result = self.shards[index].repair_unindexed(
            own or "0", limit, timeout_ms=timeout_ms, max_requeues=max_requeues,
            rest_ms=rest_ms, lane_rests=lane_rests)
        if result.cursor != "0":
            after = f"{index}:{result.cursor}"
        elif index + 1 < len(self.shards):
            after = f"{index + 1}:0"
        else:
            after = "0"
        return dataclasses.replace(result, cursor=after)

    def read_fleet_stats(self) -> tuple[dict[str, int], list[str]]:
        """The crawl's counters: each shard's (enqueued, leased, acked ...) and the
        crawl-wide ones (shed, scraped, spider errors: ``count_limits``), summed;
        and the names of fields that held no integer."""
        counters: dict[str, int] = {}
        bad: list[str] = []
        for part in (self.crawl, *self.shards):
            these, wrong = part.read_fleet_stats()
            for name, value in these.items():
                counters[name] = counters.get(name, 0) + value
            bad += [name for name in wrong if name not in bad]
        return counters, bad

    def fleet_stats(self) -> dict[str, int]:
        return self.read_fleet_stats()[0]

    def workers_alive(self, timeout_ms: int) -> int:
        return self.crawl.workers_alive(timeout_ms)

    def memory(self) -> MemoryReading:
        """The use and limit of the fullest server the crawl lives on: on one server,
        that server's; on Redis Cluster, of the masters that hold its shards, the one
        nearest its maxmemory (or the one using most, if none has one); evicting if
        any of them may evict the crawl's keys."""
        if not self.keys.cluster:
            return self.crawl.memory()
        readings: list[MemoryReading] = []
        seen: set[str] = set()
        for part in (self.crawl, *self.shards):
            node = str(routed_to(self.client, part.keys.queue).get("target_nodes", ""))
            if node in seen:
                continue
            seen.add(node)
            readings.append(part.memory())
        fullest = max(readings, key=lambda reading: (
            reading.used / reading.maxmemory if reading.maxmemory else 0.0, reading.used))
        evicting = next((reading.evicting for reading in readings if reading.evicting), "")
        return dataclasses.replace(fullest, evicting=evicting)

    def record_progress(self, worker_acks: int, fleet_acks: int) -> None:
        self.crawl.record_progress(worker_acks, fleet_acks)

    def count_limits(self, items: int, errors: int, *, item_limit: int, error_limit: int,
                     timeout_ms: int) -> str:
        """On the crawl-wide keys (its stats, control and record)."""
        return self.crawl.count_limits(items, errors, item_limit=item_limit,
                                       error_limit=error_limit, timeout_ms=timeout_ms)

    def group_crawls(self, limit: int) -> list[str]:
        return self.crawl.group_crawls(limit)

    def of_crawl(self, crawl_id: str) -> Any:
        return self.crawl.of_crawl(crawl_id)


def sharded_upkeep(client: redis.Redis, keys: CrawlKeys, worker_id: str, *,
                   concurrency: int = 1, epoch: str = "") -> ShardedUpkeep:
    """The upkeep of a sharded crawl for a worker or tool that holds no frontier of it
    (a sweep of another crawl of the politeness group), with its epoch."""
    crawl = FrontierUpkeep(client, keys, worker_id, concurrency=concurrency,
                           sharded=sharded_upkeep)
    shards = [FrontierUpkeep(client, view, worker_id, concurrency=concurrency)
              for view in keys.shard_views()]
    for part in (crawl, *shards):
        part.epoch = epoch
    return ShardedUpkeep(keys, crawl, shards)

