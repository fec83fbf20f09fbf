"""Acks that carry nothing go in the lease's own script call (``scripts/lease.lua``,
``scripts/lib/acks.lua``): the same outcome as an enqueue of them followed by a lease,
in one script call. On fakeredis and the real redis-server (``client``)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import pytest
import redis

from scrapy_redisspine._results import enqueue_result, lease_batch
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.scripts import SCRIPT_NAMES
from scrapy_redisspine.settings import Throttle

if TYPE_CHECKING:
    from scrapy_redisspine._results import EnqueueResult, LeaseBatch

ONE_CALL = CrawlKeys("redisspine", "acks-in-the-lease", group="one")
TWO_CALLS = CrawlKeys("redisspine", "acks-then-lease", group="two")
RULE = Throttle(start_delay=4.0, max_delay=10.0, target_concurrency=2.0, debug=False)


def _request(lane: str, name: str) -> NewRequest:
    payload = f"{lane}/{name}".encode()
    return NewRequest(payload, hashlib.sha1(payload).digest(), lane=lane)


def _frontier(client: redis.Redis, keys: CrawlKeys, rule: Throttle | None = None) -> Frontier:
    return Frontier(client, keys, "w1", concurrency=1, throttle=rule, min_delay_ms=0)


def _round(
    frontier: Frontier, *, one_call: bool, garbage_elapsed: bool = False
) -> tuple[EnqueueResult, LeaseBatch, list[str]]:
    """Lanes a, b, c (one request each in flight, a second one queued), a requeue count
    on b's lease; then acks of a (no rest), b (a rest of a minute, a latency sample)
    and c (a token that is not its own), and a lease of up to 5: in one call, or as an
    enqueue of the acks and a lease. Returns the outcome and the script calls made."""
    frontier.enqueue([_request(lane, name) for lane in "abc" for name in ("1", "2")])
    # No waiting for AutoThrottle's first rests (lib/throttle.lua: the start delay).
    frontier.client.delete(frontier.keys.host_next)
    frontier.client.zadd(frontier.keys.hosts, dict.fromkeys("abc", 0), xx=True)
    first = {lease.lane: lease for lease in frontier.lease(5).leases}
    assert sorted(first) == ["a", "b", "c"]
    frontier.client.hset(frontier.keys.requeues, first["b"].key, 2)
    elapsed: Any = "garbage" if garbage_elapsed else 0
    acks = [(first["a"].key, first["a"].token, 0, -1, 0, elapsed),
            (first["b"].key, first["b"].token, 60_000, 3000, 200, 0),
            (first["c"].key, "999999", 0, -1, 0, 0)]
    calls: list[str] = []
    pipelined = frontier._pipelined

    def counted(batch: Any) -> list[Any]:
        calls.extend(name for name, _, _ in batch)
        return pipelined(batch)

    frontier._pipelined = counted  # type: ignore[method-assign]
    try:
        if one_call:
            sent, batch = frontier.enqueue_and_lease([], acks, 5)
            assert not isinstance(sent, Exception)
        else:
            (sent_reply, lease_reply) = counted([frontier.enqueue_call([], acks),
                                                 frontier.lease_call(5)])
            sent, batch = enqueue_result(sent_reply), lease_batch(lease_reply)
    finally:
        del frontier._pipelined
    return sent, batch, calls


def _state(client: redis.Redis, keys: CrawlKeys) -> dict[str, Any]:
    """What the round left, without its clock readings and order keys."""
    inflight = client.hgetall(keys.inflight)
    return {
        # owner \n token \n member; a member starts with its lane and a NUL
        "in_flight": sorted(value.split(b"\n", 2)[2].split(b"\0")[0]
                            for value in inflight.values()),
        "leases": client.zcard(keys.leases),
        "owned": client.zcard(keys.owned),
        "requeues": client.hlen(keys.requeues),
        "busy": client.hgetall(keys.busy),
        "backlog": client.hgetall(keys.backlog),
        "resting": sorted(client.hkeys(keys.host_next)),
        "due": sorted(client.zrange(keys.hosts, 0, -1)),
        "acked": client.hget(keys.stats, "acked"),
        "leased": client.hget(keys.stats, "leased"),
        "delay": client.hgetall(keys.lane_throttle),
    }


def test_acks_in_the_lease_leave_what_an_enqueue_of_them_then_a_lease_leaves(
    client: redis.Redis,
) -> None:
    one = _frontier(client, ONE_CALL)
    sent, batch, calls = _round(one, one_call=True)
    two = _frontier(client, TWO_CALLS)
    sent_apart, batch_apart, calls_apart = _round(two, one_call=False)

    assert calls == ["lease"], "one script call for the acks and the lease"
    assert calls_apart == ["enqueue", "lease"]
    assert sent.acked == sent_apart.acked == 2, "c's ack carries another token: refused"
    # a was freed with no rest: its second request is leased in the same call; b
    # rests a minute; c's lease is still in flight.
    assert [lease.payload for lease in batch.leases] == [b"a/2"]
    assert [lease.payload for lease in batch_apart.leases] == [b"a/2"]
    state = _state(client, ONE_CALL)
    assert state == _state(client, TWO_CALLS)
    assert state["in_flight"] == [b"a", b"c"]
    assert (state["leases"], state["owned"], state["requeues"]) == (2, 2, 0)
    assert state["acked"] == b"2"
    assert state["resting"] == [b"b"]
    assert batch.repairs == batch_apart.repairs == ()


def test_autothrottle_takes_the_same_samples_from_acks_in_the_lease(
    client: redis.Redis,
) -> None:
    sent, batch, _ = _round(_frontier(client, ONE_CALL, RULE), one_call=True)
    sent_apart, batch_apart, _ = _round(_frontier(client, TWO_CALLS, RULE), one_call=False)
    assert sent.throttled == sent_apart.throttled
    assert [(step.lane, step.latency_ms) for step in sent.throttled] == [("b", 3000)]
    # AutoThrottle's start delay rests a too: nothing is leased.
    assert batch.leases == batch_apart.leases == []
    assert _state(client, ONE_CALL) == _state(client, TWO_CALLS)
    assert client.hget(ONE_CALL.lane_throttle, "b") is not None


def test_an_elapsed_that_is_no_number_is_repaired_and_reported_once(
    client: redis.Redis,
) -> None:
    sent, batch, _ = _round(_frontier(client, ONE_CALL), one_call=True, garbage_elapsed=True)
    assert sent.acked == 2
    assert sent.repairs == ()
    assert [repair for repair in batch.repairs if "elapsed" in repair]


def test_a_lease_refuses_acks_that_claim_items_before_it_writes(client: redis.Redis) -> None:
    frontier = _frontier(client, ONE_CALL)
    frontier.enqueue([_request("a", "1"), _request("b", "1")])
    (lease,) = frontier.lease(1).leases
    keys, args = frontier._lease_call(1, [(lease.key, lease.token, 0)])
    args[12 + 3] = 1  # the ack's n_items
    before = (client.hgetall(ONE_CALL.inflight), client.zrange(ONE_CALL.queue, 0, -1))
    with pytest.raises(redis.exceptions.ResponseError, match="carries no items"):
        frontier._scripts.call("lease", keys, args)
    assert (client.hgetall(ONE_CALL.inflight), client.zrange(ONE_CALL.queue, 0, -1)) == before


def test_a_script_flush_loads_every_script_again_not_only_the_one_called(
    real_redis: redis.Redis,
) -> None:
    client = real_redis  # fakeredis keeps no script cache to flush
    frontier = _frontier(client, ONE_CALL)
    frontier.enqueue([_request("a", "1"), _request("a", "2")])
    (lease,) = frontier.lease(5).leases
    client.script_flush()
    sent, batch = frontier.enqueue_and_lease([], [(lease.key, lease.token, 0)], 5)
    assert not isinstance(sent, Exception)
    assert (sent.acked, [lease.payload for lease in batch.leases]) == (1, [b"a/2"])
    shas = [frontier._scripts[name].sha for name in SCRIPT_NAMES]
    assert all(client.script_exists(*shas)), "the next pipeline finds its enqueue too"
    # ... so new requests and the lease that may take them run in their order.
    sent, batch = frontier.enqueue_and_lease(
        [_request("c", "1")], [(batch.leases[0].key, batch.leases[0].token, 0)], 5)
    assert not isinstance(sent, Exception)
    assert [lease.payload for lease in batch.leases] == [b"c/1"]
