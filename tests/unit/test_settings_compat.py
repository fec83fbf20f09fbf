"""Settings from elsewhere are never ignored silently: scrapy-redis's are carried
over or refused by name, Scrapy's queue settings the plugin replaces are warned
about, misspelt REDISSPINE_ names get the closest known one."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler

from scrapy_redisspine._settings_compat import notices
from scrapy_redisspine.settings import ConfigError, known_names, load_config


def _project(**values: Any) -> Settings:
    """Scrapy's defaults with ``values`` set the way settings.py sets them."""
    settings = Settings()
    for name, value in values.items():
        settings.set(name, value, priority="project")
    return settings


def _lines(settings: Any) -> list[tuple[bool, str]]:
    return notices(settings, known_names())


@pytest.mark.parametrize(("theirs", "field"), [
    ("SCHEDULER_PERSIST", "persist"), ("SCHEDULER_FLUSH_ON_START", "flush_on_start"),
])
def test_scrapy_redis_flags_are_carried_over_unless_ours_are_set(theirs: str, field: str) -> None:
    default = getattr(load_config({}), field)
    assert getattr(load_config({theirs: not default}), field) is (not default)
    ours = theirs.replace("SCHEDULER_", "REDISSPINE_")
    assert getattr(load_config({theirs: not default, ours: default}), field) is default
    (line,) = _lines({theirs: not default})
    assert line == (False, f"{theirs} (scrapy-redis) is read as {ours}")


@pytest.mark.parametrize(("settings", "url"), [
    ({"REDIS_HOST": "redis.internal"}, "redis://redis.internal:6379/0"),
    ({"REDIS_HOST": "h", "REDIS_PORT": "6380"}, "redis://h:6380/0"),
    ({"REDIS_HOST": "h", "REDIS_PARAMS": {"password": "p@ss", "db": 2}}, "redis://:p%40ss@h:6379/2"),
    ({"REDIS_PARAMS": {"ssl": True, "username": "u", "password": "p"}},
     "rediss://u:p@localhost:6379/0"),
])
def test_scrapy_redis_host_settings_give_the_url(settings: dict[str, Any], url: str) -> None:
    # A project configured the scrapy-redis way must never fall back to an embedded
    # Redis of its own (on several machines each would run a crawl of its own).
    assert load_config(settings).redis_url == url


def test_our_url_or_redis_url_wins_over_host_settings() -> None:
    assert load_config({"REDIS_HOST": "h", "REDIS_URL": "redis://u/1"}).redis_url == "redis://u/1"
    assert load_config({"REDIS_HOST": "h", "REDISSPINE_REDIS_URL": "redis://o/1"}).redis_url == (
        "redis://o/1"
    )


def test_scrapy_redis_start_urls_settings_name_the_feed_key() -> None:
    config = load_config({"REDIS_START_URLS_KEY": "%(name)s:urls",
                          "REDIS_START_URLS_BATCH_SIZE": "16"})
    assert (config.feed_key, config.feed_batch_size) == ("%(name)s:urls", 16)
    ours = load_config({"REDIS_START_URLS_KEY": "x", "REDISSPINE_FEED_KEY": "y"})
    assert ours.feed_key == "y"
    (line,) = _lines({"REDIS_START_URLS_KEY": "x"})
    assert line == (False, "REDIS_START_URLS_KEY (scrapy-redis) is read as REDISSPINE_FEED_KEY")


@pytest.mark.parametrize(("settings", "said"), [
    ({"REDIS_HOST": "h", "REDIS_PARAMS": {"socket_timeout": 3}}, "socket_timeout"),
    ({"REDIS_PORT": "sixty"}, "REDIS_PORT"),
    ({"REDIS_PARAMS": "password=x"}, "REDIS_PARAMS must be a dict"),
])
def test_host_settings_that_cannot_be_carried_over_are_refused(
    settings: dict[str, Any], said: str
) -> None:
    with pytest.raises(ConfigError, match=said):
        load_config(settings)


@pytest.mark.parametrize("name", [
    "SCHEDULER_IDLE_BEFORE_CLOSE", "SCHEDULER_QUEUE_CLASS", "SCHEDULER_SERIALIZER",
])
def test_scrapy_redis_settings_without_an_equivalent_are_warned_about(name: str) -> None:
    (line,) = _lines({name: "x"})
    assert line[0]
    assert line[1].startswith(f"{name} (scrapy-redis) has no effect: ")


@pytest.mark.parametrize("name", [
    "SCHEDULER_PRIORITY_QUEUE", "SCHEDULER_MEMORY_QUEUE", "SCHEDULER_DISK_QUEUE",
    "SCHEDULER_START_MEMORY_QUEUE", "SCHEDULER_START_DISK_QUEUE", "JOBDIR",
])
def test_scrapy_queue_settings_the_plugin_replaces_are_warned_about(name: str) -> None:
    assert _lines(Settings()) == [], "Scrapy's own defaults are not the user's doing"
    (line,) = _lines(_project(**{name: "x"}))
    assert line[0]
    assert line[1].startswith(f"{name} has no effect with scrapy_redisspine: ")


def test_autothrottle_is_warned_about() -> None:
    assert _lines(_project(AUTOTHROTTLE_ENABLED=False)) == []
    (line,) = _lines(_project(AUTOTHROTTLE_ENABLED=True))
    assert "AUTOTHROTTLE_ENABLED" in line[1]
    assert "fleet-wide" in line[1]


def test_a_misspelt_setting_gets_the_closest_known_name() -> None:
    lines = _lines({"REDISSPINE_HOST_CONCURENCY": 2, "REDISSPINE_NONSENSE_XYZ": 1,
                    "REDISSPINE_HOST_CONCURRENCY": 1})
    assert lines == [
        (True, "unknown setting REDISSPINE_HOST_CONCURENCY: did you mean "
               "REDISSPINE_HOST_CONCURRENCY?"),
        (True, "unknown setting REDISSPINE_NONSENSE_XYZ (see the settings reference in the docs)"),
    ]


def test_the_scheduler_logs_each_notice_once(caplog: pytest.LogCaptureFixture) -> None:
    from scrapy_redisspine.scheduler import Scheduler
    from tests.unit.conftest import FakeEngine

    crawler = get_crawler(Spider, {"SCHEDULER_PERSIST": False, "JOBDIR": "/tmp/x",
                                   "REDISSPINE_HOST_CONCURENCY": 2})
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        scheduler = Scheduler.from_crawler(crawler, engine=FakeEngine())
    messages = [r.getMessage() for r in caplog.records]
    assert any("SCHEDULER_PERSIST (scrapy-redis) is read as REDISSPINE_PERSIST" in m
               for m in messages)
    assert any("JOBDIR has no effect" in m for m in messages)
    assert any("did you mean REDISSPINE_HOST_CONCURRENCY" in m for m in messages)
    assert scheduler.config.persist is False


def test_the_add_on_warns_when_another_scheduler_is_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from scrapy_redisspine.addon import Addon

    settings = _project(SCHEDULER="scrapy.core.scheduler.Scheduler")
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
        Addon().update_settings(settings)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "scrapy.core.scheduler.Scheduler" in line
    assert "scrapy_redisspine.scheduler.Scheduler" in line
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="scrapy_redisspine"):
        Addon().update_settings(Settings())
    assert not caplog.records
