"""New requests and acks on their way to Redis.

A request's children always reach Redis in the same atomic step as its ack, or
before it: both wait here and go in one ``enqueue`` call, usually in the same round
trip as the next lease (see ``_leasing``), else when the buffer is full or its timer
fires. So do the request's items (``REDISSPINE_ITEMS``): they ride with its ack and
enter the items stream only if Redis applies that ack. Requests that went in are
kept as objects for a while (``REDISSPINE_LOCAL_REQUEST_CACHE``), so that leasing
them back skips decoding; the fingerprints Redis confirmed go to ``_seen``
(``REDISSPINE_LOCAL_DEDUP_CACHE``), so that a repeat is not sent again.

Scrapy-free: requests are only held, never built or inspected here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import redis

from scrapy_redisspine._guard import CALL_ERRORS
from scrapy_redisspine._redis_io import InlineIO

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from scrapy import Request
    from scrapy.statscollectors import StatsCollector

    from scrapy_redisspine._clock import Clock, DelayedCall
    from scrapy_redisspine._guard import RedisGuard
    from scrapy_redisspine._redis_io import RedisIO
    from scrapy_redisspine._seen import ConfirmedSeen
    from scrapy_redisspine.frontier import (
        Ack,
        EnqueueResult,
        LeaseHandle,
        NewRequest,
        StreamItem,
    )

logger = logging.getLogger("scrapy_redisspine.scheduler")

_SHED_LOG_INTERVAL_SECONDS = 60.0


class _EveryMinute:
    """Says whether a repeated warning is due again: at most one line a minute."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._last = float("-inf")

    def due(self) -> bool:
        now = self._clock.seconds()
        if now - self._last <= _SHED_LOG_INTERVAL_SECONDS:
            return False
        self._last = now
        return True

#: (order key, token, rest of its lane in ms, clock time when its fetch ended (its
#: response came in; without one, when the request was done), its download latency in
#: ms or -1, its response's status or 0: AutoThrottle's sample)
PendingAck = tuple[str, str, int, float, int, int]


class Enqueuer(Protocol):
    """The frontier call the outbox sends through."""

    def enqueue(
        self, requests: Sequence[NewRequest], acks: Sequence[Ack | LeaseHandle] = (),
        items: Sequence[Sequence[StreamItem]] = (), loose: Sequence[StreamItem] = (),
    ) -> EnqueueResult: ...

    def injected_starts(self, fingerprints: Sequence[bytes]) -> list[bool]: ...

    def add_shed(self, shed: int) -> None: ...


@dataclass(frozen=True)
class Sending:
    """What one send takes from the buffers (the buffers may grow meanwhile)."""

    requests: list[tuple[NewRequest, Request]]
    acks: list[PendingAck]
    entries: list[NewRequest]
    ack_args: list[Ack]
    items: list[tuple[StreamItem, ...]]  # per ack (empty when no ack has any)
    loose: list[StreamItem]
    #: requests shed that the fleet is told of first (``add_shed``), before the acks
    shed: int = 0
    #: the guard's era when the send was made (``_seen``: replies of an earlier era
    #: are not remembered)
    era: int = 0

    @property
    def carries(self) -> bool:
        """Does it hold anything for ``enqueue`` (else only the shed count)?"""
        return bool(self.entries or self.ack_args or self.loose)


class Outbox:
    """Owns the buffered requests and acks, the local request cache, the flush timer.

    Invariant kept: an ack never leaves before the requests buffered ahead of it,
    so a parent never leaves in-flight before its children are queued; a request's
    items leave only with its ack, in the same call.
    """

    def __init__(
        self,
        frontier: Enqueuer,
        guard: RedisGuard,
        stats: StatsCollector,
        clock: Clock,
        *,
        batch_size: int,
        cache_size: int,
        on_sent: Callable[[EnqueueResult], None],
        on_duplicate: Callable[[Request], None],
        on_dropped: Callable[[Request], None],
        io: RedisIO | None = None,
        seen: ConfirmedSeen | None = None,
    ) -> None:
        """``on_duplicate`` and ``on_dropped`` hear of the requests Redis did not
        queue (a duplicate, a lane at its backlog cap): the scheduler had said yes
        to them before the batch went out. ``io`` runs the sends (by default at once,
        on the caller's thread). ``seen`` learns the fingerprints Redis confirmed
        (queued, or a duplicate), for the scheduler to drop repeats before sending."""
        self._frontier = frontier
        self._io: RedisIO = io or InlineIO(stats)
        # A send on its way (its buffers stay here until Redis took them): no second
        # send may take the same entries.
        self._in_flight = False
        self._guard = guard
        self._stats = stats
        self._clock = clock
        self._batch_size = batch_size
        self._cache_size = cache_size
        self._on_sent = on_sent
        self._on_duplicate = on_duplicate
        self._on_dropped = on_dropped
        self._seen = seen
        self._requests: list[tuple[NewRequest, Request]] = []
        self._acks: list[PendingAck] = []
        self._ack_items: list[tuple[StreamItem, ...]] = []  # one per ack
        self._loose: list[StreamItem] = []  # items of no lease (start())
        self._items_waiting = 0  # items in _ack_items and _loose
        self._local: dict[bytes, Request] = {}  # payload -> the request it encodes
        self._flush_call: DelayedCall | None = None
        self._flush_due = 0.0  # when it fires (clock time)
        self._shed_log = _EveryMinute(clock)
        self._shed_unreported = 0  # requests shed that the fleet does not know of yet
        self._items_log = _EveryMinute(clock)
        # Requests on their way in whose lane is not known yet (lanes by IP, waiting
        # for their host's address): while any is, no ack leaves, since it may be the
        # ack of their parent.
        self._holds = 0

    # -- what waits --------------------------------------------------------------------

    def __len__(self) -> int:
        """Requests waiting to be sent (acks not counted)."""
        return len(self._requests)

    @property
    def acks(self) -> int:
        return len(self._acks)

    @property
    def empty(self) -> bool:
        return (not self._requests and not self._acks and not self._loose
                and not self._shed_unreported and not self._holds)

    @property
    def sendable(self) -> bool:
        """Is there anything a send would take now (held acks wait; so does all of
        it while a send is on its way)?"""
        return not self._in_flight and bool(
            self._requests or self._loose or self._shed_unreported
            or (self._acks and not self._holds))

    @property
    def in_flight(self) -> bool:
        """A send is on its way to Redis."""
        return self._in_flight

    def hold(self) -> None:
        """A request is on its way whose lane is not known yet: acks wait for it."""
        self._holds += 1

    def release_hold(self) -> None:
        """That request is in the buffer now (:meth:`add`); acks may go again."""
        self._holds = max(self._holds - 1, 0)
        if not self._holds and self._acks:
            self.flush_soon(0.0)

    @property
    def items(self) -> int:
        """Items waiting to be sent with their acks (or loose)."""
        return self._items_waiting

    @property
    def cached_count(self) -> int:
        """Requests kept as objects for a lease of them to skip decoding."""
        return len(self._local)

    def ack_keys(self) -> list[str]:
        return [ack[0] for ack in self._acks]

    def add(self, entry: NewRequest, request: Request, within: float) -> None:
        """Buffer a request; it leaves within ``within`` seconds at the latest."""
        self._requests.append((entry, request))
        self.flush_soon(within)

    def add_ack(self, handle: LeaseHandle, rest_ms: int, within: float,
                items: Sequence[StreamItem] = (), sample: tuple[int, int] = (-1, 0),
                *, ended: float | None = None) -> None:
        """Buffer the ack of a finished lease whose lane rests ``rest_ms`` from the
        end of its fetch (``ended``, this clock's time its response came in; None:
        now), with the items its callback produced and its AutoThrottle ``sample``
        (latency ms, status; -1: none)."""
        at = self._clock.seconds() if ended is None else ended
        self._acks.append((handle[0], handle[1], rest_ms, at, *sample))
        self._ack_items.append(tuple(items))
        self._items_waiting += len(items)
        self.flush_soon(within)

    def add_loose(self, item: StreamItem, within: float) -> None:
        """Buffer an item that belongs to no lease (one ``start()`` yielded)."""
        self._loose.append(item)
        self._items_waiting += 1
        self.flush_soon(within)

    def cached(self, payload: bytes) -> Request | None:
        """The request object this worker queued as ``payload``, if still kept."""
        return self._local.pop(payload, None)

    # -- sending -----------------------------------------------------------------------

    def flush_soon(self, within: float) -> None:
        """Send the buffers now if full, else within ``within`` seconds at the latest
        (the next lease usually carries them sooner)."""
        waiting = len(self._requests) + len(self._acks) + self._items_waiting
        if waiting >= self._batch_size or within <= 0:
            self.try_flush()
            return
        due = self._clock.seconds() + within
        call = self._flush_call
        if call is not None and call.active():
            if self._flush_due <= due:
                return  # called per request: this check must stay cheap
            call.cancel()
        self._flush_due = due
        self._flush_call = self._clock.callLater(within, self.try_flush)

    def try_flush(self) -> bool:
        """Send what waits unless Redis is backing off (through ``io``: the reply may
        come later); True if nothing is left to send, none on its way."""
        if self.empty:
            return True
        if not self.sendable:
            return False  # held acks: release_hold() flushes; a send on its way
        if not self._guard.available("enqueue"):
            return False
        sending = self.begin_send()
        frontier = self._frontier

        def send() -> EnqueueResult | None:  # on io's thread: Redis calls only
            if sending.shed:
                frontier.add_shed(sending.shed)
            if not sending.carries:
                return None
            return frontier.enqueue(sending.entries, sending.ack_args, sending.items,
                                    sending.loose)

        def done(result: EnqueueResult | None) -> None:
            if result is None:
                self._in_flight = False
            else:
                self.sent(sending, result)
            self._guard.succeeded("enqueue")

        def failed(exc: Exception) -> None:
            self.abort_send(sending)
            if not isinstance(exc, CALL_ERRORS):
                raise exc
            self.send_failed(exc)

        self._io.submit("enqueue", send, done, failed)
        return self.empty

    def flush(self) -> None:
        """Send the buffers in one atomic round trip, on the caller's thread (at
        close, once ``io`` is drained); raises what Redis raised."""
        self.report_shed()
        if not self.sendable:
            return
        sending = self.sending()
        self.sent(sending, self._frontier.enqueue(sending.entries, sending.ack_args,
                                                  sending.items, sending.loose))

    def report_shed(self) -> None:
        """Tell the fleet how many requests were shed, before the acks of the requests
        that found them leave (so no worker finds the crawl done without knowing);
        raises what Redis raised, the count kept for the next send."""
        if self._shed_unreported:
            self._frontier.add_shed(self._shed_unreported)
            self._shed_unreported = 0

    def sending(self) -> Sending:
        """The buffers as the frontier takes them, for a send of its own: copies, as
        the buffers may grow while a send is on its way (:meth:`sent` drops as many
        as it took from their front)."""
        requests, acks = list(self._requests), [] if self._holds else list(self._acks)
        items = list(self._ack_items) if self._items_waiting and acks else []  # one per ack
        return Sending(requests, acks, [entry for entry, _ in requests],
                       ack_args(acks, self._clock.seconds()), items, list(self._loose),
                       era=self._guard.era)

    def begin_send(self) -> Sending:
        """Take the buffers for a send that may be answered later, with the shed
        count to tell first: until :meth:`sent`, :meth:`send_failed` or
        :meth:`abort_send`, nothing else sends."""
        sending = self.sending()
        if self._shed_unreported:
            sending = Sending(sending.requests, sending.acks, sending.entries,
                              sending.ack_args, sending.items, sending.loose,
                              shed=self._shed_unreported, era=sending.era)
            self._shed_unreported = 0
        self._in_flight = True
        return sending

    def abort_send(self, sending: Sending) -> None:
        """That send did not reach Redis (or its reply was lost): its buffers stay
        for the next one, its shed count too."""
        self._in_flight = False
        self._shed_unreported += sending.shed

    def sent_shed_only(self, sending: Sending) -> None:
        """Redis took a send that held only the shed count."""
        self._in_flight = False

    def sent(self, sending: Sending, result: EnqueueResult) -> None:
        """Redis took ``sending``: empty those buffers, count, tell the owner."""
        self._in_flight = False
        self._requests = self._requests[len(sending.requests):]  # new lists
        self._acks = self._acks[len(sending.acks):]
        self._ack_items = self._ack_items[len(sending.acks):]
        self._loose = self._loose[len(sending.loose):]
        self._items_waiting -= len(sending.loose) + sum(len(its) for its in sending.items)
        self._record(sending, result)
        self._guard.repaired("enqueue", result.repairs)
        self._on_sent(result)

    def send_failed(self, exc: Exception) -> None:
        self._in_flight = False
        if isinstance(exc, redis.exceptions.OutOfMemoryError):
            self.shed_buffered()
        self._guard.failed("enqueue", exc)

    def close(self) -> None:
        """Stop the timer and forget the cache (what waits stays, for a last flush)."""
        if self._flush_call is not None and self._flush_call.active():
            self._flush_call.cancel()
        self._local.clear()

    # -- memory pressure -----------------------------------------------------------------

    def shed(self, request: Request) -> None:
        """Count (and log, once a minute) a new request dropped for lack of memory."""
        self._stats.inc_value("redisspine/memory/shed")
        self._shed_unreported += 1
        if self._shed_log.due():
            logger.warning(
                "redisspine: Redis is near its memory budget: not queueing newly discovered "
                "requests such as %s (start requests, retries and redirects still go in); "
                "see redisspine/memory/shed", request,
            )

    def shed_buffered(self) -> None:
        """Redis refused writes (OOM): keep work in progress, drop new discoveries,
        and start requests another worker already injected (a read still works on a
        full Redis). What is kept goes in on the next try however full Redis is: a
        batch of only start and dont_filter requests needs no room (enqueue.lua).
        Items waiting are shed too: they would be written past the budget."""
        self.shed_items()
        kept: list[tuple[NewRequest, Request]] = []
        for entry, request in self._requests:
            if entry.is_start or request.dont_filter:
                kept.append((entry, request))
            else:
                self.shed(request)
                self._on_dropped(request)  # enqueue_request() had said yes
        self._requests = kept
        starts = [entry.fingerprint for entry, _ in kept if entry.is_start]
        try:
            injected = iter(self._frontier.injected_starts(starts) if starts else [])
        except CALL_ERRORS:
            return  # kept: sent when Redis has room
        self._requests = []
        for entry, request in kept:
            if entry.is_start and next(injected, False):
                self._stats.inc_value("redisspine/scheduler/start_requests_skipped")
                self._on_dropped(request)
            else:
                self._requests.append((entry, request))

    def shed_items(self) -> None:
        """Drop the items waiting (their acks stay): counted, logged once a minute."""
        if not self._items_waiting:
            return
        self.items_shed(self._items_waiting)
        self._ack_items = [() for _ in self._ack_items]
        self._loose = []
        self._items_waiting = 0

    def items_shed(self, count: int) -> None:
        """Count (and log, once a minute) items not stored for lack of room."""
        self._stats.inc_value("redisspine/items/shed", count)
        if self._items_log.due():
            logger.warning(
                "redisspine: %d item(s) not stored: the items stream is at its cap "
                "(REDISSPINE_ITEMS_MAX_COUNT / REDISSPINE_ITEMS_MAX_BYTES) or Redis is near "
                "its memory budget; see redisspine/items/shed", count,
            )

    # -- bookkeeping -----------------------------------------------------------------------

    def _record(self, sending: Sending, result: EnqueueResult) -> None:
        stats = self._stats
        enqueued = result.enqueued
        if enqueued:
            stats.inc_value("scheduler/enqueued/redis", enqueued)
            stats.inc_value("scheduler/enqueued", enqueued)
        self._record_statuses(sending, result)
        if result.items_written:
            stats.inc_value("redisspine/items/stored", result.items_written)
        if result.items_shed:
            self.items_shed(result.items_shed)
        carried = len(sending.loose) + sum(len(its) for its in sending.items)
        fenced = carried - result.items_written - result.items_shed
        if fenced > 0:  # their acks were refused: another worker's ack writes them
            stats.inc_value("redisspine/items/fenced", fenced)
        sent = len(sending.acks)
        if sent:
            stats.inc_value("redisspine/scheduler/acked", result.acked)
        if result.acked < sent:
            stats.inc_value("redisspine/scheduler/ack_refused", sent - result.acked)
            logger.warning("redisspine: %d ack(s) refused: lease no longer ours",
                           sent - result.acked)

    def _record_statuses(self, sending: Sending, result: EnqueueResult) -> None:
        """Each request's fate: kept locally, confirmed as seen, or dropped."""
        stats = self._stats
        confirmed: list[bytes] = []
        for (entry, request), status in zip(sending.requests, result.statuses, strict=False):
            if status == "+":
                if self._cache_size:
                    self._keep_local(entry.payload, request)
                if not (entry.dont_filter or entry.is_start):
                    confirmed.append(entry.fingerprint)
            elif status == "d":
                confirmed.append(entry.fingerprint)  # (only filtered requests are "d")
                self._on_duplicate(request)
                self._on_dropped(request)
            elif status == "c":
                stats.inc_value("redisspine/scheduler/backlog_capped")
                self._on_dropped(request)
            else:  # a start request the crawl already has: not queued by this one
                stats.inc_value("redisspine/scheduler/start_requests_skipped")
                self._on_dropped(request)
        if self._seen is not None and confirmed:
            self._seen.confirm(confirmed, sending.era)

    def _keep_local(self, payload: bytes, request: Request) -> None:
        local = self._local
        local[payload] = request
        if len(local) > self._cache_size:
            del local[next(iter(local))]  # the oldest


def ack_args(acks: Sequence[PendingAck], now: float) -> list[Ack]:
    """Acks as sent: a lane's rest counts from the end of its fetch, so each ack
    tells how long ago that was (the callback, the item pipeline and the wait in the
    buffer; less 1 ms, what Redis's ms clock may lose to rounding: a rest is never
    cut short). enqueue.lua credits it against the lane's rest, AutoThrottle's
    delay included, up to that rest."""
    return [
        (key, token, rest_ms, latency_ms, status, max(0, int((now - ended) * 1000) - 1))
        for key, token, rest_ms, ended, latency_ms, status in acks
    ]
