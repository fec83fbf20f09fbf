"""Plain data <-> bytes, with no code execution on the way back.

Requests travel as dicts of values (see ``request_codec``). Whatever a shared Redis
hands back is decoded by msgpack or JSON only, never unpickled: anybody able to write
to that Redis must not be able to run code on the workers.

Besides what both formats carry natively (dict, list, str, bytes, int, float, bool,
None), the values of :data:`WIRE_TYPES` travel typed. Each is defined once: a name, a
msgpack ExtType code, and a pair of functions to and from its *parts*, a plain value
(a str, a list ...). The two formats only frame the parts:

- msgpack: ``ExtType(code, packb(parts))``;
- JSON: a one-key object ``{"__name__": parts}``. Every one-key object whose key starts
  and ends with ``__`` is a tag: a user dict that looks like one, or that has a key
  other than a str, travels as ``{"__map__": [[key, value], ...]}`` instead, so no user
  data is ever read as a tag. Bytes keep the tag they always had, ``__bytes_b64__``.

Objects that only the caller may rebuild (Scrapy items, nested requests) travel the
same way, as the kinds of :data:`OBJECT_KINDS`; an :class:`Objects` hook turns them
into parts and back, and decides which it accepts. Subclasses of the native types
travel as the type they extend (an OrderedDict as a dict, an IntEnum as an int).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import uuid
import zoneinfo
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import msgpack

if TYPE_CHECKING:
    from collections.abc import Callable


class SerializationError(ValueError):
    """A value cannot be encoded, or stored bytes cannot be decoded."""


class Objects(Protocol):
    """The caller's objects: what it stores of values no wire type covers."""

    def object_parts(self, value: Any) -> tuple[str, Any] | None:
        """``(kind, parts)`` of a value the caller stores, None for one it does not
        know; raises TypeError (or ValueError) for one it knows but will not store."""

    def rebuild_object(self, kind: str, parts: Any) -> Any:
        """The object back from its (decoded) parts; raises SerializationError to refuse."""


@dataclass(frozen=True, eq=False)  # hashed by identity: it may sit in a set
class StoredObject:
    """An object read without an :class:`Objects` hook (to show a payload, say)."""

    kind: str
    parts: Any


class Serializer(Protocol):
    name: str

    def dumps(self, data: dict[str, Any], objects: Objects | None = None) -> bytes: ...

    def loads(self, payload: bytes, objects: Objects | None = None) -> dict[str, Any]: ...


@dataclass(frozen=True)
class WireType:
    """One typed value: its JSON tag is ``__name__``, its msgpack ExtType ``code``."""

    name: str
    code: int
    cls: type | None  # None: chosen by value, not by class (big ints)
    to_parts: Callable[[Any], Any]
    from_parts: Callable[[Any], Any]

    @property
    def tag(self) -> str:
        return f"__{self.name}__"


def _parts(expected: type, parts: Any) -> Any:
    if type(parts) is not expected:
        raise ValueError(f"parts must be a {expected.__name__}, not {parts!r:.60}")
    return parts


def _clock_parts(value: dt.datetime | dt.time) -> Any:
    """ISO text, with its UTC offset if aware. A zoneinfo zone (kept by its key, beside
    the wall clock time) or a ``fold`` make it a list ``[text, zone, fold]``."""
    tz = value.tzinfo
    if isinstance(tz, zoneinfo.ZoneInfo) and tz.key is not None:
        return [value.replace(tzinfo=None).isoformat(), tz.key, value.fold]
    if tz is not None and value.utcoffset() is None:
        raise TypeError(f"cannot store {value!r}: its tzinfo gives no UTC offset")
    return [value.isoformat(), None, 1] if value.fold else value.isoformat()


def _clock_from(cls: type[dt.datetime] | type[dt.time], parts: Any) -> Any:
    if type(parts) is str:
        return cls.fromisoformat(parts)
    text, zone, fold = _parts(list, parts)
    value = cls.fromisoformat(_parts(str, text)).replace(fold=_parts(int, fold))
    return value if zone is None else value.replace(tzinfo=zoneinfo.ZoneInfo(_parts(str, zone)))


def _timedelta_from(parts: Any) -> dt.timedelta:
    days, seconds, microseconds = (_parts(int, part) for part in _parts(list, parts))
    return dt.timedelta(days=days, seconds=seconds, microseconds=microseconds)


#: Every typed value, defined once. Codes and names are the wire format: never reuse one.
WIRE_TYPES: tuple[WireType, ...] = (
    WireType("tuple", 1, tuple, list, lambda parts: tuple(_parts(list, parts))),
    WireType("set", 2, set, list, lambda parts: set(_parts(list, parts))),
    WireType("frozenset", 3, frozenset, list, lambda parts: frozenset(_parts(list, parts))),
    WireType("datetime", 4, dt.datetime, _clock_parts, partial(_clock_from, dt.datetime)),
    WireType("date", 5, dt.date, dt.date.isoformat,
             lambda parts: dt.date.fromisoformat(_parts(str, parts))),
    WireType("time", 6, dt.time, _clock_parts, partial(_clock_from, dt.time)),
    WireType("timedelta", 7, dt.timedelta,
             lambda value: [value.days, value.seconds, value.microseconds], _timedelta_from),
    WireType("decimal", 8, Decimal, str, lambda parts: Decimal(_parts(str, parts))),
    WireType("uuid", 9, uuid.UUID, str, lambda parts: uuid.UUID(_parts(str, parts))),
    # Ints msgpack cannot hold (beyond 64 bits), in hex: no digit limit, linear time.
    WireType("int", 10, None, lambda value: format(value, "x"),
             lambda parts: int(_parts(str, parts), 16)),
)
#: Kinds of objects an :class:`Objects` hook stores, by msgpack code (JSON: ``__kind__``).
OBJECT_KINDS: dict[str, int] = {"item": 16, "request": 17}

_INT = WIRE_TYPES[-1]
_INT_RANGE = range(-(2**63), 2**64)  # what msgpack stores natively
_BY_CLASS = {wire.cls: wire for wire in WIRE_TYPES if wire.cls is not None}
_BY_CODE = {wire.code: wire for wire in WIRE_TYPES}
_BY_TAG = {wire.tag: wire for wire in WIRE_TYPES}
_KIND_BY_CODE = {code: kind for kind, code in OBJECT_KINDS.items()}
_KIND_BY_TAG = {f"__{kind}__": kind for kind in OBJECT_KINDS}
_BYTES_TAG = "__bytes_b64__"
_MAP_TAG = "__map__"
_NATIVE_BASES = (str, bytes, int, float, dict, list)
_wire_of_class: dict[type, WireType | None] = {}


def _wire_type(cls: type) -> WireType | None:
    """The wire type of a class or of the nearest base class that has one."""
    try:
        return _wire_of_class[cls]
    except KeyError:
        wire = next((_BY_CLASS[base] for base in cls.__mro__ if base in _BY_CLASS), None)
        _wire_of_class[cls] = wire
        return wire


def _object_parts(objects: Objects | None, value: Any) -> tuple[str, Any] | None:
    stored: tuple[str, Any] | None
    if isinstance(value, StoredObject):
        stored = value.kind, value.parts
    else:
        stored = None if objects is None else objects.object_parts(value)
    if stored is not None and stored[0] not in OBJECT_KINDS:
        raise TypeError(f"unknown kind of object {stored[0]!r}")
    return stored


def _rebuild(objects: Objects | None, kind: str, parts: Any) -> Any:
    return StoredObject(kind, parts) if objects is None else objects.rebuild_object(kind, parts)


def _native_base(value: Any) -> Any:
    """A subclass of a native type as that type, or None."""
    base = next((base for base in _NATIVE_BASES if isinstance(value, base)), None)
    return None if base is None else base(value)


def _from_parts(wire: WireType, parts: Any) -> Any:
    try:
        return wire.from_parts(parts)
    except (TypeError, ValueError, ArithmeticError, zoneinfo.ZoneInfoNotFoundError) as exc:
        raise SerializationError(f"malformed {wire.name}: {exc}") from exc


# -- msgpack ------------------------------------------------------------------------


def _packb(value: Any, objects: Objects | None, default: Any = None) -> bytes:
    # strict_types: tuples and subclasses reach _ext_of instead of passing as lists.
    return msgpack.packb(  # type: ignore[no-any-return]
        value, use_bin_type=True, strict_types=True,
        default=default or partial(_ext_of, objects),
    )


def _ext(code: int, parts: Any, objects: Objects | None) -> msgpack.ExtType:
    return msgpack.ExtType(code, _packb(parts, objects))


def _ext_of(objects: Objects | None, value: Any) -> Any:
    """msgpack's ``default``: what it cannot pack as it is."""
    cls = type(value)
    wire = _wire_type(cls)
    if wire is not None:
        return _ext(wire.code, wire.to_parts(value), objects)
    stored = _object_parts(objects, value)
    if stored is not None:
        return _ext(OBJECT_KINDS[stored[0]], stored[1], objects)
    base = _native_base(value)  # an int is here when it is a subclass or too big
    if type(base) is int and base not in _INT_RANGE:
        return _ext(_INT.code, _INT.to_parts(base), objects)
    if base is None:
        raise TypeError(f"can not serialize {cls.__name__!r} object")
    return base


def _unpackb(payload: bytes, ext_hook: Callable[[int, bytes], Any]) -> Any:
    return msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=ext_hook)


def _value_of_ext(objects: Objects | None, code: int, data: bytes) -> Any:
    """msgpack's ``ext_hook``: the value of an ExtType."""
    parts = _unpackb(data, partial(_value_of_ext, objects))
    wire = _BY_CODE.get(code)
    if wire is not None:
        return _from_parts(wire, parts)
    kind = _KIND_BY_CODE.get(code)
    if kind is None:
        raise SerializationError(f"unknown msgpack extension type {code}")
    return _rebuild(objects, kind, parts)


class MsgpackSerializer:
    """Compact and fast; bytes and str stay distinct, typed values are ExtTypes."""

    name = "msgpack"

    def __init__(self) -> None:
        self._hooks = self._make_hooks(None)

    @staticmethod
    def _make_hooks(objects: Objects | None) -> tuple[Objects | None, Any, Any]:
        return objects, partial(_ext_of, objects), partial(_value_of_ext, objects)

    def _hooks_for(self, objects: Objects | None) -> tuple[Objects | None, Any, Any]:
        """msgpack's hooks for ``objects``, made once for the caller that uses this
        serializer (read once per call: another thread may swap them meanwhile)."""
        hooks = self._hooks
        if hooks[0] is not objects:
            hooks = self._hooks = self._make_hooks(objects)
        return hooks

    def dumps(self, data: dict[str, Any], objects: Objects | None = None) -> bytes:
        try:
            return _packb(data, objects, self._hooks_for(objects)[1])
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise SerializationError(str(exc)) from exc

    def loads(self, payload: bytes, objects: Objects | None = None) -> dict[str, Any]:
        try:
            data = _unpackb(payload, self._hooks_for(objects)[2])
        except SerializationError:
            raise
        except Exception as exc:  # msgpack raises several unrelated types
            raise SerializationError(f"not a msgpack payload: {exc}") from exc
        if not isinstance(data, dict):
            raise SerializationError(f"payload is a {type(data).__name__}, not a map")
        return data


# -- JSON ---------------------------------------------------------------------------


def _is_tag(key: str) -> bool:
    return len(key) > 4 and key.startswith("__") and key.endswith("__")


_JSON_SCALARS = frozenset((str, float, bool, type(None)))


def _to_json(value: Any, objects: Objects | None) -> Any:
    """The value in JSON's own types, typed values as tags."""
    cls = type(value)
    if cls in _JSON_SCALARS or (cls is int and value in _INT_RANGE):
        return value
    if cls is dict:
        return _json_object(value, objects)
    if cls is list:
        return [_to_json(item, objects) for item in value]
    if cls is bytes or cls is bytearray or cls is memoryview:
        return {_BYTES_TAG: base64.b64encode(value).decode("ascii")}
    if cls is int:
        return {_INT.tag: _INT.to_parts(value)}
    wire = _wire_type(cls)
    if wire is not None:
        return {wire.tag: _to_json(wire.to_parts(value), objects)}
    stored = _object_parts(objects, value)
    if stored is not None:
        return {f"__{stored[0]}__": _to_json(stored[1], objects)}
    base = _native_base(value)
    if base is None:
        raise TypeError(f"Object of type {cls.__name__} is not JSON serializable")
    return _to_json(base, objects)


def _json_object(value: dict[Any, Any], objects: Objects | None) -> dict[str, Any]:
    """A dict as a JSON object, or as ``__map__`` pairs when its keys are not plain."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        if type(key) is not str:  # then pairs: one pass over the dict in the usual case
            break
        cls = type(item)
        plain = cls in _JSON_SCALARS or (cls is int and item in _INT_RANGE)
        out[key] = item if plain else _to_json(item, objects)
    else:
        if len(out) != 1 or not _is_tag(next(iter(out))):
            return out
    return {_MAP_TAG: [[_to_json(k, objects), _to_json(v, objects)] for k, v in value.items()]}


def _from_json_object(objects: Objects | None, obj: dict[str, Any]) -> Any:
    """json's ``object_hook``: a tag's value, or the object as it is."""
    if len(obj) != 1:
        return obj
    ((key, parts),) = obj.items()
    if not _is_tag(key):
        return obj
    if key == _BYTES_TAG:
        if not isinstance(parts, str):
            raise SerializationError(f"{_BYTES_TAG} must hold a base64 string, not {parts!r}")
        return base64.b64decode(parts, validate=True)
    if key == _MAP_TAG:
        if not isinstance(parts, list) or not all(
            isinstance(pair, list) and len(pair) == 2 for pair in parts
        ):
            raise SerializationError(f"{_MAP_TAG} must hold [key, value] pairs")
        return dict(parts)
    wire = _BY_TAG.get(key)
    if wire is not None:
        return _from_parts(wire, parts)
    kind = _KIND_BY_TAG.get(key)
    if kind is None:
        raise SerializationError(f"unknown tag {key!r}")
    return _rebuild(objects, kind, parts)


class JsonSerializer:
    """Readable in redis-cli; bytes and typed values are tagged objects."""

    name = "json"

    def __init__(self) -> None:
        self._hook: tuple[Objects | None, Any] = (None, partial(_from_json_object, None))

    def dumps(self, data: dict[str, Any], objects: Objects | None = None) -> bytes:
        try:
            return json.dumps(_to_json(data, objects), separators=(",", ":")).encode()
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise SerializationError(str(exc)) from exc

    def loads(self, payload: bytes, objects: Objects | None = None) -> dict[str, Any]:
        hook = self._hook  # read once: another thread may swap it meanwhile
        if hook[0] is not objects:  # made once for the caller using this serializer
            hook = self._hook = (objects, partial(_from_json_object, objects))
        try:
            data = json.loads(payload, object_hook=hook[1])
        except SerializationError:
            raise
        except (ValueError, TypeError, RecursionError) as exc:  # binascii.Error: ValueError
            raise SerializationError(f"not a JSON payload: {exc}") from exc
        if not isinstance(data, dict):
            raise SerializationError(f"payload is a {type(data).__name__}, not an object")
        return data


_READERS = (JsonSerializer(), MsgpackSerializer())


def loads_any(payload: bytes, objects: Objects | None = None) -> dict[str, Any]:
    """Decode either format: a JSON object starts with ``{``, which no msgpack map does.

    So a crawl survives a change of ``REDISSPINE_SERIALIZER`` and pushes made in the
    other format.
    """
    return _READERS[payload[:1] != b"{"].loads(payload, objects)


def get_serializer(name: str) -> Serializer:
    if name == "msgpack":
        return MsgpackSerializer()
    if name == "json":
        return JsonSerializer()
    raise SerializationError(f"unknown serializer {name!r}; use 'msgpack' or 'json'")
