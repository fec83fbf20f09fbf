"""The Scrapy scheduler adapter, driven without a crawl engine.

Schedulers are built with ``crawler=None`` so no engine hooks are installed; the
engine's "done with this request" hook is called by hand
(``scheduler._on_request_done``). Each test runs on fakeredis and on the real
redis-server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import fakeredis
import msgpack
import pytest
import pytest_twisted
import redis as redis_lib
from scrapy import Request, Spider
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.test import get_crawler
from twisted.internet import reactor
from twisted.internet.task import deferLater

import scrapy_redisspine.worker
from scrapy_redisspine.dupefilter import RedisDupeFilter
from scrapy_redisspine.frontier import CorruptKeyError, Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.scheduler import Scheduler
from scrapy_redisspine.settings import load_config
from tests.unit.conftest import StubHooks

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

    from scrapy_redisspine.testing.redis_server import RedisServer

KEYS = CrawlKeys("redisspine", "test")
IDLE_POLL_SECONDS = 0.01


class SchedSpider(Spider):
    name = "sched"

    def parse(self, response: Any) -> None:
        pass

    def parse_item(self, response: Any) -> None:
        pass


class Backend:
    """Where the schedulers connect, and a client to look at the keys directly."""

    def __init__(self, url: str, client: redis.Redis) -> None:
        self.url = url
        self.client = client


@pytest.fixture(params=["fakeredis", "redis"])
def redis_backend(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Backend]:
    if request.param == "fakeredis":
        server = fakeredis.FakeServer()
        monkeypatch.setattr(
            scrapy_redisspine.worker,
            "client_from_url",
            lambda url: fakeredis.FakeRedis(server=server),
        )
        backend = Backend("redis://fakeredis.invalid:6379/0", fakeredis.FakeRedis(server=server))
    else:
        redis_server: RedisServer = request.getfixturevalue("redis_server")
        url = request.getfixturevalue("redis_url")  # emptied for this test
        backend = Backend(url, redis_server.client())
    yield backend
    backend.client.close()


MakeScheduler = Callable[..., Scheduler]


@pytest.fixture
def make_scheduler(redis_backend: Backend) -> Iterator[MakeScheduler]:
    """``make_scheduler(worker_id, **settings)``: an opened scheduler on the test crawl.

    Every scheduler still open at the end of the test is closed, so no twisted timer
    outlives the test.
    """
    opened: list[Scheduler] = []

    def make(worker_id: str = "w1", **settings: Any) -> Scheduler:
        config = load_config(
            {
                "REDISSPINE_REDIS_URL": redis_backend.url,
                "REDISSPINE_CRAWL_ID": KEYS.crawl_id,
                "REDISSPINE_IDLE_POLL_SECONDS": IDLE_POLL_SECONDS,
                **settings,
            }
        )
        crawler = get_crawler(SchedSpider)
        stats = MemoryStatsCollector(crawler)
        dupefilter = RedisDupeFilter(RequestFingerprinter(), config, stats=stats)
        scheduler = Scheduler(config, dupefilter, stats, crawler=None, worker_id=worker_id)
        scheduler.open(SchedSpider())
        opened.append(scheduler)
        return scheduler

    yield make
    for scheduler in opened:
        if any(timer.running for timer in scheduler._timers):
            scheduler.close("shutdown")
        assert not any(timer.running for timer in scheduler._timers)
        assert scheduler._flush_call is None or not scheduler._flush_call.active()


@pytest.fixture
def scheduler(make_scheduler: MakeScheduler) -> Scheduler:
    return make_scheduler()


def _close(scheduler: Scheduler, reason: str = "shutdown") -> None:
    scheduler.close(reason)


def _counts(backend: Backend) -> tuple[int, int]:
    return int(backend.client.zcard(KEYS.queue)), int(backend.client.hlen(KEYS.inflight))


def _next(scheduler: Scheduler, attempts: int = 5) -> Request | None:
    """next_request(), letting the idle-poll back-off pass between empty answers."""
    for _ in range(attempts):
        request = scheduler.next_request()
        if request is not None:
            return request
        time.sleep(IDLE_POLL_SECONDS * 1.5)
    return None


def _drain(scheduler: Scheduler) -> list[Request]:
    """Every request the scheduler hands out, each processed (acked) before the next.

    The ack frees its host's slot: with one request of a host in flight at a time
    (REDISSPINE_HOST_CONCURRENCY=1), the next one is leased only after it.
    """
    requests = []
    while (request := _next(scheduler, attempts=2)) is not None:
        requests.append(request)
        scheduler._on_request_done(request)
    return requests


def _stat(scheduler: Scheduler, name: str) -> Any:
    return scheduler.stats.get_value(name)


def _pending(scheduler: Scheduler) -> bool:
    """has_pending_requests() once the cached fleet counts are stale."""
    time.sleep(IDLE_POLL_SECONDS * 1.5)
    return scheduler.has_pending_requests()


def _spider(scheduler: Scheduler) -> SchedSpider:
    assert isinstance(scheduler.spider, SchedSpider)
    return scheduler.spider


# -- enqueue and dequeue ------------------------------------------------------------


def test_enqueue_then_next_request(scheduler: Scheduler, redis_backend: Backend) -> None:
    spider = _spider(scheduler)
    request = Request(
        "http://example.com/a", callback=spider.parse_item, meta={"k": [1, b"\x00"]}
    )
    assert scheduler.enqueue_request(request)
    assert _counts(redis_backend) == (0, 0), "buffered locally until flushed"
    assert scheduler.has_pending_requests()

    out = scheduler.next_request()
    assert out is not None
    assert out.url == "http://example.com/a"
    assert out.callback == spider.parse_item
    assert out.meta["k"] == [1, b"\x00"]
    assert _counts(redis_backend) == (0, 1)
    assert _stat(scheduler, "scheduler/enqueued/redis") == 1
    assert _stat(scheduler, "scheduler/enqueued") == 1
    assert _stat(scheduler, "scheduler/dequeued/redis") == 1
    assert _stat(scheduler, "redisspine/scheduler/leased") == 1
    assert scheduler.next_request() is None


def test_flush_sends_the_outbox_in_one_batch(
    scheduler: Scheduler, redis_backend: Backend
) -> None:
    for i in range(5):
        scheduler.enqueue_request(Request(f"http://example.com/{i}"))
    assert len(scheduler) >= 5
    assert scheduler._try_flush()
    assert _counts(redis_backend) == (5, 0)
    assert [r.url for r in _drain(scheduler)] == [f"http://example.com/{i}" for i in range(5)]


def test_full_batch_is_sent_at_once(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = make_scheduler(REDISSPINE_ENQUEUE_BATCH_SIZE=3)
    for i in range(3):
        scheduler.enqueue_request(Request(f"http://example.com/{i}"))
    assert _counts(redis_backend) == (3, 0)


def test_priority_order(scheduler: Scheduler) -> None:
    # one host: priority is honoured within a politeness lane
    for priority in (0, 10, -5, 3, 10):
        scheduler.enqueue_request(Request(f"http://example.com/{priority}", priority=priority,
                                          dont_filter=True))
    assert [r.priority for r in _drain(scheduler)] == [10, 10, 3, 0, -5]


def test_priority_order_is_per_host(scheduler: Scheduler) -> None:
    for host in ("a.example", "b.example"):
        for priority in (0, 10, -5):
            scheduler.enqueue_request(Request(f"http://{host}/{priority}", priority=priority))
    requests = _drain(scheduler)
    assert len(requests) == 6
    for host in ("a.example", "b.example"):
        assert [r.priority for r in requests if host in r.url] == [10, 0, -5]


def test_one_request_per_host_in_flight_by_default(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = make_scheduler(REDISSPINE_LEASE_BATCH_SIZE=10)
    scheduler._hooks = StubHooks(free_slots=10)  # type: ignore[assignment]
    for host in ("a.example", "b.example"):
        for i in range(3):
            scheduler.enqueue_request(Request(f"http://{host}/{i}"))
    first = scheduler.next_request()
    assert first is not None
    assert _counts(redis_backend) == (4, 2), "one lease per host, though 10 slots are free"
    assert {request.url for request, _ in scheduler._ready} | {first.url} == {
        "http://a.example/0", "http://b.example/0",
    }


def test_lifo_order(make_scheduler: MakeScheduler) -> None:
    scheduler = make_scheduler(REDISSPINE_QUEUE_ORDER="lifo")
    for i in range(3):
        scheduler.enqueue_request(Request(f"http://example.com/{i}"))
    assert [r.url for r in _drain(scheduler)] == [f"http://example.com/{i}" for i in (2, 1, 0)]


def test_duplicate_is_filtered(scheduler: Scheduler, redis_backend: Backend) -> None:
    assert scheduler.enqueue_request(Request("http://example.com/a"))
    scheduler.enqueue_request(Request("http://example.com/a"))
    scheduler.enqueue_request(Request("http://example.com/a", dont_filter=True))
    scheduler._try_flush()
    assert _stat(scheduler, "dupefilter/filtered") == 1
    assert _stat(scheduler, "scheduler/enqueued") == 2
    assert _counts(redis_backend) == (2, 0)
    assert redis_backend.client.scard(KEYS.seen) == 1


def test_duplicate_is_filtered_across_workers(make_scheduler: MakeScheduler) -> None:
    first, second = make_scheduler("w1"), make_scheduler("w2")
    first.enqueue_request(Request("http://example.com/a"))
    first._try_flush()
    second.enqueue_request(Request("http://example.com/a"))
    second._try_flush()
    assert _stat(second, "dupefilter/filtered") == 1
    assert len(_drain(first)) + len(_drain(second)) == 1


def test_unserializable_meta_is_refused_and_the_crawl_goes_on(
    scheduler: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    bad = Request("http://example.com/bad", meta={"culprit": object()})
    with caplog.at_level(logging.ERROR, logger="scrapy_redisspine"):
        assert scheduler.enqueue_request(bad) is False
    assert _stat(scheduler, "redisspine/scheduler/unserializable") == 1
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "meta['culprit']" in errors[0].getMessage()
    assert "http://example.com/bad" in errors[0].getMessage()

    assert scheduler.enqueue_request(Request("http://example.com/good"))
    out = scheduler.next_request()
    assert out is not None
    assert out.url == "http://example.com/good"


def test_lambda_callback_is_refused(scheduler: Scheduler) -> None:
    request = Request("http://example.com/", callback=lambda response: None)
    assert scheduler.enqueue_request(request) is False
    assert _stat(scheduler, "redisspine/scheduler/unserializable") == 1


# -- several workers ------------------------------------------------------------------


def test_start_request_enqueued_by_two_workers_enters_once(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    first, second = make_scheduler("w1"), make_scheduler("w2")
    for scheduler in (first, second):
        start = Request(
            "http://example.com/start", dont_filter=True, meta={"is_start_request": True}
        )
        assert scheduler.enqueue_request(start)
        scheduler._try_flush()
    assert _counts(redis_backend) == (1, 0)
    assert _stat(second, "redisspine/scheduler/start_requests_skipped") == 1
    got = [r for r in (first.next_request(), second.next_request()) if r is not None]
    assert [r.url for r in got] == ["http://example.com/start"]


def test_pending_while_another_worker_holds_a_lease(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    producer, consumer = make_scheduler("w1"), make_scheduler("w2")
    producer.enqueue_request(Request("http://example.com/a"))
    producer._try_flush()
    request = consumer.next_request()
    assert request is not None
    assert _counts(redis_backend) == (0, 1)

    assert _pending(producer), "another worker's lease is still in flight"
    assert _pending(consumer)

    consumer._on_request_done(request)
    assert _pending(consumer), "its ack is not sent yet"
    assert consumer._try_flush()
    assert _counts(redis_backend) == (0, 0)
    assert _stat(consumer, "redisspine/scheduler/acked") == 1
    assert not _pending(producer)
    assert not _pending(consumer)


def test_ack_sends_children_with_the_ack(
    scheduler: Scheduler, redis_backend: Backend
) -> None:
    scheduler.enqueue_request(Request("http://example.com/parent"))
    parent = scheduler.next_request()
    assert parent is not None
    scheduler.enqueue_request(Request("http://example.com/child1"))
    scheduler.enqueue_request(Request("http://example.com/child2"))
    scheduler._on_request_done(parent)
    assert _counts(redis_backend) == (0, 1), "buffered until a lease or the timer"
    assert scheduler._try_flush()
    assert _counts(redis_backend) == (2, 0)
    assert redis_backend.client.hget(KEYS.stats, "acked") == b"1"


def test_done_for_a_request_not_handed_out_is_ignored(
    scheduler: Scheduler, redis_backend: Backend
) -> None:
    scheduler._on_request_done(Request("http://example.com/robots.txt"))
    assert _stat(scheduler, "redisspine/scheduler/acked") is None
    assert _counts(redis_backend) == (0, 0)


def test_not_pending_on_an_empty_crawl(scheduler: Scheduler) -> None:
    assert not _pending(scheduler)


def test_keep_alive_is_always_pending(make_scheduler: MakeScheduler) -> None:
    assert _pending(make_scheduler(REDISSPINE_KEEP_ALIVE=True))


# -- close ------------------------------------------------------------------------------


def test_close_releases_leased_but_unstarted_requests(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    # one host; four of its requests may be in flight at once
    scheduler = make_scheduler("w1", REDISSPINE_LEASE_BATCH_SIZE=4, REDISSPINE_HOST_CONCURRENCY=4)
    scheduler._hooks = StubHooks(free_slots=10)  # type: ignore[assignment]
    for i in range(6):
        scheduler.enqueue_request(Request(f"http://example.com/{i}", priority=i))
    started = scheduler.next_request()
    assert started is not None
    assert started.priority == 5
    assert _counts(redis_backend) == (2, 4), "one batch of 4 leased, one handed out"
    queue_before = set(redis_backend.client.zrange(KEYS.queue, 0, -1, withscores=True))

    _close(scheduler)
    assert _counts(redis_backend) == (6, 0)
    assert queue_before <= set(redis_backend.client.zrange(KEYS.queue, 0, -1, withscores=True))
    assert _stat(scheduler, "redisspine/scheduler/released") == 4
    assert redis_backend.client.zscore(KEYS.workers, "w1") is None
    assert not redis_backend.client.exists(KEYS.busy), "the host's slots are free again"
    assert redis_backend.client.hgetall(KEYS.backlog) == {b"example.com": b"6"}

    other = make_scheduler("w2")
    assert [r.priority for r in _drain(other)] == [5, 4, 3, 2, 1, 0]


def test_close_sends_the_outbox_and_releases_the_unfinished_parent(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = make_scheduler("w1")
    scheduler.enqueue_request(Request("http://example.com/parent"))
    parent = scheduler.next_request()
    assert parent is not None
    scheduler.enqueue_request(Request("http://example.com/child"))
    _close(scheduler)
    assert _counts(redis_backend) == (2, 0)
    urls = sorted(r.url for r in _drain(make_scheduler("w2")))
    assert urls == ["http://example.com/child", "http://example.com/parent"]


def test_persist_false_deletes_keys_when_finished(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = make_scheduler(REDISSPINE_PERSIST=False)
    scheduler.enqueue_request(Request("http://example.com/a"))
    request = scheduler.next_request()
    assert request is not None
    scheduler._on_request_done(request)
    _close(scheduler, "finished")
    for key in KEYS.all_crawl_keys():
        assert not redis_backend.client.exists(key), key


def test_persist_false_keeps_keys_while_work_remains(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = make_scheduler(REDISSPINE_PERSIST=False)
    scheduler.enqueue_request(Request("http://example.com/a"))
    _close(scheduler, "finished")
    assert _counts(redis_backend) == (1, 0)


def test_persist_false_keeps_keys_when_stopped_early(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = make_scheduler(REDISSPINE_PERSIST=False)
    scheduler.enqueue_request(Request("http://example.com/a"))
    request = scheduler.next_request()
    assert request is not None
    scheduler._on_request_done(request)
    _close(scheduler, "shutdown")
    assert redis_backend.client.scard(KEYS.seen) == 1


def test_persist_true_keeps_keys(make_scheduler: MakeScheduler, redis_backend: Backend) -> None:
    scheduler = make_scheduler(REDISSPINE_PERSIST=True)
    scheduler.enqueue_request(Request("http://example.com/a"))
    request = scheduler.next_request()
    assert request is not None
    scheduler._on_request_done(request)
    _close(scheduler, "finished")
    assert redis_backend.client.scard(KEYS.seen) == 1
    assert redis_backend.client.exists(KEYS.stats)

    resumed = make_scheduler("w2")
    resumed.enqueue_request(Request("http://example.com/a"))
    resumed._try_flush()
    assert _stat(resumed, "dupefilter/filtered") == 1


# -- bad data in Redis ---------------------------------------------------------------


MALFORMED_STAT = "redisspine/scheduler/malformed"


def _assert_buried_and_crawl_goes_on(
    scheduler: Scheduler,
    backend: Backend,
    caplog: pytest.LogCaptureFixture,
    reason: bytes = b"undecodable request",
    stat: str = "redisspine/scheduler/undecodable",
) -> None:
    with caplog.at_level(logging.ERROR, logger="scrapy_redisspine"):
        out = _next(scheduler)
    assert out is not None
    assert out.url == "http://example.com/good"
    assert backend.client.hlen(KEYS.dead) == 1
    (entry,) = backend.client.hvals(KEYS.dead)
    assert entry.startswith(reason)
    assert _counts(backend) == (0, 1), "only the good request is in flight"
    assert _stat(scheduler, stat) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("dead letters" in message for message in errors), errors


def test_garbage_in_the_queue_goes_to_dead_letters(
    scheduler: Scheduler, redis_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler.enqueue_request(Request("http://example.com/good"))
    scheduler._try_flush()
    redis_backend.client.zadd(KEYS.queue, {b"garbage, not a request": -100})
    _assert_buried_and_crawl_goes_on(
        scheduler, redis_backend, caplog, b"malformed queue member", MALFORMED_STAT
    )


def test_binary_garbage_in_the_queue_goes_to_dead_letters(
    scheduler: Scheduler, redis_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler.enqueue_request(Request("http://example.com/good"))
    scheduler._try_flush()
    redis_backend.client.zadd(KEYS.queue, {b"\xff\xfe\x00\x80 binary garbage \n": -100})
    _assert_buried_and_crawl_goes_on(
        scheduler, redis_backend, caplog, b"malformed queue member", MALFORMED_STAT
    )


def test_well_formed_member_with_malformed_request_goes_to_dead_letters(
    scheduler: Scheduler, redis_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler.enqueue_request(Request("http://example.com/good"))
    scheduler._try_flush()
    bad = msgpack.packb({"url": "http://example.com/bad", "headers": [1, 2]})
    Frontier(redis_backend.client, KEYS, "pusher").push([NewRequest(bad, priority=100)])
    _assert_buried_and_crawl_goes_on(scheduler, redis_backend, caplog)


def test_corrupt_key_fails_open_naming_it(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    redis_backend.client.set(KEYS.queue, b"not a zset")
    with pytest.raises(CorruptKeyError, match="queue"):
        make_scheduler()


# -- start-up ------------------------------------------------------------------------------


def test_open_registers_the_worker(scheduler: Scheduler, redis_backend: Backend) -> None:
    assert redis_backend.client.zscore(KEYS.workers, "w1") is not None
    assert redis_backend.client.smembers(KEYS.crawls) == {b"test"}


def test_flush_on_start_refused_while_a_peer_is_alive(
    make_scheduler: MakeScheduler, redis_backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    peer = make_scheduler("w1")
    peer.enqueue_request(Request("http://example.com/a"))
    peer._try_flush()
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
        make_scheduler("w2", REDISSPINE_FLUSH_ON_START=True)
    assert _counts(redis_backend) == (1, 0)
    assert any("not flushing" in r.getMessage() for r in caplog.records)


def test_flush_on_start_when_alone(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    Frontier(redis_backend.client, KEYS, "gone").push([NewRequest(b"old", b"fp")])
    make_scheduler("w1", REDISSPINE_FLUSH_ON_START=True)
    assert _counts(redis_backend) == (0, 0)
    assert not redis_backend.client.exists(KEYS.seen)


# -- timers (the reactor runs) ---------------------------------------------------------


@pytest_twisted.inlineCallbacks
def test_flush_timer_sends_a_lone_request(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> Any:
    scheduler = make_scheduler(REDISSPINE_ENQUEUE_FLUSH_SECONDS=0.01)
    scheduler.enqueue_request(Request("http://example.com/a"))
    yield deferLater(reactor, 0.2, lambda: None)
    assert _counts(redis_backend) == (1, 0)
    _close(scheduler)


@pytest_twisted.inlineCallbacks
def test_heartbeat_timer_refreshes_the_worker(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> Any:
    scheduler = make_scheduler(REDISSPINE_HEARTBEAT_SECONDS=0.1)
    registered = redis_backend.client.zscore(KEYS.workers, "w1")
    yield deferLater(reactor, 0.35, lambda: None)
    assert redis_backend.client.zscore(KEYS.workers, "w1") > registered
    _close(scheduler)
    assert all(not timer.running for timer in scheduler._timers)


# -- acks travel with leases -----------------------------------------------------------


def _spy_round_trips(scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the frontier calls the scheduler makes: each is one round trip."""
    calls: list[str] = []
    frontier = scheduler.frontier
    for name in ("enqueue", "lease", "enqueue_and_lease"):
        original = getattr(frontier, name)

        def spy(*args: Any, _name: str = name, _original: Any = original, **kwargs: Any) -> Any:
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(frontier, name, spy)
    return calls


def test_acks_travel_with_the_next_lease(
    make_scheduler: MakeScheduler, redis_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = make_scheduler(REDISSPINE_LEASE_BATCH_SIZE=4)
    scheduler._hooks = StubHooks(free_slots=4)  # type: ignore[assignment]
    for i in range(8):
        scheduler.enqueue_request(Request(f"http://h{i}.example/"))
    assert scheduler._try_flush()
    calls = _spy_round_trips(scheduler, monkeypatch)

    first = [scheduler.next_request() for _ in range(4)]
    assert calls == ["lease"]
    for request in first:
        assert request is not None
        scheduler._on_request_done(request)
    assert calls == ["lease"], "acks wait for the next lease"
    assert _counts(redis_backend) == (4, 4)
    assert scheduler.has_pending_requests()

    second = scheduler.next_request()
    assert second is not None
    assert calls == ["lease", "enqueue_and_lease"], "4 acks and a lease: one round trip"
    assert _stat(scheduler, "redisspine/scheduler/acked") == 4
    assert redis_backend.client.hget(KEYS.stats, "acked") == b"4"
    assert _counts(redis_backend) == (0, 4)
    assert len(scheduler._ready) == 3


def test_children_and_ack_go_before_the_lease_that_may_take_them(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = make_scheduler()
    scheduler.enqueue_request(Request("http://example.com/parent"))
    parent = scheduler.next_request()
    assert parent is not None
    scheduler.enqueue_request(Request("http://example.com/child"))
    scheduler._on_request_done(parent)
    child = scheduler.next_request()  # the parent's ack frees the host's one slot first
    assert child is not None
    assert child.url == "http://example.com/child"
    assert _counts(redis_backend) == (0, 1)


@pytest_twisted.inlineCallbacks
def test_ack_timer_bounds_the_wait(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> Any:
    # a child's long enqueue timer does not hold back the ack of its parent
    scheduler = make_scheduler(
        REDISSPINE_ACK_FLUSH_SECONDS=0.02, REDISSPINE_ENQUEUE_FLUSH_SECONDS=30
    )
    scheduler.enqueue_request(Request("http://example.com/parent"))
    parent = scheduler.next_request()
    assert parent is not None
    scheduler.enqueue_request(Request("http://example.com/child"))
    scheduler._on_request_done(parent)
    assert _counts(redis_backend) == (0, 1)
    yield deferLater(reactor, 0.3, lambda: None)
    assert _counts(redis_backend) == (1, 0)
    assert _stat(scheduler, "redisspine/scheduler/acked") == 1
    _close(scheduler)


def test_zero_ack_flush_seconds_sends_each_ack_at_once(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = make_scheduler(REDISSPINE_ACK_FLUSH_SECONDS=0)
    scheduler.enqueue_request(Request("http://example.com/a"))
    request = scheduler.next_request()
    assert request is not None
    scheduler._on_request_done(request)
    assert _counts(redis_backend) == (0, 0)
    assert not scheduler._acks


def test_a_full_buffer_sends_its_acks(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    scheduler = make_scheduler(REDISSPINE_ENQUEUE_BATCH_SIZE=2, REDISSPINE_LEASE_BATCH_SIZE=2)
    scheduler._hooks = StubHooks(free_slots=2)  # type: ignore[assignment]
    for url in ("http://a.example/", "http://b.example/"):
        scheduler.enqueue_request(Request(url))
    taken = [scheduler.next_request(), scheduler.next_request()]
    scheduler._on_request_done(taken[0])  # type: ignore[arg-type]
    assert _counts(redis_backend) == (0, 2)
    scheduler._on_request_done(taken[1])  # type: ignore[arg-type]
    assert _counts(redis_backend) == (0, 0)


def test_buffered_ack_rest_counts_from_the_end_of_the_fetch() -> None:
    from scrapy_redisspine._sched_outbox import ack_args

    sent = ack_args([
        ("k1", "t", 1000, 99.75),  # waited 250 ms: 750 ms of rest left (+1 for rounding)
        ("k2", "t", 1000, 95.0),  # waited longer than its rest
        ("k3", "t", 500, 100.0),  # sent at once
        ("k4", "t", 0, 99.0),
    ], now=100.0)
    assert sent == [("k1", "t", 751), ("k2", "t", 0), ("k3", "t", 500), ("k4", "t", 0)]


def test_acks_survive_a_script_flush(
    make_scheduler: MakeScheduler, redis_backend: Backend
) -> None:
    # the pipelined EVALSHA gets NOSCRIPT after a restart or SCRIPT FLUSH: loaded again
    scheduler = make_scheduler()
    for url in ("http://a.example/", "http://b.example/"):
        scheduler.enqueue_request(Request(url))
    first = scheduler.next_request()
    assert first is not None
    scheduler._on_request_done(first)
    redis_backend.client.script_flush()
    second = _next(scheduler)
    assert second is not None
    assert _stat(scheduler, "redisspine/scheduler/acked") == 1
    assert _counts(redis_backend) == (0, 1)


def test_a_refused_send_keeps_the_outbox_and_the_leases_it_came_with(
    make_scheduler: MakeScheduler, redis_backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A script error on the enqueue half of the pipeline (not a full Redis): the lease
    # half ran, so its leases are handed out; the outbox and acks wait, and the
    # breaker stays open so they are retried with backoff, not at every lease.
    scheduler = make_scheduler(REDISSPINE_LEASE_BATCH_SIZE=1)
    for url in ("http://a.example/", "http://b.example/"):
        scheduler.enqueue_request(Request(url))
    first = scheduler.next_request()
    assert first is not None
    scheduler._on_request_done(first)
    scheduler.enqueue_request(Request("http://c.example/child"))
    assert scheduler.frontier is not None
    pipelined = scheduler.frontier._pipelined

    def refuse_the_send(calls: Any) -> list[Any]:
        replies = pipelined(calls[1:])  # the lease alone runs
        return [redis_lib.exceptions.ResponseError("boom"), *replies]

    monkeypatch.setattr(scheduler.frontier, "_pipelined", refuse_the_send)
    second = scheduler.next_request()
    assert second is not None, "the lease half ran: its lease is handed out"
    assert second.url == "http://b.example/"
    assert len(scheduler._outbox) == 1
    assert len(scheduler._acks) == 1
    assert scheduler.health.down
    assert _stat(scheduler, "redisspine/redis_errors/enqueue") == 1
    assert scheduler.has_pending_requests()

    monkeypatch.undo()
    scheduler.health._retry_at = 0.0  # skip the backoff
    assert scheduler._try_flush()
    assert not scheduler.health.down
    assert not scheduler._outbox
    assert _stat(scheduler, "redisspine/scheduler/acked") == 1


# -- the local request cache ----------------------------------------------------------


def test_own_requests_come_back_without_decoding(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Request("http://example.com/a", meta={"depth": 2}, cb_kwargs={"x": 1})
    scheduler.enqueue_request(sent)
    assert scheduler.codec is not None
    monkeypatch.setattr(scheduler.codec, "decode", _no_decoding)
    assert scheduler.next_request() is sent
    assert not scheduler._local


def _no_decoding(payload: bytes) -> Request:
    raise AssertionError("decoded a request this worker still had")


def test_cache_keeps_the_newest_and_skips_refused_requests(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler = make_scheduler(REDISSPINE_LOCAL_REQUEST_CACHE=2)
    sent = [Request(f"http://h{i}.example/") for i in range(3)]
    for request in sent:
        scheduler.enqueue_request(request)
    scheduler.enqueue_request(Request("http://h0.example/"))  # a duplicate
    assert scheduler._try_flush()
    assert list(scheduler._local.values()) == sent[1:]
    got = _drain(scheduler)
    assert [request.url for request in got] == [request.url for request in sent]
    assert got[0] is not sent[0], "evicted: decoded from Redis"
    assert all(a is b for a, b in zip(got[1:], sent[1:], strict=True)), "kept: not decoded"


def test_cache_off_and_other_workers_requests_are_decoded(
    make_scheduler: MakeScheduler,
) -> None:
    producer = make_scheduler("w1")
    consumer = make_scheduler("w2", REDISSPINE_LOCAL_REQUEST_CACHE=0)
    sent = Request("http://example.com/a")
    producer.enqueue_request(sent)
    consumer.enqueue_request(Request("http://example.com/b"))
    assert producer._try_flush()
    assert consumer._try_flush()
    assert not consumer._local
    got = sorted(_drain(consumer), key=lambda request: request.url)
    assert [request.url for request in got] == ["http://example.com/a", "http://example.com/b"]
    assert got[0] is not sent
