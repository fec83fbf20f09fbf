"""SameFingerprinter: byte-for-byte Scrapy's fingerprints, short-cut only where sure.

Run on the oldest supported Scrapy too (``compat``): the short cut's promise is
about what Scrapy and w3lib compute, which could change between their versions.
"""

from __future__ import annotations

import logging
import random

import pytest
from scrapy import Request
from scrapy.utils import request as scrapy_request
from scrapy.utils.request import RequestFingerprinter

from scrapy_redisspine.fingerprints import SameFingerprinter, same_fingerprinter

pytestmark = pytest.mark.compat

#: Characters that make canonicalize_url change a URL, or JSON escape it.
_AWKWARD = "%;?#=&+:@!$'()*,[]| é\\\"<>{}^`ABC."
_PLAIN = "abcxyz0129-._~"
#: Percent escapes, the short cut's (upper-case, a byte >= 0x80 or a space) and others.
_ESCAPES = ("%C3%A9", "%E2%82%AC", "%FF", "%80", "%20", "%c3%a9", "%2F", "%2f", "%25",
            "%3B", "%3F", "%41", "%7C", "%2E", "%7E", "%5E", "%22", "%ZZ", "%", "%0A")


def _near_plain_url(rng: random.Random) -> str:
    """A URL of the short cut's shape, then half the time one awkward character
    put anywhere in it."""
    host = ".".join(
        "".join(rng.choice("abc0-") for _ in range(rng.randint(1, 4))).strip("-") or "a"
        for _ in range(rng.randint(1, 3))
    ) + rng.choice([".com", ".example", "", ".1"])
    path = "/" + "/".join(
        "".join(rng.choice(_PLAIN + "ABC") if rng.random() < 0.85 else rng.choice(_ESCAPES)
                for _ in range(rng.randint(0, 5)))
        for _ in range(rng.randint(1, 3))
    )
    query = ""
    if rng.random() < 0.5:
        query = "?" + "&".join(
            "".join(rng.choice(_PLAIN) for _ in range(rng.randint(1, 3))) + "="
            + "".join(rng.choice(_PLAIN) for _ in range(rng.randint(0, 3)))
            for _ in range(rng.randint(1, 4))
        )
    port = rng.choice(["", "", ":80", ":8080", ":65535", ":65536", ":1", ":08"])
    url = f"{rng.choice(['http', 'https'])}://{host}{port}{path}{query}"
    if rng.random() < 0.5:
        at = rng.randrange(len(url))
        url = url[:at] + rng.choice(_AWKWARD) + url[at:]
    return url


def _requests(seed: int, count: int) -> list[Request]:
    rng = random.Random(seed)
    requests: list[Request] = []
    while len(requests) < count:
        try:
            requests.append(Request(
                _near_plain_url(rng), method=rng.choice(["GET", "POST", "get", "PROPFIND"]),
                body=rng.choice([b"", b"a=1", '{"q": "é"}'.encode()]),
            ))
        except ValueError:
            continue  # a URL Scrapy refuses (e.g. a character put in its scheme)
    return requests


def _outcome(fingerprinter: object, request: Request) -> bytes | str:
    """A fingerprint, or the error fingerprinting raised (some URLs Scrapy accepts
    make its fingerprint raise ValueError, e.g. port 65536 on some versions; the
    short cut must raise it too)."""
    try:
        return bytes(fingerprinter.fingerprint(request))  # type: ignore[attr-defined]
    except ValueError as exc:
        return f"ValueError: {exc}"


@pytest.fixture
def scrapys() -> RequestFingerprinter:
    return RequestFingerprinter()


def test_short_cut_is_on_for_scrapys_default(scrapys: RequestFingerprinter) -> None:
    assert SameFingerprinter(scrapys).enabled


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_every_fingerprint_is_scrapys(scrapys: RequestFingerprinter, seed: int) -> None:
    same = SameFingerprinter(scrapys)
    requests = _requests(seed, 4000)
    differing = [request for request in requests
                 if _outcome(same, request) != _outcome(scrapys, request)]
    assert differing == []
    # Both ways were taken, often: about a sixth of the corpus is short-cut.
    assert 0.1 * len(requests) < same.short_cuts < 0.8 * len(requests)


@pytest.mark.parametrize(("url", "short"), [
    ("http://example.com/", True),
    ("https://h1.example:8080/p/12/a-b_c.d~e", True),
    ("http://127.0.0.2:39123/page/7", True),
    ("http://shop.example/list?page=2&cat=shoes&sort=", True),
    ("http://shop.example/list?a-b=0&a=1", True),  # sorted by name, then value
    ("http://shop.example/list?b=2&a=1&a=0", True),
    ("http://Shop.example/list", True),  # Scrapy lowercases the host of a new request
    ("http://127.1/", False),
    ("http://0x7f.0.0.1/", False),
    ("http://example.com/a/./b", False),
    ("http://example.com/a/../b", False),
    ("http://example.com/.well-known/x", False),
    ("http://example.com/a;p=1", False),
    ("http://example.com/a?x", False),  # becomes "x="
    ("http://example.com/a?x=1+2", False),
    ("http://example.com/a?x=1#top", False),
    ("http://example.com", False),  # gains a "/"
    ("http://xn--bcher-kva.example/", True),
    ("http://example.com/caf%C3%A9/a%20b/%FF", True),
    ("http://example.com/caf%c3%a9", False),  # canonicalize_url upper-cases the hex
    ("http://example.com/a%2Fb", False),
    ("http://example.com/a%41", False),  # decoded: "aA"
    ("http://example.com/a%25b", False),
    ("http://example.com/a%2E/b", False),
    ("ftp://example.com/a", False),
    ("http://user@example.com/", False),
])
def test_edge_cases(scrapys: RequestFingerprinter, url: str, short: bool) -> None:
    same = SameFingerprinter(scrapys)
    request = Request(url)
    assert _outcome(same, request) == _outcome(scrapys, request)
    if request.url != url:
        # A Request changes some URLs itself (w3lib's safe_url_string): the URL the
        # fingerprinter sees is then a plain one, and the short cut takes it.
        assert request.url in PLAIN_AFTER_REQUEST, request.url
        short = True
    assert same.short_cuts == int(short)


# What a Request makes of the table's URLs that it changes: each a plain URL.
# w3lib 2.6 resolves dot segments and numeric hosts and adds the root "/" (2.5 did not).
PLAIN_AFTER_REQUEST = frozenset({
    "http://shop.example/list",  # http://Shop.example/list (any w3lib)
    "http://127.0.0.1/",  # http://127.1/, http://0x7f.0.0.1/
    "http://example.com/a/b",  # http://example.com/a/./b
    "http://example.com/b",  # http://example.com/a/../b
    "http://example.com/",  # http://example.com
})


@pytest.mark.parametrize(("method", "body", "short"), [
    ("POST", b'{"id": "7", "q": "caf\xc3\xa9 \\"x\\""}', True),
    ("PUT", b"\x00\xff", True),
    ("PROPFIND", b"", False),
])
def test_methods_and_bodies(
    scrapys: RequestFingerprinter, method: str, body: bytes, short: bool
) -> None:
    same = SameFingerprinter(scrapys)
    request = Request("http://example.com/api", method=method, body=body)
    assert same.fingerprint(request) == scrapys.fingerprint(request)
    assert same.short_cuts == int(short)


def test_verbatim_url_takes_scrapys_way(scrapys: RequestFingerprinter) -> None:
    """Scrapy 2.14+ fingerprints a ``verbatim_url`` request by its URL as given."""
    same = SameFingerprinter(scrapys)
    request = Request("http://example.com/b?z=1&a=2", meta={"verbatim_url": True})
    assert same.fingerprint(request) == scrapys.fingerprint(request)
    assert same.short_cuts == 0


def test_other_fingerprinters_are_called_as_they_are() -> None:
    class Mine(RequestFingerprinter):
        def fingerprint(self, request: Request) -> bytes:
            return b"mine:" + request.url.encode()

    class Headers:
        def fingerprint(self, request: Request) -> bytes:
            return scrapy_request.fingerprint(request, include_headers=["X-Id"])

    for inner in (Mine(), Headers()):
        same = SameFingerprinter(inner)
        request = Request("http://example.com/a", headers={"X-Id": "1"})
        assert not same.enabled
        assert same.fingerprint(request) == inner.fingerprint(request)
        assert same.short_cuts == 0


def test_a_different_canonical_form_turns_the_short_cut_off(
    scrapys: RequestFingerprinter, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """If a Scrapy or w3lib version canonicalised plain URLs otherwise (here: default
    ports dropped), the probes disagree and every request takes Scrapy's way."""
    canonicalize = scrapy_request.canonicalize_url  # type: ignore[attr-defined]

    def without_default_port(url: str, **kwargs: object) -> str:
        return str(canonicalize(url, **kwargs)).replace(":80/", "/")  # type: ignore[arg-type]

    monkeypatch.setattr(scrapy_request, "canonicalize_url", without_default_port)
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine.fingerprints"):
        same = SameFingerprinter(scrapys)
    assert not same.enabled
    assert "differ" in caplog.text
    request = Request("http://example.com:80/a")
    assert same.fingerprint(request) == scrapys.fingerprint(request)
    assert same.short_cuts == 0


def test_wrapping_is_done_once(scrapys: RequestFingerprinter) -> None:
    same = same_fingerprinter(scrapys)
    assert isinstance(same, SameFingerprinter)
    assert same_fingerprinter(same) is same


def test_the_scheduler_short_cuts_with_another_dupefilter() -> None:
    """With another DUPEFILTER_CLASS the scheduler still fingerprints start requests
    (each is injected once per crawl): the same bytes as the crawler's fingerprinter."""
    from scrapy.dupefilters import BaseDupeFilter
    from scrapy.statscollectors import MemoryStatsCollector
    from scrapy.utils.test import get_crawler

    from scrapy_redisspine.scheduler import Scheduler
    from scrapy_redisspine.settings import load_config

    crawler = get_crawler()
    config = load_config({"REDISSPINE_REDIS_URL": "redis://127.0.0.1:1/0",
                          "REDISSPINE_CRAWL_ID": "fingerprints"})
    scheduler = Scheduler(config, BaseDupeFilter(), MemoryStatsCollector(crawler),
                          crawler=crawler, worker_id="w1")
    for url in ("http://example.com/a?b=1&a=2", "http://Example.com/a%2fb#x"):
        request = Request(url)
        assert scheduler._fingerprint(request) == crawler.request_fingerprinter.fingerprint(
            request)
    assert isinstance(scheduler._fingerprinter, SameFingerprinter)
    assert scheduler._fingerprinter.short_cuts == 1
