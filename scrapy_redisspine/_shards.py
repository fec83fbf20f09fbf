"""The pure parts of a sharded frontier: routing by lane, and the double collect.

No Redis calls and no Scrapy here: :class:`~scrapy_redisspine.sharded.ShardedFrontier`
does the calls; these functions decide where requests go, in which order the calls
must run, and when N separate readings of the shards prove the crawl idle.

Why a double collect. Termination must never be early: a parent's ack removes it
from its shard only after (or with) its children's enqueue, but a reader that
visits shard B, then shard A, can see B before a child arrives in it and A after
the parent left it: two empty readings while work exists. Each shard therefore
keeps a change stamp (shard_counts.lua) that grows with every change of what it
holds. The crawl is idle only if a first pass over all shards saw them all empty
and a second pass saw every stamp unchanged: then each shard held nothing from its
first reading to its second, and those intervals share the instant between the two
passes, at which the whole crawl held nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, TypeVar

from scrapy_redisspine._results import Lease, LeaseBatch
from scrapy_redisspine.keys import shard_of

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

_T = TypeVar("_T")


def route(lanes: Sequence[str], shards: int) -> dict[int, list[int]]:
    """Positions of ``lanes`` grouped by owning shard, each group in input order
    (a batch keeps its order within a shard: priorities tie FIFO)."""
    routed: dict[int, list[int]] = {}
    for position, lane in enumerate(lanes):
        routed.setdefault(shard_of(lane, shards), []).append(position)
    return routed


def pick(items: Sequence[_T], positions: Sequence[int]) -> list[_T]:
    return [items[position] for position in positions]


@dataclass(frozen=True)
class EnqueuePlan:
    """The calls of one sharded enqueue, in two phases.

    ``first``: shard -> positions of the requests sent without acks; these calls
    must all complete before any call of ``last`` starts. ``last``: shard ->
    (positions of requests, positions of acks), each an ack-carrying call. Acks
    never leave before every child bound for another shard is in: with the acks of
    one shard only, that shard's children ride with them (one call fewer); with acks
    in several shards, every child goes first, since a call carrying acks of shard
    A and children of A's parent-in-B would otherwise race B's ack.
    """

    first: dict[int, list[int]]
    last: dict[int, tuple[list[int], list[int]]]


def plan_enqueue(request_lanes: Sequence[str], ack_shards: Sequence[int],
                 shards: int) -> EnqueuePlan:
    """Where each request and ack of one enqueue goes, keeping children before acks."""
    requests = route(request_lanes, shards)
    acks: dict[int, list[int]] = {}
    for position, shard in enumerate(ack_shards):
        acks.setdefault(shard, []).append(position)
    if len(acks) == 1:
        (ack_shard, ack_positions), = acks.items()
        own = requests.pop(ack_shard, [])
        return EnqueuePlan(requests, {ack_shard: (own, ack_positions)})
    return EnqueuePlan(requests, {shard: ([], positions) for shard, positions in acks.items()})


@dataclass(frozen=True)
class ShardCounts:
    """One shard's reading (shard_counts.lua)."""

    queued: int
    inflight: int
    ever: bool
    stamp: int


@dataclass(frozen=True)
class Collected:
    """The totals of a double collect; ``settled``: both passes agree, so the totals
    held at one instant (and, when they are 0, the crawl was idle then)."""

    queued: int
    inflight: int
    ever: bool
    stamp: int
    settled: bool

    @property
    def idle(self) -> bool:
        return self.settled and self.queued == 0 and self.inflight == 0


def double_collect(read: Callable[[int], ShardCounts], shards: int) -> Collected:
    """Read every shard, then every shard again; see the module docstring.

    ``read(i)`` reads shard i atomically. Unsettled (a stamp moved between the two
    passes): the second pass's totals, which are no snapshot and never read as idle.
    """
    first = [read(index) for index in range(shards)]
    second = [read(index) for index in range(shards)]
    settled = all(a.stamp == b.stamp for a, b in zip(first, second, strict=True))
    return Collected(
        queued=sum(counts.queued for counts in second),
        inflight=sum(counts.inflight for counts in second),
        ever=any(counts.ever for counts in second),
        stamp=sum(counts.stamp for counts in second),
        settled=settled,
    )


def shard_key(shard: int, key: str) -> str:
    """A lease's key as the sharded frontier hands it out: its shard, then its key."""
    return f"{shard}/{key}"


def split_key(key: str) -> tuple[int, str]:
    """The shard and the shard's own order key of a handed-out key."""
    shard, slash, own = key.partition("/")
    if not slash or not shard.isdigit():
        raise ValueError(f"lease key {key!r} names no shard (expected 'shard/order key')")
    return int(shard), own


def shares(count: int, shards: int) -> list[int]:
    """``count`` split over ``shards`` as evenly as it goes, the larger shares first."""
    share, extra = divmod(count, shards)
    return [share + (1 if index < extra else 0) for index in range(shards)]


class LeaseTally:
    """The leases of one sharded lease call, and its shards' last counts."""

    def __init__(self) -> None:
        self.leases: list[Lease] = []
        self.batches: list[LeaseBatch] = []
        self.latest: dict[int, LeaseBatch] = {}  # a shard asked twice: its later counts

    def add(self, shard: int, batch: LeaseBatch) -> LeaseBatch:
        self.leases += [in_shard(shard, lease) for lease in batch.leases]
        self.batches.append(batch)
        self.latest[shard] = batch
        return batch

    def batch(self) -> LeaseBatch:
        waits = [batch.wait_ms for batch in self.latest.values() if batch.wait_ms >= 0]
        return LeaseBatch(
            self.leases, sum(batch.queued for batch in self.latest.values()),
            sum(batch.inflight for batch in self.latest.values()),
            sum(batch.malformed for batch in self.batches), min(waits) if waits else -1,
            tuple(repair for batch in self.batches for repair in batch.repairs),
            next((batch.close_reason for batch in self.batches if batch.close_reason), ""),
            sum(batch.page_limited for batch in self.batches),
        )


def in_shard(shard: int, lease: Lease) -> Lease:
    """A shard's lease as the sharded frontier hands it out (:func:`shard_key`)."""
    return replace(lease, key=shard_key(shard, lease.key))
