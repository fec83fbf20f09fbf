from __future__ import annotations

import logging

import pytest
from scrapy import Spider
from scrapy.settings import SETTINGS_PRIORITIES
from scrapy.utils.test import get_crawler

from scrapy_redisspine import Addon

SCHEDULER = "scrapy_redisspine.scheduler.Scheduler"
DUPEFILTER = "scrapy_redisspine.dupefilter.RedisDupeFilter"


class AddonSpider(Spider):
    name = "addon"


def test_addon_sets_scheduler_and_dupefilter_at_addon_priority() -> None:
    crawler = get_crawler(AddonSpider, {"ADDONS": {Addon: 0}})
    settings = crawler.settings
    assert settings["SCHEDULER"] == SCHEDULER
    assert settings["DUPEFILTER_CLASS"] == DUPEFILTER
    assert settings.getpriority("SCHEDULER") == settings.getpriority("DUPEFILTER_CLASS")
    assert settings.getpriority("SCHEDULER") == SETTINGS_PRIORITIES["addon"]


def test_addon_by_dotted_path() -> None:
    crawler = get_crawler(AddonSpider, {"ADDONS": {"scrapy_redisspine.Addon": 0}})
    assert crawler.settings["SCHEDULER"] == SCHEDULER
    assert crawler.settings["DUPEFILTER_CLASS"] == DUPEFILTER


def test_explicit_project_setting_wins_over_the_addon() -> None:
    crawler = get_crawler(
        AddonSpider,
        {
            "ADDONS": {Addon: 0},
            "SCHEDULER": "scrapy.core.scheduler.Scheduler",
            "DUPEFILTER_CLASS": "scrapy.dupefilters.BaseDupeFilter",
        },
    )
    assert crawler.settings["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"
    assert crawler.settings["DUPEFILTER_CLASS"] == "scrapy.dupefilters.BaseDupeFilter"


def test_one_explicit_setting_leaves_the_other_to_the_addon() -> None:
    crawler = get_crawler(
        AddonSpider,
        {"ADDONS": {Addon: 0}, "DUPEFILTER_CLASS": "scrapy.dupefilters.BaseDupeFilter"},
    )
    assert crawler.settings["SCHEDULER"] == SCHEDULER
    assert crawler.settings["DUPEFILTER_CLASS"] == "scrapy.dupefilters.BaseDupeFilter"


def test_without_the_addon_scrapy_defaults_stay() -> None:
    crawler = get_crawler(AddonSpider)
    assert crawler.settings["SCHEDULER"] != SCHEDULER
    assert crawler.settings["DUPEFILTER_CLASS"] != DUPEFILTER


@pytest.mark.parametrize(("argv", "command"), [
    (["/usr/bin/python3", "-m", "scrapy", "shell", "http://a/", "-c", "1"], "shell"),
    (["/usr/bin/python3", "/venv/bin/scrapy", "crawl", "books", "-s", "X=1"], "crawl"),
    (["/usr/bin/python3", "-m", "scrapy", "bench", "-s", "CLOSESPIDER_TIMEOUT=2"], "bench"),
    (["/usr/bin/python3", "-m", "scrapy.cmdline", "fetch", "-s", "A=1", "http://a/"], "fetch"),
    (["/usr/bin/python3", "-m", "scrapy.cmdline", "crawl", "books"], "crawl"),
    (["/usr/bin/python3", "-m", "pytest", "tests"], None),
    (["/usr/bin/python3", "run.py", "scrapy"], None),
])
def test_the_scrapy_command_is_read_from_the_command_line(
    argv: list[str], command: str | None
) -> None:
    from scrapy_redisspine.addon import scrapy_command

    assert scrapy_command(argv) == command


def test_a_command_that_does_not_crawl_keeps_scrapys_scheduler(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import sys

    from scrapy.settings import Settings

    from scrapy_redisspine.addon import Addon

    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "scrapy", "fetch", "http://a/"])
    settings = Settings()
    with caplog.at_level(logging.INFO, logger="scrapy_redisspine"):
        Addon().update_settings(settings)
    assert settings["SCHEDULER"] == "scrapy.core.scheduler.Scheduler"
    assert "`scrapy fetch` runs on its own" in caplog.text


def test_reactorless_mode_is_taken_like_any_other() -> None:
    # The add-on's timers run on asyncio's loop when there is no reactor
    # (tests/integration/test_reactorless_e2e.py crawls so): nothing to refuse.
    from scrapy.settings import Settings

    settings = Settings({"TWISTED_REACTOR_ENABLED": False})
    Addon().update_settings(settings)
    assert settings["SCHEDULER"] == SCHEDULER


def test_features_left_off_by_default_are_disabled_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Scrapy logs a WARNING for every component that raises NotConfigured with a
    # message: a feature the user never asked for must stay quiet (found by Scrapy's
    # own test_spidermiddleware_metacopy, which asserts no warning at all).
    from scrapy.extension import ExtensionManager
    from scrapy.utils.misc import build_from_crawler

    crawler = get_crawler(AddonSpider, {"ADDONS": {Addon: 0}})
    with caplog.at_level(logging.WARNING):
        build_from_crawler(ExtensionManager, crawler)
    assert [r.getMessage() for r in caplog.records if "redisspine" in r.getMessage()] == []


def test_scrapys_own_autothrottle_is_not_active_under_the_addon() -> None:
    """With AUTOTHROTTLE_ENABLED the fleet throttles each lane in Redis: Scrapy's
    per-process extension must not run on top (the two would stack)."""
    from scrapy.extension import ExtensionManager
    from scrapy.extensions.throttle import AutoThrottle
    from scrapy.utils.misc import build_from_crawler

    settings = {"AUTOTHROTTLE_ENABLED": True, "REDISSPINE_REDIS_URL": "redis://127.0.0.1:1"}
    plain = build_from_crawler(ExtensionManager, get_crawler(AddonSpider, settings))
    assert any(isinstance(ext, AutoThrottle) for ext in plain.middlewares), "the control"
    crawler = get_crawler(AddonSpider, {**settings, "ADDONS": {Addon: 0}})
    extensions = build_from_crawler(ExtensionManager, crawler)
    assert not any(isinstance(ext, AutoThrottle) for ext in extensions.middlewares)
    assert crawler.settings.getbool("AUTOTHROTTLE_ENABLED"), "left on for the fleet's rule"


def test_a_project_enabling_autothrottle_by_hand_still_gets_it_off() -> None:
    from scrapy.extension import ExtensionManager
    from scrapy.extensions.throttle import AutoThrottle
    from scrapy.utils.misc import build_from_crawler

    crawler = get_crawler(AddonSpider, {
        "ADDONS": {Addon: 0}, "AUTOTHROTTLE_ENABLED": True,
        "EXTENSIONS": {"scrapy.extensions.throttle.AutoThrottle": 0},
    })
    extensions = build_from_crawler(ExtensionManager, crawler)
    assert not any(isinstance(ext, AutoThrottle) for ext in extensions.middlewares)
