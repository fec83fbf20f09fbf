"""Scrapy Request <-> bytes, safely.

Scrapy's own ``request_from_dict`` imports whatever ``_class`` a payload names and
``getattr``s any callback name on the spider. A payload comes from a shared Redis,
so this codec accepts only Request classes on an allow-list and only callbacks that
are methods of the running spider. Callback names are looked up once per function
(``Request.to_dict(spider=...)`` scans the spider's members on every call).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.misc import load_object

from scrapy_redisspine.serialization import SerializationError, Serializer, loads_any

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

#: What a payload may never name as a callback: scrapy.Spider's own attributes
#: (``__init__``, ``start``, ``_set_crawler`` ...) except ``parse``.
_SPIDER_MACHINERY = frozenset(name for name in dir(Spider) if name != "parse")


class RequestEncodeError(ValueError):
    """A request cannot be stored (e.g. its meta holds an object)."""


class RequestDecodeError(ValueError):
    """A stored payload is not a request this worker may rebuild."""


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


class RequestCodec:
    """Turns requests into payloads for one spider, and back."""

    def __init__(
        self,
        spider: Spider | None,
        serializer: Serializer,
        allowed_classes: Iterable[str] = (),
    ) -> None:
        self.spider = spider
        self.serializer = serializer
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
            return self.serializer.dumps(data)
        except SerializationError as exc:
            raise RequestEncodeError(self._explain(request, data, exc)) from exc

    def decode(self, payload: bytes) -> Request:
        try:
            data = loads_any(payload)
        except SerializationError as exc:
            raise RequestDecodeError(str(exc)) from exc
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
                 if m.__func__ is target),
                "",
            )
            if not name:
                raise RequestEncodeError(
                    f"cannot store {request}: its {field} {func!r} is not found on the spider"
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
        """Name the field (and meta / cb_kwargs key) that cannot be serialized."""
        for field, value in data.items():
            if field in ("meta", "cb_kwargs") and isinstance(value, dict):
                for key, item in value.items():
                    if not self._serializable({"v": item}):
                        return (
                            f"cannot store {request}: {field}[{key!r}] holds a "
                            f"{type(item).__name__}, which the {self.serializer.name} "
                            f"serializer cannot encode ({exc})"
                        )
            elif not self._serializable({"v": value}):
                return f"cannot store {request}: its {field} cannot be encoded ({exc})"
        return f"cannot store {request}: {exc}"

    def _serializable(self, data: dict[str, Any]) -> bool:
        try:
            self.serializer.dumps(data)
        except SerializationError:
            return False
        return True
