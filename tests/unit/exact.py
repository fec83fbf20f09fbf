"""``same(a, b)``: equal, and of the same types all the way down.

``1 == 1.0 == True`` and ``(1,) != [1]`` but ``{1} == frozenset({1})``: a lossless
round trip needs more than ``==``. Items compare field by field and requests by
their fields, since neither compares by value on its own.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from decimal import Decimal
from typing import Any

import attr
from scrapy import Item, Request


def same(a: Any, b: Any) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        keys = {key_of(k): k for k in b}
        return len(a) == len(b) and all(
            key_of(k) in keys and same(k, keys[key_of(k)]) and same(v, b[keys[key_of(k)]])
            for k, v in a.items()
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (set, frozenset)):
        return sorted(map(key_of, a)) == sorted(map(key_of, b))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (
            a == b and math.copysign(1, a) == math.copysign(1, b)
        )
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, (dt.datetime, dt.time)):
        return (a.replace(tzinfo=None) == b.replace(tzinfo=None) and a.fold == b.fold
                and a.utcoffset() == b.utcoffset() and _zone(a) == _zone(b))
    fields = fields_of(a)
    if fields is not None:
        return same(fields, fields_of(b))
    return bool(a == b)


def fields_of(value: Any) -> dict[str, Any] | None:
    """What an item or a request holds, or None for other values."""
    if isinstance(value, Item):
        return dict(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if attr.has(type(value)):
        return {a.name: getattr(value, a.name) for a in attr.fields(type(value))}
    if isinstance(value, Request):
        fields = {name: getattr(value, name) for name in type(value).attributes}
        fields["headers"] = {name: value.headers.getlist(name) for name in value.headers}
        return fields
    return None


def key_of(value: Any) -> str:
    """A type-exact, comparable stand-in for a hashable value."""
    if isinstance(value, (tuple, frozenset)):
        inner = sorted(map(key_of, value)) if isinstance(value, frozenset) else map(key_of, value)
        return f"{type(value).__name__}({', '.join(inner)})"
    if isinstance(value, (dt.datetime, dt.time)):
        return f"{type(value).__name__}({value.isoformat()}, {_zone(value)}, {value.fold})"
    if isinstance(value, float) and math.isnan(value):
        return "float(nan)"
    if isinstance(value, Decimal):
        return f"Decimal({value})"
    return f"{type(value).__name__}({value!r})"


def _zone(value: dt.datetime | dt.time) -> str | None:
    return getattr(value.tzinfo, "key", None)
