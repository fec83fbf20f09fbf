"""scrapy_redisspine: a distributed, crash-safe Scrapy crawl with one Redis as its spine.

Turn it on with ``ADDONS = {"scrapy_redisspine.Addon": 0}``, or set
``SCHEDULER = "scrapy_redisspine.scheduler.Scheduler"`` and
``DUPEFILTER_CLASS = "scrapy_redisspine.dupefilter.RedisDupeFilter"``.
"""

from scrapy_redisspine.addon import Addon
from scrapy_redisspine.keys import CrawlKeys

__all__ = ["Addon", "CrawlKeys"]
__version__ = "0.1.0"
