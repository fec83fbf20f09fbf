from __future__ import annotations

import ast
import dataclasses
import difflib
import re
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import Settings

from scrapy_redisspine.settings import (
    DEFAULTS,
    SETTINGS,
    ConfigError,
    Setting,
    SpineConfig,
    Throttle,
    known_names,
    load_config,
)
from tests.test_docs import load_settings_reference

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def test_defaults() -> None:
    # Pinned here on purpose, apart from the declarations: a default that changes by
    # accident must fail a test, not slip through a second copy of the same table.
    assert dataclasses.asdict(load_config({})) == {
        "redis_url": None,
        "crawl_id": None,
        "key_prefix": "redisspine",
        "shards": 1,
        "persist": True,
        "flush_on_start": False,
        "serializer": "msgpack",
        "allowed_request_classes": (),
        "allowed_item_classes": (),
        "queue_order": "fifo",
        "lease_batch_size": 16,
        "enqueue_batch_size": 500,
        "enqueue_flush_seconds": 0.05,
        "ack_flush_seconds": 0.05,
        "local_request_cache": 10_000,
        "local_dedup_cache": 100_000,
        "idle_poll_seconds": 0.1,
        "redis_thread": True,
        "redis_greenlets": True,
        "lease_alongside": True,
        "redis_timeout_seconds": 5.0,
        "keep_alive": False,
        "wait_for_first_request": True,
        "idle_close_seconds": 0.0,
        "feed_key": "%(name)s:start_urls",
        "feed_batch_size": 100,
        "feed_seconds": 0.5,
        "heartbeat_seconds": 5.0,
        "worker_timeout_seconds": 30.0,
        "sweep_seconds": 5.0,
        "lease_ceiling_seconds": 3600.0,
        "max_requeues": 3,
        "memory_budget_bytes": 0,
        "host_concurrency": 1,
        "politeness_key": "host",
        "politeness_group": "default",
        "host_delays": (),
        "max_crawl_delay_seconds": 60.0,
        "max_retry_after_seconds": 600.0,
        "host_backlog_cap": 0,
        "host_page_limit": 0,
        "embedded_dir": None,
        "redis_server_bin": None,
        "items": False,
        "items_max_count": 0,
        "items_max_bytes": 0,
        "closespider_per_process": False,
        "limits_check_seconds": 0.5,
        "dedup_set_max_fingerprints": 2_000_000,
        "bloom_backend": "auto",
        "bloom_capacity": 10_000_000,
        "bloom_error_rate": 0.01,
        "dedup_migration_chunk_size": 200,
        "dedup_check_seconds": 5.0,
        "dedup_strip_tracking_params": False,
        "dedup_extra_tracking_params": (),
        "download_delay": 0.0,
        "download_delay_jitter": 0.5,
        "download_slots": (),
        "closespider_pagecount": 0,
        "closespider_itemcount": 0,
        "closespider_errorcount": 0,
        "closespider_timeout": 0.0,
        "autothrottle": None,
    }


def test_every_setting_is_prefixed_and_declared_once() -> None:
    names = [setting.name for setting in SETTINGS]
    assert len(names) == len(set(names))
    assert all(name.startswith("REDISSPINE_") for name in names)
    assert set(DEFAULTS) == set(names)


def test_known_names_are_the_declared_ones_and_find_a_misspelling() -> None:
    assert known_names() == {setting.name for setting in SETTINGS}
    assert difflib.get_close_matches("REDISSPINE_WORKER_TIMEOUT", known_names(), n=1) == [
        "REDISSPINE_WORKER_TIMEOUT_SECONDS"
    ]


def _declared(name: str) -> Setting:
    [setting] = [setting for setting in SETTINGS if setting.name == name]
    return setting


def test_field_is_the_name_without_the_prefix_unless_given() -> None:
    timeout = _declared("REDISSPINE_WORKER_TIMEOUT_SECONDS")
    assert timeout.field == "worker_timeout_seconds"
    assert Setting("REDISSPINE_X", None, timeout.check, (), "", field="other").field == "other"


def test_a_setting_reads_its_value_or_its_default_through_its_check() -> None:
    timeout = _declared("REDISSPINE_WORKER_TIMEOUT_SECONDS")  # 30.0, a number >= 1
    assert timeout.read({}) == 30.0
    assert timeout.read({"REDISSPINE_WORKER_TIMEOUT_SECONDS": None}) == 30.0
    assert timeout.read({"REDISSPINE_WORKER_TIMEOUT_SECONDS": "12"}) == 12.0
    with pytest.raises(ConfigError, match=r"REDISSPINE_WORKER_TIMEOUT_SECONDS .*>= 1"):
        timeout.read({"REDISSPINE_WORKER_TIMEOUT_SECONDS": 0.5})


#: Config fields read from Scrapy's own settings rather than a REDISSPINE_ one.
FROM_SCRAPY_SETTINGS = {
    "download_delay": "DOWNLOAD_DELAY",
    "download_delay_jitter": "DOWNLOAD_DELAY_JITTER",  # or RANDOMIZE_DOWNLOAD_DELAY
    "download_slots": "DOWNLOAD_SLOTS",
    "closespider_pagecount": "CLOSESPIDER_PAGECOUNT",
    "closespider_itemcount": "CLOSESPIDER_ITEMCOUNT",
    "closespider_errorcount": "CLOSESPIDER_ERRORCOUNT",
    "closespider_timeout": "CLOSESPIDER_TIMEOUT",
    "autothrottle": "AUTOTHROTTLE_ENABLED",  # and its _START_DELAY, _MAX_DELAY ...
}


def test_config_fields_and_declarations_agree_one_to_one() -> None:
    fields = {field.name for field in dataclasses.fields(SpineConfig)}
    declared = [setting.field for setting in SETTINGS]
    assert len(declared) == len(set(declared))
    assert fields == set(declared) | set(FROM_SCRAPY_SETTINGS)
    assert not set(declared) & set(FROM_SCRAPY_SETTINGS)


def test_config_repeats_no_default() -> None:
    with_default = [
        field.name for field in dataclasses.fields(SpineConfig)
        if field.default is not dataclasses.MISSING
        or field.default_factory is not dataclasses.MISSING
    ]
    assert not with_default, f"defaults belong in SETTINGS only: {with_default}"


def test_fields_from_scrapy_settings_are_read_from_them() -> None:
    defaults = load_config({})
    assert (defaults.download_delay, defaults.download_delay_jitter) == (0.0, 0.5)
    config = load_config({"DOWNLOAD_DELAY": "2.5", "DOWNLOAD_DELAY_JITTER": 0.2})
    assert (config.download_delay, config.download_delay_jitter) == (2.5, 0.2)
    assert load_config({"RANDOMIZE_DOWNLOAD_DELAY": "false"}).download_delay_jitter == 0.0


def test_milliseconds_for_the_scripts_are_whole_and_truncated() -> None:
    config = load_config(
        {"REDISSPINE_WORKER_TIMEOUT_SECONDS": 12.3456, "REDISSPINE_LEASE_CEILING_SECONDS": 0}
    )
    assert (config.worker_timeout_ms, config.lease_ceiling_ms) == (12_345, 0)
    assert isinstance(config.worker_timeout_ms, int)
    assert load_config({}).lease_ceiling_ms == 3_600_000


def test_config_is_frozen() -> None:
    config = load_config({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.persist = False  # type: ignore[misc]


def test_values_are_read_and_typed() -> None:
    config = load_config(
        {
            "REDISSPINE_REDIS_URL": "redis://example:6380/2",
            "REDISSPINE_CRAWL_ID": "books",
            "REDISSPINE_KEY_PREFIX": "spine",
            "REDISSPINE_PERSIST": "false",
            "REDISSPINE_FLUSH_ON_START": "1",
            "REDISSPINE_SERIALIZER": " JSON ",
            "REDISSPINE_ALLOWED_REQUEST_CLASSES": "a.B, c.D",
            "REDISSPINE_QUEUE_ORDER": "LIFO",
            "REDISSPINE_LEASE_BATCH_SIZE": "4",
            "REDISSPINE_ENQUEUE_BATCH_SIZE": 10,
            "REDISSPINE_ENQUEUE_FLUSH_SECONDS": "0",
            "REDISSPINE_IDLE_POLL_SECONDS": 0.5,
            "REDISSPINE_KEEP_ALIVE": True,
            "REDISSPINE_HEARTBEAT_SECONDS": "2",
            "REDISSPINE_WORKER_TIMEOUT_SECONDS": 12,
            "REDISSPINE_EMBEDDED_DIR": "/tmp/spine",
            "REDISSPINE_REDIS_SERVER_BIN": "/usr/bin/redis-server",
        }
    )
    assert config.redis_url == "redis://example:6380/2"
    assert config.crawl_id == "books"
    assert config.key_prefix == "spine"
    assert config.persist is False
    assert config.flush_on_start is True
    assert config.serializer == "json"
    assert config.allowed_request_classes == ("a.B", "c.D")
    assert config.queue_order == "lifo"
    assert config.lease_batch_size == 4
    assert isinstance(config.lease_batch_size, int)
    assert config.enqueue_batch_size == 10
    assert config.enqueue_flush_seconds == 0.0
    assert config.idle_poll_seconds == 0.5
    assert config.keep_alive is True
    assert config.heartbeat_seconds == 2.0
    assert isinstance(config.heartbeat_seconds, float)
    assert config.worker_timeout_seconds == 12.0
    assert config.embedded_dir == "/tmp/spine"
    assert config.redis_server_bin == "/usr/bin/redis-server"


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1", True), ("true", True), ("Yes", True), ("on", True), (1, True),
     ("0", False), ("False", False), ("no", False), ("OFF", False), (0, False)],
)
def test_boolean_spellings(text: Any, expected: bool) -> None:
    assert load_config({"REDISSPINE_PERSIST": text}).persist is expected


def test_allowed_classes_as_list() -> None:
    config = load_config({"REDISSPINE_ALLOWED_REQUEST_CLASSES": ["a.B", "c.D"]})
    assert config.allowed_request_classes == ("a.B", "c.D")


def test_scrapy_settings_object_is_accepted() -> None:
    settings = Settings({"REDISSPINE_LEASE_BATCH_SIZE": "3", "REDISSPINE_PERSIST": "False"})
    config = load_config(settings)
    assert config.lease_batch_size == 3
    assert config.persist is False
    assert config.key_prefix == "redisspine"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REDISSPINE_PERSIST", "maybe"),
        ("REDISSPINE_FLUSH_ON_START", 2),
        ("REDISSPINE_KEEP_ALIVE", 1.5),
        ("REDISSPINE_LEASE_BATCH_SIZE", 0),
        ("REDISSPINE_LEASE_BATCH_SIZE", "many"),
        ("REDISSPINE_ENQUEUE_BATCH_SIZE", -1),
        ("REDISSPINE_ENQUEUE_FLUSH_SECONDS", -0.5),
        ("REDISSPINE_IDLE_POLL_SECONDS", 0),
        ("REDISSPINE_HEARTBEAT_SECONDS", "soon"),
        ("REDISSPINE_WORKER_TIMEOUT_SECONDS", 0.5),
        ("REDISSPINE_SERIALIZER", "pickle"),
        ("REDISSPINE_QUEUE_ORDER", "random"),
        ("REDISSPINE_CRAWL_ID", 42),
        ("REDISSPINE_REDIS_URL", 6379),
        ("REDISSPINE_EMBEDDED_DIR", ["/tmp"]),
        ("REDISSPINE_ALLOWED_REQUEST_CLASSES", ["a.B", 3]),
    ],
)
def test_bad_value_is_rejected_naming_the_setting(name: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=name):
        load_config({name: value})


def test_bad_value_message_shows_the_value() -> None:
    with pytest.raises(ConfigError, match="'pickle'"):
        load_config({"REDISSPINE_SERIALIZER": "pickle"})
    with pytest.raises(ConfigError, match=">= 1"):
        load_config({"REDISSPINE_LEASE_BATCH_SIZE": 0})


def test_choice_message_lists_the_choices() -> None:
    with pytest.raises(ConfigError, match="msgpack, json"):
        load_config({"REDISSPINE_SERIALIZER": "pickle"})


def test_allowed_classes_that_are_not_a_list_are_rejected_naming_the_setting() -> None:
    # A non-iterable must give the ConfigError, not a bare TypeError from iterating it.
    with pytest.raises(ConfigError, match="REDISSPINE_ALLOWED_REQUEST_CLASSES"):
        load_config({"REDISSPINE_ALLOWED_REQUEST_CLASSES": 5})


@pytest.mark.parametrize("value", ["nan", float("nan")])
def test_nan_interval_is_rejected(value: Any) -> None:
    # NaN compares False with the minimum, so a bare `< minimum` check lets it through.
    with pytest.raises(ConfigError, match="REDISSPINE_HEARTBEAT_SECONDS"):
        load_config({"REDISSPINE_HEARTBEAT_SECONDS": value})


def test_fractional_batch_size_is_rejected_not_truncated() -> None:
    # "2.5" (a string) is refused; 2.5 (a float) must not silently become 2.
    with pytest.raises(ConfigError, match="REDISSPINE_LEASE_BATCH_SIZE"):
        load_config({"REDISSPINE_LEASE_BATCH_SIZE": "2.5"})
    with pytest.raises(ConfigError, match="REDISSPINE_LEASE_BATCH_SIZE"):
        load_config({"REDISSPINE_LEASE_BATCH_SIZE": 2.5})


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"REDISSPINE_BLOOM_ERROR_RATE": 1},
         "REDISSPINE_BLOOM_ERROR_RATE must be between 0 and 1, got 1.0"),
        ({"REDISSPINE_BLOOM_CAPACITY": 10**13},
         "REDISSPINE_BLOOM_CAPACITY: a Bloom filter for 10000000000000 fingerprints"),
        ({"REDISSPINE_DEDUP_MIGRATION_CHUNK_SIZE": 5001},
         "REDISSPINE_DEDUP_MIGRATION_CHUNK_SIZE must be at most 5000, got 5001"),
        ({"REDISSPINE_HEARTBEAT_SECONDS": 16, "REDISSPINE_WORKER_TIMEOUT_SECONDS": 30},
         "REDISSPINE_HEARTBEAT_SECONDS (16.0) must be at most half of "
         "REDISSPINE_WORKER_TIMEOUT_SECONDS (30.0), or live workers would be taken for dead"),
    ],
)
def test_rules_beyond_a_single_check_name_the_setting(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config(settings)
    assert str(raised.value).startswith(message)


def test_redis_url_falls_back_to_redis_url() -> None:
    assert load_config({"REDIS_URL": "redis://fallback/1"}).redis_url == "redis://fallback/1"


def test_own_redis_url_wins_over_redis_url() -> None:
    config = load_config(
        {"REDIS_URL": "redis://fallback/1", "REDISSPINE_REDIS_URL": "redis://own/2"}
    )
    assert config.redis_url == "redis://own/2"


def test_empty_redis_url_means_unset() -> None:
    config = load_config({"REDISSPINE_REDIS_URL": "", "REDIS_URL": "redis://fallback/1"})
    assert config.redis_url == "redis://fallback/1"
    assert load_config({"REDISSPINE_REDIS_URL": ""}).redis_url is None


def test_bad_fallback_url_is_rejected_naming_redis_url() -> None:
    with pytest.raises(ConfigError, match="REDIS_URL"):
        load_config({"REDIS_URL": 6379})


# -- no hand-written copy of the settings table -------------------------------------
# The one table users read is the docs' settings reference, generated from SETTINGS when
# the docs are built (tests/test_docs.py checks it has every setting with its declared
# default). A hand-written table anywhere else is a copy that drifts, so none may exist.


def _table_rows(text: str) -> dict[str, list[str]]:
    """The cells after the name, by the name in the first cell of a Markdown table row."""
    rows = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|") or not cells:
            continue
        match = re.fullmatch(r"`?(REDISSPINE_[A-Z0-9_]+)`?", cells[0])
        if match:
            rows[match.group(1)] = cells[1:]
    return rows


def _table_settings(text: str) -> set[str]:
    """Names in the first cell of any Markdown table row of the text."""
    return set(_table_rows(text))


def test_table_parser_reads_names_in_and_out_of_backticks() -> None:
    text = (
        "| Setting | Default | Meaning |\n|---|---|---|\n"
        "| `REDISSPINE_PERSIST` | `True` | keep |\n"
        "| REDISSPINE_SERIALIZER | msgpack | how |\n"
        "REDISSPINE_KEEP_ALIVE is mentioned in prose only.\n"
    )
    assert _table_settings(text) == {"REDISSPINE_PERSIST", "REDISSPINE_SERIALIZER"}


def test_the_readme_has_no_settings_table() -> None:
    assert _table_settings(README.read_text("utf-8")) == set()


def test_no_docs_page_has_a_hand_written_settings_table() -> None:
    pages = sorted(DOCS.glob("*.md"))
    assert DOCS / "settings.md" in pages
    copies = {page.name: sorted(found) for page in pages
              if (found := _table_settings(page.read_text("utf-8")))}
    assert copies == {}, f"settings tables written by hand (a copy that drifts): {copies}"


def test_the_generated_reference_lists_only_declared_settings() -> None:
    # What test_docs.py checks row by row, seen through this file's parser: the same
    # names, no unknown one, each with its declared default.
    rows = _table_rows(load_settings_reference().settings_table())
    assert list(rows) == [setting.name for setting in SETTINGS]
    assert set(rows) <= set(DEFAULTS)
    wrong = {
        setting.name: rows[setting.name][0]
        for setting in SETTINGS
        if ast.literal_eval(rows[setting.name][0].strip("`")) != setting.default
    }
    assert not wrong, f"reference defaults that differ from SETTINGS: {wrong}"


def test_allowed_item_classes() -> None:
    assert load_config({}).allowed_item_classes == ()
    config = load_config({"REDISSPINE_ALLOWED_ITEM_CLASSES": "shop.items.Product, vendor"})
    assert config.allowed_item_classes == ("shop.items.Product", "vendor")
    config = load_config(Settings({"REDISSPINE_ALLOWED_ITEM_CLASSES": ["a.B"]}))
    assert config.allowed_item_classes == ("a.B",)
    with pytest.raises(ConfigError, match="REDISSPINE_ALLOWED_ITEM_CLASSES"):
        load_config({"REDISSPINE_ALLOWED_ITEM_CLASSES": ["a.B", 3]})


def test_autothrottle_is_read_from_scrapys_settings() -> None:
    config = load_config({"AUTOTHROTTLE_ENABLED": True, "AUTOTHROTTLE_START_DELAY": "2",
                          "AUTOTHROTTLE_TARGET_CONCURRENCY": 2.0, "AUTOTHROTTLE_DEBUG": "1"})
    assert config.autothrottle == Throttle(2.0, 60.0, 2.0, True)
    assert load_config({"AUTOTHROTTLE_ENABLED": False}).autothrottle is None


def test_autothrottle_target_concurrency_must_be_above_zero() -> None:
    with pytest.raises(ConfigError, match="AUTOTHROTTLE_TARGET_CONCURRENCY"):
        load_config({"AUTOTHROTTLE_ENABLED": True, "AUTOTHROTTLE_TARGET_CONCURRENCY": 0})
