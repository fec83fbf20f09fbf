"""The typed values of both serializers: each round trip exact, tags collision-proof,
malformed parts refused, and everything the encoder accepts decodes."""

from __future__ import annotations

import collections
import datetime as dt
import enum
import json
import math
import re
import uuid
import zoneinfo
from decimal import Decimal
from pathlib import Path
from typing import Any, NamedTuple

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_redisspine.serialization import (
    OBJECT_KINDS,
    WIRE_TYPES,
    JsonSerializer,
    MsgpackSerializer,
    SerializationError,
    Serializer,
    StoredObject,
    get_serializer,
    loads_any,
)
from tests.unit.exact import same

DOCS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "requests-and-dedup.md"
PARIS = zoneinfo.ZoneInfo("Europe/Paris")
ODD_OFFSET = dt.timezone(dt.timedelta(hours=-3, minutes=-30, seconds=-15, microseconds=-7))


@pytest.fixture(params=["msgpack", "json"])
def serializer(request: pytest.FixtureRequest) -> Serializer:
    return get_serializer(request.param)


def round_trip(serializer: Serializer, value: Any) -> Any:
    return serializer.loads(serializer.dumps({"v": value}))["v"]


class Point(NamedTuple):
    x: int
    y: int


class Colour(enum.IntEnum):
    RED = 1


class Text(str):
    pass


TYPED = {
    "tuple": (1, "a", (2.5, None), [b"x"]),
    "empty tuple": (),
    "set": {1, "a", (2, 3), frozenset({4})},
    "empty set": set(),
    "frozenset": frozenset({b"x", 1.5, None}),
    "naive datetime": dt.datetime(2024, 2, 29, 23, 59, 58, 999999),
    "datetime min": dt.datetime.min,
    "datetime max": dt.datetime.max,
    "utc datetime": dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone.utc),
    "odd offset datetime": dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=ODD_OFFSET),
    "zoneinfo datetime": dt.datetime(2024, 7, 1, 9, 30, tzinfo=PARIS),
    "ambiguous second pass": dt.datetime(2021, 10, 31, 2, 30, fold=1, tzinfo=PARIS),
    "imaginary wall time": dt.datetime(2021, 3, 28, 2, 30, tzinfo=PARIS),
    "naive fold": dt.datetime(2021, 10, 31, 2, 30, fold=1),
    "date": dt.date(1, 1, 1),
    "time": dt.time(23, 59, 59, 999999),
    "aware time": dt.time(1, 2, 3, 4, tzinfo=ODD_OFFSET),
    "time fold": dt.time(1, fold=1),
    "zoneinfo time": dt.time(12, tzinfo=PARIS),  # no offset without a date: kept by key
    "utc zoneinfo time": dt.time(0, tzinfo=zoneinfo.ZoneInfo("UTC")),
    "timedelta": dt.timedelta(days=-3, seconds=5, microseconds=7),
    "timedelta max": dt.timedelta.max,
    "decimal": Decimal("-1234567890.000000000001"),
    "decimal negative zero": Decimal("-0.00"),
    "decimal exponent": Decimal("1E+999999"),
    "decimal nan": Decimal("NaN"),
    "decimal snan": Decimal("-sNaN12"),
    "decimal infinity": Decimal("-Infinity"),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "int just past 64 bits": 2**64,
    "int largest unsigned 64": 2**64 - 1,
    "int below signed 64": -(2**63) - 1,
    "int smallest signed 64": -(2**63),
    "int huge": -(2**4000) + 12345,
    "int past the str digit limit": 10**5000,
    "bytes": b"\x00\xff",
    "nested": {"a": [(1, {dt.date(2020, 1, 1)}), {"b": frozenset({(uuid.UUID(int=1), 2)})}]},
    "int keys": {1: "one", -(2**70): "big", 2.5: "float", None: "none", False: "false"},
    "tuple keys": {(1, "a"): [1], (): "empty", frozenset({1}): {2: 3}},
    "typed keys": {dt.date(2020, 1, 2): 1, uuid.UUID(int=5): 2, Decimal("1.0"): 3, b"k": 4},
}


@pytest.mark.parametrize("name", sorted(TYPED))
def test_typed_round_trip(serializer: Serializer, name: str) -> None:
    value = TYPED[name]
    assert same(round_trip(serializer, value), value)


@pytest.mark.parametrize("name", sorted(TYPED))
def test_typed_values_decode_in_either_format(name: str) -> None:
    for serializer in (MsgpackSerializer(), JsonSerializer()):
        assert same(loads_any(serializer.dumps({"v": TYPED[name]}))["v"], TYPED[name])


def test_zoneinfo_is_kept_by_its_key(serializer: Serializer) -> None:
    copy = round_trip(serializer, TYPED["ambiguous second pass"])
    assert copy.tzinfo is PARIS
    assert copy.utcoffset() == dt.timedelta(hours=1)  # the second 02:30 of that night


def test_other_tzinfo_arrives_as_its_fixed_offset(serializer: Serializer) -> None:
    class Plus2(dt.tzinfo):
        def utcoffset(self, _: dt.datetime | None) -> dt.timedelta:
            return dt.timedelta(hours=2)

        def dst(self, _: dt.datetime | None) -> dt.timedelta:
            return dt.timedelta(0)

    value = dt.datetime(2024, 1, 1, 10, tzinfo=Plus2())
    copy = round_trip(serializer, value)
    assert copy == value
    assert copy.tzinfo == dt.timezone(dt.timedelta(hours=2))


def test_tzinfo_without_an_offset_is_refused(serializer: Serializer) -> None:
    class Nowhere(dt.tzinfo):
        def utcoffset(self, _: dt.datetime | None) -> None:
            return None

    for value in (dt.time(12, tzinfo=Nowhere()), dt.datetime(2024, 1, 1, tzinfo=Nowhere())):
        with pytest.raises(SerializationError, match="no UTC offset"):
            serializer.dumps({"v": value})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (collections.OrderedDict(a=1), {"a": 1}),
        (collections.defaultdict(list, {"a": [1]}), {"a": [1]}),
        (collections.Counter("aa"), {"a": 2}),
        (Colour.RED, 1),
        (Text("x"), "x"),
        (Point(1, 2), (1, 2)),
    ],
    ids=["OrderedDict", "defaultdict", "Counter", "IntEnum", "str-subclass", "namedtuple"],
)
def test_subclasses_travel_as_the_type_they_extend(
    serializer: Serializer, value: Any, expected: Any
) -> None:
    assert same(round_trip(serializer, value), expected)


def test_big_int_subclass(serializer: Serializer) -> None:
    class Big(int):
        pass

    assert same(round_trip(serializer, Big(2**80)), 2**80)


# -- JSON tags ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "user_dict",
    [
        {"__bytes_b64__": "aGk="},
        {"__tuple__": [1, 2]},
        {"__map__": [["a", 1]]},
        {"__datetime__": "2024-01-01T00:00:00"},
        {"__item__": ["os.system", {}]},
        {"__request__": {"url": "http://example.com/"}},
        {"__unknown__": 1},
        {"__int__": "ff"},
        {"__x__": {"__y__": {"__bytes_b64__": 5}}},
    ],
)
def test_user_dicts_that_look_like_tags_come_back_as_dicts(
    serializer: Serializer, user_dict: dict[str, Any]
) -> None:
    assert same(round_trip(serializer, user_dict), user_dict)
    assert same(serializer.loads(serializer.dumps(user_dict)), user_dict)  # top level too


@pytest.mark.parametrize(
    "user_dict",
    [{"__tuple__": [1], "other": 2}, {"____": 1}, {"__": 1}, {"_x_": 1}, {"__x": 1}],
)
def test_dicts_that_are_not_tags_stay_plain_json_objects(user_dict: dict[str, Any]) -> None:
    payload = JsonSerializer().dumps({"v": user_dict})
    assert json.loads(payload) == {"v": user_dict}
    assert same(JsonSerializer().loads(payload)["v"], user_dict)


def test_json_tags_are_readable() -> None:
    payload = JsonSerializer().dumps(
        {"when": dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc), "t": (1, 2),
         "n": {1: "a"}}
    )
    assert json.loads(payload) == {
        "when": {"__datetime__": "2024-01-02T03:04:05+00:00"},
        "t": {"__tuple__": [1, 2]},
        "n": {"__map__": [[1, "a"]]},
    }


@pytest.mark.parametrize(
    "payload",
    [
        b'{"v": {"__nope__": 1}}',
        b'{"v": {"__tuple__": "abc"}}',
        b'{"v": {"__set__": [[1]]}}',
        b'{"v": {"__datetime__": "yesterday"}}',
        b'{"v": {"__datetime__": ["2024-01-01T00:00:00", "Not/AZone", 0]}}',
        b'{"v": {"__datetime__": ["2024-01-01T00:00:00", "../../etc/passwd", 0]}}',
        b'{"v": {"__datetime__": ["2024-01-01T00:00:00", null]}}',
        b'{"v": {"__datetime__": 5}}',
        b'{"v": {"__date__": "2024-13-01"}}',
        b'{"v": {"__time__": ["01:00", null, "1"]}}',
        b'{"v": {"__timedelta__": [1, 2]}}',
        b'{"v": {"__timedelta__": [1e9, 0, 0]}}',
        b'{"v": {"__timedelta__": [999999999999, 0, 0]}}',
        b'{"v": {"__decimal__": "1.2.3"}}',
        b'{"v": {"__decimal__": 1.5}}',
        b'{"v": {"__uuid__": "not-a-uuid"}}',
        b'{"v": {"__int__": "xyz"}}',
        b'{"v": {"__int__": 12}}',
        b'{"v": {"__map__": [[1]]}}',
        b'{"v": {"__map__": [[[1], 2]]}}',
        b'{"v": {"__map__": {"a": 1}}}',
        b'{"v": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    ],
)
def test_malformed_json_tags_are_serialization_errors(payload: bytes) -> None:
    with pytest.raises(SerializationError):
        JsonSerializer().loads(payload)


def _ext(code: int, parts: Any) -> bytes:
    return msgpack.packb({"v": msgpack.ExtType(code, msgpack.packb(parts))})


@pytest.mark.parametrize(
    "payload",
    [
        _ext(99, 1),
        _ext(1, "abc"),
        _ext(4, "yesterday"),
        _ext(4, ["2024-01-01T00:00:00", "Not/AZone", 0]),
        _ext(7, [1, 2]),
        _ext(8, "1.2.3"),
        _ext(9, b"\x00" * 16),
        _ext(10, "xyz"),
        msgpack.packb({"v": msgpack.ExtType(1, b"\xc1")}),
        msgpack.packb({"v": msgpack.ExtType(1, msgpack.packb([1]) + b"\x01")}),
    ],
)
def test_malformed_msgpack_extensions_are_serialization_errors(payload: bytes) -> None:
    with pytest.raises(SerializationError):
        MsgpackSerializer().loads(payload)


def test_plain_values_are_untyped_on_the_wire() -> None:
    # A plain payload is what msgpack and json make of it alone: no growth, no tags.
    data = {"url": "http://example.com/", "meta": {"depth": 1, "l": [1.5, None, True]}}
    assert MsgpackSerializer().dumps(data) == msgpack.packb(data, use_bin_type=True)
    assert JsonSerializer().dumps(data) == json.dumps(data, separators=(",", ":")).encode()


# -- the format is pinned, documented, and open to the caller's objects --------------


def test_wire_format_is_pinned() -> None:
    # Codes and tags are what stored payloads hold: changing one loses a crawl's data.
    assert {wire.name: wire.code for wire in WIRE_TYPES} == {
        "tuple": 1, "set": 2, "frozenset": 3, "datetime": 4, "date": 5, "time": 6,
        "timedelta": 7, "decimal": 8, "uuid": 9, "int": 10,
    }
    assert OBJECT_KINDS == {"item": 16, "request": 17}


def test_docs_table_gives_every_tag_and_code() -> None:
    text = DOCS_PAGE.read_text("utf-8")
    section = text[text.index("## Requests travel as data"):]
    section = section[: section.index("\n## ", 1)]
    rows = {  # JSON tag -> msgpack code, from the rows of the section's table
        cells[-2].strip("` "): cells[-1].strip()
        for line in section.splitlines()
        if line.startswith("| ") and len(cells := line.strip(" |").split(" | ")) >= 3
    }
    expected = {wire.tag: str(wire.code) for wire in WIRE_TYPES}
    expected.update({f"__{kind}__": str(code) for kind, code in OBJECT_KINDS.items()})
    assert {tag: rows.get(tag) for tag in expected} == expected
    assert "{\"__bytes_b64__\": " in section
    assert "{\"__map__\": " in section


class Boxes:
    """A toy Objects hook: a Box travels as its content."""

    def object_parts(self, value: Any) -> tuple[str, Any] | None:
        return ("item", [value.content]) if isinstance(value, Box) else None

    def rebuild_object(self, kind: str, parts: Any) -> Any:
        assert kind == "item"
        return Box(parts[0])


class Box:
    def __init__(self, content: Any) -> None:
        self.content = content


def test_objects_hook(serializer: Serializer) -> None:
    hook = Boxes()
    value = {"b": Box((1, Box({2: dt.date(2020, 1, 1)})))}
    copy = serializer.loads(serializer.dumps(value, hook), hook)["b"]
    assert isinstance(copy, Box)
    assert copy.content[0] == 1
    assert isinstance(copy.content[1], Box)
    assert same(copy.content[1].content, {2: dt.date(2020, 1, 1)})
    with pytest.raises(SerializationError, match="Box"):
        serializer.dumps(value)  # without the hook, a Box is an object like any other


def test_objects_read_without_a_hook_are_stored_objects(serializer: Serializer) -> None:
    hook = Boxes()
    payload = serializer.dumps({"b": {Box(1)}}, hook)
    data = serializer.loads(payload)
    (stored,) = data["b"]
    assert stored in data["b"]  # hashed by identity, since its parts may be a list
    assert isinstance(stored, StoredObject)
    assert (stored.kind, stored.parts) == ("item", [1])
    assert serializer.dumps(data) == payload  # and written back as they were


# -- the property: what encodes, decodes, exactly --------------------------------------

_scalars = (
    st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63 - 5)
    | st.integers(max_value=-(2**63) + 5) | st.floats() | st.text() | st.binary()
    | st.decimals(allow_nan=False) | st.uuids() | st.dates() | st.timedeltas()
    | st.datetimes(timezones=st.none() | st.timezones(), allow_imaginary=True)
    | st.times(timezones=st.none() | st.timezones())
)
# signalling NaNs cannot be hashed, so they are leaves only
_nans = st.sampled_from([Decimal("NaN"), Decimal("-sNaN7"), math.nan])
_unsupported = st.sampled_from([object(), print, type, Box(1), Path("/"), re.compile("x")])
_hashables = st.recursive(
    _scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
_values = st.recursive(
    _scalars | _nans | _unsupported,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=8) | st.sampled_from(["__tuple__", "__map__"]),
                          inner, max_size=4)
        | st.dictionaries(_hashables, inner, max_size=3)
        | st.sets(_hashables, max_size=3)
        | st.frozensets(_hashables, max_size=3)
    ),
    max_leaves=12,
)


@settings(max_examples=400, database=None, deadline=None)
@given(value=_values, name=st.sampled_from(["msgpack", "json"]))
def test_what_encodes_decodes_exactly(value: Any, name: str) -> None:
    serializer = get_serializer(name)
    try:
        payload = serializer.dumps({"v": value})
    except SerializationError:
        return  # refused when written: never stored, never a surprise for a reader
    assert same(serializer.loads(payload)["v"], value)
    assert same(loads_any(payload)["v"], value)


def test_an_object_of_an_unknown_kind_is_refused(serializer: Serializer) -> None:
    with pytest.raises(SerializationError, match="unknown kind"):
        serializer.dumps({"v": StoredObject("pickle", b"")})


def test_hooks_of_two_callers_do_not_mix(serializer: Serializer) -> None:
    # One serializer, two callers in turn (two codecs reading through loads_any).
    class Doubles(Boxes):
        def rebuild_object(self, kind: str, parts: Any) -> Any:
            return ("doubled", parts[0] * 2)

    payload = serializer.dumps({"b": Box(2)}, Boxes())
    for _ in range(2):
        assert isinstance(serializer.loads(payload, Boxes())["b"], Box)
        assert serializer.loads(payload, Doubles())["b"] == ("doubled", 4)
        assert isinstance(serializer.loads(payload)["b"], StoredObject)
