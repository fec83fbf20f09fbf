"""The frontier's per-lane and per-lease keys leave Redis's packed encoding past 16
entries, whatever the server's thresholds (``scripts/lib/hashed.lua``).

A packed HASH or ZSET is scanned entry by entry on every read and write, and Redis's
defaults keep one packed up to 128 (ZSET) or 512 (HASH) entries: a crawl of 20 to
512 hosts paid that scan on every lease and ack (benchmarks/RESULTS.md, sessions 17
and 20). These run on a real redis-server with its default thresholds (fakeredis has
no encodings and no OBJECT command); what they hold: the keys are converted, their
contents are exactly what they were (no trace of the converting entry), a small
crawl keeps the compact form, a restart's re-packing is undone by the next entry set,
and neither a full Redis nor a server that refuses OBJECT to scripts breaks a call.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

from scrapy_redisspine.connection import PACKED_ENTRIES_MAX
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.scripts import source
from scrapy_redisspine.status import read_status

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from scrapy_redisspine.frontier import Lease
    from scrapy_redisspine.keys import CrawlKeys

PACKED = {b"listpack", b"ziplist"}
LANES = PACKED_ENTRIES_MAX + 4
#: The keys each step writes, as (CrawlKeys property, HASH or not).
ENQUEUED = (("backlog", True), ("hosts", False), ("queue", False))
#: Those a lease grows (and it writes `backlog`, which it empties when it takes a
#: lane's only request).
LEASED = (("busy", True), ("group_busy", True), ("inflight", True), ("leases", False),
          ("owned", False))
#: Of those, the ones a restart can find packed: in-flight's values (owner, token and
#: member) are longer than a packed entry may be anyway.
REPACKABLE = ("busy", "group_busy", "leases", "owned")


def _started(client: redis.Redis, keys: CrawlKeys) -> Frontier:
    frontier = Frontier(client, keys, "w1")
    frontier.register(flush=False, alive_ms=30_000)
    return frontier


def _enqueue_lanes(frontier: Frontier, lanes: int, page: int = 0) -> None:
    frontier.enqueue([NewRequest(f"h{i}.test/{page}".encode(), f"fp-{i}-{page}".encode(),
                                 lane=f"h{i}.test") for i in range(lanes)])


def _encoding(client: redis.Redis, key: str) -> bytes:
    return client.object("encoding", key)  # type: ignore[return-value]


def _entries(client: redis.Redis, key: str, is_hash: bool) -> list[bytes]:
    if is_hash:
        return list(client.hkeys(key))  # type: ignore[arg-type]
    return list(client.zrange(key, 0, -1))  # type: ignore[arg-type]


def _assert_converted(client: redis.Redis, keys: CrawlKeys, names: tuple[tuple[str, bool], ...],
                      size: int) -> None:
    for name, is_hash in names:
        key = getattr(keys, name)
        assert _encoding(client, key) not in PACKED, (name, _encoding(client, key))
        entries = _entries(client, key, is_hash)
        assert len(entries) == size, (name, entries)
        assert not [entry for entry in entries if entry.startswith(b"\0")], name


def _repack(client: redis.Redis, keys: CrawlKeys, names: tuple[str, ...]) -> None:
    """What an RDB or AOF load does to a small key: it comes back packed."""
    for name in names:
        key = getattr(keys, name)
        client.restore(key, 0, client.dump(key), replace=True)  # type: ignore[arg-type]
        assert _encoding(client, key) in PACKED, name


def _ack(frontier: Frontier, leases: list[Lease]) -> int:
    return frontier.ack([lease.handle for lease in leases])


def test_the_library_converts_past_the_limit_status_and_the_embedded_server_use() -> None:
    assert f"    local hashed_above = {PACKED_ENTRIES_MAX}\n" in source("lease")


def test_enqueue_lease_and_ack_leave_the_keys_past_the_limit_hashed_and_exact(
    real_redis: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    frontier = _started(real_redis, crawl_keys)
    _enqueue_lanes(frontier, LANES)
    _assert_converted(real_redis, crawl_keys, ENQUEUED, LANES)
    leases = frontier.lease(LANES).leases
    assert len(leases) == LANES
    assert {lease.lane for lease in leases} == {f"h{i}.test" for i in range(LANES)}
    _assert_converted(real_redis, crawl_keys, LEASED, LANES)
    assert real_redis.hvals(crawl_keys.busy) == [b"1"] * LANES
    assert _ack(frontier, leases) == LANES
    assert real_redis.zcard(crawl_keys.leases) == real_redis.hlen(crawl_keys.busy) == 0
    assert int(real_redis.hget(crawl_keys.stats, "acked")) == LANES  # type: ignore[arg-type]


def test_a_crawl_of_few_lanes_keeps_the_compact_form(
    real_redis: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    frontier = _started(real_redis, crawl_keys)
    _enqueue_lanes(frontier, PACKED_ENTRIES_MAX)
    frontier.lease(PACKED_ENTRIES_MAX // 2)
    for name in ("backlog", "hosts", "queue", "busy", "leases", "owned"):
        assert _encoding(real_redis, getattr(crawl_keys, name)) in PACKED, name


def test_keys_a_restart_packs_again_are_converted_by_the_next_lease(
    real_redis: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    frontier = _started(real_redis, crawl_keys)
    _enqueue_lanes(frontier, LANES)
    first = frontier.lease(LANES // 2).leases
    _repack(real_redis, crawl_keys, ("backlog", *REPACKABLE))
    second = frontier.lease(LANES).leases
    assert len(first) + len(second) == LANES
    _assert_converted(real_redis, crawl_keys, LEASED, LANES)
    assert _encoding(real_redis, crawl_keys.backlog) not in PACKED
    assert _ack(frontier, first + second) == LANES


def test_hosts_a_restart_packs_again_is_converted_by_the_next_ack(
    real_redis: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    frontier = _started(real_redis, crawl_keys)
    _enqueue_lanes(frontier, LANES)
    _enqueue_lanes(frontier, LANES, page=1)
    leased = frontier.lease(LANES // 2).leases
    assert real_redis.zcard(crawl_keys.hosts) == LANES - len(leased), "busy lanes are not due"
    _repack(real_redis, crawl_keys, ("hosts",))
    assert _ack(frontier, leased) == len(leased)  # their lanes are due again
    _assert_converted(real_redis, crawl_keys, (("hosts", False),), LANES)


def test_a_full_redis_still_takes_acks_and_leases_of_repacked_keys(
    real_redis: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    # The converting entry is a "denyoom" write: it comes only after the call wrote
    # something (which passed Redis's memory check), so it is never the one refused.
    frontier = _started(real_redis, crawl_keys)
    _enqueue_lanes(frontier, 2 * LANES)
    first = frontier.lease(LANES).leases
    _repack(real_redis, crawl_keys, ("backlog", *REPACKABLE))
    real_redis.config_set("maxmemory", 1)
    try:
        second = frontier.lease(LANES).leases
        acked = _ack(frontier, first)
    finally:
        real_redis.config_set("maxmemory", 0)
    assert (len(second), acked) == (LANES, LANES)
    _assert_converted(real_redis, crawl_keys, (("leases", False), ("owned", False)), LANES)
    assert _ack(frontier, second) == LANES
    assert real_redis.zcard(crawl_keys.queue) == 0


def test_a_server_that_refuses_object_to_the_worker_changes_nothing_but_speed(
    real_redis: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    # An ACL (or a managed Redis that renames OBJECT) leaves the keys packed: every
    # call works as before, and `redisspine status`, run by a user who may ask,
    # names the keys left packed
    with _worker_without_object(real_redis) as limited:
        frontier = _started(limited, crawl_keys)
        _enqueue_lanes(frontier, LANES)
        _enqueue_lanes(frontier, LANES, page=1)
        leases = frontier.lease(LANES).leases
        assert len(leases) == LANES
        for name in ("backlog", "queue", "busy", "leases", "owned"):
            assert _encoding(real_redis, getattr(crawl_keys, name)) in PACKED, name
        packed = {key["key"] for key in read_status(real_redis, crawl_keys)["packed_keys"]}
        assert {"backlog", "busy", "leases", "owned"} <= packed
        assert _ack(frontier, leases) == LANES
        assert len(frontier.lease(LANES).leases) == LANES, "the lanes' second requests"
    assert real_redis.zcard(crawl_keys.queue) == 0


@contextmanager
def _worker_without_object(admin: redis.Redis) -> Iterator[redis.Redis]:
    """A client whose ACL user may run every command but OBJECT."""
    admin.execute_command("ACL", "SETUSER", "no-object", "on", ">pw", "~*", "&*", "+@all",
                          "-object")
    kwargs = admin.connection_pool.connection_kwargs
    client = type(admin)(host=kwargs.get("host", "localhost"), port=kwargs.get("port", 6379),
                         unix_socket_path=kwargs.get("path"), username="no-object",
                         password="pw")
    try:
        yield client
    finally:
        client.close()
        admin.execute_command("ACL", "DELUSER", "no-object")
