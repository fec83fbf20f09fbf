from __future__ import annotations

import inspect
from typing import Any

import msgpack
import pytest
from scrapy import FormRequest, Request, Spider
from scrapy.http import JsonRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.spiders import CrawlSpider

import scrapy_redisspine.request_codec as request_codec_module
from scrapy_redisspine.compact import loads_request
from scrapy_redisspine.request_codec import RequestCodec, RequestDecodeError, RequestEncodeError
from scrapy_redisspine.serialization import get_serializer

SERIALIZERS = ("msgpack", "json")


class CodecSpider(Spider):
    name = "codec"

    def parse(self, response: Any) -> None:
        pass

    def parse_item(self, response: Any, **kwargs: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass

    def __parse_private(self, response: Any) -> None:
        pass

    def private_request(self) -> Request:
        return Request("http://example.com/private", callback=self.__parse_private)

    alias = parse_item


class PrivateSpider(CrawlSpider):
    name = "private"

    def _parse_detail(self, response: Any) -> None:
        pass

    def __mangled(self, response: Any) -> None:
        pass

    def closed(self, reason: str) -> None:
        pass

    def log(self, response: Any) -> None:  # type: ignore[override]
        pass


class UserRequest(Request):
    pass


USER_REQUEST_PATH = f"{__name__}.UserRequest"


@pytest.fixture
def spider() -> CodecSpider:
    return CodecSpider()


@pytest.fixture(params=SERIALIZERS)
def serializer_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def codec(spider: CodecSpider, serializer_name: str) -> RequestCodec:
    return RequestCodec(spider, get_serializer(serializer_name))


def _fields(request: Request) -> dict[str, Any]:
    return {
        "class": type(request),
        "url": request.url,
        "method": request.method,
        "headers": {name: request.headers.getlist(name) for name in request.headers},
        "body": request.body,
        "cookies": request.cookies,
        "meta": request.meta,
        "cb_kwargs": request.cb_kwargs,
        "callback": request.callback,
        "errback": request.errback,
        "priority": request.priority,
        "dont_filter": request.dont_filter,
        "flags": request.flags,
        "encoding": request.encoding,
    }


def _round_trip(codec: RequestCodec, request: Request) -> Request:
    payload = codec.encode(request)
    assert isinstance(payload, bytes)
    return codec.decode(payload)


def _assert_round_trip(codec: RequestCodec, request: Request) -> Request:
    copy = _round_trip(codec, request)
    assert copy is not request
    assert _fields(copy) == _fields(request)
    return copy


class TestRoundTrip:
    def test_every_field(self, codec: RequestCodec, spider: CodecSpider) -> None:
        request = Request(
            "http://example.com/p\u00e4th?q=1#frag",
            method="PUT",
            headers={"X-Multi": ["a", "b"], "Accept": "text/html", "X-Raw": b"\xff\x00"},
            body=b"\x00\xff\xfe not utf-8 \n",
            cookies={"session": "abc", "n": "1"},
            meta={
                "nested": {"list": [1, 2.5, None, True, b"\x00bytes", {"deep": "x"}]},
                "bytes": b"\x80\x81",
                "int": 3,
                "float": 0.25,
                "none": None,
                "bool": False,
                "str": "h\u00e9llo",
                "depth": 2,
            },
            cb_kwargs={"page": 2, "tags": ["a", "b"], "raw": b"\x01"},
            callback=spider.parse_item,
            errback=spider.on_error,
            priority=-7,
            dont_filter=True,
            flags=["cached", "retry"],
            encoding="latin-1",
        )
        copy = _assert_round_trip(codec, request)
        assert copy.headers.getlist("X-Multi") == [b"a", b"b"]
        assert copy.callback == spider.parse_item
        assert copy.callback.__self__ is spider
        assert copy.errback == spider.on_error

    def test_defaults(self, codec: RequestCodec) -> None:
        request = Request("http://example.com/")
        copy = _assert_round_trip(codec, request)
        assert copy.callback is None
        assert copy.errback is None

    def test_cookies_in_list_form(self, codec: RequestCodec) -> None:
        request = Request(
            "http://example.com/",
            cookies=[
                {"name": "a", "value": "1", "domain": "example.com", "path": "/"},
                {"name": "b", "value": "2"},
            ],
        )
        copy = _assert_round_trip(codec, request)
        assert isinstance(copy.cookies, list)

    def test_tuples_and_sets_in_meta_come_back_as_they_were(self, codec: RequestCodec) -> None:
        meta = {"t": (1, 2), "s": {1, 2}, "f": frozenset({"a"}), 1: "int key"}
        copy = _assert_round_trip(codec, Request("http://example.com/", meta=meta))
        assert type(copy.meta["t"]) is tuple
        assert type(copy.meta["s"]) is set
        assert type(copy.meta["f"]) is frozenset

    def test_form_request(self, codec: RequestCodec, spider: CodecSpider) -> None:
        request = FormRequest(
            "http://example.com/form",
            formdata={"q": "caf\u00e9", "multi": ["1", "2"]},
            callback=spider.parse,
        )
        copy = _assert_round_trip(codec, request)
        assert isinstance(copy, FormRequest)
        assert copy.method == "POST"
        assert copy.body == request.body

    def test_form_request_get(self, codec: RequestCodec) -> None:
        request = FormRequest("http://example.com/search", method="GET", formdata={"q": "x"})
        copy = _assert_round_trip(codec, request)
        assert copy.url == "http://example.com/search?q=x"

    def test_json_request(self, codec: RequestCodec, spider: CodecSpider) -> None:
        request = JsonRequest(
            "http://example.com/api",
            data={"k": [1, 2], "s": "x"},
            dumps_kwargs={"sort_keys": True},
            callback=spider.parse,
        )
        copy = _assert_round_trip(codec, request)
        assert isinstance(copy, JsonRequest)
        assert copy.body == b'{"k": [1, 2], "s": "x"}'
        assert copy.headers.get("Content-Type") == b"application/json"

    def test_no_callback(self, codec: RequestCodec) -> None:
        copy = _assert_round_trip(codec, Request("http://example.com/", callback=NO_CALLBACK))
        assert copy.callback is NO_CALLBACK

    def test_name_mangled_private_callback(
        self, codec: RequestCodec, spider: CodecSpider
    ) -> None:
        request = spider.private_request()
        copy = _assert_round_trip(codec, request)
        assert copy.callback == request.callback
        # Twice, to go through the codec's name cache as well.
        assert _round_trip(codec, request).callback == request.callback

    def test_aliased_callback(self, codec: RequestCodec, spider: CodecSpider) -> None:
        copy = _assert_round_trip(codec, Request("http://example.com/", callback=spider.alias))
        assert copy.callback.__func__ is CodecSpider.parse_item

    def test_user_subclass_allowed_by_setting(
        self, spider: CodecSpider, serializer_name: str
    ) -> None:
        codec = RequestCodec(spider, get_serializer(serializer_name), [USER_REQUEST_PATH])
        copy = _assert_round_trip(codec, UserRequest("http://example.com/", callback=spider.parse))
        assert type(copy) is UserRequest

    def test_decoding_needs_no_spider_without_callbacks(self, serializer_name: str) -> None:
        codec = RequestCodec(None, get_serializer(serializer_name))
        _assert_round_trip(codec, Request("http://example.com/", meta={"a": 1}))

    def test_payload_without_class_is_a_plain_request(self, codec: RequestCodec) -> None:
        payload = codec.serializer.dumps({"url": "http://example.com/", "unknown_field": 1})
        request = codec.decode(payload)
        assert type(request) is Request
        assert request.url == "http://example.com/"


class TestRequestClasses:
    def test_user_subclass_refused_by_default(self, codec: RequestCodec) -> None:
        with pytest.raises(RequestEncodeError, match="REDISSPINE_ALLOWED_REQUEST_CLASSES") as info:
            codec.encode(UserRequest("http://example.com/"))
        assert USER_REQUEST_PATH in str(info.value)

    def test_user_subclass_payload_refused_by_a_worker_that_does_not_allow_it(
        self, spider: CodecSpider, serializer_name: str
    ) -> None:
        serializer = get_serializer(serializer_name)
        allowing = RequestCodec(spider, serializer, [USER_REQUEST_PATH])
        payload = allowing.encode(UserRequest("http://example.com/"))
        with pytest.raises(RequestDecodeError, match="not allowed"):
            RequestCodec(spider, serializer).decode(payload)

    @pytest.mark.parametrize(
        "path", ["os.system", "subprocess.Popen", "builtins.eval", "scrapy.Request", 5, None]
    )
    def test_unlisted_class_is_refused_without_importing_it(
        self, codec: RequestCodec, monkeypatch: pytest.MonkeyPatch, path: Any
    ) -> None:
        imported: list[Any] = []
        monkeypatch.setattr(request_codec_module, "load_object", imported.append)
        payload = codec.serializer.dumps({"_class": path, "url": "http://example.com/"})
        with pytest.raises(RequestDecodeError, match="not allowed"):
            codec.decode(payload)
        assert imported == []

    def test_allowed_path_that_is_not_a_request_class_is_refused(
        self, spider: CodecSpider, serializer_name: str
    ) -> None:
        serializer = get_serializer(serializer_name)
        codec = RequestCodec(spider, serializer, ["collections.OrderedDict"])
        payload = serializer.dumps({"_class": "collections.OrderedDict", "url": "http://x.com/"})
        with pytest.raises(RequestDecodeError, match="not a Request class"):
            codec.decode(payload)


class TestCallbacks:
    @pytest.mark.parametrize(
        "name",
        [
            "__class__",
            "name",
            "crawler",
            "settings",
            "logger",
            "custom_settings",
            "from_crawler",
            "update_settings",
            "close",
            "no_such_method",
            "parse_item.__globals__",
            5,
            ["parse"],
        ],
    )
    @pytest.mark.parametrize("field", ["callback", "errback"])
    def test_name_that_is_not_a_spider_method_is_refused(
        self, codec: RequestCodec, name: Any, field: str
    ) -> None:
        payload = codec.serializer.dumps({"url": "http://example.com/", field: name})
        with pytest.raises(RequestDecodeError, match=field):
            codec.decode(payload)

    @pytest.mark.parametrize("name", ["__init__", "__repr__", "_set_crawler", "start"])
    def test_spider_machinery_is_not_a_callback(self, codec: RequestCodec, name: str) -> None:
        # These are bound methods of the spider, but of Scrapy's Spider machinery, not
        # callbacks: a payload from a shared Redis must not make a worker call them.
        payload = codec.serializer.dumps({"url": "http://example.com/", "callback": name})
        with pytest.raises(RequestDecodeError, match="callback"):
            codec.decode(payload)

    def test_private_methods_of_the_spider_are_callbacks(self, serializer_name: str) -> None:
        spider = PrivateSpider()
        codec = RequestCodec(spider, get_serializer(serializer_name))
        for callback in (spider._parse_detail, spider._parse, spider._callback,
                         spider.parse_start_url):
            copy = _assert_round_trip(codec, Request("http://example.com/", callback=callback))
            assert copy.callback == callback

    def test_spider_machinery_is_refused_when_stored(self, serializer_name: str) -> None:
        spider = PrivateSpider()
        codec = RequestCodec(spider, get_serializer(serializer_name))
        for name in ("_set_crawler", "start", "log"):
            with pytest.raises(RequestEncodeError, match=f"{name}.*scrapy.Spider's machinery"):
                codec.encode(Request("http://example.com/", callback=getattr(spider, name)))

    def test_what_encodes_as_a_callback_decodes_as_the_same(self, serializer_name: str) -> None:
        # Every bound method of a spider (its own, CrawlSpider's, Spider's, an override of
        # Spider's machinery): refused when stored, or rebuilt as the same method.
        spider = PrivateSpider()
        codec = RequestCodec(spider, get_serializer(serializer_name))
        accepted = []
        for name, method in inspect.getmembers(spider, inspect.ismethod):
            for field in ("callback", "errback"):
                try:
                    payload = codec.encode(Request("http://example.com/", **{field: method}))
                except RequestEncodeError:
                    continue
                assert getattr(codec.decode(payload), field).__func__ is method.__func__, name
                accepted.append(name)
        assert {"_parse_detail", "_PrivateSpider__mangled", "parse", "_parse", "closed"} <= set(
            accepted
        )
        assert "log" not in accepted  # overrides Spider.log: still Spider's name

    def test_callback_refused_without_a_spider(self, serializer_name: str) -> None:
        codec = RequestCodec(None, get_serializer(serializer_name))
        payload = codec.serializer.dumps({"url": "http://example.com/", "callback": "parse"})
        with pytest.raises(RequestDecodeError, match="callback 'parse' cannot be resolved"):
            codec.decode(payload)

    def test_lambda_callback_is_refused_with_a_clear_message(self, codec: RequestCodec) -> None:
        request = Request("http://example.com/", callback=lambda response: None)
        with pytest.raises(RequestEncodeError, match="only spider methods") as info:
            codec.encode(request)
        assert "callback" in str(info.value)
        assert "lambda" in str(info.value)

    def test_lambda_errback_is_refused(self, codec: RequestCodec) -> None:
        request = Request("http://example.com/", errback=lambda failure: None)
        with pytest.raises(RequestEncodeError, match="errback"):
            codec.encode(request)

    def test_plain_function_callback_is_refused(self, codec: RequestCodec) -> None:
        with pytest.raises(RequestEncodeError, match="not a method of the spider"):
            codec.encode(Request("http://example.com/", callback=print))

    def test_method_of_another_spider_instance_is_refused(
        self, codec: RequestCodec
    ) -> None:
        with pytest.raises(RequestEncodeError, match="not a method of the spider"):
            codec.encode(Request("http://example.com/", callback=CodecSpider().parse))

    def test_method_of_another_instance_is_refused_after_own_method_was_encoded(
        self, codec: RequestCodec, spider: CodecSpider
    ) -> None:
        # The name cache must not skip the owner check.
        codec.encode(Request("http://example.com/", callback=spider.parse))
        with pytest.raises(RequestEncodeError, match="not a method of the spider"):
            codec.encode(Request("http://example.com/", callback=CodecSpider().parse))

    def test_callback_refused_when_encoding_without_spider(self, serializer_name: str) -> None:
        codec = RequestCodec(None, get_serializer(serializer_name))
        with pytest.raises(RequestEncodeError, match="callback"):
            codec.encode(Request("http://example.com/", callback=CodecSpider().parse))


class TestEncodeErrors:
    @pytest.mark.parametrize("value", [object(), Spider, print])
    def test_unserializable_meta_names_the_key(self, codec: RequestCodec, value: Any) -> None:
        request = Request("http://example.com/", meta={"fine": 1, "culprit": value})
        with pytest.raises(RequestEncodeError) as info:
            codec.encode(request)
        message = str(info.value)
        assert "meta['culprit']" in message
        assert type(value).__name__ in message
        assert codec.serializer.name in message
        assert "http://example.com/" in message

    def test_unserializable_cb_kwargs_names_the_key(self, codec: RequestCodec) -> None:
        request = Request("http://example.com/", cb_kwargs={"item": object()})
        with pytest.raises(RequestEncodeError, match=r"cb_kwargs\['item'\]"):
            codec.encode(request)

    def test_unserializable_nested_meta_names_the_top_level_key(
        self, codec: RequestCodec
    ) -> None:
        request = Request("http://example.com/", meta={"outer": {"inner": [object()]}})
        with pytest.raises(RequestEncodeError, match=r"meta\['outer'\]"):
            codec.encode(request)


class TestDecodeErrors:
    @pytest.mark.parametrize(
        "payload", [b"", b"\x00\xff\xfe garbage", b"\xc1", b"[1, 2]", b"\x92\x01\x02", b"null"]
    )
    def test_garbage_bytes(self, codec: RequestCodec, payload: bytes) -> None:
        with pytest.raises(RequestDecodeError):
            codec.decode(payload)

    @pytest.mark.parametrize(
        "data",
        [
            pytest.param({}, id="no-url"),
            pytest.param({"url": None}, id="url-none"),
            pytest.param({"url": 5}, id="url-int"),
            pytest.param({"url": "no scheme"}, id="url-no-scheme"),
            pytest.param({"url": "http://example.com/", "meta": 5}, id="meta-int"),
            pytest.param({"url": "http://example.com/", "priority": "high"}, id="priority-str"),
            pytest.param({"url": "http://example.com/", "body": 5}, id="body-int"),
            pytest.param({"url": "http://example.com/", "headers": 5}, id="headers-int"),
            pytest.param({"url": "http://example.com/", "flags": 5}, id="flags-int"),
            pytest.param({"url": "http://example.com/", "cb_kwargs": 5}, id="cb_kwargs-int"),
            pytest.param(
                {"url": "http://example.com/", "headers": [1, 2]}, id="headers-not-pairs"
            ),
            pytest.param(
                {"url": "http://example.com/", "headers": [["X-A", "b", "c"]]},
                id="headers-triple",
            ),
            pytest.param(
                {"url": "http://example.com/", "headers": [[1, [2]]]}, id="headers-int-name"
            ),
        ],
    )
    def test_malformed_fields_give_a_decode_error(
        self, codec: RequestCodec, data: dict[str, Any]
    ) -> None:
        # Anything a shared Redis hands back must fail as RequestDecodeError, which the
        # scheduler dead-letters; any other exception escapes next_request().
        with pytest.raises(RequestDecodeError):
            codec.decode(codec.serializer.dumps(data))

    def test_payload_of_the_other_serializer_decodes(self, spider: CodecSpider) -> None:
        # A crawl survives a change of REDISSPINE_SERIALIZER (and pushes in either format).
        request = Request("http://example.com/", callback=spider.parse, meta={"b": b"\xff"})
        msgpack_codec = RequestCodec(spider, get_serializer("msgpack"))
        json_codec = RequestCodec(spider, get_serializer("json"))
        assert _fields(json_codec.decode(msgpack_codec.encode(request))) == _fields(request)
        assert _fields(msgpack_codec.decode(json_codec.encode(request))) == _fields(request)

    def test_decode_error_is_a_value_error(self) -> None:
        assert issubclass(RequestDecodeError, ValueError)
        assert issubclass(RequestEncodeError, ValueError)


def test_msgpack_payload_is_smaller_than_json(spider: CodecSpider) -> None:
    request = Request("http://example.com/", callback=spider.parse, meta={"depth": 1})
    small = RequestCodec(spider, get_serializer("msgpack")).encode(request)
    large = RequestCodec(spider, get_serializer("json")).encode(request)
    assert len(small) < len(large)
    # compact: URL, callback, then the other fields as the serializer's map
    url, callback, rest = small.split(b"\0", 2)
    assert (url, callback, msgpack.unpackb(rest)) == (b"http://example.com/", b"parse",
                                                      {"meta": {"depth": 1}})


@pytest.mark.parametrize("serializer", SERIALIZERS)
def test_plain_request_leaves_its_defaults_out(spider: CodecSpider, serializer: str) -> None:
    codec = RequestCodec(spider, get_serializer(serializer))
    plain = Request("http://example.com/a")
    assert codec.encode(plain) == plain.url.encode()  # a plain GET's payload is its URL
    assert loads_request(codec.encode(plain)) == {"url": plain.url}
    copy = codec.decode(codec.encode(plain))
    assert _fields(copy) == _fields(plain)

    # a field that differs from the default travels, even if falsy-looking
    odd = Request("http://example.com/b", priority=-1, meta={"x": 0}, body=b"0", dont_filter=True)
    data = loads_request(codec.encode(odd))
    assert {"priority", "meta", "body", "dont_filter"} <= set(data)
    assert "method" not in data
    assert _fields(codec.decode(codec.encode(odd))) == _fields(odd)


def test_subclasses_keep_every_field(spider: CodecSpider) -> None:
    # their defaults may differ from Request's (FormRequest, JsonRequest...)
    codec = RequestCodec(spider, get_serializer("msgpack"))
    request = JsonRequest("http://example.com/api", data={"q": 1})
    data = loads_request(codec.encode(request))
    assert set(Request.attributes) - {"callback"} <= set(data)  # a None callback: left out
    assert _fields(codec.decode(codec.encode(request))) == _fields(request)


def _plain_requests(spider: CodecSpider) -> list[Request]:
    """Plain Requests with each field at, beside and off its default (the types too)."""
    url = "http://example.com/a?b=1"
    return [
        Request(url),
        Request(url, callback=spider.parse_item, meta={"depth": 2}),
        Request(url, callback=NO_CALLBACK, errback=spider.on_error),
        Request(url, method="POST", body=b"x=1", headers={"X-A": ["1", "2"]}),
        Request(url, cookies={"a": "b"}, encoding="latin-1", flags=["f"],
                cb_kwargs={"k": [1]}, priority=-3, dont_filter=True),
        Request(url, cookies=[{"name": "a", "value": "b"}]),
        Request(url, cookies=[]),  # falsy, but a list: not the default {}
        Request(url, priority=True),  # type: ignore[arg-type]  # a bool is not the int 0
        Request(url, method="get"),
        Request(url, meta={}, cb_kwargs={}),
    ]


def test_a_plain_request_encodes_as_the_general_path_encodes_it(
    spider: CodecSpider, codec: RequestCodec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The field-by-field path for plain Requests gives the same fields and values; in
    the same order (a payload's map keeps it), and so the same payload bytes, where
    Scrapy lists Request's fields in that order (recent ones; 2.13 does not)."""
    requests = _plain_requests(spider)
    fast = [(list(codec._to_dict(r).items()), codec.encode(r)) for r in requests]
    monkeypatch.setattr(request_codec_module, "_PLAIN_FIELDS_KNOWN", False)
    general = [(list(codec._to_dict(r).items()), codec.encode(r)) for r in requests]
    assert [dict(fields) for fields, _ in fast] == [dict(fields) for fields, _ in general]
    if tuple(Request.attributes) == request_codec_module._PLAIN_FIELDS:
        assert fast == general
    monkeypatch.setattr(request_codec_module, "_PLAIN_FIELDS_KNOWN", True)
    for request in requests:  # either order decodes to the same request
        assert _fields(_round_trip(codec, request)) == _fields(request)
    # Scrapy itself turns cookies=[] into {} and "get" into "GET": those are plain GETs
    bare = [i for i, (_, payload) in enumerate(fast) if payload == b"http://example.com/a?b=1"]
    assert bare == [0, 6, 8, 9]


def test_the_plain_path_knows_this_scrapy_s_request_fields() -> None:
    """A Scrapy whose Request has other fields takes the general path (no field is
    dropped); this one's are the ones the plain path reads, in some order."""
    assert request_codec_module._PLAIN_FIELDS_KNOWN
    assert set(request_codec_module._PLAIN_FIELDS) == set(Request.attributes)
    assert set(request_codec_module._PLAIN_FIELDS) == {"url", *request_codec_module._DEFAULTS}


def test_encoding_a_plain_request_makes_no_headers_for_it(codec: RequestCodec) -> None:
    """Recent Scrapy makes a request's Headers on first access: the encode does not
    (it found them empty by making them, for every request, and the local request
    cache kept them). A Scrapy that makes them at once has them either way."""
    request = Request("http://example.com/p")
    lazy = getattr(request, "_headers", "made at once") is None
    assert codec.encode(request) == b"http://example.com/p"
    assert getattr(request, "_headers", None) is None or not lazy
    request.headers["X-Made"] = "1"
    assert codec.decode(codec.encode(request)).headers[b"X-Made"] == b"1"
