"""One line in ``ADDONS`` switches the plugin on.

Sets the scheduler and the dupefilter with the ``addon`` priority, so a project that
sets them explicitly in settings.py still wins, and enables the recovery extension
(the sweep that requeues the work of dead workers), the fleet log line and the politeness downloader
middleware (Retry-After and robots.txt Crawl-delay, shared fleet-wide).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrapy.settings import Settings


class Addon:
    """``ADDONS = {"scrapy_redisspine.Addon": 0}``"""

    def update_settings(self, settings: Settings) -> None:
        settings.set("SCHEDULER", "scrapy_redisspine.scheduler.Scheduler", "addon")
        settings.set(
            "DUPEFILTER_CLASS", "scrapy_redisspine.dupefilter.RedisDupeFilter", "addon"
        )
        from scrapy_redisspine.extension import FleetLog, Recovery
        from scrapy_redisspine.middleware import Politeness

        settings.setdefault_in_component_priority_dict("EXTENSIONS", Recovery, 500)
        settings.setdefault_in_component_priority_dict("EXTENSIONS", FleetLog, 510)
        # After RetryMiddleware (550) on the way in: sees 429/503 before it retries.
        settings.setdefault_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", Politeness, 560)
