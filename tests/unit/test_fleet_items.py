"""Fleet items (REDISSPINE_ITEMS): each request's items enter the crawl's items stream
in the same enqueue step as its ack, and only when that ack passes the fencing check.

The script tests run on fakeredis and on a real redis-server; the scheduler tests play
the engine with a FakeEngine; the codec tests need no Redis.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import pytest
import redis
import scrapy
from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler

from scrapy_redisspine._items import ItemClasses
from scrapy_redisspine.fleet_items import FleetItems, feed_uri_params
from scrapy_redisspine.frontier import Frontier, Lease, NewRequest, StreamItem
from scrapy_redisspine.item_codec import (
    ItemCodec,
    ItemEncodeError,
    entry_fields,
)
from scrapy_redisspine.request_codec import RequestCodec
from scrapy_redisspine.serialization import get_serializer, loads_any
from tests.queue_view import queued_count
from tests.unit.conftest import SchedSpider, finish

if TYPE_CHECKING:
    from scrapy_redisspine.keys import CrawlKeys
    from tests.unit.conftest import FrontierFactory, MakeScheduler

WIDE = 10_000


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()


@dataclasses.dataclass
class Review:
    stars: int
    when: dt.date


def _item(name: str) -> StreamItem:
    return StreamItem("dict", f"https://a.example/{name}", f'{{"n":"{name}"}}'.encode())


def _leased(frontier: Frontier, *payloads: bytes) -> list[Lease]:
    frontier.enqueue([NewRequest(p, b"fp-" + p, lane=p.decode()) for p in payloads])
    leases = frontier.lease(len(payloads)).leases
    assert len(leases) == len(payloads)
    return leases


def _stream(client: redis.Redis, keys: CrawlKeys) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in client.xrange(keys.items)]


def _urls(client: redis.Redis, keys: CrawlKeys) -> list[str]:
    return [fields[b"url"].decode() for fields in _stream(client, keys)]


def _requeue_to(frontier: Frontier, other: Frontier, client: redis.Redis,
                keys: CrawlKeys) -> Lease:
    """Take ``frontier``'s worker for dead, sweep, and lease its request to ``other``."""
    client.zadd(keys.workers, {frontier.worker_id: 1})
    swept = frontier.upkeep.requeue_stale(timeout_ms=60_000, ceiling_ms=0, max_requeues=10,
                                          limit=100)
    assert swept.requeued == 1
    (again,) = other.lease(1).leases
    return again


class TestScript:
    def test_items_of_an_applied_ack_enter_the_stream_with_it(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier(concurrency=WIDE)
        (lease,) = _leased(frontier, b"a")
        result = frontier.enqueue([], [lease.handle], [[_item("a1"), _item("a2")]])
        assert (result.acked, result.items_written, result.items_shed) == (1, 2, 0)
        entries = _stream(client, crawl_keys)
        assert [e[b"item"] for e in entries] == [b'{"n":"a1"}', b'{"n":"a2"}']
        assert entries[0][b"class"] == b"dict"
        assert entries[0][b"url"] == b"https://a.example/a1"
        assert not client.hlen(crawl_keys.inflight)  # the ack itself was applied
        assert int(client.hget(crawl_keys.stats, "items") or 0) == 2

    def test_a_fenced_ack_writes_none_of_its_items_and_the_winner_writes_them_once(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        first, second = make_frontier("w1"), make_frontier("w2")
        (old,) = _leased(first, b"a")
        new = _requeue_to(first, second, client, crawl_keys)
        # w1 comes back and sends its ack with its items, beside an ack of its own
        # that still holds: only the latter's items go in.
        (mine,) = _leased(first, b"b")
        result = first.enqueue([], [old.handle, mine.handle],
                               [[_item("a-by-w1")], [_item("b-by-w1")]])
        assert (result.acked, result.items_written) == (1, 1)
        assert _urls(client, crawl_keys) == ["https://a.example/b-by-w1"]
        assert int(client.hget(crawl_keys.stats, "items_fenced") or 0) == 1
        won = second.enqueue([], [new.handle], [[_item("a-by-w2")]])
        assert (won.acked, won.items_written) == (1, 1)
        assert _urls(client, crawl_keys) == ["https://a.example/b-by-w1",
                                             "https://a.example/a-by-w2"]

    def test_an_ack_sent_again_after_a_lost_reply_writes_nothing_more(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        (lease,) = _leased(frontier, b"a")
        items = [[_item("a1")]]
        assert frontier.enqueue([], [lease.handle], items).items_written == 1
        again = frontier.enqueue([], [lease.handle], items)
        assert (again.acked, again.items_written) == (0, 0)
        assert len(_stream(client, crawl_keys)) == 1

    def test_the_same_ack_twice_in_one_batch_writes_its_items_once(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        (lease,) = _leased(frontier, b"a")
        result = frontier.enqueue([], [lease.handle, lease.handle],
                                  [[_item("a1")], [_item("a1")]])
        assert (result.acked, result.items_written) == (1, 1)

    def test_items_and_ack_are_one_step_a_failing_script_applies_neither(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        (lease,) = _leased(frontier, b"a")
        client.set(crawl_keys.items, "not a stream")
        with pytest.raises(redis.ResponseError, match="holds a string, expected a stream"):
            frontier.enqueue([], [lease.handle], [[_item("a1")]])
        assert client.hlen(crawl_keys.inflight) == 1  # the ack did not happen either
        client.delete(crawl_keys.items)
        assert frontier.enqueue([], [lease.handle], [[_item("a1")]]).items_written == 1

    def test_items_go_with_the_acks_and_children_of_one_call(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier(concurrency=WIDE)
        a, b = _leased(frontier, b"a", b"b")
        children = [NewRequest(b"c", b"fp-c", lane="c")]
        result = frontier.enqueue(children, [a.handle, b.handle], [[], [_item("b1")]])
        assert (result.statuses, result.acked, result.items_written) == ("+", 2, 1)
        assert _urls(client, crawl_keys) == ["https://a.example/b1"]

    def test_the_count_cap_sheds_items_but_never_refuses_the_ack(
        self, make_frontier: FrontierFactory, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier = make_frontier()
        frontier.items_cap = 2
        (lease,) = _leased(frontier, b"a")
        result = frontier.enqueue([], [lease.handle], [[_item("1"), _item("2"), _item("3")]])
        assert (result.acked, result.items_written, result.items_shed) == (1, 2, 1)
        assert int(client.hget(crawl_keys.stats, "items_shed") or 0) == 1
        client.xtrim(crawl_keys.items, maxlen=0)  # a consumer trims what it processed
        assert frontier.enqueue([], [], loose=[_item("4")]).items_written == 1

    def test_the_byte_cap_counts_what_the_stream_still_holds(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.items_max_bytes = 25  # each payload here is 10 bytes
        result = frontier.enqueue([], [], loose=[_item("1"), _item("2"), _item("3")])
        assert (result.items_written, result.items_shed) == (2, 1)
        client.xtrim(crawl_keys.items, maxlen=0)
        assert frontier.enqueue([], [], loose=[_item("4")]).items_written == 1

    def test_loose_items_need_no_ack(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        result = frontier.enqueue([], [], loose=[_item("s")])
        assert result.items_written == 1
        assert _urls(client, crawl_keys) == ["https://a.example/s"]

    def test_the_items_outlive_a_crawl_purged_as_done_but_not_an_explicit_purge(
        self, frontier: Frontier, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        frontier.register(flush=False, alive_ms=30_000)
        (lease,) = _leased(frontier, b"a")
        frontier.enqueue([], [lease.handle], [[_item("a1")]])
        assert frontier.upkeep.purge_if_done(frontier.epoch, 30_000)  # PERSIST = False
        left = [key for key in crawl_keys.all_crawl_keys() if client.exists(key)]
        assert left == [crawl_keys.items]
        frontier.upkeep.purge()
        assert not client.exists(crawl_keys.items)

    def test_an_item_list_per_ack_is_required(self, frontier: Frontier) -> None:
        with pytest.raises(ValueError, match="1 item lists for 2 acks"):
            frontier.enqueue([], [("k", "t"), ("k2", "t")], [[_item("x")]])


def _response(request: Request) -> HtmlResponse:
    return HtmlResponse(request.url, body=b"<html></html>", request=request)


def _lease_request(scheduler: Any, url: str) -> Request:
    assert scheduler.enqueue_request(Request(url))
    scheduler.outbox.flush()
    request = scheduler.next_request()
    assert request is not None
    return request


class TestFullRedis:
    def test_a_fenced_ack_and_loose_items_are_not_refused_by_a_full_redis(
        self, real_redis: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        # No ack applies here, so nothing else writes first: without the script's
        # non-"denyoom" first write, a full Redis would refuse this send for good and
        # the worker holding it would never finish.
        first = Frontier(real_redis, crawl_keys, "w1", concurrency=WIDE)
        second = Frontier(real_redis, crawl_keys, "w2", concurrency=WIDE)
        (old,) = _leased(first, b"a")
        _requeue_to(first, second, real_redis, crawl_keys)
        real_redis.config_set("maxmemory", 1)
        try:
            result = first.enqueue([], [old.handle], [[_item("a-by-w1")]],
                                   loose=[_item("s")])
        finally:
            real_redis.config_set("maxmemory", 0)
        assert (result.acked, result.items_written) == (0, 1)
        assert _urls(real_redis, crawl_keys) == ["https://a.example/s"]
        assert int(real_redis.hget(crawl_keys.stats, "items_fenced") or 0) == 1


class TestScheduler:
    def test_an_item_waits_for_its_requests_ack_and_goes_with_it(
        self, make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        scheduler = make_scheduler(REDISSPINE_ITEMS=True)
        request = _lease_request(scheduler, "https://a.example/1")
        scheduler.view.items.add({"n": 1}, request, request.url)
        scheduler.outbox.flush()
        assert not client.exists(crawl_keys.items), "an item left before its ack"
        finish(scheduler, request)
        assert scheduler.outbox.items == 1
        scheduler.outbox.flush()
        assert _urls(client, crawl_keys) == ["https://a.example/1"]
        assert scheduler.stats.get_value("redisspine/items/stored") == 1
        assert not client.hlen(crawl_keys.inflight)

    def test_a_worker_closing_before_the_ack_writes_no_item_and_hands_the_lease_back(
        self, make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        scheduler = make_scheduler(REDISSPINE_ITEMS=True)
        request = _lease_request(scheduler, "https://a.example/1")
        scheduler.view.items.add({"n": 1}, request, request.url)
        scheduler.close("shutdown")
        assert not client.exists(crawl_keys.items)
        assert queued_count(client, crawl_keys) == 1  # fetched again, items made again
        assert scheduler.stats.get_value("redisspine/items/unacked_dropped") == 1

    def test_an_item_of_no_request_of_ours_goes_loose(
        self, make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        scheduler = make_scheduler(REDISSPINE_ITEMS=True)
        scheduler.view.items.add({"from": "start"}, None, "")
        scheduler.outbox.flush()
        assert len(_stream(client, crawl_keys)) == 1
        assert scheduler.stats.get_value("redisspine/items/loose") == 1

    def test_a_full_redis_sheds_items_and_counts_them(
        self, make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        scheduler = make_scheduler(REDISSPINE_ITEMS=True)
        request = _lease_request(scheduler, "https://a.example/1")
        scheduler.guard.memory_pressure = True
        scheduler.view.items.add({"n": 1}, request, request.url)
        finish(scheduler, request)
        scheduler.outbox.flush()
        assert not client.exists(crawl_keys.items)
        assert scheduler.stats.get_value("redisspine/items/shed") == 1
        assert not client.hlen(crawl_keys.inflight)  # the ack went all the same

    def test_an_item_that_cannot_be_stored_is_counted_and_the_crawl_goes_on(
        self, make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
    ) -> None:
        scheduler = make_scheduler(REDISSPINE_ITEMS=True)
        request = _lease_request(scheduler, "https://a.example/1")
        scheduler.view.items.add({"handle": object()}, request, request.url)
        finish(scheduler, request)
        scheduler.outbox.flush()
        assert scheduler.stats.get_value("redisspine/items/unserializable") == 1
        assert not client.hlen(crawl_keys.inflight)

    def test_without_the_setting_there_is_no_item_box(
        self, make_scheduler: MakeScheduler
    ) -> None:
        assert make_scheduler().view.items is None


class _Box:
    def __init__(self) -> None:
        self.added: list[tuple[Any, Request | None, str]] = []

    def add(self, item: Any, request: Request | None, url: str) -> None:
        self.added.append((item, request, url))


class TestExtension:
    def test_off_unless_the_setting_is_on(self) -> None:
        with pytest.raises(NotConfigured):
            FleetItems.from_crawler(get_crawler(SchedSpider))

    def test_hands_the_item_over_with_the_request_of_its_response_or_failure(self) -> None:
        extension = FleetItems.from_crawler(
            get_crawler(SchedSpider, {"REDISSPINE_ITEMS": True})
        )
        box = _Box()
        extension.box = box  # type: ignore[assignment]
        request = Request("https://a.example/1")
        extension.item_scraped({"n": 1}, response=_response(request))

        class Failed:  # what Scrapy hands errback items: a Failure with .request
            pass

        failure = Failed()
        failure.request = request  # type: ignore[attr-defined]
        extension.item_scraped({"n": 2}, response=failure)
        extension.item_scraped({"n": 3}, response=None)
        assert box.added == [({"n": 1}, request, request.url), ({"n": 2}, request, request.url),
                             ({"n": 3}, None, "")]


def test_a_feed_uri_per_worker() -> None:
    import os

    from scrapy.extensions.feedexport import apply_uri_params

    params = feed_uri_params({"name": "books", "time": "t"}, None)
    uri = apply_uri_params("items-%(name)s-%(worker)s.jsonl", params)
    assert uri.startswith("items-books-")
    assert uri.endswith(f"-{os.getpid()}.jsonl")


def _codec(serializer: str = "msgpack") -> ItemCodec:
    items = ItemClasses([__name__])
    requests = RequestCodec(None, get_serializer(serializer), (), items)
    return ItemCodec(requests.serializer, items, requests)


class TestCodec:
    @pytest.mark.parametrize("serializer", ["msgpack", "json"])
    def test_items_of_every_kind_round_trip_with_their_class_recorded(
        self, serializer: str
    ) -> None:
        codec = _codec(serializer)
        for item, path in (
            ({"a": 1, "b": [b"x", Decimal("1.5")]}, "dict"),
            (Product(name="p", price=Decimal("9.99")), f"{__name__}.Product"),
            (Review(5, dt.date(2026, 1, 2)), f"{__name__}.Review"),
        ):
            entry = codec.encode(item, "https://a.example/")
            assert entry.class_path == path
            # plain msgpack / JSON: read back with no hook, no class, no code run
            assert loads_any(entry.payload)["class"] == path
            back = codec.decode(entry.payload)
            assert type(back) is type(item)
            assert (dict(back) == dict(item)) if isinstance(item, Product) else back == item

    def test_a_tool_reads_plain_fields_without_the_classes(self) -> None:
        codec = _codec()
        entry = codec.encode(Product(name="p", price=Review(4, dt.date(2026, 1, 2))), "u")
        read = entry_fields(b"1-0", {b"class": entry.class_path.encode(), b"url": b"u",
                                     b"item": entry.payload})
        assert (read.entry_id, read.class_path, read.url) == ("1-0", f"{__name__}.Product", "u")
        assert read.fields == {"name": "p", "price": {"stars": 4, "when": dt.date(2026, 1, 2)}}

    def test_a_class_off_the_allowlist_is_refused_where_it_is_stored(self) -> None:
        codec = ItemCodec(get_serializer("msgpack"), ItemClasses(["elsewhere"]),
                          RequestCodec(None, get_serializer("msgpack"), (), ItemClasses()))
        with pytest.raises(ItemEncodeError, match="is not allowed"):
            codec.encode(Product(name="p"), "u")

    def test_what_is_no_item_or_holds_an_object_is_refused(self) -> None:
        codec = _codec()
        with pytest.raises(ItemEncodeError, match="cannot store an item of type"):
            codec.encode(["a list"], "u")
        with pytest.raises(ItemEncodeError, match="cannot store an item of dict"):
            codec.encode({"x": object()}, "u")
