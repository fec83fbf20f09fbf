"""The Scrapy scheduler adapter, driven without a crawl engine.

Schedulers get a ``FakeEngine`` and a ``task.Clock`` through their constructor
(``tests/unit/conftest.py``): the engine's "done with this request" is played by
``finish``, time moves with ``clock.advance``. Each test runs on fakeredis and on
the real redis-server.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import msgpack
import pytest
from scrapy import Request

from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from tests.queue_view import queued_count
from tests.unit.conftest import (
    SchedSpider,
    drain,
    engine_of,
    finish,
    next_request,
    pending,
)

if TYPE_CHECKING:
    import redis
    from twisted.internet import task

    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import MakeScheduler

KEYS = CrawlKeys("redisspine", "test")


def _counts(client: redis.Redis) -> tuple[int, int]:
    return int(queued_count(client, KEYS)), int(client.hlen(KEYS.inflight))


def _stat(scheduler: Scheduler, name: str) -> Any:
    return scheduler.stats.get_value(name)


def _spider(scheduler: Scheduler) -> SchedSpider:
    assert isinstance(scheduler.spider, SchedSpider)
    return scheduler.spider


# -- enqueue and dequeue ------------------------------------------------------------


def test_enqueue_then_next_request(scheduler: Scheduler, client: redis.Redis) -> None:
    spider = _spider(scheduler)
    request = Request(
        "http://example.com/a", callback=spider.parse_item, meta={"k": [1, b"\x00"]}
    )
    assert scheduler.enqueue_request(request)
    assert _counts(client) == (0, 0), "buffered locally until flushed"
    assert scheduler.has_pending_requests()

    out = scheduler.next_request()
    assert out is not None
    assert out.url == "http://example.com/a"
    assert out.callback == spider.parse_item
    assert out.meta["k"] == [1, b"\x00"]
    assert _counts(client) == (0, 1)
    assert _stat(scheduler, "scheduler/enqueued/redis") == 1
    assert _stat(scheduler, "scheduler/enqueued") == 1
    assert _stat(scheduler, "scheduler/dequeued/redis") == 1
    assert _stat(scheduler, "redisspine/scheduler/leased") == 1
    assert scheduler.next_request() is None


def test_flush_sends_the_outbox_in_one_batch(
    scheduler: Scheduler, client: redis.Redis
) -> None:
    for i in range(5):
        scheduler.enqueue_request(Request(f"http://example.com/{i}"))
    assert len(scheduler) >= 5
    assert scheduler.outbox.try_flush()
    assert _counts(client) == (5, 0)
    assert [r.url for r in drain(scheduler)] == [f"http://example.com/{i}" for i in range(5)]


def test_full_batch_is_sent_at_once(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = make_scheduler(REDISSPINE_ENQUEUE_BATCH_SIZE=3)
    for i in range(3):
        scheduler.enqueue_request(Request(f"http://example.com/{i}"))
    assert _counts(client) == (3, 0)


def test_priority_order(scheduler: Scheduler) -> None:
    # one host: priority is honoured within a politeness lane
    for priority in (0, 10, -5, 3, 10):
        scheduler.enqueue_request(Request(f"http://example.com/{priority}", priority=priority,
                                          dont_filter=True))
    assert [r.priority for r in drain(scheduler)] == [10, 10, 3, 0, -5]


def test_priority_order_is_per_host(scheduler: Scheduler) -> None:
    for host in ("a.example", "b.example"):
        for priority in (0, 10, -5):
            scheduler.enqueue_request(Request(f"http://{host}/{priority}", priority=priority))
    requests = drain(scheduler)
    assert len(requests) == 6
    for host in ("a.example", "b.example"):
        assert [r.priority for r in requests if host in r.url] == [10, 0, -5]


def test_one_request_per_host_in_flight_by_default(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = make_scheduler(REDISSPINE_LEASE_BATCH_SIZE=10, free_slots=10)
    for host in ("a.example", "b.example"):
        for i in range(3):
            scheduler.enqueue_request(Request(f"http://{host}/{i}"))
    first = scheduler.next_request()
    assert first is not None
    assert _counts(client) == (4, 2), "one lease per host, though 10 slots are free"
    assert scheduler.book.ready == 1
    second = scheduler.next_request()
    assert second is not None
    assert {first.url, second.url} == {"http://a.example/0", "http://b.example/0"}


def test_lifo_order(make_scheduler: MakeScheduler) -> None:
    scheduler = make_scheduler(REDISSPINE_QUEUE_ORDER="lifo")
    for i in range(3):
        scheduler.enqueue_request(Request(f"http://example.com/{i}"))
    assert [r.url for r in drain(scheduler)] == [f"http://example.com/{i}" for i in (2, 1, 0)]


def test_duplicate_is_filtered(scheduler: Scheduler, client: redis.Redis) -> None:
    assert scheduler.enqueue_request(Request("http://example.com/a"))
    scheduler.enqueue_request(Request("http://example.com/a"))
    scheduler.enqueue_request(Request("http://example.com/a", dont_filter=True))
    scheduler.outbox.try_flush()
    assert _stat(scheduler, "dupefilter/filtered") == 1
    assert _stat(scheduler, "scheduler/enqueued") == 2
    assert _counts(client) == (2, 0)
    assert client.scard(KEYS.seen) == 1


def test_duplicate_is_filtered_across_workers(make_scheduler: MakeScheduler) -> None:
    first, second = make_scheduler("w1"), make_scheduler("w2")
    first.enqueue_request(Request("http://example.com/a"))
    first.outbox.try_flush()
    second.enqueue_request(Request("http://example.com/a"))
    second.outbox.try_flush()
    assert _stat(second, "dupefilter/filtered") == 1
    assert len(drain(first)) + len(drain(second)) == 1


def test_unserializable_meta_is_kept_here_and_the_crawl_goes_on(
    scheduler: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    bad = Request("http://bad.example/", meta={"culprit": object()})
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
        assert scheduler.enqueue_request(bad), "kept in memory, as Scrapy's scheduler does"
    assert _stat(scheduler, "redisspine/scheduler/unserializable") == 1
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "meta['culprit']" in warning
    assert "http://bad.example/" in warning
    assert "kept in this worker's memory" in warning

    assert scheduler.enqueue_request(Request("http://example.com/good"))
    got = {request.url: request for request in drain(scheduler)}
    assert set(got) == {"http://example.com/good", "http://bad.example/"}
    assert got["http://bad.example/"] is bad


def test_lambda_callback_is_kept_here(scheduler: Scheduler) -> None:
    request = Request("http://example.com/", callback=lambda response: None)
    assert scheduler.enqueue_request(request)
    assert _stat(scheduler, "redisspine/scheduler/unserializable") == 1
    assert drain(scheduler) == [request]


# -- several workers ------------------------------------------------------------------


def test_start_request_enqueued_by_two_workers_enters_once(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    first, second = make_scheduler("w1"), make_scheduler("w2")
    for scheduler in (first, second):
        start = Request(
            "http://example.com/start", dont_filter=True, meta={"is_start_request": True}
        )
        assert scheduler.enqueue_request(start)
        scheduler.outbox.try_flush()
    assert _counts(client) == (1, 0)
    assert _stat(second, "redisspine/scheduler/start_requests_skipped") == 1
    got = [r for r in (first.next_request(), second.next_request()) if r is not None]
    assert [r.url for r in got] == ["http://example.com/start"]


def test_pending_while_another_worker_holds_a_lease(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    producer, consumer = make_scheduler("w1"), make_scheduler("w2")
    producer.enqueue_request(Request("http://example.com/a"))
    producer.outbox.try_flush()
    request = consumer.next_request()
    assert request is not None
    assert _counts(client) == (0, 1)

    assert pending(producer), "another worker's lease is still in flight"
    assert pending(consumer)

    finish(consumer, request)
    assert consumer.has_pending_requests(), "its ack is not sent yet"
    assert consumer.outbox.try_flush()
    assert _counts(client) == (0, 0)
    assert _stat(consumer, "redisspine/scheduler/acked") == 1
    assert not pending(producer)
    assert not pending(consumer)


def test_ack_sends_children_with_the_ack(
    scheduler: Scheduler, client: redis.Redis
) -> None:
    scheduler.enqueue_request(Request("http://example.com/parent"))
    parent = scheduler.next_request()
    assert parent is not None
    scheduler.enqueue_request(Request("http://example.com/child1"))
    scheduler.enqueue_request(Request("http://example.com/child2"))
    finish(scheduler, parent)
    assert _counts(client) == (0, 1), "buffered until a lease or the timer"
    assert scheduler.outbox.try_flush()
    assert _counts(client) == (2, 0)
    assert client.hget(KEYS.stats, "acked") == b"1"


def test_done_for_a_request_not_handed_out_is_ignored(
    scheduler: Scheduler, client: redis.Redis
) -> None:
    finish(scheduler, Request("http://example.com/robots.txt"))
    assert _stat(scheduler, "redisspine/scheduler/acked") is None
    assert _counts(client) == (0, 0)


def test_a_crawl_that_never_had_a_request_waits_for_one(
    scheduler: Scheduler, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        assert pending(scheduler), "waiting, not finished"
        assert pending(scheduler)
    waiting = [r for r in caplog.records if "no request queued yet" in r.getMessage()]
    assert len(waiting) == 1, "said once"
    scheduler.enqueue_request(Request("http://example.com/a"))
    drain(scheduler)
    assert scheduler.outbox.try_flush()
    assert not pending(scheduler), "it had work, and all of it is done"


def test_a_worker_still_producing_start_requests_holds_the_fleet_open(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    starter, idle = make_scheduler("w1"), make_scheduler("w2")
    engine_of(starter).start_pending = True
    starter.enqueue_request(Request("http://example.com/a"))
    drain(starter)
    assert starter.outbox.try_flush()
    assert pending(idle), "w1's start() may still yield requests"
    engine_of(starter).start_pending = False
    assert not pending(starter), "its start requests are in, and done"
    assert not pending(idle)


def test_a_dead_starter_does_not_hold_the_fleet_open_for_ever(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    idle = make_scheduler("w2")
    idle.enqueue_request(Request("http://example.com/a"))
    drain(idle)
    assert idle.outbox.try_flush()
    client.zadd(KEYS.starting, {"dead-starter": 1})  # its last heartbeat: long ago
    assert not pending(idle)


def test_a_crawl_done_after_a_starter_stopped_mid_start_says_so_once(
    make_scheduler: MakeScheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # The requests its start() had not queued yet are known to no one: the crawl ends
    # with what is queued, and the worker that finds it done says that it may be short.
    idle = make_scheduler("w2")
    idle.enqueue_request(Request("http://example.com/a"))
    client.zadd(KEYS.starting, {"dead-starter": 1})  # its last heartbeat: long ago
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
        assert pending(idle), "work queued: nothing said yet"
        assert not caplog.records
        drain(idle)
        assert idle.outbox.try_flush()
        assert not pending(idle)
        assert not pending(idle)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "1 worker(s) stopped without noting their start requests done" in warning
    assert _stat(idle, "redisspine/fleet/starts_cut_short") == 1


def test_keep_alive_is_alwayspending(make_scheduler: MakeScheduler) -> None:
    assert pending(make_scheduler(REDISSPINE_KEEP_ALIVE=True))


# -- close ------------------------------------------------------------------------------


def test_close_releases_leased_but_unstarted_requests(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    # one host; four of its requests may be in flight at once
    scheduler = make_scheduler(
        "w1", REDISSPINE_LEASE_BATCH_SIZE=4, REDISSPINE_HOST_CONCURRENCY=4, free_slots=10
    )
    for i in range(6):
        scheduler.enqueue_request(Request(f"http://example.com/{i}", priority=i))
    started = scheduler.next_request()
    assert started is not None
    assert started.priority == 5
    assert _counts(client) == (2, 4), "one batch of 4 leased, one handed out"
    queue_before = set(client.zrange(KEYS.queue, 0, -1, withscores=True))

    scheduler.close("shutdown")
    assert _counts(client) == (6, 0)
    assert queue_before <= set(client.zrange(KEYS.queue, 0, -1, withscores=True))
    assert _stat(scheduler, "redisspine/scheduler/released") == 4
    assert client.zscore(KEYS.workers, "w1") is None
    assert not client.exists(KEYS.busy), "the host's slots are free again"
    assert client.hgetall(KEYS.backlog) == {b"example.com": b"6"}

    other = make_scheduler("w2")
    assert [r.priority for r in drain(other)] == [5, 4, 3, 2, 1, 0]


def test_close_sends_the_outbox_and_releases_the_unfinished_parent(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = make_scheduler("w1")
    scheduler.enqueue_request(Request("http://example.com/parent"))
    parent = scheduler.next_request()
    assert parent is not None
    scheduler.enqueue_request(Request("http://example.com/child"))
    scheduler.close("shutdown")
    assert _counts(client) == (2, 0)
    urls = sorted(r.url for r in drain(make_scheduler("w2")))
    assert urls == ["http://example.com/child", "http://example.com/parent"]


def _crawl_one_page(make_scheduler: MakeScheduler, *, persist: bool, reason: str) -> None:
    """One worker fetches the crawl's only page, then closes for ``reason``."""
    scheduler = make_scheduler(REDISSPINE_PERSIST=persist)
    scheduler.enqueue_request(Request("http://example.com/a"))
    request = scheduler.next_request()
    assert request is not None
    finish(scheduler, request)
    scheduler.close(reason)


def test_persist_false_deletes_keys_when_finished(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    _crawl_one_page(make_scheduler, persist=False, reason="finished")
    for key in KEYS.all_crawl_keys():
        assert not client.exists(key), key


def test_persist_false_keeps_keys_while_work_remains(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = make_scheduler(REDISSPINE_PERSIST=False)
    scheduler.enqueue_request(Request("http://example.com/a"))
    scheduler.close("finished")
    assert _counts(client) == (1, 0)


def test_persist_false_keeps_keys_when_stopped_early(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    _crawl_one_page(make_scheduler, persist=False, reason="shutdown")
    assert client.scard(KEYS.seen) == 1


def test_persist_true_keeps_keys(make_scheduler: MakeScheduler, client: redis.Redis) -> None:
    _crawl_one_page(make_scheduler, persist=True, reason="finished")
    assert client.scard(KEYS.seen) == 1
    assert client.exists(KEYS.stats)

    resumed = make_scheduler("w2")
    resumed.enqueue_request(Request("http://example.com/a"))
    resumed.outbox.try_flush()
    assert _stat(resumed, "dupefilter/filtered") == 1


# -- bad data in Redis ---------------------------------------------------------------


MALFORMED_STAT = "redisspine/scheduler/malformed"


def _assert_buried_and_crawl_goes_on(
    scheduler: Scheduler,
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    reason: bytes = b"undecodable request",
    stat: str = "redisspine/scheduler/undecodable",
) -> None:
    with caplog.at_level(logging.ERROR, logger="scrapy_redisspine"):
        out = next_request(scheduler)
    assert out is not None
    assert out.url == "http://example.com/good"
    assert client.hlen(KEYS.dead) == 1
    (entry,) = client.hvals(KEYS.dead)
    assert entry.startswith(reason)
    assert _counts(client) == (0, 1), "only the good request is in flight"
    assert _stat(scheduler, stat) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("dead letters" in message for message in errors), errors


@pytest.mark.parametrize(
    "garbage", [b"garbage, not a request", b"\xff\xfe\x00\x80 binary garbage \n"],
    ids=["text", "binary"],
)
def test_garbage_in_the_queue_goes_to_dead_letters(
    scheduler: Scheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture, garbage: bytes
) -> None:
    scheduler.enqueue_request(Request("http://example.com/good"))
    scheduler.outbox.try_flush()
    client.zadd(KEYS.queue, {garbage: -100})
    _assert_buried_and_crawl_goes_on(
        scheduler, client, caplog, b"malformed queue member", MALFORMED_STAT
    )


def test_well_formed_member_with_malformed_request_goes_to_dead_letters(
    scheduler: Scheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler.enqueue_request(Request("http://example.com/good"))
    scheduler.outbox.try_flush()
    bad = msgpack.packb({"url": "http://example.com/bad", "headers": [1, 2]})
    Frontier(client, KEYS, "pusher").push([NewRequest(bad, priority=100)])
    _assert_buried_and_crawl_goes_on(scheduler, client, caplog)


def test_corrupt_key_refuses_to_start_in_one_line_naming_it(
    make_scheduler: MakeScheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture,
    clock: task.Clock,
) -> None:
    client.set(KEYS.queue, b"not a zset")
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        scheduler = make_scheduler()
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert KEYS.queue in line
    assert "redisspine_corrupt_key" in line
    assert not any(r.exc_info for r in caplog.records), "no traceback"
    assert engine_of(scheduler).failed, "the process will exit non-zero"
    assert scheduler.has_pending_requests(), "never idle, so never 'finished'"
    assert scheduler.next_request() is None
    clock.advance(0)  # the close is asked from the reactor's next turn
    assert scheduler.next_request() is None
    clock.advance(0)
    assert engine_of(scheduler).closed == ["redisspine_corrupt_key"], "closed once"
    assert scheduler.enqueue_request(Request("http://example.com/")) is False
    assert client.zscore(KEYS.workers, "w1") is None, "it did not join"
    scheduler.close("redisspine_corrupt_key")


# -- start-up ------------------------------------------------------------------------------


def test_open_registers_the_worker(scheduler: Scheduler, client: redis.Redis) -> None:
    assert client.zscore(KEYS.workers, "w1") is not None
    assert client.smembers(KEYS.crawls) == {b"test"}


def test_flush_on_start_refused_while_a_peer_is_alive(
    make_scheduler: MakeScheduler, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    peer = make_scheduler("w1")
    peer.enqueue_request(Request("http://example.com/a"))
    peer.outbox.try_flush()
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
        make_scheduler("w2", REDISSPINE_FLUSH_ON_START=True)
    assert _counts(client) == (1, 0)
    assert any("not flushing" in r.getMessage() for r in caplog.records)


def test_flush_on_start_when_alone(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    Frontier(client, KEYS, "gone").push([NewRequest(b"old", b"fp")])
    make_scheduler("w1", REDISSPINE_FLUSH_ON_START=True)
    assert _counts(client) == (0, 0)
    assert not client.exists(KEYS.seen)


# -- timers (on the test clock) ----------------------------------------------------------


def test_flush_timer_sends_a_lone_request(
    make_scheduler: MakeScheduler, client: redis.Redis, clock: task.Clock
) -> None:
    # the idle poll (which would also send it) is slower here
    scheduler = make_scheduler(
        REDISSPINE_ENQUEUE_FLUSH_SECONDS=0.5, REDISSPINE_IDLE_POLL_SECONDS=10
    )
    scheduler.enqueue_request(Request("http://example.com/a"))
    clock.advance(0.49)
    assert _counts(client) == (0, 0)
    clock.advance(0.02)
    assert _counts(client) == (1, 0)


def test_heartbeat_timer_refreshes_the_worker(
    make_scheduler: MakeScheduler, client: redis.Redis, clock: task.Clock
) -> None:
    scheduler = make_scheduler(REDISSPINE_HEARTBEAT_SECONDS=1)
    registered = client.zscore(KEYS.workers, "w1")
    time.sleep(0.01)  # the heartbeat is stamped with Redis's clock
    clock.advance(0.99)
    assert client.zscore(KEYS.workers, "w1") == registered
    clock.advance(0.02)
    assert client.zscore(KEYS.workers, "w1") > registered
    scheduler.close("shutdown")
    assert not scheduler.running


def test_a_failing_timer_keeps_running(
    make_scheduler: MakeScheduler, clock: task.Clock, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A LoopingCall whose function raises stops for good; a heartbeat that stopped
    # would get a live worker swept. Ours logs, counts and beats again.
    scheduler = make_scheduler(REDISSPINE_HEARTBEAT_SECONDS=1)
    beats: list[int] = []

    def broken() -> None:
        beats.append(1)
        raise RuntimeError("garbage")

    monkeypatch.setattr(scheduler.frontier, "heartbeat", lambda *_: broken())
    with caplog.at_level(logging.ERROR, logger="scrapy_redisspine"):
        clock.advance(1.01)
        clock.advance(1.0)
    assert len(beats) == 2
    assert scheduler.running
    assert _stat(scheduler, "redisspine/errors/heartbeat") == 2
    lines = [r.getMessage() for r in caplog.records if "heartbeat failed" in r.getMessage()]
    assert lines
    assert "RuntimeError: garbage" in lines[0]


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
    make_scheduler: MakeScheduler, client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler = make_scheduler(REDISSPINE_LEASE_BATCH_SIZE=4, free_slots=4)
    for i in range(8):
        scheduler.enqueue_request(Request(f"http://h{i}.example/"))
    assert scheduler.outbox.try_flush()
    calls = _spy_round_trips(scheduler, monkeypatch)

    first = [scheduler.next_request() for _ in range(4)]
    assert calls == ["lease"]
    for request in first:
        assert request is not None
        finish(scheduler, request)
    assert calls == ["lease"], "acks wait for the next lease"
    assert _counts(client) == (4, 4)
    assert scheduler.has_pending_requests()

    second = scheduler.next_request()
    assert second is not None
    assert calls == ["lease", "enqueue_and_lease"], "4 acks and a lease: one round trip"
    assert _stat(scheduler, "redisspine/scheduler/acked") == 4
    assert client.hget(KEYS.stats, "acked") == b"4"
    assert _counts(client) == (0, 4)
    assert scheduler.book.ready == 3


def test_children_and_ack_go_before_the_lease_that_may_take_them(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = make_scheduler()
    scheduler.enqueue_request(Request("http://example.com/parent"))
    parent = scheduler.next_request()
    assert parent is not None
    scheduler.enqueue_request(Request("http://example.com/child"))
    finish(scheduler, parent)
    child = scheduler.next_request()  # the parent's ack frees the host's one slot first
    assert child is not None
    assert child.url == "http://example.com/child"
    assert _counts(client) == (0, 1)


def test_ack_timer_bounds_the_wait(
    make_scheduler: MakeScheduler, client: redis.Redis, clock: task.Clock
) -> None:
    # a child's long enqueue timer does not hold back the ack of its parent
    scheduler = make_scheduler(
        REDISSPINE_ACK_FLUSH_SECONDS=0.02, REDISSPINE_ENQUEUE_FLUSH_SECONDS=30,
        REDISSPINE_IDLE_POLL_SECONDS=10,  # the idle poll would send it too
    )
    scheduler.enqueue_request(Request("http://example.com/parent"))
    parent = scheduler.next_request()
    assert parent is not None
    scheduler.enqueue_request(Request("http://example.com/child"))
    finish(scheduler, parent)
    assert _counts(client) == (0, 1)
    clock.advance(0.019)
    assert _counts(client) == (0, 1)
    clock.advance(0.002)
    assert _counts(client) == (1, 0)
    assert _stat(scheduler, "redisspine/scheduler/acked") == 1


def test_zero_ack_flush_seconds_sends_each_ack_at_once(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = make_scheduler(REDISSPINE_ACK_FLUSH_SECONDS=0)
    scheduler.enqueue_request(Request("http://example.com/a"))
    request = scheduler.next_request()
    assert request is not None
    finish(scheduler, request)
    assert _counts(client) == (0, 0)
    assert not scheduler.outbox.acks


def test_a_full_buffer_sends_its_acks(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    scheduler = make_scheduler(
        REDISSPINE_ENQUEUE_BATCH_SIZE=2, REDISSPINE_LEASE_BATCH_SIZE=2, free_slots=2
    )
    for url in ("http://a.example/", "http://b.example/"):
        scheduler.enqueue_request(Request(url))
    taken = [scheduler.next_request(), scheduler.next_request()]
    finish(scheduler, taken[0])
    assert _counts(client) == (0, 2)
    finish(scheduler, taken[1])
    assert _counts(client) == (0, 0)


def test_buffered_ack_rest_counts_from_the_end_of_the_fetch() -> None:
    # Private: the outbox's arithmetic at a fixed `now` (a scheduler would use Redis's clock).
    from scrapy_redisspine._outbox import ack_args

    # Each ack tells how long ago its fetch ended (less 1 ms: rounding); the script
    # credits that against the rest, up to the rest (test_politeness.py).
    sent = ack_args([
        ("k1", "t", 1000, 99.75, -1, 0),  # fetch ended 250 ms ago
        ("k2", "t", 1000, 95.0, -1, 0),  # longer ago than its rest: the script caps it
        ("k3", "t", 500, 100.0, 120, 200),  # sent at once, with an AutoThrottle sample
        ("k4", "t", 0, 99.0, -1, 0),
        ("k5", "t", 500, 100.5, -1, 0),  # a time after now (no clock goes back): 0
    ], now=100.0)
    assert sent == [("k1", "t", 1000, -1, 0, 249), ("k2", "t", 1000, -1, 0, 4999),
                    ("k3", "t", 500, 120, 200, 0), ("k4", "t", 0, -1, 0, 999),
                    ("k5", "t", 500, -1, 0, 0)]


def test_acks_survive_a_script_flush(
    make_scheduler: MakeScheduler, client: redis.Redis
) -> None:
    # the pipelined EVALSHA gets NOSCRIPT after a restart or SCRIPT FLUSH: loaded again
    scheduler = make_scheduler()
    for url in ("http://a.example/", "http://b.example/"):
        scheduler.enqueue_request(Request(url))
    first = scheduler.next_request()
    assert first is not None
    finish(scheduler, first)
    client.script_flush()
    second = next_request(scheduler)
    assert second is not None
    assert _stat(scheduler, "redisspine/scheduler/acked") == 1
    assert _counts(client) == (0, 1)


def test_a_refused_send_keeps_the_outbox_and_the_leases_it_came_with(
    make_scheduler: MakeScheduler, client: redis.Redis, clock: task.Clock
) -> None:
    # A script error on the enqueue half of the pipeline (not a full Redis; here
    # garbage in the dedup HASH, which the enqueue script refuses before it writes
    # anything): the lease half ran, so its leases are handed out; the outbox and
    # acks wait and are retried with backoff, not at every lease. A script error is
    # no outage: the breaker stays closed, heartbeats go on.
    scheduler = make_scheduler(REDISSPINE_LEASE_BATCH_SIZE=1)
    for url in ("http://a.example/", "http://b.example/"):
        scheduler.enqueue_request(Request(url))
    first = scheduler.next_request()
    assert first is not None
    finish(scheduler, first)
    scheduler.enqueue_request(Request("http://c.example/child"))
    client.hset(KEYS.dedup, "mode", "garbage")
    second = scheduler.next_request()
    assert second is not None, "the lease half ran: its lease is handed out"
    assert second.url == "http://b.example/"
    assert len(scheduler.outbox) == 1
    assert scheduler.outbox.acks == 1
    assert not scheduler.guard.down
    assert not scheduler.guard.available("enqueue")
    assert scheduler.guard.available("heartbeat")
    assert _stat(scheduler, "redisspine/script_errors/enqueue") == 1
    assert scheduler.has_pending_requests()
    assert not scheduler.outbox.try_flush(), "backing off"
    beat = client.zscore(KEYS.workers, "w1")
    time.sleep(0.002)
    scheduler.fleet.heartbeat()
    assert client.zscore(KEYS.workers, "w1") > beat, "heartbeats are not held back"

    client.hdel(KEYS.dedup, "mode")
    clock.advance(1)  # past the backoff
    assert scheduler.outbox.try_flush()
    assert scheduler.guard.available("enqueue")
    assert scheduler.outbox.empty
    assert _stat(scheduler, "redisspine/scheduler/acked") == 1


# -- the local request cache ----------------------------------------------------------


def test_own_requests_come_back_without_decoding(
    scheduler: Scheduler, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent = Request("http://example.com/a", meta={"depth": 2}, cb_kwargs={"x": 1})
    scheduler.enqueue_request(sent)
    monkeypatch.setattr(scheduler.codec, "decode", _no_decoding)
    assert scheduler.next_request() is sent
    assert scheduler.outbox.cached_count == 0


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
    assert scheduler.outbox.try_flush()
    assert scheduler.outbox.cached_count == 2
    got = drain(scheduler)
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
    assert producer.outbox.try_flush()
    assert consumer.outbox.try_flush()
    assert consumer.outbox.cached_count == 0
    got = sorted(drain(consumer), key=lambda request: request.url)
    assert [request.url for request in got] == ["http://example.com/a", "http://example.com/b"]
    assert got[0] is not sent


def test_requests_redis_did_not_queue_are_reported_dropped(
    make_scheduler: MakeScheduler,
) -> None:
    from scrapy import signals as scrapy_signals
    from scrapy.utils.test import get_crawler

    crawler = get_crawler(SchedSpider)
    dropped: list[Request] = []

    def on_dropped(request: Request, spider: Any) -> None:
        dropped.append(request)

    crawler.signals.connect(on_dropped, signal=scrapy_signals.request_dropped)
    scheduler = make_scheduler(crawler=crawler, REDISSPINE_HOST_BACKLOG_CAP=1)
    kept, duplicate = Request("http://a.example/1"), Request("http://a.example/1")
    capped = Request("http://a.example/2")
    for request in (kept, duplicate, capped):
        assert scheduler.enqueue_request(request), "decided in Redis, after the call"
    assert scheduler.outbox.try_flush()
    assert dropped == [duplicate, capped]

