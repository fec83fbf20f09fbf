"""Settings from elsewhere: scrapy-redis's names, and Scrapy's that the plugin replaces.

A project that switches from scrapy-redis keeps its settings.py for a while, and a
project that switches on the add-on keeps its Scrapy queue settings: none of them
may be ignored silently. :func:`foreign_values` maps scrapy-redis's settings onto
ours (when ours are unset); :func:`notices` says, one line each, what was mapped,
what has no effect under the plugin and what it does instead, and which
``REDISSPINE_*`` names are unknown (with the closest known one). Scrapy-free.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from scrapy_redisspine._settings_checks import ConfigError, as_bool

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

PREFIX = "REDISSPINE_"

#: scrapy-redis setting -> ours (same meaning, same values).
_SAME_AS = {
    "SCHEDULER_PERSIST": "REDISSPINE_PERSIST",
    "SCHEDULER_FLUSH_ON_START": "REDISSPINE_FLUSH_ON_START",
}
#: scrapy-redis setting -> ours, the value passed on as it is (our check reads it).
_CARRIED = {
    "REDIS_START_URLS_KEY": "REDISSPINE_FEED_KEY",
    "REDIS_START_URLS_BATCH_SIZE": "REDISSPINE_FEED_BATCH_SIZE",
}
#: scrapy-redis settings with no equivalent here: why, and what to use instead.
_REFUSED = {
    "SCHEDULER_IDLE_BEFORE_CLOSE": "workers close when the whole fleet has nothing "
    "left; to stay open for requests fed from outside set REDISSPINE_KEEP_ALIVE = True",
    "SCHEDULER_QUEUE_CLASS": "the queue is the plugin's own (priorities per host, "
    "REDISSPINE_QUEUE_ORDER for FIFO or LIFO)",
    "SCHEDULER_QUEUE_KEY": "key names come from REDISSPINE_KEY_PREFIX and "
    "REDISSPINE_CRAWL_ID",
    "SCHEDULER_DUPEFILTER_KEY": "key names come from REDISSPINE_KEY_PREFIX and "
    "REDISSPINE_CRAWL_ID",
    "SCHEDULER_SERIALIZER": "requests are stored as data (REDISSPINE_SERIALIZER: msgpack "
    "or json), never pickled",
}
#: Scrapy settings the plugin's scheduler makes moot: what it does instead.
_REPLACED = {
    "SCHEDULER_PRIORITY_QUEUE": "the queue lives in Redis: request.priority orders each "
    "host's requests, politeness orders the hosts",
    "SCHEDULER_MEMORY_QUEUE": "the queue lives in Redis",
    "SCHEDULER_DISK_QUEUE": "the queue lives in Redis",
    "SCHEDULER_START_MEMORY_QUEUE": "start requests enter the shared queue in Redis",
    "SCHEDULER_START_DISK_QUEUE": "start requests enter the shared queue in Redis",
    "JOBDIR": "the crawl persists in Redis (REDISSPINE_PERSIST); JOBDIR keeps only "
    "spider.state",
}
_SCRAPY_REDIS_PARAMS = {"password", "username", "db", "ssl"}


class Layered(Mapping[str, Any]):
    """``values`` over ``settings``: what load_config reads."""

    def __init__(self, values: Mapping[str, Any], settings: Mapping[str, Any]) -> None:
        self._values = values
        self._settings = settings

    def __getitem__(self, name: str) -> Any:
        return self._values[name] if name in self._values else self._settings[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self._values[name] if name in self._values else self._settings.get(name, default)

    def __iter__(self) -> Iterator[str]:
        yield from self._values
        yield from (name for name in self._settings if name not in self._values)

    def __len__(self) -> int:
        return len(set(self._values) | set(self._settings))


def foreign_values(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Our setting names with the values scrapy-redis's settings give them, where ours
    are unset; ``REDIS_HOST``/``REDIS_PORT``/``REDIS_PARAMS`` become a URL."""
    values: dict[str, Any] = {
        ours: as_bool(theirs, settings.get(theirs))
        for theirs, ours in _SAME_AS.items()
        if settings.get(theirs) is not None and settings.get(ours) is None
    }
    values.update({
        ours: settings.get(theirs) for theirs, ours in _CARRIED.items()
        if settings.get(theirs) is not None and settings.get(ours) is None
    })
    if (settings.get("REDISSPINE_REDIS_URL") is None and settings.get("REDIS_URL") is None
            and _has_host_settings(settings)):
        values["REDISSPINE_REDIS_URL"] = _url_from_host_settings(settings)
    return values


def _has_host_settings(settings: Mapping[str, Any]) -> bool:
    return any(settings.get(name) is not None
               for name in ("REDIS_HOST", "REDIS_PORT", "REDIS_PARAMS"))


def _url_from_host_settings(settings: Mapping[str, Any]) -> str:
    """scrapy-redis's connection settings as one URL (its defaults: localhost:6379)."""
    host = str(settings.get("REDIS_HOST") or "localhost")
    try:
        port = int(settings.get("REDIS_PORT") or 6379)
    except (TypeError, ValueError):
        raise ConfigError(f"REDIS_PORT must be a port number, got "
                          f"{settings.get('REDIS_PORT')!r}") from None
    params = settings.get("REDIS_PARAMS") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"REDIS_PARAMS must be a dict, got {type(params).__name__}")
    unknown = sorted(set(params) - _SCRAPY_REDIS_PARAMS)
    if unknown:
        raise ConfigError(
            f"REDIS_PARAMS {unknown} cannot be carried over (only password, username, db "
            f"and ssl can): set REDISSPINE_REDIS_URL instead"
        )
    auth = ""
    if params.get("password"):
        auth = f"{quote(str(params.get('username') or ''))}:{quote(str(params['password']))}@"
    scheme = "rediss" if params.get("ssl") else "redis"
    return f"{scheme}://{auth}{host}:{port}/{int(params.get('db') or 0)}"


def notices(settings: Mapping[str, Any], known: Iterable[str]) -> list[tuple[bool, str]]:
    """(is a warning, one line) for every setting from elsewhere that was carried
    over, has no effect, or is misspelt."""
    lines: list[tuple[bool, str]] = []
    for theirs, ours in (*_SAME_AS.items(), *_CARRIED.items()):
        if settings.get(theirs) is not None:
            lines.append((False, f"{theirs} (scrapy-redis) is read as {ours}"
                          + ("" if settings.get(ours) is None else f"; {ours} is set and wins")))
    if _has_host_settings(settings):
        lines.append((False, "REDIS_HOST/REDIS_PORT/REDIS_PARAMS (scrapy-redis) give the "
                      "Redis URL, unless REDISSPINE_REDIS_URL or REDIS_URL is set"))
    for name, instead in _REFUSED.items():
        if settings.get(name) is not None:
            lines.append((True, f"{name} (scrapy-redis) has no effect: {instead}"))
    lines += _replaced(settings)
    lines += _unknown(settings, set(known))
    return lines


def _user_set(settings: Mapping[str, Any], name: str) -> bool:
    """Set by the project, a spider or the command line, not Scrapy's default."""
    priority = getattr(settings, "getpriority", None)
    if priority is None:
        return settings.get(name) is not None
    return settings.get(name) not in (None, "") and (priority(name) or 0) > 0


def _replaced(settings: Mapping[str, Any]) -> list[tuple[bool, str]]:
    lines = [(True, f"{name} has no effect with scrapy_redisspine: {instead}")
             for name, instead in _REPLACED.items() if _user_set(settings, name)]
    if _user_set(settings, "AUTOTHROTTLE_ENABLED") and as_bool(
        "AUTOTHROTTLE_ENABLED", settings.get("AUTOTHROTTLE_ENABLED")
    ):
        lines.append((True, "AUTOTHROTTLE_ENABLED throttles each worker on its own, on top "
                      "of the fleet-wide per-host delay: use DOWNLOAD_DELAY and "
                      "REDISSPINE_HOST_DELAYS (applied fleet-wide) instead"))
    return lines


def _unknown(settings: Mapping[str, Any], known: set[str]) -> list[tuple[bool, str]]:
    lines = []
    # Compared without the prefix every name shares, which would make all look alike.
    bare = {name.removeprefix(PREFIX): name for name in known}
    for name in sorted(str(name) for name in settings):
        if name.startswith(PREFIX) and name not in known:
            close = difflib.get_close_matches(name.removeprefix(PREFIX), sorted(bare), n=1,
                                              cutoff=0.75)
            hint = (f": did you mean {bare[close[0]]}?" if close
                    else " (see the settings reference in the docs)")
            lines.append((True, f"unknown setting {name}{hint}"))
    return lines
