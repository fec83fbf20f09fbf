"""RedisDupeFilter: fingerprints, the tracking option, request_seen, stats and logging,
and the timer that drives the SET-to-Bloom switch (on a fake clock)."""

from __future__ import annotations

import hashlib
import logging
from typing import TYPE_CHECKING, Any

import fakeredis
import pytest
import redis
from scrapy import Request, Spider
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.test import get_crawler
from twisted.internet import task

import scrapy_redisspine.worker
from scrapy_redisspine.dedup import MODE_BLOOM, MODE_SET, SET_MEMBER_BYTES, DedupState
from scrapy_redisspine.dupefilter import RedisDupeFilter
from scrapy_redisspine.frontier import CorruptKeyError
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.scheduler import Scheduler
from scrapy_redisspine.settings import load_config
from tests.queue_view import queued_count

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


KEYS = CrawlKeys("redisspine", "df-test")


class DedupSpider(Spider):
    name = "df-test"


class HexFingerprinter:
    """A custom fingerprinter returning 40 hex characters (not 20 raw bytes)."""

    def fingerprint(self, request: Request) -> bytes:
        return hashlib.sha1(request.url.encode()).hexdigest().encode()


@pytest.fixture(params=["fakeredis", "redis", "redisbloom-server"])
def redis_url(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """A URL the dupefilter connects to; fakeredis is patched in behind a dummy URL."""
    if request.param == "fakeredis":
        server = fakeredis.FakeServer()
        monkeypatch.setattr(
            scrapy_redisspine.worker, "client_from_url",
            lambda url, **options: fakeredis.FakeRedis(server=server),
        )
        monkeypatch.setattr(
            "tests.unit.test_dedup_dupefilter._inspect", lambda url: fakeredis.FakeRedis(
                server=server)
        )
        yield "redis://fakeredis.invalid:6379/0"
    elif request.param == "redisbloom-server":
        yield request.getfixturevalue("bloom_redis_url")
    else:
        request.getfixturevalue("redis_server")
        yield request.getfixturevalue("redis_url")


@pytest.fixture
def bloom_backend(request: pytest.FixtureRequest, redis_url: str) -> str:
    """The filter the Bloom-mode tests ask for: the real module where the server has it,
    else the Lua bitmap (fakeredis' BF.* imitation is covered in test_dedup.py)."""
    on_module = request.node.callspec.params.get("redis_url") == "redisbloom-server"
    return "redisbloom" if on_module else "bitmap"


def _inspect(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


@pytest.fixture
def make_filter(redis_url: str) -> Iterator[Callable[..., RedisDupeFilter]]:
    """``make_filter(clock=None, fingerprinter=None, **settings)``: an opened filter."""
    opened: list[RedisDupeFilter] = []

    def make(clock: Any = None, fingerprinter: Any = None, **settings: Any) -> RedisDupeFilter:
        config = load_config({
            "REDISSPINE_REDIS_URL": redis_url, "REDISSPINE_CRAWL_ID": KEYS.crawl_id, **settings,
        })
        stats = MemoryStatsCollector(get_crawler(DedupSpider))
        dupefilter = RedisDupeFilter(
            fingerprinter or RequestFingerprinter(), config, stats=stats,
            debug=bool(settings.get("DEBUG")), clock=clock,
        )
        dupefilter.open()
        opened.append(dupefilter)
        return dupefilter

    yield make
    for dupefilter in opened:
        dupefilter.close("finished")


@pytest.fixture
def inspect(redis_url: str) -> Iterator[redis.Redis]:
    client = _inspect(redis_url)
    yield client
    client.close()


# -- fingerprints ---------------------------------------------------------------------


def test_fingerprint_is_the_configured_fingerprinters_raw_bytes(
    make_filter: Callable[..., RedisDupeFilter],
) -> None:
    dupefilter = make_filter()
    get, post = Request("https://a.example/x"), Request("https://a.example/x", method="POST")
    assert dupefilter.fingerprint(get) == RequestFingerprinter().fingerprint(get)
    assert len(dupefilter.fingerprint(get)) == 20
    assert dupefilter.fingerprint(get) != dupefilter.fingerprint(post)
    with_body = Request("https://a.example/x", method="POST", body=b"q=1")
    assert dupefilter.fingerprint(post) != dupefilter.fingerprint(with_body)


def test_custom_fingerprinter_is_used_and_kept_to_20_bytes(
    make_filter: Callable[..., RedisDupeFilter],
) -> None:
    dupefilter = make_filter(fingerprinter=HexFingerprinter())
    fingerprint = dupefilter.fingerprint(Request("https://a.example/x"))
    expected = hashlib.sha1(HexFingerprinter().fingerprint(Request("https://a.example/x")))
    assert fingerprint == expected.digest()


VARIANTS = [
    "https://Shop.example/item?id=7",
    "https://shop.example:443/item?utm_source=mail&id=7",
    "https://shop.example/item?id=7&gclid=abc#top",
    "https://shop.example/item?fbclid=z&id=7&utm_medium=x",
]


def test_tracking_variants_are_one_page_with_the_option(
    make_filter: Callable[..., RedisDupeFilter],
) -> None:
    dupefilter = make_filter(REDISSPINE_DEDUP_STRIP_TRACKING_PARAMS=True)
    requests = [Request(url) for url in VARIANTS]
    assert len({dupefilter.fingerprint(request) for request in requests}) == 1
    assert [request.url for request in requests] == [Request(url).url for url in VARIANTS]
    assert dupefilter.fingerprint(Request("https://shop.example/item?id=8")) != (
        dupefilter.fingerprint(requests[0])
    )


def test_tracking_variants_differ_without_the_option(
    make_filter: Callable[..., RedisDupeFilter],
) -> None:
    dupefilter = make_filter()
    assert len({dupefilter.fingerprint(Request(url)) for url in VARIANTS}) > 1


def test_extra_tracking_params(make_filter: Callable[..., RedisDupeFilter]) -> None:
    dupefilter = make_filter(
        REDISSPINE_DEDUP_STRIP_TRACKING_PARAMS=True,
        REDISSPINE_DEDUP_EXTRA_TRACKING_PARAMS="sessionid, ref_*",
    )
    plain = dupefilter.fingerprint(Request("https://a.example/p?x=1"))
    tagged = dupefilter.fingerprint(Request("https://a.example/p?x=1&SessionId=9&ref_a=b"))
    assert plain == tagged


# -- request_seen, stats, logging -----------------------------------------------------------


def test_request_seen_is_shared_by_every_worker(
    make_filter: Callable[..., RedisDupeFilter], inspect: redis.Redis
) -> None:
    first, second = make_filter(), make_filter()
    request = Request("https://a.example/seen")
    assert first.request_seen(request) is False
    assert first.request_seen(request) is True
    assert second.request_seen(request.replace()) is True
    assert inspect.smembers(KEYS.seen) == {first.fingerprint(request)[:SET_MEMBER_BYTES]}


def test_request_seen_in_bloom_mode(
    make_filter: Callable[..., RedisDupeFilter], inspect: redis.Redis, bloom_backend: str
) -> None:
    dupefilter = make_filter(
        REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS=0, REDISSPINE_BLOOM_BACKEND=bloom_backend,
        REDISSPINE_BLOOM_CAPACITY=1000,
    )
    step = dupefilter.maintain()
    assert step is not None
    assert step.mode == MODE_BLOOM
    request = Request("https://a.example/bloom")
    assert [dupefilter.request_seen(request) for _ in range(2)] == [False, True]
    assert not inspect.exists(KEYS.seen)


def test_request_seen_before_open_is_an_error() -> None:
    dupefilter = RedisDupeFilter(RequestFingerprinter(), load_config({}))
    with pytest.raises(RuntimeError, match="before open"):
        dupefilter.request_seen(Request("https://a.example/"))


def test_log_counts_and_logs_like_scrapy(
    make_filter: Callable[..., RedisDupeFilter], caplog: pytest.LogCaptureFixture
) -> None:
    dupefilter = make_filter()
    caplog.set_level(logging.DEBUG, logger="scrapy_redisspine.dupefilter")
    for i in range(3):
        dupefilter.log(Request(f"https://a.example/{i}"), None)
    assert dupefilter.stats is not None
    assert dupefilter.stats.get_value("dupefilter/filtered") == 3
    messages = [r.getMessage() for r in caplog.records if "Filtered duplicate" in r.getMessage()]
    assert len(messages) == 1
    assert "no more duplicates will be shown" in messages[0]


def test_debug_logs_every_duplicate_with_its_referer(
    make_filter: Callable[..., RedisDupeFilter], caplog: pytest.LogCaptureFixture
) -> None:
    dupefilter = make_filter(DEBUG=True)
    caplog.set_level(logging.DEBUG, logger="scrapy_redisspine.dupefilter")
    for i in range(3):
        dupefilter.log(Request(f"https://a.example/{i}", headers={"Referer": "https://r/"}), None)
    messages = [r.getMessage() for r in caplog.records if "Filtered duplicate" in r.getMessage()]
    assert len(messages) == 3
    assert all("referer: https://r/" in m for m in messages)


def test_open_names_a_corrupt_key(
    make_filter: Callable[..., RedisDupeFilter], inspect: redis.Redis
) -> None:
    inspect.set(KEYS.seen, b"someone's string")
    with pytest.raises(CorruptKeyError, match=r"df-test.*:seen"):
        make_filter()


# -- the switch, driven by the filter's timer ---------------------------------------------


def test_timer_switches_and_migrates_while_open(
    make_filter: Callable[..., RedisDupeFilter], inspect: redis.Redis,
    caplog: pytest.LogCaptureFixture, bloom_backend: str,
) -> None:
    caplog.set_level(logging.INFO, logger="scrapy_redisspine.dupefilter")
    inspect.sadd(KEYS.seen, *(hashlib.sha1(b"%d" % i).digest() for i in range(300)))
    clock = task.Clock()
    dupefilter = make_filter(
        clock=clock, REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS=100,
        REDISSPINE_BLOOM_BACKEND=bloom_backend,
        REDISSPINE_BLOOM_CAPACITY=1000, REDISSPINE_DEDUP_MIGRATION_CHUNK_SIZE=10,
        REDISSPINE_DEDUP_CHECK_SECONDS=30,
    )
    assert dupefilter.dedup is not None
    ticks = 0
    while dupefilter.dedup.state().mode != MODE_BLOOM:
        clock.advance(0.02)
        ticks += 1
        assert ticks < 200
    assert not inspect.exists(KEYS.seen)
    assert dupefilter.stats is not None
    assert dupefilter.stats.get_value("redisspine/dedup/switched") == 1
    assert dupefilter.stats.get_value("redisspine/dedup/migrated") == 300
    text = caplog.text
    assert f"switching crawl 'df-test' to a {bloom_backend} Bloom filter" in text
    assert "dedup switch done" in text
    assert [call.getTime() for call in clock.getDelayedCalls()] == [clock.seconds() + 30]
    dupefilter.close("finished")
    assert not clock.getDelayedCalls()


def test_timer_survives_redis_errors(
    make_filter: Callable[..., RedisDupeFilter], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = task.Clock()
    dupefilter = make_filter(clock=clock, REDISSPINE_DEDUP_CHECK_SECONDS=1)
    assert dupefilter.dedup is not None

    def down(budget_seconds: float) -> None:
        raise redis.ConnectionError("down")

    monkeypatch.setattr(dupefilter.dedup, "maintain", down)
    for _ in range(3):
        clock.advance(1)
    assert dupefilter.stats is not None
    assert dupefilter.stats.get_value("redisspine/redis_errors/dedup") == 3
    assert caplog.text.count("dedup maintenance failed") == 1
    assert len(clock.getDelayedCalls()) == 1


def test_full_filter_is_reported_once(
    make_filter: Callable[..., RedisDupeFilter], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    dupefilter = make_filter(REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS=0,
                             REDISSPINE_BLOOM_BACKEND="bitmap", REDISSPINE_BLOOM_CAPACITY=100)
    assert dupefilter.dedup is not None
    dupefilter.maintain()
    real = dupefilter.dedup.state()

    def full_state() -> DedupState:
        layers = real.layers
        return DedupState(MODE_BLOOM, "bitmap", 0, layers, len(layers),
                          tuple(layer.capacity for layer in layers))

    monkeypatch.setattr(dupefilter.dedup, "state", full_state)
    dupefilter.maintain()
    dupefilter.maintain()
    assert caplog.text.count("is full") == 1


# -- with the scheduler -----------------------------------------------------------------


def test_scheduler_filters_duplicates_in_bloom_mode(
    redis_url: str, inspect: redis.Redis, bloom_backend: str
) -> None:
    config = load_config({
        "REDISSPINE_REDIS_URL": redis_url, "REDISSPINE_CRAWL_ID": KEYS.crawl_id,
        "REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS": 0, "REDISSPINE_BLOOM_BACKEND": bloom_backend,
        "REDISSPINE_BLOOM_CAPACITY": 1000,
    })
    stats = MemoryStatsCollector(get_crawler(DedupSpider))
    dupefilter = RedisDupeFilter(RequestFingerprinter(), config, stats=stats)
    scheduler = Scheduler(config, dupefilter, stats, clock=task.Clock(), worker_id="w1")
    scheduler.open(DedupSpider())
    try:
        step = dupefilter.maintain()
        assert step is not None
        assert step.mode == MODE_BLOOM
        for _ in range(2):
            for i in range(5):
                scheduler.enqueue_request(Request(f"https://a.example/{i}"))
            scheduler.enqueue_request(Request("https://a.example/again", dont_filter=True))
            scheduler.outbox.flush()
        assert stats.get_value("dupefilter/filtered") == 5
        assert stats.get_value("scheduler/enqueued") == 7
        assert queued_count(inspect, KEYS) == 7
        assert not inspect.exists(KEYS.seen)
    finally:
        scheduler.close("finished")
    assert dupefilter.dedup is not None
    assert dupefilter.dedup.state().mode != MODE_SET
