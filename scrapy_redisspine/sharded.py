"""One crawl's frontier spread over several hash tags (``REDISSPINE_SHARDS``).

A :class:`ShardedFrontier` holds one :class:`~scrapy_redisspine.frontier.Frontier` per
shard (its view of the keys: ``{crawl id/i}``) and one on the crawl-wide keys
(``{crawl id}``: workers, record, control ...). A lane lives in one shard
(:func:`~scrapy_redisspine.keys.shard_of`), with its queue, slots and the dedup of its
URLs, so every script still runs on one shard's keys and stays atomic there.

Invariants kept across shards:

- A child is in the frontier before its parent's ack: children bound for shards other
  than their parents' are enqueued in calls that complete before any ack leaves
  (``_shards.plan_enqueue``); so no reader can see the crawl without the parent and
  without the child.
- A lease handle names its shard: order keys come back as ``"<shard>/<order key>"``
  (each shard numbers its own requests), and acks, releases and buries go there.
- Termination is read by a double collect (``_shards.double_collect``), never by N
  readings taken for one snapshot.

The crawl record holds the number of shards the crawl was created with; a worker
with another number is refused at ``register`` (status ``shards``).

On Redis Cluster each shard's scripts stay in the shard's slot: the shard keeps its
own copies of the crawl record's epoch, of the lease's close order and of the
heartbeats its sweep reads (keys.CLUSTER_SHARD_COPIES), written here; the crawl-wide
reads (termination, heartbeats) run on the crawl's own slot.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import redis

from scrapy_redisspine._results import (
    Count,
    EnqueueResult,
    FleetCounts,
    Lease,
    LeaseBatch,
    Registration,
    enqueue_result,
    fields,
    lease_batch,
    number,
    repairs_of,
    text,
)
from scrapy_redisspine._results import fleet_counts as read_fleet_counts
from scrapy_redisspine._shards import (
    Collected,
    LeaseTally,
    ShardCounts,
    double_collect,
    in_shard,
    pick,
    plan_enqueue,
    shares,
    split_key,
)
from scrapy_redisspine.connection import is_cluster
from scrapy_redisspine.frontier import Frontier
from scrapy_redisspine.sharded_upkeep import ShardedUpkeep

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from scrapy_redisspine.frontier import Ack, LeaseHandle, NewRequest, StreamItem
    from scrapy_redisspine.keys import CrawlKeys

#: How often a count retries a double collect that a concurrent change unsettled,
#: before it reports the crawl as busy (never as idle).
COLLECT_TRIES = 3
#: How often a worker finishes a purge another left midway before it gives up.
PURGE_TRIES = 3

#: One enqueue call of a phase: shard, positions of its requests, its acks (with the
#: shard's own order keys), their item lists, loose items.
_Send = tuple[int, list[int], "Sequence[Ack | LeaseHandle]", "Sequence[Sequence[StreamItem]]",
              "Sequence[StreamItem]"]


def stored_shards(client: redis.Redis, keys: CrawlKeys) -> int:
    """The number of shards the crawl was created with (its record's ``shards``; a
    record without it, or no record: 1). Tools outside the fleet read it to pick
    their layout."""
    return number(client.hget(keys.record, "shards"), 1)


def items_caps_share(options: Mapping[str, Any], shards: int) -> dict[str, Any]:
    """``options`` with each shard's share of the items caps.

    REDISSPINE_ITEMS_MAX_COUNT / _MAX_BYTES are for the whole crawl, and each shard's
    items stream holds at most ``ceil(cap / shards)`` of it: a shard's script sees
    only its own stream, so the caps are split up front, never summed at run time.
    The crawl then holds at most ``shards - 1`` entries (or bytes) more than the
    cap, and fewer when its lanes (hence its items) are unevenly spread."""
    share = dict(options)
    for name in ("items_cap", "items_max_bytes"):
        cap = int(share.get(name, 0) or 0)
        if cap > 0:
            share[name] = -(-cap // shards)
    return share


class ShardedFrontier:
    """One worker's handle on a sharded crawl: routes every call to its shards.

    Keys touched: each shard's frontier keys (``{C/i}``, see keys.SHARD_KEY_NAMES)
    and the crawl-wide ones (``{C}``) through ``crawl``.
    """

    def __init__(self, client: redis.Redis, keys: CrawlKeys, worker_id: str,
                 order: str = "fifo", **options: Any) -> None:
        if keys.shard is not None:
            raise ValueError("a ShardedFrontier takes the crawl-wide keys, not a shard's")
        if keys.cluster != is_cluster(client):
            raise ValueError("the keys' cluster flag must say whether the client is one")
        #: CLOSESPIDER_PAGECOUNT fleet-wide: kept on the crawl-wide keys and taken
        #: before each lease (take_pages.lua), never by the shards' lease scripts.
        self.page_budget = int(options.pop("page_budget", 0) or 0)
        #: A page holder silent this long is dead (REDISSPINE_WORKER_TIMEOUT_SECONDS).
        self.holder_timeout_ms = int(options.pop("holder_timeout_ms", 30_000))
        self._unsettled: int | None = None  # pages leased of a hold not settled yet
        self.client = client
        self.keys = keys
        self.worker_id = worker_id
        self.crawl = Frontier(client, keys, worker_id, order, **options)
        shard_options = items_caps_share(options, keys.shards)
        self.shards = [Frontier(client, view, worker_id, order, **shard_options)
                       for view in keys.shard_views()]
        self._next_shard = 0  # where the next lease starts (round-robin)
        #: Loose items a call wrote in an enqueue that raised (another shard's call
        #: failed): the caller sends them again with its retry, and they are skipped.
        self._loose_written: list[StreamItem] = []
        #: Each shard's queue as its last lease reply counted it: the crawl's queue
        #: for display (len(scheduler)), without a call to every shard per lease.
        self._queued_seen = [0] * len(self.shards)
        self.upkeep = ShardedUpkeep(keys, self.crawl.upkeep,
                                    [shard.upkeep for shard in self.shards])

    @property
    def epoch(self) -> str:
        return self.crawl.epoch

    @epoch.setter
    def epoch(self, epoch: str) -> None:
        """The crawl's identity, for a handle that did not register (a feed drain)."""
        for part in (self.crawl, *self.shards):
            part.epoch = part.upkeep.epoch = epoch

    # -- the crawl-wide calls ------------------------------------------------------------

    def register(self, *, flush: bool, alive_ms: int, spider: str = "") -> Registration:
        """Register on the crawl-wide keys; learn the epoch for every shard."""
        stored = stored_shards(self.client, self.keys)
        registration = self.crawl.register(flush=flush, alive_ms=alive_ms, spider=spider)
        for _ in range(PURGE_TRIES):
            if registration.status != "purging":
                break
            # The crawl's last worker was deleting it (persistence off) and stopped
            # midway, or is at it: finish that, then join whatever is there.
            self.upkeep.finish_purge(registration.epoch, alive_ms)
            registration = self.crawl.register(flush=flush, alive_ms=alive_ms, spider=spider)
        if registration.status == "purging":
            raise redis.RedisError(f"crawl {self.keys.crawl_id!r} is still being deleted "
                                   f"after {PURGE_TRIES} tries (persistence off)")
        if registration.status in ("conflict", "shards"):
            return registration
        if registration.status == "finished" and not self.collect().idle:
            # register.lua reads the crawl-wide queue, which a sharded crawl leaves
            # empty: work pushed since it finished is in the shards
            registration = replace(registration, status="joined")
        if self.keys.cluster and self.keys.shards > 1:
            if registration.flushed:
                self._flush_shards(max(stored, self.keys.shards))
            for shard in self.shards:
                # The shard's copy of the crawl's identity (its scripts' epoch check);
                # a tombstone of a purge before goes once the epoch is there.
                self.client.hset(shard.keys.record, "epoch", registration.epoch)
                self.client.hdel(shard.keys.record, "purged_ms")
        for shard in self.shards:
            shard.epoch = shard.upkeep.epoch = self.crawl.epoch
        return registration

    def _flush_shards(self, shards: int) -> None:
        """Delete every shard's keys (of ``shards``, the crawl's old number if it had
        more), one slot at a time; purge.lua takes each shard's in-flight counts out
        of its group's."""
        layout = replace(self.keys, shards=shards)
        for view in layout.shard_views():
            named = (view.record, view.busy, view.group_busy)
            rest = [key for key in view.shard_keys() if key not in named]
            self.shards[0].upkeep.purge_keys([*named, *rest])  # (KEYS name every key)

    def heartbeat(self, starting: bool = False) -> Any:
        """The crawl-wide heartbeat, its count of the queue the shards' as last seen
        (heartbeat.lua counts the crawl-wide queue, which a sharded crawl leaves empty)."""
        return replace(self.crawl.heartbeat(starting), queued=sum(self._queued_seen))

    def done_starting(self) -> None:
        self.crawl.done_starting()

    def leave(self) -> None:
        self._settle()
        self.crawl.leave()

    def collect(self) -> Collected:
        """The shards' totals by a double collect, retried while changes unsettle it."""
        collected = double_collect(self.shard_counts, len(self.shards))
        for _ in range(COLLECT_TRIES - 1):
            if collected.settled:
                break
            collected = double_collect(self.shard_counts, len(self.shards))
        return collected

    def shard_counts(self, index: int) -> ShardCounts:
        """Shard ``index``'s reading (shard_counts.lua), atomic on its own."""
        queued, inflight, ever, stamp = fields(self.shards[index].run_script(
            "shard_counts", []), 4)
        return ShardCounts(number(queued, 1), number(inflight), bool(number(ever, 1)),
                           number(stamp))

    def fleet_counts(self, alive_ms: int, idle_close_ms: int = 0) -> FleetCounts:
        """As ``Frontier.fleet_counts``, with the shards' totals from :meth:`collect`;
        an unsettled collect counts one request in flight (a move was under way)."""
        collected = self.collect()
        inflight = collected.inflight
        if not collected.settled and collected.queued + inflight == 0:
            inflight = 1
        return read_fleet_counts(self.crawl.run_script("fleet_counts", [
            self.epoch, alive_ms, idle_close_ms, collected.queued, inflight,
            int(collected.ever), collected.stamp,
        ]))

    def mark_finished(self) -> bool:
        """Note the crawl finished, only after a double collect found it idle (the
        crawl-wide queue that mark_finished.lua checks is never written)."""
        if not self.collect().idle:
            return False
        return self.crawl.mark_finished()

    # -- enqueue and ack -----------------------------------------------------------------

    def enqueue(self, requests: Sequence[NewRequest],
                acks: Sequence[Ack | LeaseHandle] = (),
                items: Sequence[Sequence[StreamItem]] = (),
                loose: Sequence[StreamItem] = ()) -> EnqueueResult:
        """Queue requests in their lanes' shards and ack leases in theirs, children
        first (the module docstring); a failed call raises before any ack is sent
        when it carried children. ``loose`` items go with the first call (to its
        shard's items stream; with no call else, to shard 0's), once: a retry of an
        enqueue that raised after their call went through skips them (they are
        fenced by no ack, and the caller retries all it sent)."""
        if items and len(items) != len(acks):
            raise ValueError(f"{len(items)} item lists for {len(acks)} acks")
        split = [split_key(ack[0]) for ack in acks]
        own_acks: list[Ack | LeaseHandle] = [
            (own, *ack[1:]) for (_, own), ack in zip(split, acks, strict=True)]  # type: ignore[misc]
        plan = plan_enqueue([request.lane for request in requests],
                            [shard for shard, _ in split], len(self.shards))
        statuses = ["?"] * len(requests)
        results: list[EnqueueResult] = []
        first: list[_Send] = [(shard, positions, [], [], ())
                              for shard, positions in plan.first.items()]
        last: list[_Send] = [(shard, positions, pick(own_acks, ack_positions),
                              pick(items, ack_positions) if items else [], ())
                             for shard, (positions, ack_positions) in plan.last.items()]
        already = 0
        if loose:  # (an ack alone in between keeps what the retry will skip)
            sent = {id(item) for item in self._loose_written}  # (held: ids not reused)
            already = sum(1 for item in loose if id(item) in sent)
            loose = [item for item in loose if id(item) not in sent]
            self._loose_written = []
        if loose:  # written as they are: with the first call there is, or on their own
            target = first or last or [(0, [], [], [], ())]
            shard, positions, these_acks, these_items, _ = target[0]
            target[0] = (shard, positions, these_acks, these_items, loose)
            if not first and not last:
                first = target
        written: list[StreamItem] = []  # loose items of the calls that went through
        for phase in (first, last):
            try:
                replies = self._run_phase(requests, phase)
            except redis.RedisError:
                if written:
                    self._loose_written = written  # (this phase's: unknown, a lost reply)
                raise
            written += [item for send, reply in zip(phase, replies, strict=True)
                        if not isinstance(reply, redis.RedisError) for item in send[4]]
            error = next((reply for reply in replies if isinstance(reply, redis.RedisError)),
                         None)
            if error is not None:
                if written:
                    self._loose_written = written
                raise error
            for (_, positions, *_rest), reply in zip(phase, replies, strict=True):
                result = enqueue_result(reply)
                for position, status in zip(positions, result.statuses, strict=False):
                    statuses[position] = status
                results.append(result)
        return EnqueueResult(
            "".join(statuses), sum(result.acked for result in results),
            tuple(repair for result in results for repair in result.repairs),
            already + sum(result.items_written for result in results),
            sum(result.items_shed for result in results),
            tuple(step for result in results for step in result.throttled),
        )

    def _run_phase(self, requests: Sequence[NewRequest], phase: Sequence[_Send]) -> list[Any]:
        """One call per shard, pipelined on one server; every call has completed when
        this returns. Each reply, or the error of its call: on a cluster a call whose
        master is unreachable too, the others' having gone through (``enqueue``
        needs to know which did)."""
        calls = [self.shards[shard].enqueue_call(pick(requests, positions), acks, items, loose)
                 for shard, positions, acks, items, loose in phase]
        if not is_cluster(self.client):
            return self.crawl.pipelined(calls) if calls else []
        replies: list[Any] = []
        for call in calls:
            try:
                replies.extend(self.crawl.pipelined([call]))
            except redis.RedisError as exc:
                replies.append(exc)
        return replies

    def ack(self, acks: Sequence[Ack | LeaseHandle]) -> int:
        return self.enqueue((), acks).acked if acks else 0

    def push(self, requests: Sequence[NewRequest]) -> EnqueueResult:
        return self.enqueue(requests)

    # -- leases --------------------------------------------------------------------------

    def lease(self, count: int) -> LeaseBatch:
        """Up to ``count`` requests from the shards (:meth:`_lease`); with a page
        budget, at most what this worker took from it first, and what it did not
        lease goes back (take_pages.lua). A lease that raises settles its whole hold
        as spent: the budget is never over-spent, at worst under-spent."""
        if not self.page_budget or count <= 0:
            return self._lease(count)
        granted, close_reason, repairs = self._take_pages(count)
        if not granted:
            return replace(self._lease(0), close_reason=close_reason,
                           repairs=repairs)
        self._unsettled = granted  # until the shards said how many they gave
        batch = self._lease(granted)
        self._unsettled = len(batch.leases)
        self._settle()
        return replace(batch, repairs=batch.repairs + repairs) if repairs else batch

    def _take_pages(self, want: int) -> tuple[int, str, tuple[str, ...]]:
        """Settle the last hold (if one is open) and take up to ``want`` pages."""
        used = "" if self._unsettled is None else str(self._unsettled)
        granted, reason, repairs = fields(self.crawl.run_script("take_pages", [
            self.epoch, self.worker_id, self.page_budget, used, want,
            self.holder_timeout_ms]), 3)
        self._unsettled = None
        return number(granted), text(reason), repairs_of(repairs)

    def _settle(self) -> None:
        """Give back what the last hold did not lease (nothing open: no call)."""
        if self.page_budget and self._unsettled is not None:
            self._take_pages(0)

    def _lease(self, count: int) -> LeaseBatch:
        """Up to ``count`` requests from the shards, starting one shard further than the
        last call did.

        On one server every shard is asked for its share of ``count`` in one pipeline,
        then the shards that gave their whole share (they may have more) for what is
        still missing, one call each; on a cluster the shards are asked one after the
        other, each for what the ones before left. A shard's error raises; the leases
        other shards of the same call recorded for this worker are then its orphans,
        returned by ``release_orphans`` as after a lost reply on one server.
        """
        start = self._next_shard
        self._next_shard = (start + 1) % len(self.shards)
        order = [(start + step) % len(self.shards) for step in range(len(self.shards))]
        taken = LeaseTally()
        if count > 0 and not is_cluster(self.client):
            asked = [(shard, share) for shard, share in zip(order, shares(count, len(order)),
                                                             strict=True) if share > 0]
            replies = self.crawl.pipelined([self.shards[shard].lease_call(share)
                                            for shard, share in asked])
            for (shard, share), reply in zip(asked, replies, strict=True):
                if isinstance(reply, redis.RedisError):
                    raise reply
                if len(taken.add(shard, lease_batch(reply)).leases) < share:
                    order.remove(shard)  # it gave less than asked: nothing more is due
        for shard in order:
            if len(taken.leases) >= count:
                break
            taken.add(shard, self.shards[shard].lease(count - len(taken.leases)))
        for shard, batch in taken.latest.items():
            self._queued_seen[shard] = batch.queued
        # the queue of shards not asked this time as they last said: for display, and
        # never the only sign of work left (a lease that finds none asks every shard)
        return replace(taken.batch(), queued=sum(self._queued_seen))

    def enqueue_and_lease(
        self, requests: Sequence[NewRequest], acks: Sequence[Ack | LeaseHandle], count: int,
        items: Sequence[Sequence[StreamItem]] = (), loose: Sequence[StreamItem] = (),
    ) -> tuple[EnqueueResult | redis.RedisError, LeaseBatch]:
        """``enqueue`` then ``lease``: a failed enqueue is returned, not raised."""
        sent: EnqueueResult | redis.RedisError
        try:
            sent = self.enqueue(requests, acks, items, loose)
        except redis.RedisError as exc:
            sent = exc
        return sent, self.lease(count)

    def release(self, handles: Iterable[LeaseHandle]) -> Count:
        """Put leases back, each in its shard: how many."""
        by_shard: dict[int, list[LeaseHandle]] = {}
        for key, token in handles:
            shard, own = split_key(key)
            by_shard.setdefault(shard, []).append((own, token))
        counts = [self.shards[shard].release(group) for shard, group in by_shard.items()]
        return Count(sum(counts), tuple(r for count in counts for r in count.repairs))

    def release_orphans(self, known_keys: Iterable[str], limit: int = 10_000) -> Count:
        """Every shard returns this worker's leases it never received."""
        known: dict[int, list[str]] = {index: [] for index in range(len(self.shards))}
        for key in known_keys:
            shard, own = split_key(key)
            known[shard].append(own)
        counts = [self.shards[shard].release_orphans(keys, limit)
                  for shard, keys in known.items()]
        return Count(sum(counts), tuple(r for count in counts for r in count.repairs))

    def bury(self, handle: LeaseHandle, reason: str) -> Count:
        shard, own = split_key(handle[0])
        return self.shards[shard].bury((own, handle[1]), reason)

    # -- upkeep across shards ------------------------------------------------------------

    def set_lane_limits(self, limits: Mapping[str, int]) -> None:
        """As ``Frontier.set_lane_limits``, into every shard's group keys (on a
        cluster each shard has its own; on one server they are one key)."""
        for shard in self._distinct(lambda keys: keys.lane_limits):
            shard.set_lane_limits(limits)

    def set_crawl_delay(self, lane: str, seconds: float) -> None:
        """A lane's Crawl-delay, where its shard's scripts read it."""
        self.shards[self.keys.shard_of(lane)].set_crawl_delay(lane, seconds)

    def take_slot(self, lane: str, priority: int, payload: bytes
                  ) -> tuple[Lease | None, int, tuple[str, ...]]:
        """As ``Frontier.take_slot``, in the lane's shard."""
        shard = self.keys.shard_of(lane)
        lease, wait_ms, repairs = self.shards[shard].take_slot(lane, priority, payload)
        return (None if lease is None else in_shard(shard, lease)), wait_ms, repairs

    def add_shed(self, shed: int) -> None:
        self.crawl.add_shed(shed)  # the crawl-wide stats, which fleet_counts reads

    def injected_starts(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Which start requests entered the crawl: in whichever shard their lane put
        them (a fingerprint is one request's, so at most one shard has it)."""
        found = [False] * len(fingerprints)
        for shard in self.shards:
            found = [a or b for a, b in zip(found, shard.injected_starts(fingerprints),
                                            strict=True)]
        return found

    def _distinct(self, key: Callable[[CrawlKeys], str]) -> list[Frontier]:
        seen: dict[str, Frontier] = {}
        for shard in self.shards:
            seen.setdefault(key(shard.keys), shard)
        return list(seen.values())


#: What a worker's parts hold: one crawl's frontier, sharded or not (``_joining``).
AnyFrontier = Frontier | ShardedFrontier
