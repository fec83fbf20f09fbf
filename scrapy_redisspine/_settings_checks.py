"""Checks that turn one raw setting value into a typed one, or fail naming it.

Used by ``settings.load_config``; Scrapy-free, like it. Every check raises
:class:`ConfigError` with the setting's name and the value it got.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from scrapy_redisspine import _redis_urls as redis_urls

if TYPE_CHECKING:
    from collections.abc import Callable


class ConfigError(ValueError):
    """A setting has a value the plugin cannot use."""


def as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, str)) and str(value).strip().lower() in (
        "1", "0", "true", "false", "yes", "no", "on", "off",
    ):
        return str(value).strip().lower() in ("1", "true", "yes", "on")
    raise ConfigError(f"{name} must be a boolean, got {value!r}")


def as_number(name: str, value: Any, kind: Callable[[Any], Any], minimum: float) -> Any:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    try:
        number = kind(float(value)) if kind is float else kind(value)
        if kind is int and isinstance(value, float) and number != value:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        what = "an int" if kind is int else "a number"
        raise ConfigError(f"{name} must be {what}, got {value!r}") from None
    if not math.isfinite(number) or number < minimum:
        raise ConfigError(f"{name} must be a finite number >= {minimum}, got {value!r}")
    return number


def as_fraction(name: str, value: Any) -> float:
    """A rate: strictly between 0 and 1, since neither end is a rate anything can aim for."""
    number: float = as_number(name, value, float, 0)
    if not 0 < number < 1:
        raise ConfigError(f"{name} must be between 0 and 1, got {number!r}")
    return number


def as_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return text


def as_text(name: str, value: Any) -> str:
    """Any value as its text. It never fails (every value has one); it takes the name
    only to share the shape of the other checks."""
    del name
    return str(value)


def as_key_template(name: str, value: Any) -> str:
    """A key name with ``%(name)s`` for the spider's name (scrapy-redis's form), checked
    here so that a typo (``%(nme)s``, a lone ``%``) stops the crawl at its start."""
    text = str(value)
    try:
        text % {"name": "spider"}
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{name} {text!r} is no key template ({type(exc).__name__}: "
                          f"{exc}); use %(name)s for the spider's name") from None
    return text


def as_tag_text(name: str, value: Any) -> str:
    """A name that becomes a Redis Cluster hash tag (``{g:<name>}``): not empty, no
    braces (they would end the tag early and scatter the keys over slots)."""
    text = str(value)
    if not text or "{" in text or "}" in text:
        raise ConfigError(f"{name} must be a non-empty name without braces; got {value!r}")
    return text


def as_optional_str(name: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


def as_redis_url(name: str, value: Any) -> str | None:
    """A Redis URL naming a server, a cluster or a Sentinel service (``_redis_urls``);
    the error masks any password."""
    url = as_optional_str(name, value)
    if url is None:
        return None
    try:
        redis_urls.parse(url)
    except redis_urls.BadRedisUrl as exc:
        raise ConfigError(f"{name}: {exc}") from None
    return url


def _split_commas(value: Any) -> Any:
    """A comma-separated string as its parts; anything else as it is."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def as_str_tuple(name: str, value: Any) -> tuple[str, ...]:
    value = _split_commas(value)
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{name} must be a list of dotted paths, got {value!r}")
    return tuple(value)


def as_delays(name: str, value: Any) -> tuple[tuple[str, float], ...]:
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError:
            raise ConfigError(f"{name} must be a dict of lane -> seconds, got {value!r}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{name} must be a dict of lane -> seconds, got {value!r}")
    return tuple(
        (str(lane).lower(), as_number(f"{name}[{lane!r}]", seconds, float, 0))
        for lane, seconds in value.items()
    )


def as_names(name: str, value: Any) -> tuple[str, ...]:
    value = _split_commas(value)
    if not isinstance(value, (list, tuple)) or not all(
        isinstance(item, str) and item.strip() for item in value
    ):
        raise ConfigError(f"{name} must be a list of parameter names, got {value!r}")
    return tuple(item.strip() for item in value)
