"""Start requests are known by where they came from: retries and redirects of them
are fetched, identical ones with dont_filter are all fetched, and each enters the
crawl once however many workers run start(). Each test runs on fakeredis and on
the real redis-server, with the add-on's StartRequests middleware feeding the
scheduler as in a crawl."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from scrapy import Request

from scrapy_redisspine.startmw import StartRequests
from tests.unit.conftest import drain, engine_of

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    import pytest
    import redis

    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import MakeScheduler


def _start(scheduler: Scheduler, *requests: Request) -> list[Request]:
    """Run ``requests`` through the middleware into the scheduler, as start() would."""
    middleware = StartRequests()
    middleware.worker_opened(scheduler.view)

    async def start() -> AsyncIterator[Request]:
        for request in requests:
            yield request

    async def run() -> list[Request]:
        return [request async for request in middleware.process_start(start())]

    loop = asyncio.new_event_loop()
    try:
        out = loop.run_until_complete(run())
    finally:
        loop.close()
    for request in out:
        request.meta.setdefault("is_start_request", True)  # Scrapy's StartSpiderMiddleware
        scheduler.enqueue_request(request)
    assert scheduler.outbox.try_flush()
    return out


def test_a_retry_of_a_start_request_is_fetched(make_scheduler: MakeScheduler) -> None:
    scheduler = make_scheduler()
    _start(scheduler, Request("http://example.com/503", dont_filter=True))
    (fetched,) = drain(scheduler)
    retry = fetched.replace(dont_filter=True)  # RetryMiddleware: a copy, meta and all
    assert retry.meta["is_start_request"]
    assert scheduler.enqueue_request(retry)
    assert [request.url for request in drain(scheduler)] == ["http://example.com/503"]
    assert scheduler.stats.get_value("redisspine/scheduler/start_requests_skipped") is None


def test_identical_dont_filter_start_requests_are_all_fetched(
    make_scheduler: MakeScheduler,
) -> None:
    scheduler = make_scheduler()
    _start(scheduler, *(Request("http://example.com/", dont_filter=True) for _ in range(3)))
    assert len(drain(scheduler)) == 3


def test_each_start_request_enters_once_however_many_workers_start(
    make_scheduler: MakeScheduler,
) -> None:
    first, second = make_scheduler("w1"), make_scheduler("w2")
    for scheduler in (first, second):
        _start(scheduler, Request("http://example.com/", dont_filter=True),
               Request("http://example.com/", dont_filter=True),
               Request("http://example.com/other"))
    assert second.stats.get_value("redisspine/scheduler/start_requests_skipped") == 3
    assert len(drain(first)) + len(drain(second)) == 3


def test_without_the_middleware_the_meta_flag_is_used_and_said(
    make_scheduler: MakeScheduler, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler = make_scheduler()
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
        for _ in range(2):
            scheduler.enqueue_request(
                Request("http://example.com/", dont_filter=True, meta={"is_start_request": True})
            )
    assert scheduler.outbox.try_flush()
    warned = [r for r in caplog.records if "StartRequests" in r.getMessage()]
    assert len(warned) == 1


def test_a_start_request_the_crawl_already_has_is_reported_dropped(
    make_scheduler: MakeScheduler,
) -> None:
    # Scrapy's test_engine (test_crawler_dupefilter) counts request_scheduled ==
    # request_dropped + responses: a start request not queued must say so.
    from scrapy import signals as scrapy_signals
    from scrapy.utils.test import get_crawler

    from tests.unit.conftest import SchedSpider

    crawler = get_crawler(SchedSpider)
    dropped: list[str] = []
    crawler.signals.connect(lambda request, spider: dropped.append(request.url),
                            signal=scrapy_signals.request_dropped, weak=False)
    first, second = make_scheduler("w1"), make_scheduler("w2", crawler=crawler)
    _start(first, Request("http://example.com/a"))
    _start(second, Request("http://example.com/a"), Request("http://example.com/b"),
           Request("http://example.com/b"))
    assert dropped == ["http://example.com/a", "http://example.com/b"], (
        "injected by w1; a duplicate of its own"
    )
    assert len(drain(first)) + len(drain(second)) == 2


def test_a_worker_closing_with_its_start_done_holds_the_fleet_open_no_longer(
    make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    # It closes (a page budget, say) before a heartbeat noted that its start was
    # done: its "starting" entry must go with it, or the crawl's next workers would
    # wait for the entry to age past the worker timeout before they finish
    scheduler = make_scheduler("w1")
    assert client.zcard(crawl_keys.starting) == 1, "a worker joins as starting"
    engine_of(scheduler).start_pending = False
    scheduler.close("closespider_pagecount")
    assert client.zcard(crawl_keys.starting) == 0


def test_a_worker_whose_start_was_noted_does_not_note_it_again_at_close(
    make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler = make_scheduler("w1")
    engine_of(scheduler).start_pending = False
    scheduler.fleet.refresh_counts()  # notes it, as a heartbeat would
    assert client.zcard(crawl_keys.starting) == 0
    calls: list[str] = []
    monkeypatch.setattr(scheduler.frontier, "done_starting", lambda: calls.append("again"))
    scheduler.close("finished")
    assert calls == []


def test_a_worker_closing_mid_start_keeps_its_entry_until_it_ages_out(
    make_scheduler: MakeScheduler, client: redis.Redis, crawl_keys: CrawlKeys
) -> None:
    scheduler = make_scheduler("w1")
    engine_of(scheduler).start_pending = True
    scheduler.close("shutdown")
    assert client.zcard(crawl_keys.starting) == 1
