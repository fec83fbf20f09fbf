"""A crawl's state as ``redisspine status`` shows it, read with bounded commands only.

Every read is O(1), a ZRANGE/ZRANGEBYSCORE with a LIMIT, or an HSCAN that stops
after a fixed number of fields, so ``status`` never blocks Redis on a large crawl:
counts come from ZCARD/HLEN, the top hosts from one bounded HSCAN of ``backlog``.

Keys read: queue, inflight, dead, stats, fleet_stats, worker_stats, workers,
progress, backlog, busy, group_busy, hosts, host_next, host_delay, lane_limits,
lane_throttle, seen, dedup, bloom, control, record. For a sharded crawl (keys with
``shards`` > 1) the frontier's keys of every shard (``_views``): counts and counters
summed, lanes read in their own shard.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from scrapy_redisspine.connection import PACKED_ENTRIES_MAX, evicting_policy, routed_to
from scrapy_redisspine.control import read_orders
from scrapy_redisspine.members import execute_reading_counts, queue_size, read_queue_size
from scrapy_redisspine.status_eta import LanePace, eta, slowest_lane

if TYPE_CHECKING:
    from scrapy_redisspine.keys import CrawlKeys

RATE_WINDOW_MS = 60_000
_MAX_SAMPLES = 5000
_MAX_WORKERS = 100
_MAX_STAT_FIELDS = 2000
_BACKLOG_SCAN_FIELDS = 10_000


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _number(value: bytes | str | float | None) -> int | float:
    """A number read from Redis; 0 for none, or for a value that is no number (the
    scripts repair those: status only shows what is there)."""
    if value is None:
        return 0
    try:
        number = float(value)
    except ValueError:
        return 0
    if not math.isfinite(number):
        return 0
    return int(number) if number.is_integer() else number


def crawl_exists(client: redis.Redis, keys: CrawlKeys) -> bool:
    """The crawl is registered or still has any of its main keys (or its items, which
    outlive a crawl that finished with ``REDISSPINE_PERSIST = False``: of a sharded
    one, its record keeps the number of shards that says where they are)."""
    if client.sismember(keys.crawls, keys.crawl_id):
        return True
    return bool(client.exists(keys.queue, keys.inflight, keys.stats, keys.workers, keys.dead,
                              keys.items)) or bool(client.hexists(keys.record, "shards"))


def list_crawls(client: redis.Redis, registry: str, limit: int = 1000) -> list[str]:
    """Crawl ids in the ``registry`` SET (SSCAN, at most ``limit``)."""
    names: list[str] = []
    for member in client.sscan_iter(registry, count=200):
        names.append(_text(member))
        if len(names) >= limit:
            break
    return sorted(names)


def _scan_hash(client: redis.Redis, key: str, limit: int) -> dict[str, bytes]:
    fields: dict[str, bytes] = {}
    for field, value in client.hscan_iter(key, count=500):
        fields[_text(field)] = value
        if len(fields) >= limit:
            break
    return fields


@dataclass(frozen=True)
class Sample:
    ms: int
    worker: str
    worker_acks: int
    fleet_acks: int

    @classmethod
    def parse(cls, member: bytes | str) -> Sample | None:
        parts = _text(member).rsplit(":", 2)
        head = parts[0].split(":", 1) if len(parts) == 3 else []
        try:
            return cls(int(head[0]), head[1], int(parts[1]), int(parts[2]))
        except (IndexError, ValueError):
            return None


def _rates(samples: list[Sample], now_ms: int, acked: int) -> tuple[float | None, dict[str, float]]:
    """Fleet acks per minute (now vs the oldest sample) and each worker's."""
    if not samples:
        return None, {}
    first = samples[0]
    fleet = None
    if now_ms - first.ms >= 1000:
        fleet = (acked - first.fleet_acks) * 60_000 / (now_ms - first.ms)
    per_worker: dict[str, list[Sample]] = {}
    for sample in samples:
        per_worker.setdefault(sample.worker, []).append(sample)
    workers = {}
    for worker, own in per_worker.items():
        span = own[-1].ms - own[0].ms
        if span >= 1000:
            workers[worker] = (own[-1].worker_acks - own[0].worker_acks) * 60_000 / span
    return fleet, workers


def _views(keys: CrawlKeys) -> tuple[CrawlKeys, ...]:
    """The views whose frontier keys hold the crawl: its shards', or its own."""
    return keys.shard_views() if keys.shards > 1 else (keys,)


def _view_of(keys: CrawlKeys, lane: str) -> CrawlKeys:
    return keys.shard_view(keys.shard_of(lane)) if keys.shards > 1 else keys


def _backlog(client: redis.Redis, keys: CrawlKeys) -> dict[str, int]:
    """Lane -> requests queued, for at most ``_BACKLOG_SCAN_FIELDS`` lanes (of every
    shard: a lane lives in one)."""
    backlog: dict[str, int] = {}
    for view in _views(keys):
        raw = _scan_hash(client, view.backlog, _BACKLOG_SCAN_FIELDS - len(backlog))
        backlog.update((lane, int(_number(value))) for lane, value in raw.items())
        if len(backlog) >= _BACKLOG_SCAN_FIELDS:
            break
    return backlog


def _hosts(
    client: redis.Redis, keys: CrawlKeys, backlog: dict[str, int], top: int, now_ms: int
) -> list[dict[str, Any]]:
    lanes = sorted(backlog, key=lambda lane: -backlog[lane])[:top]
    # and the busy lanes with nothing queued (their last fetches), so that every busy
    # lane's delay shows: at most `top` more, one bounded HSCAN (per shard)
    busy_lanes = [lane for view in _views(keys) for lane in _scan_hash(client, view.busy, top)]
    lanes += [lane for lane in busy_lanes if lane not in backlog][:top]
    if not lanes:
        return []
    if keys.shards > 1:  # each lane in its shard's keys, in the order asked
        by_view: dict[int, list[str]] = {}
        for lane in lanes:
            by_view.setdefault(keys.shard_of(lane), []).append(lane)
        rows = {row["lane"]: row for index, these in by_view.items()
                for row in _lane_rows(client, keys.shard_view(index), these, backlog, now_ms)}
        return [rows[lane] for lane in lanes]
    return _lane_rows(client, keys, lanes, backlog, now_ms)


def _lane_rows(client: redis.Redis, keys: CrawlKeys, lanes: list[str],
               backlog: dict[str, int], now_ms: int) -> list[dict[str, Any]]:
    pipe = client.pipeline(transaction=False)
    pipe.hmget(keys.busy, lanes)
    pipe.zmscore(keys.hosts, lanes)
    pipe.hmget(keys.host_next, lanes)
    pipe.hmget(keys.host_delay, lanes)
    pipe.hmget(keys.group_busy, lanes)
    pipe.hmget(keys.lane_throttle, lanes)
    busy, due, rest, delay, group_busy, throttle = pipe.execute()
    rows = []
    for i, lane in enumerate(lanes):
        next_ms = max(_number(due[i]), _number(rest[i]))
        rows.append({
            "lane": lane,
            "backlog": backlog.get(lane, 0),
            "busy": int(_number(busy[i])),
            # the politeness group's, this crawl's included (other crawls share the lane)
            "group_busy": int(_number(group_busy[i])),
            "next_due_in_seconds": round(max(0.0, next_ms - now_ms) / 1000, 1),
            "crawl_delay_seconds": float(_number(delay[i])) if delay[i] is not None else None,
            # the fleet-wide AutoThrottle delay (AUTOTHROTTLE_ENABLED), None: none yet
            "autothrottle_delay_seconds": (
                round(float(_number(throttle[i])) / 1000, 3) if throttle[i] is not None else None
            ),
        })
    return rows


def _dedup(client: redis.Redis, keys: CrawlKeys) -> dict[str, Any]:
    """The dedup record; of a sharded crawl, its shards' summed (the mode: the one
    they share, or each shard's, comma-separated, while they differ)."""
    views = _views(keys)
    modes = [client.hget(view.dedup, "mode") for view in views]
    seen = sum(int(client.scard(view.seen)) for view in views)  # type: ignore[arg-type]
    pipe = client.pipeline(transaction=False)
    for view in views:
        pipe.memory_usage(view.seen)
        pipe.memory_usage(view.bloom)
    try:
        memory: int | None = sum(int(size or 0) for size in pipe.execute())
    except redis.ResponseError:  # MEMORY disabled (rename-command) or unsupported
        memory = None
    named = [_text(mode) if mode else "set" for mode in modes]
    return {
        "mode": named[0] if len(set(named)) == 1 else ",".join(named),
        "set_size": seen,
        "memory_bytes": memory,
    }


def _kept_totals(raw: bytes | str | None, now_ms: int) -> dict[str, Any]:
    """A worker's last pushed totals (``worker_stats``): what, how old, final or not."""
    if raw is None:
        return {"totals": None, "totals_age_seconds": None, "totals_final": False}
    ms, state, text = [*_text(raw).split("\n", 2), "", ""][:3]
    try:
        totals = {name: _number(value) for name, value in json.loads(text).items()}
    except (ValueError, AttributeError):
        totals = None  # not written by a worker: shown as none
    return {"totals": totals, "totals_age_seconds": round((now_ms - _number(ms)) / 1000, 1),
            "totals_final": state == "closed"}


def _redis_memory(client: redis.Redis, keys: CrawlKeys, budget_bytes: int) -> dict[str, Any]:
    """The server's memory (``INFO memory``: one O(1) command) and the budget the
    workers hold it to: the smaller of ``maxmemory`` and REDISSPINE_MEMORY_BUDGET_BYTES
    that is set (None: no limit); ``evicting_policy``, its maxmemory-policy when it
    may evict the crawl's keys (workers refuse it), else None. None for all when INFO
    is switched off."""
    try:
        info = client.info("memory", **routed_to(client, keys.queue))
    except redis.ResponseError:
        return {"used_bytes": None, "max_bytes": None, "budget_bytes": None,
                "evicting_policy": None}
    used, maxmemory = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    budget = min((value for value in (maxmemory, budget_bytes) if value > 0), default=None)
    return {"used_bytes": used, "max_bytes": maxmemory or None, "budget_bytes": budget,
            "evicting_policy": evicting_policy(info) or None}


_PACKED = frozenset({b"listpack", b"ziplist"})
#: The frontier's keys with a field per lane or a member per lease, which every lease
#: and ack reads or writes: name -> whether it is a HASH (else a ZSET).
_PER_LANE_OR_LEASE = {"busy": True, "backlog": True, "host_next": True, "group_busy": True,
                      "hosts": False, "leases": False, "owned": False}


def _packed_keys(client: redis.Redis, keys: CrawlKeys) -> list[dict[str, Any]] | None:
    """The frontier keys Redis keeps as one packed list (listpack, ziplist) although
    they hold more than ``PACKED_ENTRIES_MAX`` (connection.py) entries: every lease and ack scans
    them entry by entry, which Redis's default thresholds (128, 512) allow and which costs
    Redis 19-41 % more work per request (benchmarks/RESULTS.md, session 17). The
    scripts convert such a key when they set an entry in it (scripts/lib/hashed.lua),
    so one is seen here after a restart (an RDB or AOF load packs small keys again)
    until a script next sets an entry in it, or for good where the worker's Redis
    user may not run ``OBJECT``. Redis says nothing of it, so ``status`` does.
    ``OBJECT ENCODING`` and ``HLEN``/``ZCARD`` are O(1). None when the server
    refuses ``OBJECT`` to this client (an ACL, a managed Redis that renames it,
    fakeredis): not known, nothing shown."""
    pipe = client.pipeline(transaction=False)
    checked = []
    for view in _views(keys):
        for name, is_hash in _PER_LANE_OR_LEASE.items():
            key = getattr(view, name)
            pipe.object("encoding", key)
            if is_hash:
                pipe.hlen(key)
            else:
                pipe.zcard(key)
            checked.append((view, name))
    try:
        replies = pipe.execute()
    except redis.ResponseError:
        return None
    packed = []
    for (view, name), encoding, entries in zip(checked, replies[0::2], replies[1::2],
                                               strict=True):
        raw = encoding.encode() if isinstance(encoding, str) else encoding
        if raw in _PACKED and int(entries) > PACKED_ENTRIES_MAX:
            packed.append({"key": name, "shard": view.shard if keys.shards > 1 else None,
                           "entries": int(entries), "encoding": _text(raw)})
    return packed


def _workers(
    client: redis.Redis, keys: CrawlKeys, now_ms: int, timeout_ms: int, rates: dict[str, float]
) -> list[dict[str, Any]]:
    """Workers with a heartbeat, then those gone that left totals (bounded: at most
    ``_MAX_WORKERS`` of each). ``state``: alive, silent (no heartbeat for a timeout,
    not swept yet), closed (left, its totals final) or dead (swept: its totals are
    the last it pushed)."""
    beats: list[tuple[bytes, float]] = client.zrevrange(  # type: ignore[assignment]
        keys.workers, 0, _MAX_WORKERS - 1, withscores=True
    )
    ids = [_text(member) for member, _ in beats]
    kept = client.hmget(keys.worker_stats, ids) if ids else []
    rows = []
    for worker, (_, score), raw in zip(ids, beats, kept, strict=True):
        alive = now_ms - score <= timeout_ms
        rows.append({
            "id": worker, "alive": alive, "state": "alive" if alive else "silent",
            "last_heartbeat_ms": int(score),
            # a beat after this read's TIME: age 0, not negative
            "heartbeat_age_seconds": round(max(0.0, now_ms - score) / 1000, 1),
            "acks_per_minute": round(rates[worker], 1) if worker in rates else None,
            **_kept_totals(raw, now_ms),
        })
    gone = []
    for worker, raw in _scan_hash(client, keys.worker_stats, 2 * _MAX_WORKERS).items():
        if worker not in ids:
            totals = _kept_totals(raw, now_ms)
            gone.append({
                "id": worker, "alive": False,
                "state": "closed" if totals["totals_final"] else "dead",
                "last_heartbeat_ms": None, "heartbeat_age_seconds": None,
                "acks_per_minute": None, **totals,
            })
    gone.sort(key=lambda row: row["totals_age_seconds"] or 0)
    return rows + gone[:_MAX_WORKERS]


def _errors(fleet: dict[str, int | float]) -> dict[str, int | float]:
    markers = ("log_count/ERROR", "downloader/exception_type_count/", "spider_exceptions/",
               "downloader/response_status_count/4", "downloader/response_status_count/5")
    return {name: value for name, value in fleet.items() if name.startswith(markers)}


def _items(in_stream: int, counters: dict[str, int | float]) -> dict[str, int]:
    """The items stream (REDISSPINE_ITEMS): what it holds now (a consumer may trim it)
    and what the fleet wrote, shed at the cap, or kept out with a fenced ack."""
    return {"in_stream": in_stream, "stored": int(counters.get("items", 0)),
            "shed": int(counters.get("items_shed", 0)),
            "fenced": int(counters.get("items_fenced", 0))}


def _state(status: dict[str, Any]) -> str:
    """finished (and nothing left: a finished crawl fed again runs again), draining,
    paused, idle (nothing queued or in flight), running, or waiting for workers."""
    left = status["queued"] or status["in_flight"]
    if status["finished_ms"] is not None and not left:
        return "finished"
    if status["draining"]:
        return "draining"
    if status["paused"]:
        return "paused"
    if not left:
        return "idle"
    return "running" if status["workers_alive"] else "waiting for workers"


def _slowest(client: redis.Redis, keys: CrawlKeys, backlog: dict[str, int],
             pace: LanePace) -> dict[str, Any] | None:
    """The slowest lane (status_eta), each lane read in its shard's keys."""
    if keys.shards == 1:
        return slowest_lane(client, keys, backlog, pace)
    found = [slowest_lane(client, keys.shard_view(index),
                          {lane: n for lane, n in backlog.items()
                           if keys.shard_of(lane) == index}, pace)
             for index in range(keys.shards)]
    return max((lane for lane in found if lane is not None),
               key=lambda lane: lane["seconds"], default=None)


def read_status(
    client: redis.Redis, keys: CrawlKeys, *, timeout_ms: int = 30_000, top_hosts: int = 10,
    pace: LanePace | None = None, memory_budget_bytes: int = 0,
) -> dict[str, Any]:
    """The crawl's state as a JSON-ready dict (the shape of ``status --json``);
    ``pace``: the lanes' delays and concurrency from the project's settings, and
    ``memory_budget_bytes`` its REDISSPINE_MEMORY_BUDGET_BYTES."""
    seconds, micros = client.time(**routed_to(client, keys.workers))
    now_ms = seconds * 1000 + micros // 1000
    views = _views(keys)
    pipe = client.pipeline(transaction=False)
    counts_at: set[int] = set()
    for view in views:
        counts_at.add(read_queue_size(pipe, view.queue, view.queue_counts))
        pipe.hlen(view.inflight)
        pipe.hlen(view.dead)
        pipe.xlen(view.items)
    pipe.zcard(keys.workers)
    pipe.zrangebyscore(keys.progress, now_ms - RATE_WINDOW_MS, "+inf", 0, _MAX_SAMPLES)
    pipe.hget(keys.record, "finished_ms")
    # workers still producing start requests, and those that stopped while they were
    # (their start requests not queued are known to no one: fleet_counts.lua)
    pipe.zcount(keys.starting, now_ms - timeout_ms, "+inf")
    pipe.zcount(keys.starting, "-inf", f"({now_ms - timeout_ms}")
    *per_view, workers_total, raw_samples, finished_ms, producing, cut_short = (
        execute_reading_counts(pipe, counts_at))
    queued = sum(queue_size(zcard, listed)
                 for zcard, listed in zip(per_view[0::5], per_view[1::5], strict=True))
    inflight, dead, items = (sum(per_view[i::5]) for i in range(2, 5))
    counters: dict[str, int | float] = {}
    # a sharded crawl's counters: each shard's and the crawl-wide ones (shed ...)
    for stats in [view.stats for view in views] + ([keys.stats] if keys.shards > 1 else []):
        for name, value in _scan_hash(client, stats, 100).items():
            counters[name] = counters.get(name, 0) + _number(value)
    raw_fleet = _scan_hash(client, keys.fleet_stats, _MAX_STAT_FIELDS)
    fleet = {name: _number(value) for name, value in sorted(raw_fleet.items())}
    samples = [s for s in map(Sample.parse, raw_samples) if s is not None]
    done = int(counters.get("acked", 0))
    rate, worker_rates = _rates(samples, now_ms, done)
    workers = _workers(client, keys, now_ms, timeout_ms, worker_rates)
    orders = read_orders(client, keys)
    backlog = _backlog(client, keys)
    status: dict[str, Any] = {
        "crawl": keys.crawl_id,
        "shards": keys.shards,
        "time_ms": now_ms,
        "queued": int(queued),
        "in_flight": int(inflight),
        "done": done,
        "dead_letters": int(dead),
        "paused": orders.paused,
        "draining": orders.drain,
        "close_reason": orders.close_reason or None,  # a fleet-wide limit was reached
        "finished_ms": int(_number(finished_ms)) if finished_ms is not None else None,
        "workers_alive": sum(1 for w in workers if w["alive"]),
        "workers_total": int(workers_total),
        "workers_starting": int(producing),
        "workers_cut_short": int(cut_short),
        "items": _items(int(items), counters),
    }
    status["state"] = _state(status)
    if status["state"] == "finished":
        rate = None  # a finished crawl has no rate: the last minute's acks were its end
    slowest = _slowest(client, keys, backlog, pace or LanePace())
    status["eta_seconds"], status["eta_bound"] = eta(status, rate, slowest)
    status.update({
        "rate_per_minute": round(rate, 1) if rate is not None else None,
        "slowest_lane": slowest,
        "workers": workers,
        "hosts": _hosts(client, keys, backlog, top_hosts, now_ms),
        "dedup": _dedup(client, keys),
        "redis_memory": _redis_memory(client, keys, memory_budget_bytes),
        "packed_keys": _packed_keys(client, keys),
        "counters": counters,
        "fleet_stats": fleet,
        "errors": _errors(fleet),
    })
    return status
