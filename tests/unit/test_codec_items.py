"""Items and requests inside meta and cb_kwargs: round trips, the item allow-list, and
what a payload from a shared Redis can and cannot make a worker build."""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import attr
import pytest
import scrapy
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import FormRequest, Request, Spider
from scrapy.crawler import Crawler
from scrapy.http.request import NO_CALLBACK
from scrapy.settings import Settings

import scrapy_redisspine._items as items_module
from scrapy_redisspine._items import ItemClasses
from scrapy_redisspine.cli_output import describe_payload
from scrapy_redisspine.compact import loads_request
from scrapy_redisspine.request_codec import RequestCodec, RequestDecodeError, RequestEncodeError
from scrapy_redisspine.serialization import Serializer, StoredObject, get_serializer
from tests.unit.exact import same

if TYPE_CHECKING:
    from pathlib import Path

HERE = __name__  # tests.unit.test_codec_items: where the item classes below live


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()
    seller = scrapy.Field()
    offers = scrapy.Field()
    next_page = scrapy.Field()


@dataclasses.dataclass(frozen=True)
class Seller:
    name: str
    rating: Decimal = Decimal("0")
    seen: int = dataclasses.field(init=False, default=0)  # kept, though no argument


@attr.s(auto_attribs=True)
class Offer:
    _price: float  # attrs' constructor argument is ``price``
    when: dt.datetime | None = None
    tag: str = attr.ib(init=False, default="new")


@attr.s(auto_attribs=True, frozen=True, slots=True)
class Frozen:
    value: Any = None


@dataclasses.dataclass
class Positive:
    value: int

    def __post_init__(self) -> None:
        if self.value <= 0:
            raise ValueError("must be positive")


@attr.s(init=False)
class NoInit:
    x = attr.ib(default=1)


@dataclasses.dataclass(init=False)
class OwnInit:
    x: int

    def __init__(self) -> None:
        self.x = 1


class OwnItemInit(scrapy.Item):
    x = scrapy.Field()

    def __init__(self, value: int) -> None:
        super().__init__(x=value)


class NotAnItem:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


def helper() -> None:
    pass


class ItemSpider(Spider):
    name = "items"

    def parse(self, response: Any) -> None:
        pass

    def parse_item(self, response: Any, **kwargs: Any) -> None:
        pass

    def _parse_detail(self, response: Any) -> None:
        pass


@pytest.fixture
def spider() -> ItemSpider:
    return ItemSpider()


@pytest.fixture(params=["msgpack", "json"])
def serializer(request: pytest.FixtureRequest) -> Serializer:
    return get_serializer(request.param)


@pytest.fixture
def codec(spider: ItemSpider, serializer: Serializer) -> RequestCodec:
    return RequestCodec(spider, serializer, items=ItemClasses([HERE]))


def round_trip(codec: RequestCodec, request: Request) -> Request:
    copy = codec.decode(codec.encode(request))
    assert same(copy, request)
    return copy


def forged(codec: RequestCodec, kind: str, parts: Any) -> bytes:
    """A payload with ``meta['x']`` of any kind and parts, as anybody with write access
    to the Redis could make it (a StoredObject is written as it is, unchecked)."""
    data = {"url": "http://example.com/", "meta": {"x": StoredObject(kind, parts)}}
    return codec.serializer.dumps(data)


def item_payload(codec: RequestCodec, path: Any, fields: Any) -> bytes:
    return forged(codec, "item", [path, fields])


class TestItemRoundTrips:
    def test_scrapy_item(self, codec: RequestCodec) -> None:
        item = Product(name="lamp", price=Decimal("9.90"))
        copy = round_trip(codec, Request("http://example.com/", meta={"item": item}))
        assert type(copy.meta["item"]) is Product
        assert "seller" not in copy.meta["item"]  # unset fields stay unset

    def test_dataclass_with_a_field_that_is_no_argument(self, codec: RequestCodec) -> None:
        seller = Seller("bob", Decimal("4.5"))
        object.__setattr__(seller, "seen", 3)
        copy = round_trip(codec, Request("http://example.com/", cb_kwargs={"seller": seller}))
        assert copy.cb_kwargs["seller"].seen == 3

    def test_attrs_with_private_attribute_and_no_argument_field(
        self, codec: RequestCodec
    ) -> None:
        offer = Offer(1.5, dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc))
        offer.tag = "changed"
        copy = round_trip(codec, Request("http://example.com/", meta={"offer": offer}))
        assert copy.meta["offer"]._price == 1.5
        assert copy.meta["offer"].tag == "changed"

    def test_frozen_slotted_attrs(self, codec: RequestCodec) -> None:
        round_trip(codec, Request("http://example.com/", meta={"f": Frozen((1, {2}))}))

    def test_nested_items_with_requests_in_them(
        self, codec: RequestCodec, spider: ItemSpider
    ) -> None:
        next_page = FormRequest(
            "http://example.com/more", formdata={"q": "x"}, callback=spider._parse_detail,
            meta={"seller": Seller("ann")},
        )
        item = Product(
            name="lamp", seller=Seller("bob"), offers=[Offer(1.0), Offer(2.0, None)],
            next_page=next_page,
        )
        copy = round_trip(codec, Request("http://example.com/", meta={"item": item}))
        page = copy.meta["item"]["next_page"]
        assert type(page) is FormRequest
        assert page.callback == spider._parse_detail
        assert type(page.meta["seller"]) is Seller

    def test_items_in_sets_and_as_keys(self, codec: RequestCodec) -> None:
        meta = {"sellers": {Seller("a"), Seller("b")}, "by": {Frozen(1): "one"}}
        round_trip(codec, Request("http://example.com/", meta=meta))


class TestNestedRequests:
    def test_chain_of_requests_as_in_scrapys_test_referer_header(
        self, codec: RequestCodec
    ) -> None:
        req0 = Request("http://example.com/echo?headers=1&body=0", dont_filter=True)
        req1 = req0.replace()
        req2 = req0.replace(headers={"Referer": None})
        req3 = req0.replace(headers={"Referer": "http://example.com"})
        req0.meta["next"] = req1
        req1.meta["next"] = req2
        req2.meta["next"] = req3
        copy = round_trip(codec, req0)
        third = copy.meta["next"].meta["next"]
        assert third.headers.getlist("Referer") == []
        assert third.meta["next"].headers["Referer"] == b"http://example.com"

    def test_nested_request_keeps_its_callbacks(
        self, codec: RequestCodec, spider: ItemSpider
    ) -> None:
        inner = Request("http://example.com/b", callback=spider.parse_item, errback=spider.parse)
        copy = round_trip(codec, Request("http://example.com/a", meta={"next": inner}))
        assert copy.meta["next"].callback == spider.parse_item
        no_callback = Request("http://example.com/c", callback=NO_CALLBACK)
        copy = round_trip(codec, Request("http://example.com/a", meta={"n": no_callback}))
        assert copy.meta["n"].callback is NO_CALLBACK

    def test_nested_plain_request_leaves_its_defaults_out(self, codec: RequestCodec) -> None:
        payload = codec.encode(Request("http://example.com/a",
                                       meta={"next": Request("http://example.com/b")}))
        nested = loads_request(payload)["meta"]["next"]
        assert (nested.kind, nested.parts) == ("request", {"url": "http://example.com/b"})

    def test_nested_request_with_a_lambda_callback_is_refused_when_stored(
        self, codec: RequestCodec
    ) -> None:
        inner = Request("http://example.com/b", callback=lambda response: None)
        with pytest.raises(RequestEncodeError, match=r"meta\['next'\].*only spider methods"):
            codec.encode(Request("http://example.com/a", meta={"next": inner}))

    def test_nested_request_of_a_class_not_allowed(
        self, spider: ItemSpider, serializer: Serializer
    ) -> None:
        class Custom(Request):
            pass

        with pytest.raises(RequestEncodeError, match="REDISSPINE_ALLOWED_REQUEST_CLASSES"):
            RequestCodec(spider, serializer).encode(
                Request("http://example.com/", meta={"r": Custom("http://example.com/b")})
            )

    @pytest.mark.parametrize(
        "parts",
        [
            {"url": "http://x.com/", "_class": "os.system"},
            {"url": "http://x.com/", "callback": "_set_crawler"},
            {"url": "http://x.com/", "errback": "no_such_method"},
            {"url": 5},
            {"url": "http://x.com/", "headers": 5},
            ["http://x.com/"],
            None,
        ],
    )
    def test_forged_nested_request_is_a_decode_error(
        self, codec: RequestCodec, parts: Any
    ) -> None:
        with pytest.raises(RequestDecodeError, match="request"):
            codec.decode(forged(codec, "request", parts))


class TestItemAllowList:
    def test_encode_refuses_a_class_that_is_not_allowed(
        self, spider: ItemSpider, serializer: Serializer
    ) -> None:
        codec = RequestCodec(spider, serializer, items=ItemClasses())
        with pytest.raises(RequestEncodeError) as info:
            codec.encode(Request("http://example.com/", meta={"page": {"item": Seller("a")}}))
        message = str(info.value)
        assert f"{HERE}.Seller is not allowed" in message
        assert "REDISSPINE_ALLOWED_ITEM_CLASSES" in message
        assert "meta['page']['item']" in message

    def test_decode_refuses_a_class_that_is_not_allowed(
        self, codec: RequestCodec, spider: ItemSpider, serializer: Serializer
    ) -> None:
        payload = codec.encode(Request("http://example.com/", meta={"s": Seller("a")}))
        strict = RequestCodec(spider, serializer, items=ItemClasses())
        with pytest.raises(RequestDecodeError, match=rf"{HERE}.Seller.*not allowed"):
            strict.decode(payload)

    @pytest.mark.parametrize(
        "path",
        [
            "os.system", "subprocess.Popen", "builtins.eval", "collections.OrderedDict",
            "scrapy.Item", "scrapy.http.request.Request", 5, None, ["os", "system"],
        ],
    )
    def test_paths_outside_the_list_are_refused_without_importing(
        self, codec: RequestCodec, monkeypatch: pytest.MonkeyPatch, path: Any
    ) -> None:
        imported: list[str] = []
        monkeypatch.setattr(items_module.importlib, "import_module", imported.append)
        with pytest.raises(RequestDecodeError, match="item"):
            codec.decode(item_payload(codec, path, {}))
        assert imported == []

    @pytest.mark.parametrize(
        ("name", "reason"),
        [
            ("NotAnItem", "not an item class"),
            ("helper", "not a class defined in"),
            ("Decimal", "not a class defined in"),  # imported here, defined elsewhere
            ("attr", "not a class defined in"),  # a module
            ("Product.fields", "module is not loaded"),  # no module of that name
            ("ItemSpider", "not an item class"),
            ("nothing_here", "not a class defined in"),
            ("__builtins__", "not a class defined in"),
        ],
    )
    def test_allowed_module_but_not_an_item_class(
        self, codec: RequestCodec, name: str, reason: str
    ) -> None:
        with pytest.raises(RequestDecodeError, match=reason) as info:
            codec.decode(item_payload(codec, f"{HERE}.{name}", {}))
        assert f"{HERE}.{name}" in str(info.value)

    def test_only_declared_fields(self, codec: RequestCodec) -> None:
        for cls, fields in ((Product, {"name": 1, "evil": 2}), (Seller, {"__class__": 1}),
                            (Offer, {"price": 1.0})):  # attrs' argument, not its field
            with pytest.raises(RequestDecodeError, match="has no field"):
                codec.decode(item_payload(codec, f"{HERE}.{cls.__name__}", fields))

    def test_the_items_own_checks_give_a_decode_error(self, codec: RequestCodec) -> None:
        with pytest.raises(RequestDecodeError, match=r"cannot rebuild item.*must be positive"):
            codec.decode(item_payload(codec, f"{HERE}.Positive", {"value": -1}))
        with pytest.raises(RequestDecodeError, match="cannot rebuild item"):
            codec.decode(item_payload(codec, f"{HERE}.Seller", {}))  # name is required

    @pytest.mark.parametrize(
        "parts", [[], [f"{HERE}.Seller"], [f"{HERE}.Seller", [], 1], "x", [f"{HERE}.Seller", []]]
    )
    def test_malformed_item(self, codec: RequestCodec, parts: Any) -> None:
        with pytest.raises(RequestDecodeError, match="malformed item"):
            codec.decode(forged(codec, "item", parts))

    def test_class_defined_in_a_function_is_refused_when_stored(
        self, codec: RequestCodec
    ) -> None:
        @dataclasses.dataclass
        class Local:
            x: int

        with pytest.raises(RequestEncodeError, match="not defined at the top level"):
            codec.encode(Request("http://example.com/", meta={"x": Local(1)}))

    @pytest.mark.parametrize("item", [NoInit(), OwnInit(), OwnItemInit(1)])
    def test_item_whose_constructor_does_not_take_its_fields_is_refused_when_stored(
        self, codec: RequestCodec, item: Any
    ) -> None:
        # Every worker would fail to rebuild it: refused where it is queued instead.
        with pytest.raises(RequestEncodeError, match="cannot be rebuilt from its fields"):
            codec.encode(Request("http://example.com/", meta={"x": item}))

    def test_pydantic_like_and_other_objects_are_refused_when_stored(
        self, codec: RequestCodec
    ) -> None:
        with pytest.raises(RequestEncodeError, match=r"meta\['x'\] holds a NotAnItem"):
            codec.encode(Request("http://example.com/", meta={"x": NotAnItem()}))


class TestModulesAreNotImportedForAPayload:
    @pytest.fixture
    def package(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
        """A package whose item module leaves a mark when imported."""
        root = tmp_path / "sideeffects_pkg"
        root.mkdir()
        (root / "__init__.py").write_text("")
        (root / "items.py").write_text(
            "import dataclasses, pathlib\n"
            f"pathlib.Path({str(tmp_path / 'imported')!r}).touch()\n"
            "@dataclasses.dataclass\nclass Thing:\n    x: int\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        yield tmp_path
        for name in ("sideeffects_pkg", "sideeffects_pkg.items"):
            sys.modules.pop(name, None)

    def test_a_prefix_never_imports_a_module(
        self, package: Path, spider: ItemSpider, serializer: Serializer
    ) -> None:
        codec = RequestCodec(spider, serializer, items=ItemClasses(["sideeffects_pkg"]))
        payload = item_payload(codec, "sideeffects_pkg.items.Thing", {"x": 1})
        with pytest.raises(RequestDecodeError, match="module is not loaded"):
            codec.decode(payload)
        assert not (package / "imported").exists()
        assert "sideeffects_pkg.items" not in sys.modules

    def test_a_prefix_covers_a_module_already_loaded(
        self, package: Path, spider: ItemSpider, serializer: Serializer
    ) -> None:
        import sideeffects_pkg.items  # type: ignore[import-not-found]

        codec = RequestCodec(spider, serializer, items=ItemClasses(["sideeffects_pkg"]))
        copy = codec.decode(item_payload(codec, "sideeffects_pkg.items.Thing", {"x": 1}))
        assert copy.meta["x"] == sideeffects_pkg.items.Thing(1)

    def test_a_class_named_in_full_is_imported(
        self, package: Path, spider: ItemSpider, serializer: Serializer
    ) -> None:
        codec = RequestCodec(
            spider, serializer, items=ItemClasses(["sideeffects_pkg.items.Thing"])
        )
        copy = codec.decode(item_payload(codec, "sideeffects_pkg.items.Thing", {"x": 2}))
        assert (package / "imported").exists()
        assert copy.meta["x"].x == 2
        # the class only: another name in that module is still refused
        with pytest.raises(RequestDecodeError, match="not allowed"):
            codec.decode(item_payload(codec, "sideeffects_pkg.items.dataclasses", {}))


class TestDefaultAllowList:
    def _spider(self, settings: dict[str, Any]) -> ItemSpider:
        crawler = Crawler(ItemSpider, Settings(settings))
        return ItemSpider.from_crawler(crawler)

    def test_project_packages_and_the_setting(self) -> None:
        spider = self._spider({
            "SPIDER_MODULES": ["myproject.spiders", "other.deep.spiders"],
            "REDISSPINE_ALLOWED_ITEM_CLASSES": ["shared.items.Product", "vendor"],
        })
        items = RequestCodec(spider, get_serializer("msgpack")).items
        for path in ("myproject.items.Product", "other.x.Y", "shared.items.Product",
                     "vendor.a.B", f"{HERE}.Seller"):  # the spider's own package too
            assert items.covers(path), path
        for path in ("myprojectx.items.P", "shared.items.Other", "shared.Product", "os.system",
                     "vendorx.A", "scrapy.Item"):
            assert not items.covers(path), path

    def test_without_a_crawler_only_the_spiders_package(self) -> None:
        items = RequestCodec(ItemSpider(), get_serializer("msgpack")).items
        assert items.covers(f"{HERE}.Seller")
        assert not items.covers("myproject.items.Product")
        assert not RequestCodec(None, get_serializer("msgpack")).items.covers(f"{HERE}.Seller")

    def test_round_trip_with_the_default(self) -> None:
        codec = RequestCodec(self._spider({}), get_serializer("json"))
        round_trip(codec, Request("http://example.com/", meta={"s": Seller("a")}))


class TestEncodeErrorPaths:
    @pytest.mark.parametrize(
        ("meta", "path", "type_name"),
        [
            ({"a": [{"b": (1, object())}]}, "meta['a'][0]['b'][1]", "object"),
            ({"a": {1, print}}, "meta['a'] (element <built-in function print>)",
             "builtin_function_or_method"),
            ({"a": {object(): 1}}, "meta['a'] (key <object object", "object"),
            ({"item": Product(name=lambda: 1)}, "meta['item']['name']", "function"),
            ({"s": Seller(name=object())}, "meta['s'].name", "object"),
            ({"r": Request("http://example.com/b", meta={"f": open})},
             "meta['r'].meta['f']", "builtin_function_or_method"),
        ],
    )
    def test_path_to_what_cannot_be_stored(
        self, codec: RequestCodec, meta: dict[str, Any], path: str, type_name: str
    ) -> None:
        with pytest.raises(RequestEncodeError) as info:
            codec.encode(Request("http://example.com/", meta=meta))
        message = str(info.value)
        assert f"{path}" in message
        assert f"holds a {type_name}" in message

    def test_cycles_are_named(self, codec: RequestCodec) -> None:
        request = Request("http://example.com/")
        request.meta["self"] = request
        loop: list[Any] = []
        loop.append(loop)
        for bad, where in ((request, "meta['self'] holds a Request"),
                           (Request("http://example.com/", cb_kwargs={"l": loop}),
                            "cb_kwargs['l'] holds a list")):
            with pytest.raises(RequestEncodeError, match="a cycle cannot be stored") as info:
                codec.encode(bad)
            assert where in str(info.value)


def test_cli_shows_a_payload_with_items_without_rebuilding_them(codec: RequestCodec) -> None:
    payload = codec.encode(Request("http://example.com/x", meta={"s": {Seller("a")}}))
    assert describe_payload(payload) == "GET http://example.com/x"


# -- the property: what the codec stores, a worker with the same settings rebuilds ------

_leaves = (
    st.none() | st.integers() | st.text(max_size=5) | st.binary(max_size=5)
    | st.decimals(allow_nan=False) | st.datetimes(timezones=st.none() | st.timezones())
    | st.sampled_from([object(), print, NotAnItem()])
)
_values = st.recursive(
    _leaves,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.tuples(inner)
        | st.dictionaries(st.text(max_size=5) | st.integers(), inner, max_size=3)
        | st.builds(Seller, st.text(max_size=5), st.decimals(allow_nan=False))
        | st.builds(Offer, st.floats(allow_nan=False), st.none())
        | st.builds(Frozen, inner)
        | st.builds(lambda **kw: Product({k: v for k, v in kw.items() if v is not None}),
                    name=inner, seller=st.none() | inner)
        | st.builds(lambda url, meta: Request(url, meta=meta),
                    st.sampled_from(["http://a.example/", "https://b.example/x?y=1"]),
                    st.dictionaries(st.text(max_size=5), inner, max_size=2))
    ),
    max_leaves=10,
)


@settings(max_examples=200, database=None, deadline=None)
@given(meta=st.dictionaries(st.text(max_size=5), _values, max_size=3),
       cb_kwargs=st.dictionaries(st.text(max_size=5), _values, max_size=2),
       name=st.sampled_from(["msgpack", "json"]))
def test_what_the_codec_stores_another_worker_rebuilds(
    meta: dict[str, Any], cb_kwargs: dict[str, Any], name: str
) -> None:
    spider = ItemSpider()
    request = Request("http://example.com/", meta=meta, cb_kwargs=cb_kwargs,
                      callback=spider.parse)
    try:
        payload = RequestCodec(spider, get_serializer(name), items=ItemClasses([HERE])).encode(
            request
        )
    except RequestEncodeError:
        return  # refused when queued: never a surprise for the worker that leases it
    reader = RequestCodec(spider, get_serializer(name), items=ItemClasses([HERE]))
    assert same(reader.decode(payload), request)
