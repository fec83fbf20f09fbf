"""Fleet items on a crawl over 3 shards (fakeredis and a real redis-server): an ack's
items go to the ack's shard's stream, once; loose items (of no ack) once, also when
another shard's call of the same enqueue failed and the worker sent it all again; the
items caps are the crawl's, each shard's stream holding its share."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import pytest
import redis

from scrapy_redisspine.frontier import NewRequest, StreamItem
from scrapy_redisspine.keys import CrawlKeys, shard_of
from scrapy_redisspine.sharded import ShardedFrontier, items_caps_share

if TYPE_CHECKING:
    from collections.abc import Sequence

SHARDS = 3
KEYS = CrawlKeys("redisspine", "shop", shards=SHARDS)


def _lane_of(shard: int) -> str:
    """A lane that shard ``shard`` owns."""
    n = 0
    while shard_of(f"h{n}.test", SHARDS) != shard:
        n += 1
    return f"h{n}.test"


def _request(shard: int, name: str) -> NewRequest:
    lane = _lane_of(shard)
    payload = f"https://{lane}/{name}".encode()
    return NewRequest(payload, hashlib.sha1(payload).digest(), lane=lane)


def _item(name: str) -> StreamItem:
    return StreamItem("dict", f"https://s.test/{name}", name.encode())


def _frontier(client: redis.Redis, **options: Any) -> ShardedFrontier:
    frontier = ShardedFrontier(client, KEYS, "w1", concurrency=100, **options)
    assert frontier.register(flush=False, alive_ms=30_000, spider="shop").status == "created"
    return frontier


def _streams(client: redis.Redis) -> list[list[bytes]]:
    """Each shard's items (their payloads), shard 0 first."""
    entries: list[list[Any]] = [client.xrange(view.items)  # type: ignore[misc]
                                for view in KEYS.shard_views()]
    return [[values[b"item"] for _, values in stream] for stream in entries]


def test_an_acks_items_go_to_the_acks_shard_with_its_children_elsewhere(
    client: redis.Redis,
) -> None:
    frontier = _frontier(client)
    frontier.enqueue([_request(1, "parent")])
    (parent,) = frontier.lease(1).leases
    children = [_request(shard, "child") for shard in range(SHARDS)]
    result = frontier.enqueue(children, [(*parent.handle, 0)], [[_item("a"), _item("b")]])
    assert result.acked == 1
    assert result.items_written == 2
    assert _streams(client) == [[], [b"a", b"b"], []]
    assert not client.exists(KEYS.items), "the crawl-wide stream is never written"


def test_a_refused_acks_items_are_not_written(client: redis.Redis) -> None:
    frontier = _frontier(client)
    frontier.enqueue([_request(2, "page")])
    (page,) = frontier.lease(1).leases
    key, _token = page.handle
    result = frontier.enqueue([], [(key, "not-the-token", 0)], [[_item("a")]])
    assert result.acked == 0
    assert result.items_written == 0
    assert _streams(client) == [[], [], []]


@pytest.mark.parametrize("with_children", [False, True])
def test_loose_items_are_written_once(client: redis.Redis, with_children: bool) -> None:
    frontier = _frontier(client)
    requests = [_request(shard, "start") for shard in range(SHARDS)] if with_children else []
    result = frontier.enqueue(requests, loose=[_item("x"), _item("y")])
    assert result.items_written == 2
    streams = _streams(client)
    assert sorted(payload for stream in streams for payload in stream) == [b"x", b"y"]
    assert sum(1 for stream in streams if stream) == 1, "both in one shard's stream"
    if not with_children:
        assert streams[0] == [b"x", b"y"], "with no call else, shard 0's"


def _failing(frontier: ShardedFrontier, shard: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shard ``shard``'s calls fail without running (its master unreachable, say);
    the others' run as usual."""
    real = frontier.crawl.pipelined
    queue = frontier.shards[shard].keys.queue

    def pipelined(calls: Sequence[Any]) -> list[Any]:
        ran = iter(real([call for call in calls if queue not in call[1]]))
        return [redis.exceptions.ConnectionError("shard down") if queue in call[1]
                else next(ran) for call in calls]

    monkeypatch.setattr(frontier.crawl, "pipelined", pipelined)


@pytest.mark.parametrize("down", range(SHARDS))
def test_loose_items_of_a_failed_enqueue_are_written_once_by_its_retry(
    client: redis.Redis, monkeypatch: pytest.MonkeyPatch, down: int,
) -> None:
    frontier = _frontier(client)
    requests = [_request(shard, "start") for shard in range(SHARDS)]
    loose = [_item("x"), _item("y")]
    with monkeypatch.context() as patch:
        _failing(frontier, down, patch)
        with pytest.raises(redis.exceptions.ConnectionError):
            frontier.enqueue(requests, loose=loose)
    frontier.ack([])  # an ack alone in between (no items) changes nothing
    retry = frontier.enqueue(requests, loose=list(loose))  # the outbox sends it all again
    assert retry.items_written == 2
    assert sorted(payload for stream in _streams(client) for payload in stream) == [b"x", b"y"]
    again = frontier.enqueue([], loose=[_item("x")])  # a new item of the same value: stored
    assert again.items_written == 1


def test_the_caps_are_the_crawls_each_shard_holding_its_share(client: redis.Redis) -> None:
    assert items_caps_share({"items_cap": 7, "items_max_bytes": 0, "concurrency": 2}, 3) == {
        "items_cap": 3, "items_max_bytes": 0, "concurrency": 2}
    assert items_caps_share({"items_cap": 6, "items_max_bytes": 1000}, 3) == {
        "items_cap": 2, "items_max_bytes": 334}
    frontier = _frontier(client, items_cap=4)  # 2 per shard
    assert frontier.crawl.items_cap == 4
    assert [shard.items_cap for shard in frontier.shards] == [2, 2, 2]
    result = frontier.enqueue([], loose=[_item(f"{n}") for n in range(3)])
    assert (result.items_written, result.items_shed) == (2, 1)
    frontier.enqueue([_request(1, "page")])
    (page,) = frontier.lease(1).leases
    result = frontier.enqueue([], [(*page.handle, 0)], [[_item("a"), _item("b"), _item("c")]])
    assert (result.items_written, result.items_shed) == (2, 1)
    assert [len(stream) for stream in _streams(client)] == [2, 2, 0]
