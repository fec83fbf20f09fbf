"""The shared frontier: enqueue, lease, ack, release over one crawl's Redis keys.

This module knows nothing of Scrapy. Each method is one round trip; each state
change is one Lua script (see ``scripts/``), so it is atomic across the fleet.

Invariant kept: a request is always in exactly one of ``queue``, ``inflight`` (with
its owner) or ``dead``; it leaves ``inflight`` only through ``ack`` (its processing
is done and its children are queued in the same step), ``release`` (back to the
queue) or ``bury`` (dead letters).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_redisspine.scripts import ScriptSet

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import redis

    from scrapy_redisspine.keys import CrawlKeys

ORDER_KEY_LENGTH = 15

#: Redis type each key must have when it exists (``TYPE`` reply).
EXPECTED_TYPES = {
    "queue": b"zset",
    "inflight": b"hash",
    "leases": b"zset",
    "seq": b"string",
    "seen": b"set",
    "dedup": b"hash",
    "starts": b"set",
    "dead": b"hash",
    "workers": b"zset",
    "stats": b"hash",
}


class CorruptKeyError(RuntimeError):
    """A crawl key holds a value of the wrong Redis type."""


@dataclass(frozen=True)
class NewRequest:
    """A request on its way into the frontier.

    Unless ``dont_filter``, ``fingerprint`` is checked against the crawl's seen-set.
    ``is_start`` makes a start request enter once per crawl, whichever worker sends it
    first, even with ``dont_filter`` (Scrapy's default start requests set it).
    """

    payload: bytes
    fingerprint: bytes = b""
    priority: int = 0
    dont_filter: bool = False
    is_start: bool = False

    def flags(self) -> str:
        flags = ("f" if not self.dont_filter else "") + ("s" if self.is_start else "")
        return flags or "-"


@dataclass(frozen=True)
class Lease:
    """A request leased to this worker; ``key`` identifies it in in-flight."""

    key: str
    payload: bytes


@dataclass(frozen=True)
class LeaseBatch:
    leases: list[Lease]
    queued: int
    inflight: int
    malformed: int = 0  # queue members not written by enqueue, moved to dead letters


@dataclass(frozen=True)
class EnqueueResult:
    """Per request: ``+`` enqueued, ``d`` duplicate, ``s`` start already injected."""

    statuses: str
    acked: int

    @property
    def enqueued(self) -> int:
        return self.statuses.count("+")


class Frontier:
    """One worker's handle on a crawl's shared frontier.

    Keys touched: queue, inflight, leases, seq, seen, starts, dead, workers, stats.
    """

    def __init__(
        self, client: redis.Redis, keys: CrawlKeys, worker_id: str, order: str = "fifo"
    ) -> None:
        if order not in ("fifo", "lifo"):
            raise ValueError(f"order must be 'fifo' or 'lifo', got {order!r}")
        self.client = client
        self.keys = keys
        self.worker_id = worker_id
        self.order = order
        self._scripts = ScriptSet(client)

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

    def register(self, *, flush: bool, alive_ms: int) -> tuple[bool, int]:
        """Announce this worker; flush first if asked and no other worker is alive.

        Returns (flushed, number of other live workers).
        """
        others = [key for key in self.keys.all_crawl_keys() if key != self.keys.workers]
        keys = [self.keys.workers, *others]
        flushed, alive = self._scripts["register"](
            keys=keys, args=[self.worker_id, "1" if flush else "0", alive_ms]
        )
        self.client.sadd(self.keys.crawls, self.keys.crawl_id)
        return bool(flushed), int(alive)

    def heartbeat(self) -> int:
        return int(self._scripts["heartbeat"](keys=[self.keys.workers], args=[self.worker_id]))

    def leave(self) -> None:
        self.client.zrem(self.keys.workers, self.worker_id)

    def enqueue(self, requests: Sequence[NewRequest], acks: Sequence[str] = ()) -> EnqueueResult:
        """Queue requests (dedup decided in Redis) and ack leases, atomically."""
        args: list[bytes | str | int] = [self.order, self.worker_id, len(acks), *acks]
        for request in requests:
            args += [request.flags(), request.fingerprint, -request.priority, request.payload]
        k = self.keys
        statuses, acked = self._scripts["enqueue"](
            keys=[
                k.queue, k.seq, k.seen, k.starts, k.inflight, k.leases, k.stats, k.dedup, k.bloom
            ],
            args=args,
        )
        if isinstance(statuses, bytes):
            statuses = statuses.decode()
        return EnqueueResult(statuses, int(acked))

    def ack(self, keys: Sequence[str]) -> int:
        """Ack leases whose processing is done (with no children to queue)."""
        return self.enqueue((), keys).acked if keys else 0

    def lease(self, count: int) -> LeaseBatch:
        """Lease up to ``count`` requests (highest priority first)."""
        k = self.keys
        members, queued, inflight, malformed = self._scripts["lease"](
            keys=[k.queue, k.inflight, k.leases, k.stats, k.dead, k.seq],
            args=[self.worker_id, count],
        )
        leases = [
            Lease(member[:ORDER_KEY_LENGTH].decode("ascii"), member[ORDER_KEY_LENGTH:])
            for member in members
        ]
        return LeaseBatch(leases, int(queued), int(inflight), int(malformed))

    def release(self, keys: Iterable[str]) -> int:
        """Put this worker's leases back in the queue, as they were."""
        keys = list(keys)
        if not keys:
            return 0
        k = self.keys
        return int(
            self._scripts["release"](
                keys=[k.queue, k.inflight, k.leases, k.stats], args=[self.worker_id, *keys]
            )
        )

    def bury(self, key: str, reason: str) -> bool:
        """Move a lease that can never be processed to the dead letters."""
        k = self.keys
        return bool(
            self._scripts["bury"](
                keys=[k.inflight, k.leases, k.dead, k.stats], args=[self.worker_id, key, reason]
            )
        )

    def counts(self) -> tuple[int, int]:
        """(queued, in flight) fleet-wide, in one round trip."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.queue)
        pipe.hlen(self.keys.inflight)
        queued, inflight = pipe.execute()
        return int(queued), int(inflight)

    def purge_if_done(self) -> bool:
        """Delete the crawl's keys if nothing is queued or in flight."""
        k = self.keys
        rest = [key for key in k.all_crawl_keys() if key not in (k.queue, k.inflight)]
        purged = bool(self._scripts["purge_if_done"](keys=[k.queue, k.inflight, *rest], args=[]))
        if purged:  # a separate command: the registry lies outside the crawl's slot
            self.client.srem(k.crawls, k.crawl_id)
        return purged

    def push(self, requests: Sequence[NewRequest]) -> EnqueueResult:
        """Add requests from outside a crawl (e.g. a seeding script)."""
        return self.enqueue(requests)
