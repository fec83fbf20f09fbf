"""What may be fed to a crawl from outside: a URL, or a JSON object describing a request.

One parser for every way in (``redisspine seed``, ``python -m scrapy_redisspine.push``
and the feed key the workers drain), so that each accepts exactly what the others do.
An entry is either an absolute http(s) URL or a JSON object with the keys ``url``
(required), ``method``, ``meta``, ``callback``, ``priority``, ``headers``, ``body``
and ``cb_kwargs``. Anything else is refused with a one-line reason, never guessed at:
a typo in a key (``"calback"``) would otherwise crawl the page with the wrong callback.

``dont_filter`` is not accepted on purpose: every fed request goes through the
crawl's dedup, which is what makes re-reading a feed batch after a crash harmless.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy import Request

if TYPE_CHECKING:
    from collections.abc import Callable

#: The keys a JSON entry may have.
ENTRY_KEYS = frozenset(
    {"url", "method", "meta", "callback", "priority", "headers", "body", "cb_kwargs"}
)


class BadEntry(ValueError):
    """An entry that is no request; its message is the one-line reason."""


@dataclass(frozen=True)
class FeedEntry:
    """A request built from an entry, and its callback's name (None: ``parse``)."""

    request: Request
    callback: str | None


def parse_entry(
    text: str | bytes, priority: int = 0,
    is_callback: Callable[[str], bool] | None = None,
) -> FeedEntry:
    """The request an entry describes; :class:`BadEntry` says why there is none.

    ``priority`` is the default of an entry that gives none. ``is_callback`` says
    whether a name is a method of the spider (a worker knows its spider; a tool
    outside the crawl passes None and only the name's form is checked).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise BadEntry("not UTF-8 text") from None
    text = text.strip()
    if not text.startswith("{"):
        return FeedEntry(_request(_url(text), priority=priority), None)
    try:
        data: dict[str, Any] = json.loads(text)  # it starts with {: an object
    except ValueError as exc:
        raise BadEntry(f"not valid JSON: {exc}") from None
    return _from_object(data, priority, is_callback)


def _from_object(
    data: dict[str, Any], priority: int, is_callback: Callable[[str], bool] | None
) -> FeedEntry:
    unknown = sorted(set(data) - ENTRY_KEYS)
    if unknown:
        raise BadEntry(f"unknown key(s) {', '.join(unknown)}; "
                       f"allowed: {', '.join(sorted(ENTRY_KEYS))}")
    if not isinstance(data.get("url"), str):
        raise BadEntry("a JSON entry needs a 'url' string")
    callback = _checked("callback", data, str, None)
    if callback is not None and (not callback.isidentifier() or callback.startswith("_")):
        raise BadEntry(f"callback {callback!r} is no public method name")
    if callback is not None and is_callback is not None and not is_callback(callback):
        raise BadEntry(f"callback {callback!r} is not a method of the spider")
    entry_priority = _checked("priority", data, int, priority)
    if isinstance(entry_priority, bool):
        raise BadEntry("'priority' must be an integer")
    headers = _checked("headers", data, dict, None)
    if headers is not None and not all(
        isinstance(value, (str, list)) for value in headers.values()
    ):
        raise BadEntry("'headers' values must be strings or lists of strings")
    request = _request(
        _url(data["url"]), method=_checked("method", data, str, "GET").upper(),
        meta=_checked("meta", data, dict, None), priority=entry_priority, headers=headers,
        body=_checked("body", data, str, None), cb_kwargs=_checked("cb_kwargs", data, dict, None),
    )
    return FeedEntry(request, callback)


def _checked(name: str, data: dict[str, Any], kind: type, default: Any) -> Any:
    value = data.get(name, default)
    if value is not None and value is not default and not isinstance(value, kind):
        raise BadEntry(f"{name!r} must be a{'n' if kind is int else ''} {_KINDS[kind]}")
    return value


_KINDS = {str: "string", int: "integer", dict: "object"}


def _url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadEntry(f"{text[:200]!r} is not an absolute http(s) URL")
    return text


def _request(url: str, **kwargs: Any) -> Request:
    try:
        return Request(url, **kwargs)
    except (ValueError, TypeError) as exc:
        raise BadEntry(f"no request can be built: {exc}") from None
