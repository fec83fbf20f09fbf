"""The feed key: entries validated, drained in batches through the dedup, bad ones
dead-lettered with their reasons, and a worker dying between the enqueue and the
removal loses nothing and fetches nothing twice (fakeredis and a real server)."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

import pytest
import redis as redis_lib
from scrapy import signals as scrapy_signals
from scrapy.utils.test import get_crawler

from scrapy_redisspine import Addon, signals
from scrapy_redisspine._feed_store import FeedStore
from scrapy_redisspine.feed import FeedDrain
from scrapy_redisspine.feed_entries import BadEntry, parse_entry
from scrapy_redisspine.keys import CrawlKeys, feed_key
from tests.queue_view import queued_count
from tests.unit.conftest import SchedSpider, clock_of, finish, scheduler_config

if TYPE_CHECKING:
    from scrapy import Request

    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import MakeScheduler

KEYS = CrawlKeys("redisspine", "test")
FEED = "sched:start_urls"  # SchedSpider's name, by the default template


def _is_callback(name: str) -> bool:
    return callable(getattr(SchedSpider(), name, None))


# --- entries --------------------------------------------------------------------------

def test_a_plain_url_is_a_get_with_the_default_priority_and_parse() -> None:
    entry = parse_entry(b"  https://a.test/x?q=1 \n", priority=3)
    assert (entry.request.url, entry.request.method) == ("https://a.test/x?q=1", "GET")
    assert entry.request.priority == 3
    assert entry.callback is None


def test_a_json_entry_carries_every_field() -> None:
    text = json.dumps({
        "url": "http://a.test/p", "method": "post", "meta": {"k": [1, 2]},
        "callback": "parse_item", "priority": 7, "headers": {"X-A": "1"},
        "body": "x=1", "cb_kwargs": {"page": 2},
    })
    entry = parse_entry(text, is_callback=_is_callback)
    request = entry.request
    assert (request.method, request.priority, request.body) == ("POST", 7, b"x=1")
    assert request.meta == {"k": [1, 2]}
    assert request.cb_kwargs == {"page": 2}
    assert request.headers["X-A"] == b"1"
    assert entry.callback == "parse_item"
    assert not request.dont_filter


@pytest.mark.parametrize(("text", "reason"), [
    ("not a url", "not an absolute http(s) URL"),
    ("ftp://a.test/x", "not an absolute http(s) URL"),
    ("{not json", "not valid JSON"),
    ('["http://a.test/"]', "not an absolute http(s) URL"),  # no object: read as a URL
    ('{"url": "http://a.test/", "calback": "parse"}', "unknown key(s) calback"),
    ('{"url": "http://a.test/", "dont_filter": true}', "unknown key(s) dont_filter"),
    ('{"meta": {}}', "needs a 'url' string"),
    ('{"url": "http://a.test/", "callback": "nope"}', "not a method of the spider"),
    ('{"url": "http://a.test/", "callback": "os.system"}', "is no public method name"),
    ('{"url": "http://a.test/", "callback": "__init__"}', "is no public method name"),
    ('{"url": "http://a.test/", "priority": "high"}', "'priority' must be an integer"),
    ('{"url": "http://a.test/", "priority": true}', "'priority' must be an integer"),
    ('{"url": "http://a.test/", "meta": [1]}', "'meta' must be a object"),
    ('{"url": "http://a.test/", "headers": {"A": 1}}', "'headers' values"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_a_bad_entry_is_refused_with_its_reason(text: str | bytes, reason: str) -> None:
    with pytest.raises(BadEntry) as caught:
        parse_entry(text, is_callback=_is_callback)
    assert reason in str(caught.value)


def test_a_tool_without_the_spider_checks_only_the_callback_form() -> None:
    assert parse_entry('{"url": "http://a.test/", "callback": "anything"}').callback == "anything"


def test_a_bad_feed_key_template_stops_the_crawl_at_its_start() -> None:
    from scrapy_redisspine._settings_checks import ConfigError
    from scrapy_redisspine.settings import load_config

    with pytest.raises(ConfigError, match="REDISSPINE_FEED_KEY '%\\(nme\\)s:x' is no key"):
        load_config({"REDISSPINE_FEED_KEY": "%(nme)s:x"})
    assert load_config({"REDISSPINE_FEED_KEY": "{c}:%(name)s"}).feed_key == "{c}:%(name)s"


def test_the_feed_key_template() -> None:
    assert feed_key("%(name)s:start_urls", "books") == "books:start_urls"
    assert feed_key("{books}:feed", "books") == "{books}:feed"
    assert feed_key("", "books") == ""
    with pytest.raises(ValueError, match="REDISSPINE_FEED_KEY"):
        feed_key("%(nme)s:start_urls", "books")


# --- the drain ------------------------------------------------------------------------

def _drain(worker: Scheduler, **settings: Any) -> FeedDrain:
    config = scheduler_config("redis://unused.invalid/0", **settings)
    drain = FeedDrain(config, worker.stats, clock=clock_of(worker))
    drain.worker_opened(worker.view, spider=SchedSpider())
    return drain


def _leased(worker: Scheduler) -> list[Request]:
    got = []
    for _ in range(50):
        clock_of(worker).advance(0.01)
        request = worker.next_request()
        if request is not None:
            got.append(request)
            finish(worker, request)
    return got


@pytest.fixture
def worker(make_scheduler: MakeScheduler) -> Scheduler:
    return make_scheduler("w1", free_slots=10)


def test_the_addon_switches_it_on_and_an_empty_key_switches_it_off() -> None:
    crawler = get_crawler(SchedSpider, {"ADDONS": {Addon: 0}})
    assert crawler.settings.getdict("EXTENSIONS")[FeedDrain] == 540
    from scrapy.exceptions import NotConfigured

    off = get_crawler(SchedSpider, {"ADDONS": {Addon: 0}, "REDISSPINE_FEED_KEY": ""})
    with pytest.raises(NotConfigured, match="REDISSPINE_FEED_KEY"):
        FeedDrain.from_crawler(off)


def test_in_a_crawl_the_key_is_named_by_the_crawler_spider(
    worker: Scheduler, client: redis_lib.Redis
) -> None:
    # (Scrapy's own extensions left out: theirs would need spider_opened before the close)
    crawler = get_crawler(SchedSpider, {"ADDONS": {Addon: 0}, "EXTENSIONS_BASE": {},
                                        "REDISSPINE_FEED_KEY": "{test}:%(name)s:feed"})
    crawler.spider = SchedSpider()  # as Crawler.crawl sets it, before the engine opens
    drain = FeedDrain.from_crawler(crawler)
    try:
        crawler.signals.send_catch_log(signals.worker_opened, worker=worker.view)
        assert drain.store is not None
        assert drain.store.feed_key == "{test}:sched:feed"
        assert drain.running
    finally:
        # The add-on's extensions of this crawler heard worker_opened too, and their
        # timers run on the real reactor: a close stops them, or they tick on in later
        # tests (a fleet totals push once logged "the crawl's state in Redis is gone"
        # into another test's capture). The worker's own close tells a crawler of its
        # own (none here), so this crawler is told here.
        crawler.signals.send_catch_log(signals.worker_closing, worker=worker.view)
        crawler.signals.send_catch_log(scrapy_signals.spider_closed, spider=crawler.spider,
                                       reason="finished")
        drain.stop()
    # (conftest's _no_timer_left_on_the_reactor fails the test if a timer is left)


def test_urls_and_json_entries_are_crawled_with_meta_and_callback_bad_ones_dead_lettered(
    worker: Scheduler, client: redis_lib.Redis
) -> None:
    client.rpush(FEED, "http://a.test/1",
                 json.dumps({"url": "http://b.test/2", "meta": {"tag": "x"},
                             "callback": "parse_item", "cb_kwargs": {"n": 1}}),
                 "not a url",
                 json.dumps({"url": "http://c.test/3", "callback": "missing"}))
    drain = _drain(worker)
    try:
        assert client.exists(FEED) == 0, "the whole batch is taken as the worker opens"
        by_url = {request.url: request for request in _leased(worker)}
        assert set(by_url) == {"http://a.test/1", "http://b.test/2"}
        assert by_url["http://b.test/2"].meta["tag"] == "x"
        assert getattr(by_url["http://b.test/2"].callback, "__name__", "") == "parse_item"
        assert by_url["http://b.test/2"].cb_kwargs == {"n": 1}
        letters = {letter.payload: letter.reason
                   for letter in worker.view.upkeep.dead_letters()}
        assert "not an absolute http(s) URL" in letters[b"not a url"]
        missing = json.dumps({"url": "http://c.test/3", "callback": "missing"}).encode()
        assert "'missing' is not a method of the spider" in letters[missing]
        assert client.hget(KEYS.stats, "fed") == b"2"
        assert client.hget(KEYS.stats, "feed_dead_lettered") == b"2"
    finally:
        drain.stop()


def test_entries_go_through_the_crawl_dedup(
    worker: Scheduler, client: redis_lib.Redis
) -> None:
    client.rpush(FEED, "http://a.test/1", "http://a.test/1", '{"url": "http://a.test/1"}')
    drain = _drain(worker)
    try:
        clock_of(worker).advance(0.5)
        assert client.exists(FEED) == 0
        assert [request.url for request in _leased(worker)] == ["http://a.test/1"]
    finally:
        drain.stop()


def test_batches_in_a_row_while_full_then_the_next_tick(
    worker: Scheduler, client: redis_lib.Redis
) -> None:
    client.rpush(FEED, *[f"http://a.test/{i}" for i in range(25)])
    drain = _drain(worker, REDISSPINE_FEED_BATCH_SIZE=2)
    try:
        assert client.llen(FEED) == 5, "ten batches of two as the worker opens"
        clock_of(worker).advance(0.5)
        assert client.llen(FEED) == 0
        assert worker.stats.get_value("redisspine/feed/enqueued") == 25
    finally:
        drain.stop()


def test_a_zset_feed_is_taken_highest_score_first(
    worker: Scheduler, client: redis_lib.Redis
) -> None:
    drain = _drain(worker, REDISSPINE_FEED_BATCH_SIZE=2)
    client.zadd(FEED, {"http://a.test/low": 1, "http://a.test/high": 9, "http://a.test/mid": 5})
    try:
        assert drain.take_batch() == 2
        assert client.zrange(FEED, 0, -1) == [b"http://a.test/low"]
    finally:
        drain.stop()


def test_a_feed_key_of_another_type_is_left_alone_with_one_warning(
    worker: Scheduler, client: redis_lib.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    client.set(FEED, "oops")
    drain = _drain(worker)
    try:
        with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
            clock_of(worker).advance(0.5)
            clock_of(worker).advance(0.5)
        warnings = [r.getMessage() for r in caplog.records if "holds a string" in r.getMessage()]
        assert len(warnings) == 1
        assert client.get(FEED) == b"oops"
        assert drain.running
    finally:
        drain.stop()


def test_a_worker_dying_between_enqueue_and_removal_loses_nothing_and_fetches_once(
    worker: Scheduler, client: redis_lib.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The removal fails as if the worker died right after its enqueue: the batch
    stays in the feed, and the next read enqueues it again into the dedup."""
    drain = _drain(worker)
    client.rpush(FEED, "http://a.test/1", '{"url": "http://a.test/2", "meta": {"m": 1}}',
                 "bad")
    real_done = FeedStore.done

    def dies(*_: Any, **__: Any) -> Any:
        raise redis_lib.ConnectionError("killed between enqueue and removal")

    try:
        monkeypatch.setattr(FeedStore, "done", dies)
        with pytest.raises(redis_lib.ConnectionError):
            drain.take_batch()
        assert client.llen(FEED) == 3, "nothing left the feed"
        assert queued_count(client, KEYS) == 2, "the good entries are queued"
        monkeypatch.setattr(FeedStore, "done", real_done)
        assert drain.take_batch() == 3
        assert client.llen(FEED) == 0
        assert queued_count(client, KEYS) == 2, "the second enqueue added nothing"
        assert sorted(request.url for request in _leased(worker)) == [
            "http://a.test/1", "http://a.test/2"]
        assert len(worker.view.upkeep.dead_letters()) == 1
    finally:
        drain.stop()


def test_two_workers_reading_one_batch_take_each_entry_once(
    make_scheduler: MakeScheduler, client: redis_lib.Redis
) -> None:
    first, second = make_scheduler("w1"), make_scheduler("w2")
    one, two = _drain(first), _drain(second)
    client.rpush(FEED, "http://a.test/1", "http://a.test/2", "bad")
    try:
        assert one.store is not None
        assert two.store is not None
        batch_one, batch_two = one.store.read(10), two.store.read(10)
        assert batch_one == batch_two
        for drain, batch in ((one, batch_one), (two, batch_two)):
            assert drain.store is not None
            drain.store.done(batch.kind, [("bad entry", b"bad")], batch.entries[:2])
        assert client.llen(FEED) == 0
        assert client.hget(KEYS.stats, "fed") == b"2"
        assert client.hget(KEYS.stats, "feed_dead_lettered") == b"1"
    finally:
        one.stop()
        two.stop()


def test_a_gone_crawl_takes_nothing_from_the_feed(
    worker: Scheduler, client: redis_lib.Redis
) -> None:
    drain = _drain(worker)
    client.rpush(FEED, "http://a.test/1")
    try:
        client.delete(KEYS.record)  # the crawl's state vanished
        assert drain.store is not None
        batch = drain.store.read(10)
        with pytest.raises(redis_lib.RedisError):
            drain.store.done(batch.kind, [], batch.entries)
        assert client.llen(FEED) == 1
    finally:
        drain.stop()


def test_a_sharded_crawls_feed_goes_to_each_entrys_shard(
    make_scheduler: MakeScheduler, client: redis_lib.Redis
) -> None:
    """REDISSPINE_SHARDS: each entry in its lane's shard, bad ones in shard 0's dead
    letters (where the sharded upkeep lists them), the feed emptied."""
    sharded = CrawlKeys("redisspine", "test", shards=3)
    worker = make_scheduler("w1", free_slots=10, REDISSPINE_SHARDS=3)
    hosts = [f"h{n}.test" for n in range(9)]
    client.rpush(FEED, *(f"http://{host}/" for host in hosts), "not a url")
    drain = _drain(worker, REDISSPINE_SHARDS=3)
    try:
        assert client.exists(FEED) == 0
        queued = [int(queued_count(client, view)) for view in sharded.shard_views()]
        expected = [sum(1 for host in hosts if sharded.shard_of(host) == index)
                    for index in range(3)]
        assert queued == expected
        assert not client.exists(KEYS.queue), "nothing in the unsharded keys"
        [letter] = worker.view.upkeep.dead_letters()
        assert letter.field.startswith("0/feed:")
        assert {request.url for request in _leased(worker)} == {
            f"http://{host}/" for host in hosts}
    finally:
        drain.stop()
