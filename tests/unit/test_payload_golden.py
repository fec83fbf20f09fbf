"""The exact bytes of ordinary requests' payloads, as main's codec wrote them before
meta could carry richer types (captured from it, in ``golden_payloads.json``).

Requests must not grow (the queue stores every payload, the benchmarks count them):
the compact form (issue 19) must carry the same fields in fewer bytes, and payloads
already in a crawl's Redis (these, written by the old codec) must keep decoding to the
same request.
The payloads were captured with Scrapy 2.19.0 (a payload's fields follow the order of
its ``Request.attributes``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from scrapy import FormRequest, Request, Spider
from scrapy.http import JsonRequest
from scrapy.http.request import NO_CALLBACK

from scrapy_redisspine.compact import loads_request
from scrapy_redisspine.request_codec import RequestCodec
from scrapy_redisspine.serialization import get_serializer, loads_any

GOLDEN: dict[str, str] = json.loads(
    (Path(__file__).with_name("golden_payloads.json")).read_text("utf-8")
)


class GoldenSpider(Spider):
    name = "golden"

    def parse(self, response: Any) -> None:
        pass

    def parse_item(self, response: Any, **kwargs: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass


def _cases(spider: GoldenSpider) -> dict[str, Request]:
    return {
        "bare": Request("http://example.com/a"),
        "callback": Request("http://h1.example/p/1", callback=spider.parse_item),
        "depth": Request("http://example.com/", callback=spider.parse, meta={"depth": 1}),
        "start": Request(
            "https://example.com/start", meta={"is_start_request": True}, dont_filter=True
        ),
        "redirected": Request(
            "http://example.com/b", callback=spider.parse, errback=spider.on_error,
            meta={"depth": 2, "redirect_times": 1, "redirect_ttl": 19,
                  "redirect_urls": ["http://example.com/a"], "redirect_reasons": [301],
                  "download_timeout": 180.0, "retry_times": 1},
            priority=-1,
        ),
        "headers_body": Request(
            "http://example.com/p\u00e4th?q=1", method="POST",
            headers={"X-Multi": ["a", "b"], "Referer": "http://example.com/"},
            body=b"\x00\xff body", cookies={"s": "1"}, flags=["f"], encoding="latin-1",
            cb_kwargs={"page": 2, "raw": b"\x01"}, callback=spider.parse_item,
        ),
        "meta_plain": Request(
            "http://example.com/m",
            meta={"nested": {"list": [1, 2.5, None, True, b"\x00", {"deep": "x"}]},
                  "s": "h\u00e9llo"},
        ),
        "no_callback": Request("http://example.com/n", callback=NO_CALLBACK),
        "form": FormRequest(
            "http://example.com/form", formdata={"q": "caf\u00e9"}, callback=spider.parse
        ),
        "json": JsonRequest(
            "http://example.com/api", data={"k": [1, 2]}, dumps_kwargs={"sort_keys": True}
        ),
    }


CASE_NAMES = sorted(_cases(GoldenSpider()))


def test_every_golden_payload_has_a_case() -> None:
    assert sorted(GOLDEN) == sorted(
        f"{serializer}/{name}" for serializer in ("msgpack", "json") for name in CASE_NAMES
    )


@pytest.mark.parametrize("serializer", ["msgpack", "json"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_payloads_are_the_golden_fields_in_fewer_bytes(serializer: str, name: str) -> None:
    spider = GoldenSpider()
    codec = RequestCodec(spider, get_serializer(serializer))
    payload = codec.encode(_cases(spider)[name])
    golden = bytes.fromhex(GOLDEN[f"{serializer}/{name}"])
    fields = loads_any(golden)
    if fields.get("callback", "") is None:  # the compact form leaves a null callback out
        del fields["callback"]
    assert loads_request(payload) == fields
    # the map's "url" key (and "callback" key) are gone, two NULs at most came in
    assert len(payload) <= len(golden) - (3 if "callback" not in fields else 13)


def test_a_plain_get_is_stored_as_its_url() -> None:
    codec = RequestCodec(GoldenSpider(), get_serializer("msgpack"))
    assert codec.encode(_cases(GoldenSpider())["bare"]) == b"http://example.com/a"


@pytest.mark.parametrize("serializer", ["msgpack", "json"])
@pytest.mark.parametrize("name", CASE_NAMES)
def test_golden_payloads_still_decode(serializer: str, name: str) -> None:
    spider = GoldenSpider()
    codec = RequestCodec(spider, get_serializer(serializer))
    expected = _cases(spider)[name]
    copy = codec.decode(bytes.fromhex(GOLDEN[f"{serializer}/{name}"]))
    assert _fields(copy) == _fields(expected)


def _fields(request: Request) -> dict[str, Any]:
    fields = {attr: getattr(request, attr) for attr in type(request).attributes}
    fields["headers"] = {name: request.headers.getlist(name) for name in request.headers}
    fields["class"] = type(request)
    return fields
