"""Scrapy Request <-> bytes, safely.

Scrapy's own ``request_from_dict`` imports whatever ``_class`` a payload names and
``getattr``s any callback name on the spider. A payload comes from a shared Redis,
so this codec accepts only Request classes on an allow-list and only callbacks that
are methods of the running spider. Callback names are looked up once per function
(``Request.to_dict(spider=...)`` scans the spider's members on every call).

Meta and cb_kwargs may hold the serializer's typed values and two kinds of objects
this codec stores for it: requests (by the same rules as the request itself) and
items (by the rules of ``_items``). What the encoder accepts, a worker with the same
settings decodes: each rule is checked on both sides.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.http.headers import Headers
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.misc import load_object

from scrapy_redisspine._items import ItemClasses
from scrapy_redisspine.compact import dumps_request, loads_request
from scrapy_redisspine.serialization import SerializationError, Serializer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


#: Request classes Scrapy ships; any other must be allowed by setting.
BUILTIN_REQUEST_CLASSES = (
    "scrapy.http.request.Request",
    "scrapy.http.request.form.FormRequest",
    "scrapy.http.request.json_request.JsonRequest",
    "scrapy.http.request.rpc.XmlRpcRequest",
)

_NO_CALLBACK_NAME = "__scrapy_no_callback__"

#: ``Request``'s defaults. A plain Request leaves out the fields that hold one: the
#: queue stores every payload, and most requests are a URL and a callback. Decoding
#: gives them back (a missing field takes the class's default).
_DEFAULTS: dict[str, Any] = {
    "method": "GET", "headers": [], "body": b"", "cookies": {}, "meta": {},
    "encoding": "utf-8", "priority": 0, "dont_filter": False, "flags": [],
    "cb_kwargs": {}, "callback": None, "errback": None,
}

#: ``Request.attributes`` as :meth:`RequestCodec._plain_to_dict` knows them, in the
#: order recent Scrapy lists them in (2.13 lists them in another; the order of a payload's
#: map changes no decoded request); a Scrapy with other fields takes the general path.
_PLAIN_FIELDS = ("url", "headers", "body", "cookies", "meta", "encoding", "flags",
                 "cb_kwargs", "callback", "dont_filter", "errback", "method", "priority")
_PLAIN_FIELDS_KNOWN = set(Request.attributes) == set(_PLAIN_FIELDS)
#: The fields after ``url`` and ``headers``, each with its default, the default's type,
#: and whether it is a method stored by name.
_PLAIN_PLAN = tuple((field, _DEFAULTS[field], type(_DEFAULTS[field]),
                     field in ("callback", "errback"))
                    for field in _PLAIN_FIELDS if field not in ("url", "headers"))

#: What is never a callback, on either side: scrapy.Spider's own attributes
#: (``__init__``, ``start``, ``_set_crawler`` ...) except ``parse`` and ``_parse``
#: (what Scrapy itself calls for a request without a callback). A spider's other
#: methods are callbacks, private ones (``_parse_detail``) included.
_SPIDER_MACHINERY = frozenset(dir(Spider)) - {"parse", "_parse"}


def _headers_if_any(request: Request) -> Headers | None:
    """The request's headers, or None when it has none, without making them: recent
    Scrapy makes a request's ``Headers`` on first access (``_headers`` is None until
    then), and reading ``request.headers`` to find it empty built one for every
    enqueued request (a third of a plain request's encode) and kept it in the local
    request cache. Any other Scrapy: the public attribute."""
    raw = getattr(request, "_headers", _NO_SLOT)
    if raw is None:
        return None
    return raw if isinstance(raw, Headers) else request.headers


_NO_SLOT = object()


class RequestEncodeError(ValueError):
    """A request cannot be stored (e.g. its meta holds an object)."""


class RequestDecodeError(ValueError):
    """A stored payload is not a request this worker may rebuild."""


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class RequestCodec:
    """Turns requests into payloads for one spider, and back.

    ``items`` are the item classes that may travel in meta; by default those of the
    spider's settings and project (:meth:`ItemClasses.for_spider`).
    """

    def __init__(
        self,
        spider: Spider | None,
        serializer: Serializer,
        allowed_classes: Iterable[str] = (),
        items: ItemClasses | None = None,
    ) -> None:
        self.spider = spider
        self.serializer = serializer
        self.items = ItemClasses.for_spider(spider) if items is None else items
        self._allowed: dict[str, type[Request] | None] = dict.fromkeys(
            (*BUILTIN_REQUEST_CLASSES, *allowed_classes)
        )
        self._names: dict[Any, str] = {}

    def encode(self, request: Request, callback_name: str | None = None) -> bytes:
        """``callback_name`` names the callback of a request built outside a spider."""
        data = self._to_dict(request)
        if callback_name is not None:
            data["callback"] = callback_name
        try:
            return dumps_request(data, self.serializer, self)
        except SerializationError as exc:
            raise RequestEncodeError(self._explain(request, data, exc)) from exc

    def decode(self, payload: bytes) -> Request:
        try:
            data = loads_request(payload, self)
        except SerializationError as exc:
            raise RequestDecodeError(str(exc)) from exc
        return self._from_dict(data)

    def object_parts(self, value: Any) -> tuple[str, Any] | None:
        """The serializer's hook: a request or an item found in meta or cb_kwargs."""
        if isinstance(value, Request):
            return "request", self._to_dict(value)
        parts = self.items.object_parts(value)
        return None if parts is None else ("item", parts)

    def rebuild_object(self, kind: str, parts: Any) -> Any:
        if kind == "item":
            return self.items.rebuild(parts)
        if kind != "request" or not isinstance(parts, dict):
            raise SerializationError(f"malformed {kind}: {parts!r:.80}")
        try:
            return self._from_dict(parts)
        except RequestDecodeError as exc:
            raise SerializationError(f"request in meta: {exc}") from exc

    def _from_dict(self, data: dict[str, Any]) -> Request:
        cls = self._request_class(data.pop("_class", "scrapy.http.request.Request"))
        for field in ("callback", "errback"):
            data[field] = self._method(data.get(field), field)
        kwargs = {key: value for key, value in data.items() if key in cls.attributes}
        if not isinstance(kwargs.get("url"), str):
            raise RequestDecodeError(f"payload has no URL string: {kwargs.get('url')!r}")
        try:
            if isinstance(kwargs.get("headers"), list):
                kwargs["headers"] = dict(kwargs["headers"])
            return cls(**kwargs)
        except Exception as exc:  # whatever a malformed field makes the class raise
            raise RequestDecodeError(
                f"cannot rebuild {cls.__name__}: {type(exc).__name__}: {exc}"
            ) from exc

    def _to_dict(self, request: Request) -> dict[str, Any]:
        if type(request) is Request and _PLAIN_FIELDS_KNOWN:
            return self._plain_to_dict(request)
        data: dict[str, Any] = {
            attr: getattr(request, attr) for attr in type(request).attributes
        }
        data["callback"] = self._name(request.callback, request, "callback")
        data["errback"] = self._name(request.errback, request, "errback")
        # Header names are bytes; a list of pairs keeps JSON able to carry them.
        data["headers"] = [[name, list(values)] for name, values in request.headers.items()]
        if type(request) is Request:
            for field, default in _DEFAULTS.items():
                value = data[field]
                if value == default and type(value) is type(default):
                    del data[field]
        else:
            path = _class_path(type(request))
            if path not in self._allowed:
                raise RequestEncodeError(
                    f"cannot store {request}: its class {path} is not allowed; add it to "
                    f"REDISSPINE_ALLOWED_REQUEST_CLASSES"
                )
            data["_class"] = path
        return data

    def _plain_to_dict(self, request: Request) -> dict[str, Any]:
        """What :meth:`_to_dict` gives a plain ``Request`` (its fields that differ from
        ``_DEFAULTS``, in ``_PLAIN_FIELDS`` order), built field by field rather
        than all fields read and the defaults deleted: about half the time of every
        enqueued request's encode (benchmarks/RESULTS.md, session 15). Used where
        Scrapy's ``Request.attributes`` are the ones this was written for."""
        data: dict[str, Any] = {"url": request.url}
        headers = _headers_if_any(request)
        if headers:
            data["headers"] = [[name, list(values)] for name, values in headers.items()]
        for field, default, kind, named in _PLAIN_PLAN:
            value = getattr(request, field)
            if named:  # callback, errback: stored by name
                if value is not None:
                    data[field] = self._name(value, request, field)
            elif type(value) is not kind or value != default:
                data[field] = value
        return data

    def _name(self, func: Callable[..., Any] | None, request: Request, field: str) -> str | None:
        if func is None:
            return None
        if func is NO_CALLBACK:
            return _NO_CALLBACK_NAME
        target = getattr(func, "__func__", None)
        owner = getattr(func, "__self__", None)
        if self.spider is None or owner is not self.spider or target is None:
            raise RequestEncodeError(
                f"cannot store {request}: its {field} {func!r} is not a method of the "
                f"spider, and only spider methods can travel between workers by name"
            )
        name = self._names.get(target)
        if name is not None:
            return name
        name = target.__name__
        if getattr(getattr(self.spider, name, None), "__func__", None) is not target:
            # Name-mangled (``__parse``) or aliased: search the spider once.
            name = next(
                (n for n, m in inspect.getmembers(self.spider, inspect.ismethod)
                 if m.__func__ is target and n not in _SPIDER_MACHINERY),
                "",
            )
            if not name:
                raise RequestEncodeError(
                    f"cannot store {request}: its {field} {func!r} is not found on the spider"
                )
        if name in _SPIDER_MACHINERY:
            raise RequestEncodeError(
                f"cannot store {request}: its {field} {name!r} is part of scrapy.Spider's "
                f"machinery, which no worker calls as a callback; use a method of your own"
            )
        self._names[target] = name
        return name

    def _method(self, name: Any, field: str) -> Callable[..., Any] | None:
        if name is None:
            return None
        if name == _NO_CALLBACK_NAME:
            return NO_CALLBACK
        if not isinstance(name, str) or self.spider is None:
            raise RequestDecodeError(f"{field} {name!r} cannot be resolved")
        if name in _SPIDER_MACHINERY:
            raise RequestDecodeError(
                f"{field} {name!r} is part of scrapy.Spider's machinery, not a callback"
            )
        method = getattr(self.spider, name, None)
        if not inspect.ismethod(method) or method.__self__ is not self.spider:
            raise RequestDecodeError(
                f"{field} {name!r} is not a method of spider {self.spider.name!r}"
            )
        return method

    def _request_class(self, path: Any) -> type[Request]:
        if not isinstance(path, str) or path not in self._allowed:
            raise RequestDecodeError(
                f"request class {path!r} is not allowed (REDISSPINE_ALLOWED_REQUEST_CLASSES)"
            )
        cls = self._allowed[path]
        if cls is None:
            cls = load_object(path)
            if not (isinstance(cls, type) and issubclass(cls, Request)):
                raise RequestDecodeError(f"{path} is not a Request class")
            self._allowed[path] = cls
        return cls

    def _explain(self, request: Request, data: dict[str, Any], exc: Exception) -> str:
        """Name the field, and the key path inside it, that cannot be serialized."""
        for field, value in data.items():
            if self._error(value) is None:
                continue
            path, culprit, cycle = self._culprit(value, field, ())
            if cycle:
                return (f"cannot store {request}: {path} holds a {type(culprit).__name__} "
                        f"that contains itself; a cycle cannot be stored")
            if field not in ("meta", "cb_kwargs") and path == field:
                return f"cannot store {request}: its {field} cannot be encoded ({exc})"
            return (
                f"cannot store {request}: {path} holds a {type(culprit).__name__}, which "
                f"the {self.serializer.name} serializer cannot encode ({self._error(culprit)})"
            )
        return f"cannot store {request}: {exc}"

    def _culprit(self, value: Any, path: str, above: tuple[int, ...]) -> tuple[str, Any, bool]:
        """The innermost part of ``value`` (at ``path``) that does not encode, and
        whether it is a cycle (a part that contains itself)."""
        above = (*above, id(value))
        for step, child in self._children(value):
            if id(child) in above:
                return path, value, True
            if self._error(child) is not None:
                return self._culprit(child, f"{path}{step}", above)
        return path, value, False

    def _children(self, value: Any) -> Iterable[tuple[str, Any]]:
        if isinstance(value, dict):
            for key, child in value.items():
                yield f" (key {key!r})", key
                yield f"[{key!r}]", child
        elif isinstance(value, (list, tuple)):
            yield from ((f"[{index}]", child) for index, child in enumerate(value))
        elif isinstance(value, (set, frozenset)):
            yield from ((f" (element {child!r})", child) for child in value)
        else:
            try:  # an item or request refused as a whole is the culprit itself
                self.object_parts(value)
            except (TypeError, ValueError):
                return
            if isinstance(value, Request):
                yield from ((f".meta[{key!r}]", child) for key, child in value.meta.items())
                yield from ((f".cb_kwargs[{key!r}]", child)
                            for key, child in value.cb_kwargs.items())
            else:
                fields = self.items.fields_of(value) or {}
                step = "[{!r}]" if isinstance(value, Mapping) else ".{}"  # scrapy.Item: a mapping
                yield from ((step.format(name), child) for name, child in fields.items())

    def _error(self, value: Any) -> str | None:
        try:
            self.serializer.dumps({"v": value}, self)
        except SerializationError as exc:
            return str(exc)
        return None
