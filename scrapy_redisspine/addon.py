"""One line in ``ADDONS`` switches the plugin on.

Sets the scheduler and the dupefilter with the ``addon`` priority, so a project that
sets them explicitly in settings.py still wins, and enables the recovery extension
(the sweep that requeues the work of dead workers), the fleet log line, the fleet
totals (each worker's stats growth summed in Redis), the
politeness downloader middleware (Retry-After and robots.txt Crawl-delay, shared
fleet-wide), the start-requests spider middleware and, with ``REDISSPINE_ITEMS``,
the fleet items extension (``fleet_items``) and the fleet-wide limits
(``limits``). It switches Scrapy's own AutoThrottle extension off: with
``AUTOTHROTTLE_ENABLED`` each lane's delay adapts fleet-wide in Redis instead
(``scripts/lib/throttle.lua``), and a per-process throttle on top would stack.

Only the commands that crawl join the fleet: ``scrapy crawl`` and ``scrapy runspider``
(and any program running a ``CrawlerProcess``). ``scrapy shell``, ``fetch``, ``view``,
``parse``, ``check`` and ``bench`` look at a page or two on this machine: joining
the crawl in Redis would hand their requests to other workers (and the command would
wait for them forever), so they run with Scrapy's own scheduler, and say so in one
line.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy.settings import Settings


logger = logging.getLogger(__name__)


#: ``scrapy`` commands that crawl: a process running one is a worker of the fleet.
FLEET_COMMANDS = frozenset({"crawl", "runspider"})
#: What ``python -m`` runs as the ``scrapy`` command (Scrapy's own tests use the second).
_SCRAPY_MODULES = frozenset({"scrapy", "scrapy.cmdline"})


def scrapy_command(argv: Sequence[str] | None = None) -> str | None:
    """The ``scrapy`` command this process runs (``scrapy shell ...``, ``python -m
    scrapy fetch ...``, ``python -m scrapy.cmdline parse ...``), or None for any
    other program.

    Read from the interpreter's own command line (``sys.orig_argv``): Scrapy pops the
    command name off ``sys.argv`` before the add-on runs."""
    argv = list(getattr(sys, "orig_argv", sys.argv) if argv is None else argv)
    for i, arg in enumerate(argv):
        if (arg in _SCRAPY_MODULES and i and argv[i - 1] == "-m") or (
            i and os.path.basename(arg) == "scrapy" and argv[i - 1] != "-m"
        ):
            return next((rest for rest in argv[i + 1:] if not rest.startswith("-")), None)
    return None


class Addon:
    """``ADDONS = {"scrapy_redisspine.Addon": 0}``"""

    def update_settings(self, settings: Settings) -> None:
        command = scrapy_command()
        if command is not None and command not in FLEET_COMMANDS:
            logger.info(
                "redisspine: `scrapy %s` runs on its own with Scrapy's scheduler: it does not "
                "join the crawl in Redis (only crawl and runspider do)", command,
            )
            return
        settings.set("SCHEDULER", "scrapy_redisspine.scheduler.Scheduler", "addon")
        settings.set(
            "DUPEFILTER_CLASS", "scrapy_redisspine.dupefilter.RedisDupeFilter", "addon"
        )
        # (DUPEFILTER_CLASS needs no such check: the scheduler says what it does with
        # whichever one it finds, see dupefilter.fleet_dupefilter.)
        _warn_if_overridden(settings, "SCHEDULER", "scrapy_redisspine.scheduler.Scheduler")
        from scrapy_redisspine.extension import FleetLog, Recovery
        from scrapy_redisspine.fleet_totals import FleetTotals
        from scrapy_redisspine.middleware import Politeness

        settings.setdefault_in_component_priority_dict("EXTENSIONS", Recovery, 500)
        settings.setdefault_in_component_priority_dict("EXTENSIONS", FleetLog, 510)
        settings.setdefault_in_component_priority_dict("EXTENSIONS", FleetTotals, 505)
        from scrapy_redisspine.fleet_items import FleetItems

        # Off unless REDISSPINE_ITEMS (NotConfigured): read when the crawler is built,
        # after every settings source, so the add-on need not decide here.
        settings.setdefault_in_component_priority_dict("EXTENSIONS", FleetItems, 520)
        from scrapy_redisspine.limits import FleetLimits

        # Off unless a CLOSESPIDER_* item, error or time limit counts fleet-wide.
        settings.setdefault_in_component_priority_dict("EXTENSIONS", FleetLimits, 530)
        from scrapy_redisspine.feed import FeedDrain

        # Off when REDISSPINE_FEED_KEY is "" (NotConfigured).
        settings.setdefault_in_component_priority_dict("EXTENSIONS", FeedDrain, 540)
        from scrapy.extensions.throttle import AutoThrottle

        # Always off: with AUTOTHROTTLE_ENABLED the fleet throttles each lane in Redis
        # (the middleware below feeds it), and Scrapy's per-process one would stack.
        settings.set_in_component_priority_dict("EXTENSIONS", AutoThrottle, None)
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
