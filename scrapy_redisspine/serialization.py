"""Plain data <-> bytes, with no code execution on the way back.

Requests travel as dicts of plain values (see ``request_codec``). Whatever a shared
Redis hands back is decoded by msgpack or JSON only, never unpickled: anybody able to
write to that Redis must not be able to run code on the workers.
"""

from __future__ import annotations

import base64
import json
from typing import Any, Protocol

import msgpack


class SerializationError(ValueError):
    """A value cannot be encoded, or stored bytes cannot be decoded."""


class Serializer(Protocol):
    name: str

    def dumps(self, data: dict[str, Any]) -> bytes: ...

    def loads(self, payload: bytes) -> dict[str, Any]: ...


class MsgpackSerializer:
    """Compact and fast; bytes and str stay distinct, tuples come back as lists."""

    name = "msgpack"

    def dumps(self, data: dict[str, Any]) -> bytes:
        try:
            return msgpack.packb(data, use_bin_type=True)  # type: ignore[no-any-return]
        except (TypeError, ValueError, OverflowError) as exc:
            raise SerializationError(str(exc)) from exc

    def loads(self, payload: bytes) -> dict[str, Any]:
        try:
            data = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise SerializationError(f"not a msgpack payload: {exc}") from exc
        if not isinstance(data, dict):
            raise SerializationError(f"payload is a {type(data).__name__}, not a map")
        return data


_BYTES_TAG = "__bytes_b64__"


def _encode_bytes(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        return {_BYTES_TAG: base64.b64encode(bytes(value)).decode("ascii")}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _decode_bytes(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and _BYTES_TAG in obj:
        value = obj[_BYTES_TAG]
        if not isinstance(value, str):
            raise ValueError(f"{_BYTES_TAG} must hold a base64 string, not {value!r}")
        return base64.b64decode(value, validate=True)
    return obj


class JsonSerializer:
    """Readable in redis-cli; bytes are tagged base64 objects."""

    name = "json"

    def dumps(self, data: dict[str, Any]) -> bytes:
        try:
            return json.dumps(data, default=_encode_bytes, separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise SerializationError(str(exc)) from exc

    def loads(self, payload: bytes) -> dict[str, Any]:
        try:
            data = json.loads(payload, object_hook=_decode_bytes)
        except (ValueError, TypeError) as exc:  # binascii.Error is a ValueError
            raise SerializationError(f"not a JSON payload: {exc}") from exc
        if not isinstance(data, dict):
            raise SerializationError(f"payload is a {type(data).__name__}, not an object")
        return data


def loads_any(payload: bytes) -> dict[str, Any]:
    """Decode either format: a JSON object starts with ``{``, which no msgpack map does.

    So a crawl survives a change of ``REDISSPINE_SERIALIZER`` and pushes made in the
    other format.
    """
    if payload[:1] == b"{":
        return JsonSerializer().loads(payload)
    return MsgpackSerializer().loads(payload)


def get_serializer(name: str) -> Serializer:
    if name == "msgpack":
        return MsgpackSerializer()
    if name == "json":
        return JsonSerializer()
    raise SerializationError(f"unknown serializer {name!r}; use 'msgpack' or 'json'")
