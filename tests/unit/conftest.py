"""Unit-test fixtures: a Redis client on each backend, frontier and scheduler builders.

``client`` runs a test twice: on fakeredis (fast, fresh server per test) and on the
session's real redis-server (emptied before the test), so a Lua script that only
works on one of them is caught. The real server comes from ``tests/conftest.py``,
which fails (never skips) when no redis-server binary exists.

Schedulers are built as a crawl builds them, but with a :class:`FakeEngine` (the
engine port) and a ``task.Clock`` passed to the constructor: a test plays the
engine's "done" with :func:`finish` and moves time with ``clock.advance``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import fakeredis
import pytest
from scrapy import Request, Spider
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.test import get_crawler
from twisted.internet import task

import scrapy_redisspine.worker
from scrapy_redisspine._clock import Periodic
from scrapy_redisspine.dupefilter import RedisDupeFilter
from scrapy_redisspine.frontier import Frontier
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.scheduler import Scheduler
from scrapy_redisspine.settings import SpineConfig, load_config

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis
    from scrapy.crawler import Crawler

    from scrapy_redisspine.testing.redis_server import RedisServer

BACKENDS = ("fakeredis", "redis")


@pytest.fixture
def crawl_keys() -> CrawlKeys:
    return CrawlKeys("redisspine", "test")


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_client(
    backend: str, request: pytest.FixtureRequest
) -> Callable[[], redis.Redis]:
    """More clients of the same backend (same data), e.g. one per thread or worker."""
    if backend == "fakeredis":
        server = fakeredis.FakeServer()
        return lambda: fakeredis.FakeRedis(server=server)
    redis_server: RedisServer = request.getfixturevalue("redis_server")
    request.getfixturevalue("redis_url")  # FLUSHALL before the test
    return redis_server.client


@pytest.fixture
def client(make_client: Callable[[], redis.Redis]) -> Iterator[redis.Redis]:
    """One client per test, on fakeredis or a real redis-server, bytes in and out."""
    redis_client = make_client()
    yield redis_client
    redis_client.close()


FrontierFactory = Callable[..., Frontier]


@pytest.fixture
def make_frontier(
    client: redis.Redis, crawl_keys: CrawlKeys
) -> FrontierFactory:
    """``make_frontier(worker_id="w1", order="fifo", client=None, concurrency=1,
    backlog_cap=0)`` on the test crawl.

    ``concurrency`` is how many requests of one politeness lane may be in flight at
    once, fleet-wide: a test that leases several requests of one lane together needs
    at least that many (or requests in distinct lanes).
    """

    def make(
        worker_id: str = "w1",
        order: str = "fifo",
        client_: redis.Redis | None = None,
        *,
        concurrency: int = 1,
        backlog_cap: int = 0,
    ) -> Frontier:
        return Frontier(
            client_ or client, crawl_keys, worker_id, order,
            concurrency=concurrency, backlog_cap=backlog_cap,
        )

    return make


@pytest.fixture
def frontier(make_frontier: FrontierFactory) -> Frontier:
    return make_frontier()


class FakeEngine:
    """An ``EnginePort`` for tests: reports free download slots, counts wake-ups and
    close orders, and plays the engine's "done with this request" (:meth:`done`)."""

    def __init__(self, free_slots: int = 1) -> None:
        self.free_slots = free_slots
        self.wakes = 0
        self.closed: list[str] = []
        self.failed = False
        self.start_pending = False  # the spider still produces start requests
        self._on_done: Callable[[Request], None] | None = None

    def attach(self, on_request_done: Callable[[Request], None]) -> None:
        self._on_done = on_request_done

    def detach(self) -> None:
        self._on_done = None

    def wake(self) -> None:
        self.wakes += 1

    def free_download_slots(self) -> int:
        return self.free_slots

    def close_spider(self, reason: str) -> None:
        self.closed.append(reason)

    def mark_failed(self) -> None:
        self.failed = True

    def starting(self) -> bool:
        return self.start_pending

    def done(self, request: Request) -> None:
        """The engine is done with ``request`` (its callback ran, its children went in)."""
        assert self._on_done is not None, "the scheduler is not open"
        self._on_done(request)


class SchedSpider(Spider):
    name = "sched"

    def parse(self, response: Any) -> None:
        pass

    def parse_item(self, response: Any) -> None:
        pass


#: How often an idle test scheduler polls (clock seconds).
IDLE_POLL_SECONDS = 0.01


@pytest.fixture
def clock() -> task.Clock:
    """The clock every scheduler and extension of a test runs on."""
    return task.Clock()


@pytest.fixture
def redis_url_for(
    backend: str, client: redis.Redis, request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """The URL workers connect to; ``client`` sees the same data (on fakeredis, the
    workers' connection is pointed at ``client``'s server)."""
    if backend == "fakeredis":
        server = client.connection_pool.connection_kwargs["server"]
        monkeypatch.setattr(
            scrapy_redisspine.worker, "client_from_url",
            lambda url, **options: fakeredis.FakeRedis(server=server),
        )
        return "redis://fakeredis.invalid:6379/0"
    return str(request.getfixturevalue("redis_url"))  # emptied for this test


def scheduler_config(url: str, **settings: Any) -> SpineConfig:
    """A test worker's config: the test crawl, a short idle poll, no delay jitter."""
    return load_config({
        "REDISSPINE_REDIS_URL": url,
        "REDISSPINE_CRAWL_ID": "test",
        "REDISSPINE_IDLE_POLL_SECONDS": IDLE_POLL_SECONDS,
        "DOWNLOAD_DELAY_JITTER": 0,
        **settings,
    })


def build_scheduler(
    url: str, clock: task.Clock, worker_id: str = "w1", *, free_slots: int = 1,
    crawler: Crawler | None = None, **settings: Any,
) -> Scheduler:
    """A scheduler (not opened) with a :class:`FakeEngine` on ``clock``; ``crawler``
    for its signals (none: no signal is sent)."""
    config = scheduler_config(url, **settings)
    stats = MemoryStatsCollector(get_crawler(SchedSpider))
    dupefilter = RedisDupeFilter(RequestFingerprinter(), config, stats=stats)
    return Scheduler(config, dupefilter, stats, engine=FakeEngine(free_slots), clock=clock,
                     worker_id=worker_id, crawler=crawler)


MakeScheduler = Callable[..., Scheduler]


@pytest.fixture(autouse=True)
def _no_timer_left_on_the_reactor() -> Iterator[None]:
    """No test may leave a worker timer (``Periodic``) on the real reactor: pytest-twisted
    runs that reactor during later tests, and a leftover timer then works for a crawl
    that is over, against another test's Redis (a fleet totals push once logged "the
    crawl's state in Redis is gone" into another test's log capture). Those left are
    stopped, and the test that left them fails."""
    yield
    from twisted.internet import reactor

    left = [call for call in reactor.getDelayedCalls()  # type: ignore[attr-defined]
            if call.active() and isinstance(getattr(call.func, "__self__", None), Periodic)]
    for call in left:
        call.func.__self__.stop()
    assert left == [], "a worker timer outlived its test on the real reactor"


@pytest.fixture
def make_scheduler(redis_url_for: str, clock: task.Clock) -> Iterator[MakeScheduler]:
    """``make_scheduler(worker_id="w1", *, spider=None, free_slots=1, **settings)``: an
    opened scheduler on the test crawl (``client``'s data), its engine a
    :class:`FakeEngine` with ``free_slots`` download slots, its clock ``clock``.

    Every scheduler still open at the end is closed; none may leave a timer behind.
    """
    opened: list[Scheduler] = []

    def make(
        worker_id: str = "w1", *, spider: Spider | None = None, free_slots: int = 1,
        crawler: Crawler | None = None, **settings: Any,
    ) -> Scheduler:
        scheduler = build_scheduler(redis_url_for, clock, worker_id, free_slots=free_slots,
                                    crawler=crawler, **settings)
        scheduler.open(spider or SchedSpider())
        opened.append(scheduler)
        return scheduler

    yield make
    for scheduler in opened:
        if scheduler.running:
            scheduler.close("shutdown")
        assert not scheduler.running
    assert not [call for call in clock.getDelayedCalls() if call.active()], "a timer outlived"


@pytest.fixture
def scheduler(make_scheduler: MakeScheduler) -> Scheduler:
    return make_scheduler()


def engine_of(scheduler: Scheduler) -> FakeEngine:
    assert isinstance(scheduler.engine, FakeEngine)
    return scheduler.engine


def clock_of(scheduler: Scheduler) -> task.Clock:
    assert isinstance(scheduler.clock, task.Clock)
    return scheduler.clock


def finish(scheduler: Scheduler, request: Request | None) -> None:
    """The engine is done with ``request``: its ack joins the outbox."""
    assert request is not None
    engine_of(scheduler).done(request)


def next_request(scheduler: Scheduler, attempts: int = 5) -> Request | None:
    """``next_request()``, letting the idle-poll back-off pass between empty answers."""
    for _ in range(attempts):
        request = scheduler.next_request()
        if request is not None:
            return request
        clock_of(scheduler).advance(IDLE_POLL_SECONDS * 1.5)
    return None


def drain(scheduler: Scheduler) -> list[Request]:
    """Every request the scheduler hands out, each processed (acked) before the next.

    The ack frees its host's slot: with one request of a host in flight at a time
    (REDISSPINE_HOST_CONCURRENCY=1), the next one is leased only after it.
    """
    requests = []
    while (request := next_request(scheduler, attempts=2)) is not None:
        requests.append(request)
        finish(scheduler, request)
    return requests


def pending(scheduler: Scheduler) -> bool:
    """``has_pending_requests()`` once the fleet counts it cached are stale."""
    clock_of(scheduler).advance(IDLE_POLL_SECONDS * 1.5)
    return scheduler.has_pending_requests()
