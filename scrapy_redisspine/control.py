"""Fleet-wide orders (pause, resume, drain) and fleet-wide Scrapy stats.

The ``redisspine`` command writes orders into the crawl's ``control`` HASH; every
worker reads it once per heartbeat (never per request). Paused workers lease nothing
and keep what they hold; draining workers lease nothing, finish what is in progress,
return their unstarted leases and close with the reason ``drained``.

Each worker adds the growth of its numeric Scrapy stats since its last push into the
``fleet_stats`` HASH (periodically and at close, ``fleet_totals.py``), so the HASH
sums the whole fleet; the same step keeps the worker's own totals in
``worker_stats``.

Each sweep also adds a sample (this worker's acks, the fleet's acks) to the
``progress`` ZSET, from which ``redisspine status`` computes rates over a minute.

Keys touched: control, fleet_stats, worker_stats, progress.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_redisspine.scripts import ScriptSet

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    import redis

    from scrapy_redisspine.keys import CrawlKeys

logger = logging.getLogger(__name__)

PROGRESS_WINDOW_MS = 300_000  # samples kept for rates

PAUSED = "paused"
DRAIN = "drain"
#: Set by the fleet's limits (``limits.py``, ``scripts/lease.lua``): the close reason
#: every worker closes with (Scrapy's ``closespider_pagecount`` ...).
CLOSE = "close_reason"
#: The close order of a spent fleet-wide page budget (``scripts/lease.lua``). The
#: requests leased within the budget count as its pages, so they are still fetched
#: (Scrapy's own CLOSESPIDER_PAGECOUNT fetches at least that many), not handed back.
PAGE_BUDGET_SPENT = "closespider_pagecount"

#: The worker's own totals kept in ``worker_stats`` (Scrapy stat names).
WORKER_TOTALS = (
    "response_received_count", "item_scraped_count", "log_count/ERROR",
    "redisspine/scheduler/acked",
)


@dataclass(frozen=True)
class Orders:
    """What the fleet was told to do, as read from the ``control`` HASH."""

    paused: bool = False
    drain: bool = False
    close_reason: str = ""  # a fleet-wide limit was reached: every worker closes

    @property
    def stop_leasing(self) -> bool:
        return self.paused or self.drain or bool(self.close_reason)

    @property
    def fetch_leased(self) -> bool:
        """Are the requests already leased still to be fetched before closing?"""
        return self.close_reason == PAGE_BUDGET_SPENT and not self.drain

    @property
    def closing_reason(self) -> str:
        """The reason a worker with nothing in progress closes with ("" : none)."""
        return self.close_reason or ("drained" if self.drain else "")

    def describe(self) -> str:
        """What a worker's log says the orders now are: ``paused``, ``draining``,
        ``paused and draining``, or ``resumed`` (no order in force)."""
        named = [word for word, on in (("paused", self.paused), ("draining", self.drain),
                                       (f"closing ({self.close_reason})", self.close_reason))
                 if on]
        return " and ".join(named) or "resumed"


def read_orders(client: redis.Redis, keys: CrawlKeys) -> Orders:
    raw: dict[bytes, bytes] = client.hgetall(keys.control)  # type: ignore[assignment]
    reason = raw.get(CLOSE.encode(), b"").decode("utf-8", "replace")
    return Orders(paused=raw.get(PAUSED.encode()) == b"1", drain=raw.get(DRAIN.encode()) == b"1",
                  close_reason=reason)


def give_order(client: redis.Redis, keys: CrawlKeys, order: str, on: bool) -> None:
    """Set (or clear) ``paused`` or ``drain`` for every worker of the crawl."""
    if order not in (PAUSED, DRAIN):
        raise ValueError(f"unknown order {order!r}")
    if on:
        client.hset(keys.control, order, "1")
    else:
        client.hdel(keys.control, order)


class StatsPusher:
    """Adds a worker's numeric stats deltas to the fleet's ``fleet_stats`` HASH.

    One atomic script per push (``add_fleet_stats.lua``): a push is never half
    applied, so a retry after a failure counts nothing twice. A field that holds no
    number in Redis is skipped (its growth is kept for when it is repaired) and
    reported once through ``on_skip``. With a ``worker_id``, each push also keeps
    that worker's own totals (``WORKER_TOTALS``) in ``worker_stats``.
    """

    def __init__(
        self, client: redis.Redis, keys: CrawlKeys,
        on_skip: Callable[[str], None] | None = None, epoch: str = "", worker_id: str = "",
    ) -> None:
        self.keys = keys
        self.epoch = epoch
        self.worker_id = worker_id
        self._scripts = ScriptSet(client, keys)
        self._on_skip = on_skip
        self._pushed: dict[str, float] = {}
        self._skipped: set[str] = set()

    def push(self, stats: Mapping[str, Any], final: bool = False) -> int:
        """Send what grew since the last push; return how many fields changed.

        Nothing grew: no round trip, unless ``final`` (the push at close, which
        marks this worker's totals ``closed``)."""
        deltas: dict[str, int | float] = {}
        for name, value in stats.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            delta = value - self._pushed.get(name, 0)
            if delta:
                deltas[name] = delta
        if not deltas and not (final and self.worker_id):
            return 0
        totals = {name: stats.get(name, 0) for name in WORKER_TOTALS}
        args = [self.epoch, self.worker_id, "closed" if final else "running",
                json.dumps(totals, sort_keys=True)]
        for name, delta in deltas.items():
            args += [name, str(delta) if isinstance(delta, int) else repr(float(delta))]
        skipped = {_text(name) for name in self._scripts.run("add_fleet_stats", args)}
        for name, delta in deltas.items():
            if name not in skipped:
                self._pushed[name] = self._pushed.get(name, 0) + delta
        for name in sorted(skipped - self._skipped):
            logger.warning(
                "redisspine: fleet stat %r in %s holds no number: not adding to it (delete "
                "the field to repair it)", name, self.keys.fleet_stats,
            )
            if self._on_skip is not None:
                self._on_skip(name)
        self._skipped |= skipped
        return len(deltas) - len(skipped)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def record_progress(
    client: redis.Redis, keys: CrawlKeys, worker_id: str, worker_acks: int, fleet_acks: int,
    *, epoch: str = "",
) -> None:
    """Add a rate sample at Redis time and forget samples past the window (not into a
    crawl that is not the caller's: ``epoch``, see ``scripts/lib/crawl.lua``)."""
    ScriptSet(client, keys).run(
        "record_progress", [epoch, worker_id, worker_acks, fleet_acks, PROGRESS_WINDOW_MS]
    )
