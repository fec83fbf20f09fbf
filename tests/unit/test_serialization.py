from __future__ import annotations

import json
from typing import Any

import msgpack
import pytest

from scrapy_redisspine.serialization import (
    JsonSerializer,
    MsgpackSerializer,
    SerializationError,
    Serializer,
    get_serializer,
)

SERIALIZERS = ("msgpack", "json")

DATA: dict[str, Any] = {
    "str": "h\u00e9llo \u2603",
    "bytes": b"\x00\xff\n raw",
    "empty_bytes": b"",
    "int": -(2**40),
    "float": 0.25,
    "none": None,
    "true": True,
    "false": False,
    "list": [1, "two", b"three", [None, {"deep": b"\x01"}]],
    "dict": {"nested": {"bytes": b"\x80", "list": []}},
}


@pytest.fixture(params=SERIALIZERS)
def serializer(request: pytest.FixtureRequest) -> Serializer:
    return get_serializer(request.param)


def test_get_serializer_by_name() -> None:
    assert isinstance(get_serializer("msgpack"), MsgpackSerializer)
    assert isinstance(get_serializer("json"), JsonSerializer)
    assert get_serializer("json").name == "json"
    assert get_serializer("msgpack").name == "msgpack"


@pytest.mark.parametrize("name", ["pickle", "", "JSON"])
def test_unknown_serializer_is_refused(name: str) -> None:
    with pytest.raises(SerializationError, match="unknown serializer"):
        get_serializer(name)


def test_round_trip(serializer: Serializer) -> None:
    payload = serializer.dumps(DATA)
    assert isinstance(payload, bytes)
    assert serializer.loads(payload) == DATA


def test_bytes_and_str_stay_distinct(serializer: Serializer) -> None:
    data = serializer.loads(serializer.dumps({"b": b"abc", "s": "abc"}))
    assert data == {"b": b"abc", "s": "abc"}
    assert isinstance(data["b"], bytes)
    assert isinstance(data["s"], str)


def test_tuples_come_back_as_tuples(serializer: Serializer) -> None:
    data = serializer.loads(serializer.dumps({"t": (1, (2, [3])), "l": [1, 2]}))
    assert data == {"t": (1, (2, [3])), "l": [1, 2]}
    assert type(data["t"]) is tuple
    assert type(data["t"][1]) is tuple
    assert type(data["l"]) is list


def test_json_is_readable() -> None:
    payload = JsonSerializer().dumps({"url": "http://example.com/", "body": b"\xff"})
    assert json.loads(payload)["url"] == "http://example.com/"
    assert b" " not in payload  # compact separators


@pytest.mark.parametrize("value", [object(), lambda: None, type, [1, object()], {"k": {object}}])
def test_unserializable_value(serializer: Serializer, value: Any) -> None:
    with pytest.raises(SerializationError):
        serializer.dumps({"v": value})


@pytest.mark.parametrize(
    "payload",
    [b"", b"\xc1", b"\x00\xff garbage \n", b"{not json", b"\xde\xad\xbe\xef" * 8],
)
def test_garbage_bytes(serializer: Serializer, payload: bytes) -> None:
    with pytest.raises(SerializationError):
        serializer.loads(payload)


@pytest.mark.parametrize("data", [[1, 2], "text", 5, None])
def test_payload_that_is_not_a_map(data: Any) -> None:
    with pytest.raises(SerializationError, match="not a map"):
        MsgpackSerializer().loads(msgpack.packb(data))
    with pytest.raises(SerializationError, match="not an object"):
        JsonSerializer().loads(json.dumps(data).encode())


def test_msgpack_map_with_non_str_keys_loads() -> None:
    assert MsgpackSerializer().loads(msgpack.packb({1: "a"})) == {1: "a"}


@pytest.mark.parametrize(
    "payload",
    [
        b'{"body": {"__bytes_b64__": "!!not base64!!"}}',
        b'{"body": {"__bytes_b64__": 5}}',
        b'{"body": {"__bytes_b64__": null}}',
        b'{"body": {"__bytes_b64__": ["a"]}}',
    ],
)
def test_json_malformed_bytes_tag_is_a_serialization_error(payload: bytes) -> None:
    # Whatever a shared Redis holds must fail as SerializationError, not as a
    # TypeError from base64 deep inside json.loads.
    with pytest.raises(SerializationError):
        JsonSerializer().loads(payload)
