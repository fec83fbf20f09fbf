"""One line in ``ADDONS`` switches the plugin on.

Sets the scheduler and the dupefilter with the ``addon`` priority, so a project that
sets them explicitly in settings.py still wins. (The in-flight downloader middleware
and the crash-recovery extension arrive with the crash-safety work; the scheduler
already leases and acks on its own.)
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
