"""What the frontier's scripts return, read into typed results.

Reading a reply never raises, whatever a script can return: a script may already
have written what the reply reports (leases recorded for this worker, acks applied),
so a reply this side failed to read would lose that work. A missing or unreadable
element reads as empty (0, "", no lease), and what could not be read is reported
with the repairs.

Repairs. A script that met a malformed value in a crawl key (a count that is no
number, an in-flight entry it cannot read ...) repaired it and says so in the last
element of its reply (``scripts/lib/numbers.lua``): one text per repair,
``"<key> <field> <old value, quoted and truncated> -> <what it is now>"`` (field ``-``
for a STRING key such as ``seq``). Every result carries them as ``repairs``, a
tuple of str, empty almost always, for the worker to log: ``LeaseBatch``,
``EnqueueResult``, ``SweepResult``, ``UnindexedResult`` as a field, and the plain
counts (``release``, ``release_orphans``, ``bury``, ``reinject_dead``) as a
:class:`Count`, an ``int`` with a ``repairs`` attribute.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from scrapy_redisspine.members import split_member

#: The repairs a script reported (see the module docstring).
Repairs = tuple[str, ...]

_SHOWN_BYTES = 40


class Count(int):
    """A count a script returned, with the repairs it made.

    An ``int`` to every caller (``if released:``, ``stats.inc_value(..., released)``);
    ``count.repairs`` for the caller that logs them.
    """

    repairs: Repairs

    def __new__(cls, value: int = 0, repairs: Repairs = ()) -> Count:
        count = super().__new__(cls, value)
        count.repairs = repairs
        return count


@dataclass(frozen=True)
class Lease:
    """A request leased to this worker.

    ``key`` identifies it in in-flight; ``token`` fences it (acks and releases must
    present it); ``requeues`` counts how often it came back from a dead worker;
    ``crawl_delay`` is its lane's robots.txt Crawl-delay if any worker learned one.
    """

    key: str
    token: str
    payload: bytes
    requeues: int = 0
    lane: str = ""
    crawl_delay: float | None = None

    @property
    def handle(self) -> tuple[str, str]:
        return (self.key, self.token)


@dataclass(frozen=True)
class LeaseBatch:
    leases: list[Lease]
    queued: int
    inflight: int
    malformed: int = 0  # queue members not written by enqueue, moved to dead letters
    wait_ms: int = -1  # until the next lane is due (-1: none scheduled)
    repairs: Repairs = ()
    close_reason: str = ""  # a fleet-wide limit was reached (control's close order)
    page_limited: int = 0  # queued requests dropped: their lane spent its page limit


@dataclass(frozen=True)
class Throttled:
    """One AutoThrottle step of a lane's fleet-wide delay (AUTOTHROTTLE_DEBUG logs it)."""

    lane: str
    old_ms: float
    new_ms: float
    latency_ms: int
    status: int


def _milliseconds(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def _throttled(flat: Any) -> tuple[Throttled, ...]:
    if not isinstance(flat, list):
        return ()
    return tuple(
        Throttled(text(flat[i]), _milliseconds(flat[i + 1]), _milliseconds(flat[i + 2]),
                  int(_milliseconds(flat[i + 3])), number(flat[i + 4]))
        for i in range(0, len(flat) - 4, 5)
    )


@dataclass(frozen=True)
class EnqueueResult:
    """Per request: ``+`` enqueued, ``d`` duplicate, ``s`` start already injected,
    ``c`` dropped because its lane's backlog is at the cap."""

    statuses: str
    acked: int
    repairs: Repairs = ()
    items_written: int = 0  # items of applied acks (and loose ones) now in the stream
    items_shed: int = 0  # items the stream's cap refused
    throttled: tuple[Throttled, ...] = ()  # AutoThrottle's steps, one per sample

    @property
    def enqueued(self) -> int:
        return self.statuses.count("+")


@dataclass(frozen=True)
class SweepResult:
    requeued: int
    dead_lettered: int
    workers_removed: int
    repairs: Repairs = ()
    # The dead workers whose leases were all taken (sharded.py's sweep needs them);
    # a detail of the sweep, not its outcome: results compare without it.
    swept: tuple[str, ...] = field(default=(), compare=False)


@dataclass(frozen=True)
class UnindexedResult:
    """One step of :meth:`FrontierUpkeep.repair_unindexed`.

    ``cursor`` is where the next step goes on ("0": a whole pass is done); in-flight
    entries without their index entries were ``requeued`` (owner dead; or
    ``dead_lettered``, requeued too often or unreadable) or ``reindexed`` (owner
    alive); ``removed`` index entries pointed to no lease.
    """

    cursor: str
    requeued: int
    dead_lettered: int
    reindexed: int
    removed: int
    repairs: Repairs = ()


@dataclass(frozen=True)
class Registration:
    """What ``register`` learned of the crawl (see ``scripts/register.lua``).

    ``status``: ``created``, ``joined``, ``finished`` (the crawl finished at
    ``finished_ms`` with ``acked`` requests done; nothing is queued) or ``conflict``
    (the crawl belongs to ``spider``, another spider: nothing was written) or
    ``shards`` (the crawl was created with ``shards`` shards, and the worker has
    another number: nothing was written).
    """

    flushed: bool
    alive: int
    status: str
    epoch: str
    spider: str = ""
    finished_ms: int = 0
    acked: int = 0
    shards: int = 0  # with status "shards": the crawl's number of shards


@dataclass(frozen=True)
class Heartbeat:
    """A heartbeat's answer (``scripts/heartbeat.lua``): ``status`` is ``ok``,
    ``swept`` (a sweep took this worker for dead), ``lost``, ``purged`` or ``changed``
    (the crawl's state is gone); ``late_ms``: since the previous heartbeat;
    ``queued``: requests queued fleet-wide; ``server``: the server's run id ("": none
    given), which changes when Redis restarts or another server takes over."""

    status: str
    late_ms: int = 0
    queued: int = 0  # requests queued fleet-wide
    server: str = ""

    @property
    def crawl_gone(self) -> bool:
        return self.status in ("lost", "purged", "changed")


@dataclass(frozen=True)
class FleetCounts:
    """``scripts/fleet_counts.lua``: the crawl's status (as ``Heartbeat.status``),
    requests queued and in flight, live workers still producing start requests, and
    whether any request was ever queued."""

    status: str
    queued: int
    inflight: int
    starting: int
    ever: bool
    shed: int = 0
    idle_ms: int = -1  # how long the crawl had no work (-1: it has, or not tracked)
    close_reason: str = ""  # the fleet's close order ("idle" once idle long enough)
    cut_short: int = 0  # workers that stopped while still producing start requests

    @property
    def has_work(self) -> bool:
        """Is work queued, in flight, or still being produced by a live worker?"""
        return bool(self.queued or self.inflight or self.starting)

    @property
    def pending(self) -> bool:
        """Is there, or may there still be, work for the fleet? A crawl that never
        had a request may get its first one (see REDISSPINE_WAIT_FOR_FIRST_REQUEST)."""
        return self.has_work or not self.ever


def text(value: Any) -> str:
    """A reply element as text (bytes decoded, never raising)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


def number(value: Any, default: int = 0) -> int:
    """A reply element as an int; ``default`` when it is none."""
    if isinstance(value, int):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def repairs_of(value: Any) -> Repairs:
    """The repairs element of a reply (anything else reads as none)."""
    if not isinstance(value, list | tuple):
        return ()
    return tuple(text(item) for item in value)


def fields(reply: Any, count: int) -> list[Any]:
    """The first ``count`` elements of a reply, None for each one missing."""
    items = list(reply) if isinstance(reply, list | tuple) else []
    return (items + [None] * count)[:count]


def count_result(reply: Any) -> Count:
    """A ``{ count, repairs }`` reply."""
    value, repairs = fields(reply, 2)
    return Count(number(value), repairs_of(repairs))


def enqueue_result(reply: Any) -> EnqueueResult:
    statuses, acked, written, shed, repairs, throttled = fields(reply, 6)
    return EnqueueResult(text(statuses), number(acked), repairs_of(repairs), number(written),
                         number(shed), _throttled(throttled))


def lease_batch(reply: Any) -> LeaseBatch:
    (members, token, requeued, delays, queued, inflight, malformed, wait_ms, close, repairs,
     page_limited) = fields(reply, 11)
    leases, unread = _leases(members if isinstance(members, list) else [],
                             str(number(token)), requeued, delays)
    return LeaseBatch(leases, number(queued), number(inflight), number(malformed),
                      number(wait_ms, -1), (*repairs_of(repairs), *unread), text(close),
                      number(page_limited))


def lease_with_acks(reply: Any) -> tuple[EnqueueResult, LeaseBatch]:
    """A lease reply that carried acks (lease.lua's last two fields): the acks' outcome
    as an enqueue of no requests would give it, and the lease. Repairs go with the
    lease alone (counted once)."""
    acked, throttled = fields(reply, 13)[11:]
    return EnqueueResult("", number(acked), throttled=_throttled(throttled)), lease_batch(reply)


def _leases(
    members: list[Any], token: str, requeued: Any, delays: Any
) -> tuple[list[Lease], list[str]]:
    times = fields(requeued, len(members))
    lane_delays = fields(delays, len(members))
    leases, unread = [], []
    for member, requeues, delay in zip(members, times, lane_delays, strict=True):
        try:
            lane, key, payload = split_member(member)
        except (AttributeError, TypeError, ValueError, UnicodeDecodeError):
            shown = member[:_SHOWN_BYTES] if isinstance(member, bytes) else member
            unread.append(f"lease reply: unreadable queue member {shown!r} (it stays in "
                          f"flight until this worker releases its orphans)")
            continue
        leases.append(Lease(key, token, payload, number(requeues), lane, _seconds(delay)))
    return leases, unread


def _seconds(value: Any) -> float | None:
    if not value:
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def registration(reply: Any) -> Registration:
    """``register.lua``'s reply; an unreadable one reads as a conflict with no
    spider (nothing was taken: the worker refuses to start)."""
    flushed, alive, status, epoch, detail = fields(reply, 5)
    status, detail = text(status) or "conflict", text(detail)
    result = Registration(bool(number(flushed)), number(alive), status, text(epoch))
    if status == "conflict":
        return replace(result, spider=detail)
    if status == "shards":
        return replace(result, shards=number(detail, 1))
    if status == "finished":
        finished_ms, _, acked = detail.partition(" ")
        return replace(result, finished_ms=number(finished_ms), acked=number(acked))
    return result


def heartbeat(reply: Any) -> Heartbeat:
    status, late_ms, queued, server = fields(reply, 4)
    return Heartbeat(text(status) or "lost", number(late_ms), number(queued), text(server))


def fleet_counts(reply: Any) -> FleetCounts:
    """``fleet_counts.lua``'s reply; an unreadable one reads as work left."""
    status, queued, inflight, starting, ever, shed, idle_ms, close, cut_short = fields(reply, 9)
    return FleetCounts(text(status) or "ok", number(queued, 1), number(inflight),
                       number(starting), bool(number(ever, 1)), number(shed),
                       number(idle_ms, -1), text(close), number(cut_short))
