from __future__ import annotations

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
