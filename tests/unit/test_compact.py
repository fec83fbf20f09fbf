"""The compact request payload (``compact.py``): the form, its fall-backs, and what a
reader does with garbage in that form."""

from __future__ import annotations

import pytest

from scrapy_redisspine._local import MARKER_PREFIX
from scrapy_redisspine.cli_output import describe_payload
from scrapy_redisspine.compact import dumps_request, is_compact, loads_request
from scrapy_redisspine.serialization import SerializationError, get_serializer

SERIALIZERS = ["msgpack", "json"]


@pytest.mark.parametrize("serializer", SERIALIZERS)
@pytest.mark.parametrize(("data", "expected"), [
    ({"url": "http://a.example/"}, b"http://a.example/"),
    ({"url": "http://a.example/", "callback": "parse"}, b"http://a.example/\0parse"),
    ({"url": "http://a.example/", "callback": "_private"}, b"http://a.example/\0_private"),
])
def test_url_and_callback_need_no_map(serializer: str, data: dict[str, str],
                                      expected: bytes) -> None:
    payload = dumps_request(data, get_serializer(serializer))
    assert payload == expected
    assert loads_request(payload) == data


@pytest.mark.parametrize("serializer", SERIALIZERS)
def test_other_fields_follow_in_the_serializers_map(serializer: str) -> None:
    data = {"url": "https://a.example/x", "meta": {"depth": 3, "raw": b"\0\n"}, "priority": -2}
    chosen = get_serializer(serializer)
    for fields in (data, {**data, "callback": "parse"}):
        payload = dumps_request(fields, chosen)
        url, callback, rest = payload.split(b"\0", 2)
        assert (url, callback) == (b"https://a.example/x", fields.get("callback", "").encode())
        assert chosen.loads(rest) == {"meta": data["meta"], "priority": -2}
        assert loads_request(payload) == fields


@pytest.mark.parametrize("url", ["1x:y", "{odd:", "http://a/\0nul", "", "\u00e9://a"])
def test_a_url_the_form_cannot_frame_is_stored_as_a_map(url: str) -> None:
    payload = dumps_request({"url": url, "callback": "parse"}, get_serializer("msgpack"))
    assert not is_compact(payload)
    assert loads_request(payload) == {"url": url, "callback": "parse"}


def test_old_payloads_and_markers_are_not_compact() -> None:
    for serializer in SERIALIZERS:
        assert not is_compact(get_serializer(serializer).dumps({"url": "http://a/"}))
    assert not is_compact(MARKER_PREFIX + b"{}")


@pytest.mark.parametrize("garbage", [
    b"http://a/\0\xff\xfe",  # a callback that is no UTF-8
    b"http://a/\0parse\0not a map",
    b"http://a/\0parse\0\x81\xa3url\xa1x",  # the map repeats the URL
    b"ht\xfftp://a/",
])
def test_garbage_in_the_compact_form_is_a_clear_error(garbage: bytes) -> None:
    with pytest.raises(SerializationError):
        loads_request(garbage)
    assert describe_payload(garbage) == f"<{len(garbage)} undecodable bytes>"


def test_the_cli_describes_a_compact_payload() -> None:
    assert describe_payload(b"http://a.example/p") == "GET http://a.example/p"
    payload = dumps_request({"url": "http://a.example/f", "method": "POST"},
                            get_serializer("json"))
    assert describe_payload(payload) == "POST http://a.example/f"
