"""The config of the plugin's extensions and middlewares, and when they stay off.

A bad setting is the scheduler's to report: it logs one line naming it and the
worker closes, so beside it these components just stay off (quietly: Scrapy would
log each of them too). Beside another scheduler they say why they are off.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_redisspine.settings import SpineConfig


def component_config(crawler: Crawler) -> SpineConfig:
    """The config, or NotConfigured (with the reason unless our scheduler runs)."""
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
