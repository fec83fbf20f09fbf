"""The shared frontier: enqueue, lease, ack, release over one crawl's Redis keys.

This module knows nothing of Scrapy. Each method is one round trip; each state
change is one Lua script (see ``scripts/``), so it is atomic across the fleet.

Invariant kept: a request is always in exactly one of ``queue``, ``inflight`` (with
its owner) or ``dead``; it leaves ``inflight`` only through ``ack`` (its processing
is done and its children are queued in the same step), ``release`` (back to the
queue) or ``bury`` (dead letters).

The upkeep operations (key checks, sweeps, dead letters, counters, purging) live in
``_frontier_upkeep``, an object each ``Frontier`` holds as ``upkeep``; the results and
how replies are read in ``_results`` (every result carries the ``repairs`` its script
made of malformed values in Redis); the queue member format in ``members``. All are
re-exported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from scrapy_redisspine._frontier_upkeep import (
    EXPECTED_TYPES,
    CorruptKeyError,
    DeadLetter,
    FrontierUpkeep,
)
from scrapy_redisspine._results import (
    Count,
    EnqueueResult,
    FleetCounts,
    Heartbeat,
    Lease,
    LeaseBatch,
    Registration,
    Repairs,
    SweepResult,
    UnindexedResult,
    count_result,
    enqueue_result,
    fields,
    lease_batch,
    lease_with_acks,
    number,
    repairs_of,
    text,
)
from scrapy_redisspine._results import fleet_counts as read_fleet_counts
from scrapy_redisspine._results import heartbeat as read_heartbeat
from scrapy_redisspine._results import registration as read_registration
from scrapy_redisspine.connection import is_cluster
from scrapy_redisspine.members import (
    ORDER_KEY_LENGTH,
    PRIORITY_KEY_LENGTH,
    priority_key,
    split_member,
)
from scrapy_redisspine.scripts import ScriptSet, script_error
from scrapy_redisspine.sharded_upkeep import sharded_upkeep

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.settings import Throttle

__all__ = [
    "EXPECTED_TYPES", "ORDER_KEY_LENGTH", "PRIORITY_KEY_LENGTH", "Ack", "CorruptKeyError",
    "Count", "DeadLetter", "EnqueueResult", "FleetCounts", "Frontier", "Heartbeat", "Lease",
    "LeaseBatch", "LeaseHandle", "NewRequest", "Registration", "Repairs", "StreamItem",
    "SweepResult", "UnindexedResult", "priority_key", "split_member",
]


@dataclass(frozen=True)
class NewRequest:
    """A request on its way into the frontier.

    Unless ``dont_filter``, ``fingerprint`` is checked against the crawl's seen-set.
    ``is_start`` makes a start request enter once per crawl, whichever worker sends it
    first, even with ``dont_filter`` (Scrapy's default start requests set it).
    ``lane`` is its politeness lane (host or registered domain; "" for none).
    """

    payload: bytes
    fingerprint: bytes = b""
    priority: int = 0
    dont_filter: bool = False
    is_start: bool = False
    lane: str = ""

    def flags(self) -> str:
        flags = ("f" if not self.dont_filter else "") + ("s" if self.is_start else "")
        return flags or "-"


@dataclass(frozen=True)
class StreamItem:
    """An item on its way into the crawl's items stream, with the ack of its request.

    ``class_path`` names its class (``dict`` for a plain dict); ``url`` is the URL of
    the response whose callback produced it; ``payload`` the item, serialized.
    """

    class_path: str
    url: str
    payload: bytes


#: (order key, fencing token): what a release must present.
LeaseHandle = tuple[str, str]
#: (order key, fencing token, rest of its lane in ms): what an ack presents; with
#: AutoThrottle also the request's download latency (ms, -1: none) and its response's
#: status (0: none), the sample that moves its lane's delay (lib/throttle.lua); and
#: how long ago (ms) its fetch ended: the lane's rest counts from then, not from the
#: ack (enqueue.lua; 0 when absent).
Ack = (tuple[str, str, int] | tuple[str, str, int, int, int]
       | tuple[str, str, int, int, int, int])


#: How soon a lease looks again at a lane whose slots other crawls of the politeness
#: group hold (lease.lua): their acks cannot reschedule it in this crawl's ``hosts``.
#: Short against any polite delay, long against a lease round trip: at most a few
#: re-checks per second per such lane, and a lane freed elsewhere waits at most this.
GROUP_RECHECK_MS = 200

#: (script name, keys, args) of one script call.
_Call = tuple[str, "Sequence[str]", list[bytes | str | int]]


class Frontier:
    """One worker's handle on a crawl's shared frontier.

    Keys touched: queue, inflight, leases, seq, seen, starts, dead, workers, stats,
    progress.
    """

    def __init__(
        self,
        client: redis.Redis,
        keys: CrawlKeys,
        worker_id: str,
        order: str = "fifo",
        *,
        concurrency: int = 1,
        backlog_cap: int = 0,
        items_cap: int = 0,
        items_max_bytes: int = 0,
        page_budget: int = 0,
        lane_page_limit: int = 0,
        throttle: Throttle | None = None,
        min_delay_ms: int = 0,
    ) -> None:
        if order not in ("fifo", "lifo"):
            raise ValueError(f"order must be 'fifo' or 'lifo', got {order!r}")
        self.client = client
        self.keys = keys
        self.worker_id = worker_id
        self.order = order
        self.concurrency = concurrency
        self.backlog_cap = backlog_cap
        self.items_cap = items_cap  # the items stream's caps (0: none; enqueue.lua)
        self.items_max_bytes = items_max_bytes
        self.page_budget = page_budget  # requests the crawl leases in all (0: no budget)
        self.lane_page_limit = lane_page_limit  # requests one lane leases in all (0: none)
        # Fleet-wide AutoThrottle (enqueue.lua's ARGV[10..13]); target 0: off.
        self.throttle_args: list[bytes | str | int] = [0, 0, 0, 0] if throttle is None else [
            repr(throttle.target_concurrency), int(throttle.start_delay * 1000), min_delay_ms,
            int(throttle.max_delay * 1000),
        ]
        # The crawl's identity, learned at register(): every write script is refused
        # (LOST) once the crawl in Redis is not this one. "" (tools, tests): no check.
        self.epoch = ""
        # Every script's KEYS, built once from its header (scripts/__init__.py).
        self._scripts = ScriptSet(client, keys)
        self.upkeep = FrontierUpkeep(
            client, keys, worker_id, concurrency=concurrency, scripts=self._scripts,
            sharded=sharded_upkeep,
        )

    def register(self, *, flush: bool, alive_ms: int, spider: str = "") -> Registration:
        """Announce this worker; flush first if asked and no other worker is alive.

        Learns the crawl's epoch (``self.epoch``), creating the crawl record if there
        is none. A crawl of another spider is refused (``status == "conflict"``)
        with nothing written; so is a crawl created with another number of shards
        (``status == "shards"``, ``registration.shards`` the crawl's).
        """
        named = self._scripts.keys("register")
        layout = self._flushed_layout() if flush else self.keys
        # A sharded crawl's flush takes each shard's in-flight counts out of the
        # group's too: those busy HASHes come first among the other keys.
        # (On a cluster they are in other slots: sharded.py flushes each shard.)
        shard_busy = ([view.busy for view in layout.shard_views()]
                      if layout.shards > 1 and not layout.cluster else [])
        others = [*shard_busy, *(key for key in layout.all_crawl_keys()
                                 if key not in named and key not in shard_busy)]
        reply = self._scripts.run(
            "register",
            [self.worker_id, "1" if flush else "0", alive_ms, spider, secrets.token_hex(8),
             self.keys.shards, len(shard_busy)],
            others,
        )
        registration = read_registration(reply)
        if registration.status in ("conflict", "shards"):
            return registration
        self.epoch = self.upkeep.epoch = registration.epoch
        # SADD is idempotent: no membership check first. A full Redis refuses it; the
        # registry of crawl ids can wait.
        with contextlib.suppress(redis.exceptions.OutOfMemoryError):
            self.client.sadd(self.keys.crawls, self.keys.crawl_id)
            # The group's registry: its other crawls sweep this one if all its
            # workers die holding the group's lane slots (extension.Recovery).
            self.client.sadd(self.keys.group_crawls, self.keys.crawl_id)
        return registration

    def _flushed_layout(self) -> CrawlKeys:
        """The keys a flush deletes: of this worker's number of shards, and of the
        crawl's own if it has more (a flush may start it afresh with fewer)."""
        stored = number(self.client.hget(self.keys.record, "shards"), 1)
        if stored <= self.keys.shards:
            return self.keys
        return dataclasses.replace(self.keys, shards=stored)

    def heartbeat(self, starting: bool = False) -> Heartbeat:
        """Stamp this worker alive (and still producing start requests, if
        ``starting``), and check that its crawl is still in Redis."""
        return read_heartbeat(self._scripts.run(
            "heartbeat", [self.worker_id, self.epoch, "1" if starting else "0"]
        ))

    def done_starting(self) -> None:
        """This worker's start requests are all in: it no longer holds the fleet open."""
        self.client.zrem(self.keys.starting, self.worker_id)

    def fleet_counts(self, alive_ms: int, idle_close_ms: int = 0) -> FleetCounts:
        """Everything that decides whether the crawl is finished, read atomically;
        with ``idle_close_ms``, also the fleet's idle time, and its close order
        ``idle`` once the crawl had no work that long (fleet_counts.lua)."""
        return read_fleet_counts(
            self._scripts.run("fleet_counts", [self.epoch, alive_ms, idle_close_ms])
        )

    def mark_finished(self) -> bool:
        """Note in the crawl record that the crawl finished (if nothing is left)."""
        return bool(self._scripts.run("mark_finished", [self.epoch]))

    def leave(self) -> None:
        self.client.zrem(self.keys.workers, self.worker_id)

    def enqueue(
        self, requests: Sequence[NewRequest], acks: Sequence[Ack | LeaseHandle] = (),
        items: Sequence[Sequence[StreamItem]] = (), loose: Sequence[StreamItem] = (),
    ) -> EnqueueResult:
        """Queue requests (dedup decided in Redis) and ack leases, atomically.

        An ack may carry how long its lane must rest from now (ms): the end of a fetch
        plus the lane's delay, or a Retry-After block. ``items[i]`` are the items of
        ``acks[i]``'s request: they enter the items stream only if that ack is
        applied (it passes the fencing check). ``loose`` items belong to no lease
        (yielded by ``start()``) and are written as they are.
        """
        keys, args = self._enqueue_call(requests, acks, items, loose)
        return enqueue_result(self._scripts.call("enqueue", keys, args))

    def _enqueue_call(
        self, requests: Sequence[NewRequest], acks: Sequence[Ack | LeaseHandle],
        items: Sequence[Sequence[StreamItem]] = (), loose: Sequence[StreamItem] = (),
    ) -> tuple[Sequence[str], list[bytes | str | int]]:
        if items and len(items) != len(acks):
            raise ValueError(f"{len(items)} item lists for {len(acks)} acks")
        args: list[bytes | str | int] = [
            self.epoch, self.order, self.worker_id, len(acks), self.concurrency,
            self.backlog_cap, self.items_cap, self.items_max_bytes, len(loose),
            *self.throttle_args,
        ]
        for i, ack in enumerate(acks):
            args += _ack_args(ack, len(items[i]) if items else 0)
        for item in (*loose, *(item for its in items for item in its)):
            args += [item.class_path, item.url, item.payload]
        for request in requests:
            args += [
                request.flags(), request.fingerprint, request.lane,
                priority_key(request.priority), request.payload,
            ]
        return self._scripts.keys("enqueue"), args

    def ack(self, acks: Sequence[Ack | LeaseHandle]) -> int:
        """Ack leases whose processing is done (with no children to queue)."""
        return self.enqueue((), acks).acked if acks else 0

    def lease(self, count: int) -> LeaseBatch:
        """Lease up to ``count`` requests, at most one per due lane."""
        keys, args = self._lease_call(count)
        return lease_batch(self._scripts.call("lease", keys, args))

    def _lease_call(
        self, count: int, acks: Sequence[Ack | LeaseHandle] = ()
    ) -> tuple[Sequence[str], list[bytes | str | int]]:
        args: list[bytes | str | int] = [
            self.epoch, self.worker_id, count, self.concurrency, self.page_budget,
            self.lane_page_limit, GROUP_RECHECK_MS, len(acks), *self.throttle_args,
        ]
        for ack in acks:
            args += _ack_args(ack, 0)
        return self._scripts.keys("lease"), args

    def enqueue_and_lease(
        self, requests: Sequence[NewRequest], acks: Sequence[Ack | LeaseHandle], count: int,
        items: Sequence[Sequence[StreamItem]] = (), loose: Sequence[StreamItem] = (),
    ) -> tuple[EnqueueResult | redis.RedisError, LeaseBatch]:
        """``enqueue`` then ``lease``, in one round trip (two scripts, each atomic).

        The acks free their lanes' slots before the lease looks for due lanes, so a
        worker hands back finished work and takes new work at the cost of one round
        trip. A failed enqueue (e.g. Redis out of memory) is returned, not raised: the
        lease ran all the same and its leases are this worker's now. A failed lease
        raises.

        Acks with nothing else (no request, no item: the usual round once a crawl's
        pages mostly yield links already seen) go in the lease's own call, applied
        first as enqueue.lua would (``scripts/lease.lua``): one script for Redis to
        run instead of two, and one round trip instead of two on Redis Cluster.
        """
        if acks and not requests and not items and not loose:
            (reply,) = self._pipelined([("lease", *self._lease_call(count, acks))])
            if isinstance(reply, redis.RedisError):
                raise reply
            return lease_with_acks(reply)
        calls: list[_Call] = [
            ("enqueue", *self._enqueue_call(requests, acks, items, loose)),
            ("lease", *self._lease_call(count)),
        ]
        sent, leased = self._pipelined(calls)
        if isinstance(leased, redis.RedisError):
            raise leased
        return (
            sent if isinstance(sent, redis.RedisError) else enqueue_result(sent),
            lease_batch(leased),
        )

    def run_script(self, name: str, args: Sequence[bytes | str | int]) -> Any:
        """Run one script on this frontier's keys: for a frontier composed of several
        (sharded.py), whose reads and sweeps span its parts."""
        return self._scripts.run(name, args)

    def enqueue_call(
        self, requests: Sequence[NewRequest], acks: Sequence[Ack | LeaseHandle],
        items: Sequence[Sequence[StreamItem]] = (), loose: Sequence[StreamItem] = (),
    ) -> _Call:
        """The enqueue script call ``enqueue`` would make, to send with others
        (:meth:`pipelined`)."""
        return ("enqueue", *self._enqueue_call(requests, acks, items, loose))

    def lease_call(self, count: int) -> _Call:
        """The lease script call ``lease`` would make, to send with others."""
        return ("lease", *self._lease_call(count))

    def pipelined(self, calls: Sequence[_Call]) -> list[Any]:
        """Run script calls (of this or another frontier of the same client) in one
        round trip (one each on Redis Cluster): replies, or errors, in order."""
        return self._pipelined(calls)

    def _pipelined(self, calls: Sequence[_Call]) -> list[Any]:
        """Run scripts in one pipeline; replies (or errors) in order.

        EVALSHA is sent directly: redis-py's pipelined ``Script`` calls would first ask
        ``SCRIPT EXISTS`` in a round trip of their own. A script the server lacks (after
        a restart or SCRIPT FLUSH) is loaded and run again on its own: a NOSCRIPT reply
        means it did not run. Every other script is loaded with it (``load_all``), so
        that the calls of one pipeline never again find the cache half loaded and run
        out of order (the lease before the acks that free its lanes: then it leases
        less, nothing worse).
        """
        if is_cluster(self.client):
            return [self._one_by_one(call) for call in calls]
        pipe = self.client.pipeline(transaction=False)
        for name, keys, args in calls:
            pipe.evalsha(self._scripts[name].sha, len(keys), *keys, *args)
        replies: list[Any] = pipe.execute(raise_on_error=False)
        if any(isinstance(reply, redis.exceptions.NoScriptError) for reply in replies):
            self._scripts.load_all()
        for i, reply in enumerate(replies):
            if isinstance(reply, redis.exceptions.NoScriptError):
                name, keys, args = calls[i]
                try:
                    replies[i] = self._scripts.call(name, keys, args)
                except redis.exceptions.ResponseError as exc:
                    replies[i] = exc
            elif isinstance(reply, redis.exceptions.ResponseError):
                replies[i] = script_error(reply)
        return replies

    def _one_by_one(self, call: _Call) -> Any:
        """One script of a batch on Redis Cluster, whose client refuses EVALSHA in a
        pipeline: each call waits for the one before (an ack still frees its lane
        before the lease looks), at one round trip per script instead of one in all.
        An error is returned in the reply's place, as the pipeline does."""
        name, keys, args = call
        try:
            return self._scripts.call(name, keys, args)
        except redis.exceptions.ResponseError as exc:
            return exc

    def release(self, handles: Iterable[LeaseHandle]) -> Count:
        """Put this worker's leases back in the queue, as they were: how many."""
        args: list[str | int] = [self.epoch, self.worker_id, self.concurrency]
        for key, token in handles:
            args += [key, token]
        if len(args) == 3:
            return Count(0)
        return count_result(self._scripts.run("release", args))

    def release_orphans(self, known_keys: Iterable[str], limit: int = 10_000) -> Count:
        """Return leases recorded for this worker that it never received (lost reply)."""
        return count_result(self._scripts.run(
            "release_orphans", [self.epoch, self.worker_id, limit, self.concurrency, *known_keys]
        ))

    def bury(self, handle: LeaseHandle, reason: str) -> Count:
        """Move a lease that can never be processed to the dead letters: 1 if it was
        this worker's, else 0."""
        key, token = handle
        return count_result(
            self._scripts.run(
                "bury", [self.epoch, self.worker_id, key, token, reason, self.concurrency]
            )
        )

    def add_shed(self, shed: int) -> None:
        """Count requests dropped for lack of Redis memory, fleet-wide (a full Redis
        takes it: ``scripts/add_shed.lua``)."""
        self._scripts.run("add_shed", [self.epoch, shed])

    def injected_starts(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Which of these start requests entered the crawl already (a read: works on
        a full Redis)."""
        found = self.client.smismember(self.keys.starts, list(fingerprints))
        return [bool(flag) for flag in found]  # type: ignore[union-attr]

    def take_slot(
        self, lane: str, priority: int, payload: bytes
    ) -> tuple[Lease | None, int, Repairs]:
        """Lease one of ``lane``'s slots for a request kept in this worker's memory
        (``payload``: its marker, see ``_local``): (the lease or None, ms until the
        lane is due (0: wait for a free slot), repairs)."""
        reply = self._scripts.run("take_slot", [
            self.epoch, self.worker_id, self.concurrency, lane, priority_key(priority),
            payload,
        ])
        key, token, wait_ms, repairs = fields(reply, 4)
        lease = (Lease(text(key), str(number(token)), payload, 0, lane) if text(key)
                 else None)
        return lease, number(wait_ms), repairs_of(repairs)

    def set_lane_limits(self, limits: Mapping[str, int]) -> None:
        """Share the lanes that have a concurrency of their own (Scrapy's
        ``DOWNLOAD_SLOTS``) with the fleet: the scripts read them (lib/lanes.lua)."""
        self.client.hset(self.keys.lane_limits, mapping=dict(limits))  # type: ignore[arg-type]

    def set_crawl_delay(self, lane: str, seconds: float) -> None:
        """Share a lane's robots.txt Crawl-delay with the fleet."""
        self.client.hset(self.keys.host_delay, lane, f"{seconds:g}")

    def push(self, requests: Sequence[NewRequest]) -> EnqueueResult:
        """Add requests from outside a crawl (e.g. a seeding script)."""
        return self.enqueue(requests)


def _ack_args(ack: Ack | LeaseHandle, n_items: int) -> list[bytes | str | int]:
    """An ack's seven script arguments (enqueue.lua's ARGV groups, lease.lua's too):
    order key, token, rest, its items' count, latency, status, elapsed."""
    return [ack[0], ack[1], ack[2] if len(ack) > 2 else 0,  # type: ignore[misc]
            n_items, ack[3] if len(ack) > 3 else -1,  # type: ignore[misc]
            ack[4] if len(ack) > 4 else 0, ack[5] if len(ack) > 5 else 0]  # type: ignore[misc]
