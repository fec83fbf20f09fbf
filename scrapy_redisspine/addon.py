"""One line in ``ADDONS`` switches the plugin on.

Sets the scheduler and the dupefilter with the ``addon`` priority, so a project that
sets them explicitly in settings.py still wins, and enables the recovery extension
(the sweep that requeues the work of dead workers), the fleet log line and the politeness downloader
middleware (Retry-After and robots.txt Crawl-delay, shared fleet-wide).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import Settings

    from scrapy_redisspine.settings import SpineConfig


logger = logging.getLogger(__name__)


class Addon:
    """``ADDONS = {"scrapy_redisspine.Addon": 0}``"""

    def update_settings(self, settings: Settings) -> None:
        settings.set("SCHEDULER", "scrapy_redisspine.scheduler.Scheduler", "addon")
        settings.set(
            "DUPEFILTER_CLASS", "scrapy_redisspine.dupefilter.RedisDupeFilter", "addon"
        )
        # (DUPEFILTER_CLASS needs no such check: the scheduler says what it does with
        # whichever one it finds, see dupefilter.fleet_dupefilter.)
        _warn_if_overridden(settings, "SCHEDULER", "scrapy_redisspine.scheduler.Scheduler")
        from scrapy_redisspine.extension import FleetLog, Recovery
        from scrapy_redisspine.middleware import Politeness

        settings.setdefault_in_component_priority_dict("EXTENSIONS", Recovery, 500)
        settings.setdefault_in_component_priority_dict("EXTENSIONS", FleetLog, 510)
        # After RetryMiddleware (550) on the way in: sees 429/503 before it retries.
        settings.setdefault_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", Politeness, 560)
        from scrapy_redisspine.startmw import StartRequests

        # Outermost (below Scrapy's StartSpiderMiddleware, 25): it sees the very
        # request objects start() hands the scheduler.
        settings.setdefault_in_component_priority_dict("SPIDER_MIDDLEWARES", StartRequests, 5)


def _warn_if_overridden(settings: Settings, name: str, ours: str) -> None:
    """A project that still sets another plugin's component (scrapy-redis's, say)
    beside the add-on would run that one: say so, naming both."""
    from scrapy.utils.misc import load_object

    value = settings.get(name)
    try:
        cls = load_object(value) if isinstance(value, str) else value
        # BaseScheduler's metaclass answers issubclass() by duck typing: ask the MRO
        fine = isinstance(cls, type) and load_object(ours) in cls.__mro__
    except (ImportError, NameError, ValueError, AttributeError):
        fine = False
    if not fine:
        name_of = value if isinstance(value, str) else getattr(value, "__qualname__", value)
        logger.warning(
            "redisspine: ADDONS switches scrapy_redisspine on, but %s is %s (set with a "
            "higher priority than the add-on's): that one runs, not %s. Remove %s from "
            "your settings.", name, name_of, ours, name,
        )


def component_config(crawler: Crawler) -> SpineConfig:
    """The config of the plugin's extensions and middleware.

    A bad setting is the scheduler's to report: it logs one line naming it and the
    worker closes, so beside it these components just stay off (quietly: Scrapy
    would log each of them too). Beside another scheduler they say why they are off.
    """
    from scrapy.exceptions import NotConfigured
    from scrapy.utils.misc import load_object

    from scrapy_redisspine.settings import ConfigError, load_config

    try:
        return load_config(crawler.settings)
    except ConfigError as exc:
        from scrapy_redisspine.scheduler import Scheduler

        scheduler = crawler.settings.get("SCHEDULER")
        try:
            cls = load_object(scheduler) if isinstance(scheduler, str) else scheduler
            ours = isinstance(cls, type) and Scheduler in cls.__mro__
        except (ImportError, NameError, ValueError, TypeError):
            ours = False
        raise NotConfigured() if ours else NotConfigured(f"redisspine: {exc}") from None
