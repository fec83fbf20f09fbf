"""The upkeep of a sharded crawl: sweeps, dead letters, counts and purges that span
its shards (``sharded.py``), built from each shard's ``FrontierUpkeep`` and the one on
the crawl-wide keys.

Dead letters of a sharded crawl are named ``"<shard>/<order key>"``, as its leases
are: each shard numbers its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_redisspine._frontier_upkeep import DeadLetter
from scrapy_redisspine._results import Count, SweepResult, number

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy_redisspine._frontier_upkeep import FrontierUpkeep
    from scrapy_redisspine.keys import CrawlKeys


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

    def requeue_stale(self, *, timeout_ms: int, ceiling_ms: int, max_requeues: int,
                      limit: int = 1000, as_worker: bool = False) -> SweepResult:
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
                                       as_worker=as_worker, remove=False)
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
