"""The frontier's upkeep: key checks, sweeps, dead letters, fleet counters, purging.

What keeps a crawl healthy rather than moving requests on the hot path (enqueue,
lease, ack, release, in ``frontier.py``): its own object, held by a ``Frontier`` as
``frontier.upkeep`` and handed to the extensions through the worker's view, so they
see the upkeep calls and nothing of the hot path. Scrapy-free.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from scrapy_redisspine._results import (
    Count,
    SweepResult,
    UnindexedResult,
    count_result,
    fields,
    number,
    repairs_of,
    text,
)
from scrapy_redisspine.connection import evicting_policy, routed_to
from scrapy_redisspine.control import record_progress
from scrapy_redisspine.members import (
    execute_reading_counts,
    queue_size,
    read_queue_size,
    split_member,
)
from scrapy_redisspine.scripts import ScriptSet

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    import redis

    from scrapy_redisspine.keys import CrawlKeys

#: Redis type each key must have when it exists (``TYPE`` reply).
#: purge_if_done.lua's replies: the crawl is gone; all but its record is, and its
#: shards are to go (a sharded crawl on a cluster, sharded_upkeep.py).
PURGED, SHARDS_LEFT = 2, 3

EXPECTED_TYPES = {
    "queue": b"zset",
    "hosts": b"zset",
    "busy": b"hash",
    "group_busy": b"hash",
    "backlog": b"hash",
    "host_next": b"hash",
    "host_delay": b"hash",
    "inflight": b"hash",
    "leases": b"zset",
    "owned": b"zset",
    "requeues": b"hash",
    "seq": b"string",
    "seen": b"set",
    "dedup": b"hash",
    "starts": b"set",
    "dead": b"hash",
    "workers": b"zset",
    "stats": b"hash",
    "control": b"hash",
    "fleet_stats": b"hash",
    "progress": b"zset",
    "record": b"hash",
    "starting": b"zset",
    "lane_limits": b"hash",
    "lane_throttle": b"hash",
    "lane_pages": b"hash",
    "items": b"stream",
    "page_holds": b"hash",
}


class CorruptKeyError(RuntimeError):
    """A crawl key holds a value of the wrong Redis type."""


@dataclass(frozen=True)
class DeadLetter:
    field: str
    reason: str
    lane: str
    payload: bytes


@dataclass(frozen=True)
class MemoryReading:
    """What ``INFO memory`` says of a server the crawl lives on."""

    used: int  # used_memory, bytes
    maxmemory: int  # bytes; 0: no limit
    #: Its ``maxmemory-policy`` when it may evict the crawl's keys, else ""
    #: (:func:`~scrapy_redisspine.connection.evicting_policy`).
    evicting: str = ""


class ShardedUpkeepFactory(Protocol):
    """Builds the upkeep of a sharded crawl (``sharded_upkeep.sharded_upkeep``), for a
    sweep of another crawl of the politeness group; given to FrontierUpkeep by who
    composes it, so this module needs nothing of the sharded one."""

    def __call__(self, client: redis.Redis, keys: CrawlKeys, worker_id: str, *,
                 concurrency: int = 1, epoch: str = "") -> Any: ...


class FrontierUpkeep:
    """The upkeep calls on one crawl's frontier, for one worker (or tool) id.

    ``Frontier`` holds one as ``frontier.upkeep`` (sharing its scripts); tools that
    only look after a crawl (the CLI, a sweep) may build one on their own.

    Keys touched: every key of the crawl (checks, purge), and for the sweep
    workers, owned, inflight, leases, queue, dead, requeues, stats and the lane keys.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: CrawlKeys,
        worker_id: str,
        *,
        concurrency: int = 1,
        scripts: ScriptSet | None = None,
        sharded: ShardedUpkeepFactory | None = None,
    ) -> None:
        """``sharded``: how to build the upkeep of a sharded crawl of the group
        (without it, such a crawl is not swept from here)."""
        self.client = client
        self.keys = keys
        self.worker_id = worker_id
        self.concurrency = concurrency
        self._scripts = scripts if scripts is not None else ScriptSet(client, keys)
        self.epoch = ""  # the crawl's identity, when a registered worker holds this
        self._sharded = sharded

    def run_script(self, name: str, args: Sequence[bytes | str | int]) -> Any:
        """Run one script on these keys: for an upkeep composed of several
        (sharded_upkeep.py), whose sweeps span its parts."""
        return self._scripts.run(name, args)

    def check_key_types(self) -> None:
        """Fail early, naming the key, if a crawl key holds the wrong type."""
        pipe = self.client.pipeline(transaction=False)
        names = list(EXPECTED_TYPES)
        for name in names:
            pipe.type(getattr(self.keys, name))
        for name, reply in zip(names, pipe.execute(), strict=True):
            found = reply.encode() if isinstance(reply, str) else reply
            if found not in (b"none", EXPECTED_TYPES[name]):
                key = getattr(self.keys, name)
                raise CorruptKeyError(
                    f"Redis key {key!r} holds a {found.decode()}, expected a "
                    f"{EXPECTED_TYPES[name].decode()}; it was not written by "
                    f"scrapy_redisspine. Delete it or use another crawl id."
                )

    def requeue_stale(
        self,
        *,
        timeout_ms: int,
        ceiling_ms: int,
        max_requeues: int,
        limit: int = 1000,
        rest_ms: int = 0,
        lane_rests: Mapping[str, int] | None = None,
        as_worker: bool = False,
        remove: bool = True,
    ) -> SweepResult:
        """Requeue leases of silent workers and leases past the ceiling (any worker).

        A requeued request's lane rests ``rest_ms`` (its lane's own in ``lane_rests``),
        and at least its robots.txt Crawl-delay: the dead worker may have been
        fetching from it. ``as_worker``: the sweeper is a heartbeating worker of the
        crawl; if its own heartbeat is as old as a dead one's, the whole fleet stalled
        (a frozen Redis) and nobody is taken for dead. ``remove=False`` (one shard of
        a sharded crawl) keeps swept workers listed: they are in ``result.swept``.
        """
        args: list[str | int] = [self.epoch, timeout_ms, ceiling_ms, max_requeues, limit,
                                 self.concurrency, rest_ms,
                                 self.worker_id if as_worker else "", "1" if remove else "0",
                                 *_pairs(lane_rests)]
        requeued, dead, removed, repairs, swept = fields(
            self._scripts.run("requeue_stale", args), 5)
        return SweepResult(number(requeued), number(dead), number(removed), repairs_of(repairs),
                           tuple(text(worker) for worker in swept)
                           if isinstance(swept, list) else ())

    def repair_unindexed(
        self,
        cursor: str = "0",
        limit: int = 100,
        *,
        timeout_ms: int,
        max_requeues: int,
        rest_ms: int = 0,
        lane_rests: Mapping[str, int] | None = None,
    ) -> UnindexedResult:
        """One bounded step over in-flight entries and their indexes (any worker).

        An in-flight entry without its index entries (no sweep would ever find it) is
        indexed again if its owner heartbeats within ``timeout_ms``, else requeued as
        :meth:`requeue_stale` would (same ``max_requeues``, ``rest_ms``,
        ``lane_rests``); an index entry pointing to no lease is removed. Start with
        cursor "0" and pass each result's ``cursor`` to the next call; a pass is done
        when it comes back "0". ``limit`` is the COUNT of the step's HSCAN/ZSCAN.
        """
        args: list[str | int] = [self.epoch, cursor, limit, timeout_ms, max_requeues,
                                 self.concurrency,
                                 rest_ms, *_pairs(lane_rests)]
        reply = self._scripts.run("repair_unindexed", args)
        next_cursor, requeued, dead, reindexed, removed, repairs = fields(reply, 6)
        return UnindexedResult(text(next_cursor) or "0", number(requeued), number(dead),
                               number(reindexed), number(removed), repairs_of(repairs))

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """Up to ``limit`` dead letters (HSCAN: never blocks Redis on a big crawl)."""
        letters: list[DeadLetter] = []
        for field, value in self.client.hscan_iter(self.keys.dead, count=limit):
            reason, _, member = value.partition(b"\n")  # a value not written here: all reason
            try:
                lane, _, payload = split_member(member)
            except (ValueError, UnicodeDecodeError):
                lane, payload = "", member
            letters.append(
                DeadLetter(field.decode(), reason.decode(errors="replace"), lane, payload)
            )
            if len(letters) >= limit:
                break
        return letters

    def reinject_dead(self, names: Iterable[str]) -> Count:
        """Put dead letters back in the queue with a fresh requeue budget: how many."""
        names = list(names)
        if not names:
            return Count(0)
        return count_result(
            self._scripts.run("reinject_dead", [self.epoch, self.concurrency, *names])
        )

    def drop_dead(self, names: Iterable[str]) -> Count:
        """Remove dead letters for good (and their requeue counts): how many were."""
        names = list(names)
        if not names:
            return Count(0)
        return count_result(self._scripts.run("drop_dead", [self.epoch, *names]))

    def dead_letter_names(self, limit: int) -> list[str]:
        """Up to ``limit`` dead-letter fields (HSCAN; NOVALUES needs Redis 7.4)."""
        names: list[str] = []
        for field, _ in self.client.hscan_iter(self.keys.dead, count=limit):
            names.append(text(field))
            if len(names) >= limit:
                break
        return names

    def counts(self) -> tuple[int, int]:
        """(queued, in flight) fleet-wide, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        counts_at = read_queue_size(pipe, self.keys.queue, self.keys.queue_counts)
        pipe.hlen(self.keys.inflight)
        zcard, listed, inflight = execute_reading_counts(pipe, (counts_at,))
        return queue_size(zcard, listed), int(inflight)

    def fleet_stats(self) -> dict[str, int]:
        """The crawl's fleet-wide counters (a small HASH of a dozen fields); a field
        that holds no integer is left out (see :meth:`read_fleet_stats`)."""
        return self.read_fleet_stats()[0]

    def read_fleet_stats(self) -> tuple[dict[str, int], list[str]]:
        """(the counters, the names of fields that hold no integer and were skipped:
        the next script to count one repairs it)."""
        raw: dict[bytes, bytes] = self.client.hgetall(self.keys.stats)  # type: ignore[assignment]
        counters: dict[str, int] = {}
        bad: list[str] = []
        for name, value in raw.items():
            counter = number(value, -1)
            if counter >= 0:
                counters[text(name)] = counter
            else:
                bad.append(text(name))
        return counters, bad

    def workers_alive(self, timeout_ms: int) -> int:
        """Workers whose last heartbeat is younger than ``timeout_ms`` (server time)."""
        seconds, micros = self.client.time(**routed_to(self.client, self.keys.workers))
        now_ms = seconds * 1000 + micros // 1000
        return int(self.client.zcount(self.keys.workers, now_ms - timeout_ms, "+inf"))

    def memory(self) -> MemoryReading:
        """What ``INFO memory`` of the server says: its use, its limit, and whether it
        may evict the crawl's keys."""
        info = self.client.info("memory", **routed_to(self.client, self.keys.queue))
        return MemoryReading(int(info.get("used_memory", 0)), int(info.get("maxmemory", 0)),
                             evicting_policy(info))

    def record_progress(self, worker_acks: int, fleet_acks: int) -> None:
        """Add a rate sample (this worker's and the fleet's acks) to ``progress``."""
        record_progress(self.client, self.keys, self.worker_id, worker_acks, fleet_acks,
                        epoch=self.epoch)

    def count_limits(self, items: int, errors: int, *, item_limit: int, error_limit: int,
                     timeout_ms: int) -> str:
        """Add this worker's new items and spider errors to the fleet's counts; the
        fleet's close order ("" if no limit was reached; scripts/count_limits.lua)."""
        reply = self._scripts.run("count_limits", [self.epoch, items, errors, item_limit,
                                                   error_limit, timeout_ms])
        return reply.decode() if isinstance(reply, bytes) else str(reply or "")

    def purge(self) -> int:
        """Delete every key of the crawl, whatever it holds, leaving a tombstone in
        its record (workers still on it learn it was purged); keys deleted."""
        named = self._scripts.keys("purge")
        # A sharded crawl on one server: its shards' in-flight counts leave the
        # group's too (on a cluster, sharded.py purges each shard in its slot).
        shard_busy = ([view.busy for view in self.keys.shard_views()]
                      if self.keys.shards > 1 and not self.keys.cluster else [])
        rest = [*shard_busy, *(key for key in self.keys.all_crawl_keys()
                               if key not in named and key not in shard_busy)]
        deleted = int(self._scripts.run("purge", [len(shard_busy)], rest))
        self.client.srem(self.keys.crawls, self.keys.crawl_id)  # outside the crawl's slot
        self.client.srem(self.keys.group_crawls, self.keys.crawl_id)
        # (P:crawl_groups keeps a colocated crawl's group: a sharded crawl's tombstone
        # is under its own tag, where an earlier version's crawl would be: placement.py)
        return deleted

    def purge_keys(self, keys: Sequence[str]) -> int:
        """purge.lua on keys of the caller's choice (record, busy, group_busy, then
        the rest): a sharded crawl's flush of one shard on Redis Cluster (sharded.py)."""
        return int(self._scripts.call("purge", keys, []))

    def purge_if_done(self, epoch: str = "", alive_ms: int = 30_000) -> bool:
        """Delete the crawl's keys if it is done (see ``scripts/purge_if_done.lua``);
        True when nothing of it is left (other live workers keep its record).

        The items stream stays: it is the crawl's output, not its state
        (``redisspine export`` reads it after the crawl; ``redisspine purge`` deletes
        it). A sharded crawl on one server goes in the same step, every shard's
        queue and in-flight checked; on a cluster, see :meth:`purge_if_done_step`."""
        return self.purge_if_done_step(epoch, alive_ms) == PURGED

    def purge_if_done_step(self, epoch: str, alive_ms: int, *,
                           keep_record: bool = False) -> int:
        """purge_if_done.lua's reply: PURGED, SHARDS_LEFT (``keep_record``: the crawl's
        keys but its record are gone, its shards are to go), 1 (others alive: its
        record stays, saying it finished) or 0 (work remains, or not the caller's)."""
        named = self._scripts.keys("purge_if_done")
        views = (self.keys.shard_views()
                 if self.keys.shards > 1 and self.keys.shard is None and not self.keys.cluster
                 else ())
        pairs = [key for view in views for key in (view.queue, view.inflight)]
        kept = {*named, *pairs, self.keys.items, *(view.items for view in views)}
        rest = [key for key in self.keys.all_crawl_keys() if key not in kept]
        purged = int(self._scripts.run(
            "purge_if_done",
            [self.worker_id, epoch, alive_ms, len(views), "1" if keep_record else "0",
             self.keys.shards],
            [*pairs, *rest]))
        if purged == PURGED:  # a separate command: the registry lies outside the slot
            self.client.srem(self.keys.crawls, self.keys.crawl_id)
            self.client.srem(self.keys.group_crawls, self.keys.crawl_id)
            # (crawl_groups keeps a colocated crawl's group: export finds its items)
        return purged

    def purge_shard(self, epoch: str, *, check: bool = False) -> int:
        """Delete this shard of a finished crawl on a cluster (``scripts/purge_shard.lua``):
        1 deleted (or, with ``check``, deletable), 0 it holds work, -1 not the crawl
        of ``epoch`` (started afresh, or this shard already gone)."""
        named = self._scripts.keys("purge_shard")
        rest = [key for key in self.keys.shard_keys()
                if key not in named and key != self.keys.items]
        return int(self._scripts.run("purge_shard", [epoch, "1" if check else "0"], rest))

    # -- the politeness group's other crawls ----------------------------------------------

    def group_crawls(self, limit: int) -> list[str]:
        """Up to ``limit`` other crawl ids of this crawl's politeness group."""
        members = self.client.srandmember(self.keys.group_crawls, limit + 1) or []
        ids = sorted({text(member) for member in members} - {self.keys.crawl_id})
        # (an id no CrawlKeys takes, e.g. with a '/' from an older version: not swept)
        return [crawl_id for crawl_id in ids if not set("{}/") & set(crawl_id)][:limit]

    def of_crawl(self, crawl_id: str) -> Any:
        """The upkeep of another crawl of the group, holding that crawl's epoch (so
        its scripts write nothing once it is gone), in that crawl's layout (a sharded
        one sweeps all its shards); None, and the crawl leaves the group's registry,
        when its record is gone (purged, or lost). (A FrontierUpkeep, or what the
        ``sharded`` factory builds: a ShardedUpkeep.)"""
        # (the crawls of a group colocated on a cluster share its number of slots)
        keys = dataclasses.replace(self.keys, crawl_id=crawl_id, shard=None,
                                   shards=self.keys.shards if self.keys.colocated else 1)
        epoch, shards = self.client.hmget(keys.record, ["epoch", "shards"])
        if epoch is None:
            self.client.srem(self.keys.group_crawls, crawl_id)
            return None
        if number(shards, 1) > 1:
            if self._sharded is None:
                return None  # (tools: no group sweep)
            return self._sharded(self.client, dataclasses.replace(keys, shards=number(shards)),
                                 self.worker_id, concurrency=self.concurrency,
                                 epoch=text(epoch))
        other = FrontierUpkeep(self.client, keys, self.worker_id, concurrency=self.concurrency,
                               sharded=self._sharded)
        other.epoch = text(epoch)
        return other


def _pairs(lane_rests: Mapping[str, int] | None) -> list[str | int]:
    """ARGV pairs lane, rest (ms) of the lanes with a delay of their own."""
    pairs: list[str | int] = []
    for lane, rest in (lane_rests or {}).items():
        pairs += [lane, rest]
    return pairs
