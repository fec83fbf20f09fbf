"""The compact request payload: ``url [\\0 callback [\\0 map of the other fields]]``.

The queue stores one payload per queued request, so its bytes are Redis memory paid
for every URL of the frontier (issue 19). Most requests are a URL, perhaps a callback,
perhaps a little meta (``depth``): as a map, the keys ``"url"`` and ``"callback"`` and
the map's framing cost 15 bytes a request, and a request with nothing but a URL (a
plain GET) needs no map at all. So a payload starts with the URL itself; a callback
name follows a NUL, and every other field stays in the serializer's map (msgpack or
JSON) after a second NUL, decoded by the same rules as before.

Old payloads keep decoding: a map starts with a msgpack map header or ``{`` (and a
worker's marker with a NUL), never with an ASCII letter, while every compact payload
starts with the URL's scheme, which is a letter. A URL that does not start with a
letter, or that holds a NUL (Scrapy escapes it as ``%00``, so only a hand-built one
could), is stored as a map as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_redisspine.serialization import SerializationError, loads_any

if TYPE_CHECKING:
    from scrapy_redisspine.serialization import Objects, Serializer

_LETTERS = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_OWN_FIELDS = ("url", "callback")


def is_compact(payload: bytes) -> bool:
    """Whether ``payload`` is in the compact form (it starts with a URL's letter)."""
    return bool(payload) and payload[0] in _LETTERS


def dumps_request(
    data: dict[str, Any], serializer: Serializer, objects: Objects | None = None
) -> bytes:
    """The payload of a request's fields (``data`` as ``request_codec`` makes it)."""
    url, callback = data.get("url"), data.get("callback")
    if not (isinstance(url, str) and _url_fits(url)
            and (callback is None or _name_fits(callback))):
        return serializer.dumps(data, objects)
    rest = {key: value for key, value in data.items() if key not in _OWN_FIELDS}
    payload: bytes = url.encode()
    if callback is not None or rest:
        payload += b"\0" + (callback.encode() if callback is not None else b"")
    if rest:
        payload += b"\0" + serializer.dumps(rest, objects)
    return payload


def loads_request(payload: bytes, objects: Objects | None = None) -> dict[str, Any]:
    """A request's fields from either form (raises SerializationError)."""
    if not is_compact(payload):
        return loads_any(payload, objects)
    url, *others = payload.split(b"\0", 2)
    try:
        data: dict[str, Any] = {"url": url.decode()}
        callback = others[0].decode() if others else ""
    except UnicodeDecodeError as exc:
        raise SerializationError(f"compact payload is not UTF-8: {exc}") from exc
    if len(others) > 1:
        rest = loads_any(others[1], objects)
        if any(field in rest for field in _OWN_FIELDS):
            raise SerializationError("compact payload repeats its URL or callback in its map")
        data.update(rest)
    if callback:
        data["callback"] = callback
    return data


def _url_fits(url: str) -> bool:
    return url[:1].isascii() and url[:1].isalpha() and "\0" not in url


def _name_fits(name: Any) -> bool:
    return isinstance(name, str) and bool(name) and "\0" not in name
