"""Items <-> entries of the crawl's items stream, with the safe serializer of requests.

An entry holds three fields, written by ``scripts/enqueue.lua``: ``class`` (the
item's dotted class path, ``dict`` for a plain dict), ``url`` (the response whose
callback produced it) and ``item``, a payload of the crawl's serializer
(``REDISSPINE_SERIALIZER``): ``{"class": path, "fields": {name: value}}``. Values
travel as request meta does (``serialization``: typed wire values, nested items by
the class rules of ``_items``), never pickled.

Two readers: a worker of the project rebuilds the item as its class
(:meth:`ItemCodec.decode`); a tool without the project (``redisspine export``, a
consumer) reads plain fields (:func:`entry_fields`), with nested items as their
fields and nested requests as their dicts, so it needs none of the project's code.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_redisspine.frontier import StreamItem
from scrapy_redisspine.serialization import SerializationError, StoredObject, loads_any

if TYPE_CHECKING:
    from collections.abc import Mapping

    from scrapy_redisspine._items import ItemClasses
    from scrapy_redisspine.serialization import Objects, Serializer

#: The stream entry's field names, as enqueue.lua writes them.
CLASS_FIELD, URL_FIELD, ITEM_FIELD = b"class", b"url", b"item"
PLAIN_DICT = "dict"


class ItemEncodeError(ValueError):
    """An item cannot be stored (its class may not travel, a value cannot be encoded)."""


class ItemCodec:
    """Turns one worker's items into stream entries and back.

    ``objects`` is the request codec's hook (nested requests and items in field
    values), ``items`` the item classes it allows.
    """

    def __init__(self, serializer: Serializer, items: ItemClasses, objects: Objects) -> None:
        self._serializer = serializer
        self._items = items
        self._objects = objects

    def encode(self, item: Any, url: str) -> StreamItem:
        """The entry of ``item``, produced by the callback of the response at ``url``."""
        if isinstance(item, dict):
            path, fields = PLAIN_DICT, dict(item)
        else:
            try:
                parts = self._items.object_parts(item)
            except TypeError as exc:
                raise ItemEncodeError(str(exc)) from exc
            if parts is None:
                raise ItemEncodeError(
                    f"cannot store an item of type {type(item).__qualname__}: items are "
                    f"dicts, scrapy.Item subclasses, dataclasses or attrs classes"
                )
            path, fields = parts
        try:
            payload = self._serializer.dumps({"class": path, "fields": fields}, self._objects)
        except SerializationError as exc:
            raise ItemEncodeError(f"cannot store an item of {path}: {exc}") from exc
        return StreamItem(path, url, payload)

    def decode(self, payload: bytes) -> Any:
        """The item as its class (``dict`` for a plain one); SerializationError if the
        payload is malformed or names a class this worker may not rebuild."""
        path, fields = _parts(loads_any(payload, self._objects))
        return fields if path == PLAIN_DICT else self._items.rebuild([path, fields])


@dataclass(frozen=True)
class Entry:
    """One stream entry as a tool reads it: plain values only."""

    entry_id: str
    class_path: str
    url: str
    fields: dict[str, Any]


def entry_fields(entry_id: bytes | str, values: Mapping[bytes, bytes]) -> Entry:
    """Read a raw stream entry without the project's classes; SerializationError if
    it is malformed."""
    payload = values.get(ITEM_FIELD)
    if payload is None:
        raise SerializationError("entry has no item field")
    path, fields = _parts(loads_any(payload))
    url = values.get(URL_FIELD, b"").decode("utf-8", "replace")
    return Entry(entry_id.decode() if isinstance(entry_id, bytes) else entry_id, path, url,
                 plain(fields))


def plain(value: Any) -> Any:
    """A decoded value with stored objects as plain data (an item as its fields)."""
    if isinstance(value, StoredObject):
        parts = value.parts
        if value.kind == "item" and isinstance(parts, list) and len(parts) == 2:
            return plain(parts[1])
        return plain(parts)
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [plain(item) for item in value]
    return value


def _parts(data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    path, fields = data.get("class"), data.get("fields")
    if not isinstance(path, str) or not isinstance(fields, dict):
        raise SerializationError(f"malformed item entry: {data!r:.80}")
    return path, fields
