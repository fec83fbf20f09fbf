"""pytest plugin: every crawler Scrapy's own tests make runs with the add-on switched on.

Loaded with ``-p redisspine_conformance`` (``tests/conformance/run.py`` puts this
directory on ``PYTHONPATH``), never by editing Scrapy's files: the point is that
Scrapy's tests run unmodified, so what they prove about Scrapy's scheduler they prove
about ours.

The hook is ``AddonManager.load_settings``: it runs once per crawler (in every
release the add-on supports, 2.13 on; this run pins 2.19.0), after the spider's
``custom_settings`` are merged and before the settings freeze, which is exactly
where a project's own ``ADDONS`` line takes effect. A test that sets its own
``SCHEDULER`` keeps it, as a project that sets one beside the add-on would (the
add-on warns).

Each crawler gets its own ``REDISSPINE_CRAWL_ID``: Scrapy's tests reuse spider names
(``test``, ``simple``) in every test, and each test expects a crawl of its own, not
the remains of the previous one. One throwaway redis-server serves the session.

Crawlers in child processes (Scrapy's ``CrawlerProcess`` scripts, ``python -m
scrapy.cmdline``) are reached through ``sitecustomize`` in ``site/``: this plugin
puts that directory on ``PYTHONPATH`` and the server's URL in the environment, which
Scrapy's tests pass on to their children.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator, Iterator

#: Environment of the session, read by ``site/sitecustomize.py`` in child processes.
URL_ENV = "REDISSPINE_CONFORMANCE_REDIS_URL"
#: File this plugin writes its counts to, for ``run.py``'s summary.
REPORT_ENV = "REDISSPINE_CONFORMANCE_REPORT"
SITE_DIR = Path(__file__).resolve().parent / "site"
OUR_SCHEDULER = "scrapy_redisspine.scheduler.Scheduler"

#: A crawl of Scrapy's tests that runs longer than this was stopped by the watchdog
#: (seconds; the slowest test on the stock scheduler takes 3 s on this machine).
CRAWL_TIMEOUT_SECONDS = float(os.environ.get("REDISSPINE_CONFORMANCE_CRAWL_TIMEOUT", "15"))
#: Extra add-on settings for every crawler, as a JSON object: to see which expected
#: failures a setting lifts (docs page "Differences from Scrapy's scheduler").
SETTINGS_ENV = "REDISSPINE_CONFORMANCE_SETTINGS"

_ids: Iterator[int] = itertools.count(1)
_counts = {"crawlers": 0, "own_scheduler": 0, "stopped_by_watchdog": 0}
#: What the watchdogs stopped, in order: "crawl id (why)".
_stopped: list[str] = []
#: Test id -> what the watchdogs stopped during it (for run.py's summary).
_stopped_in: dict[str, str] = {}


def switch_on(settings: Any, redis_url: str) -> None:
    """Add the add-on and a crawl of its own to one crawler's settings.

    ``addon`` priority: below the test's own settings (which win, as a project's do),
    above Scrapy's defaults."""
    from scrapy_redisspine import Addon

    settings.set_in_component_priority_dict("ADDONS", Addon, 0)
    settings.set("REDISSPINE_REDIS_URL", redis_url, priority="addon")
    crawl_id = f"conformance-{os.getpid()}-{next(_ids)}"
    settings.set("REDISSPINE_CRAWL_ID", crawl_id, priority="addon")
    for name, value in json.loads(os.environ.get(SETTINGS_ENV) or "{}").items():
        settings.set(name, value, priority="addon")


def _ours(scheduler: Any) -> bool:
    """Is this ``SCHEDULER`` value the add-on's (a test may set its own)?"""
    return scheduler == OUR_SCHEDULER or (
        getattr(scheduler, "__module__", "") == "scrapy_redisspine.scheduler"
    )


def install(redis_url: str) -> None:
    """Wrap ``AddonManager.load_settings`` so every crawler of this process is a
    worker of a crawl of its own on ``redis_url``."""
    from scrapy.addons import AddonManager

    original = AddonManager.load_settings
    if getattr(original, "_redisspine_conformance", False):
        return

    def load_settings(self: Any, settings: Any) -> None:
        switch_on(settings, redis_url)
        original(self, settings)
        _Watchdog(self.crawler, redis_url)
        _counts["crawlers"] += 1
        if not _ours(settings.get("SCHEDULER")):
            _counts["own_scheduler"] += 1

    load_settings._redisspine_conformance = True  # type: ignore[attr-defined]
    AddonManager.load_settings = load_settings  # type: ignore[method-assign]


class _Session:
    """The session's redis-server and what the report needs from it."""

    def __init__(self) -> None:
        from scrapy_redisspine.testing.redis_server import RedisServer

        self.server = RedisServer().start()
        os.environ[URL_ENV] = self.server.url
        path = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE_DIR), path) if p)
        install(self.server.url)

    def close(self) -> None:
        import redis

        from scrapy_redisspine.keys import CrawlKeys

        client = self.server.client()
        try:
            crawls = int(client.scard(CrawlKeys("redisspine", "any").crawls))
        except redis.RedisError:
            crawls = -1  # the server died: run.py says so
        finally:
            client.close()
        self.server.stop()
        report = os.environ.get(REPORT_ENV)
        counts: dict[str, Any] = {**_counts, "crawls_in_redis": crawls, "watchdog": _stopped_in}
        if report:
            Path(report).write_text(json.dumps(counts), encoding="utf-8")
        sys.stderr.write(
            f"redisspine conformance: {counts['crawlers']} crawler(s) in this process, "
            f"{counts['own_scheduler']} kept a scheduler of their own, "
            f"{counts['stopped_by_watchdog']} stopped by the watchdog; "
            f"{crawls} crawl(s) in Redis (child processes included)\n"
        )


_session: _Session | None = None
_WATCHDOG_KEY = pytest.StashKey[int]()
#: How long after its engine started, then how often, the watchdog looks for a crawl
#: that waits for its first request (seconds).
_WAITING_GRACE_SECONDS, _WAITING_POLL_SECONDS = 0.5, 0.25


class _Watchdog:
    """Stops one crawler that would never close on its own, on its reactor.

    pytest-timeout cannot do this: its exception lands in the reactor, which then
    stops for the rest of the session, so one hung crawl would fail every test after
    it (and it cannot reach a child process at all). Two cases: a crawl still open
    after :data:`CRAWL_TIMEOUT_SECONDS`, and (at once, not after the timeout) a crawl
    that never had a request queued while no worker still runs its spider's
    ``start()``: the add-on keeps such a crawl open for a request from ``redisspine
    seed`` (docs/getting-started.md, "Termination"), which no test sends. It closes the way Ctrl-C
    does (reason ``shutdown``); in pytest's process the test is then failed by
    :func:`pytest_runtest_makereport`, whatever it asserts after its crawl returns.
    Its timers are the add-on's own (:class:`~scrapy_redisspine._clock.CrawlClock`),
    so it also runs on a crawl without a Twisted reactor."""

    def __init__(self, crawler: Any, redis_url: str) -> None:
        from scrapy import signals

        self._crawler, self._redis_url = crawler, redis_url
        self._calls: list[Any] = []
        self._poll: Any = None
        self._client: Any = None
        self._seen_waiting = False
        self._stopping: Any = None  # the reactorless stop, kept from the collector
        crawler.signals.connect(self._start, signals.engine_started, weak=False)
        crawler.signals.connect(self._cancel, signals.engine_stopped, weak=False)

    def _start(self) -> None:
        import redis

        from scrapy_redisspine._clock import CrawlClock, Periodic

        clock = CrawlClock()  # the reactor, or asyncio's loop in reactorless mode
        self._client = redis.Redis.from_url(self._redis_url)
        self._poll = Periodic("conformance watchdog", self._stop_if_waiting,
                              _WAITING_POLL_SECONDS, clock, self._crawler.stats)
        self._calls = [
            clock.callLater(CRAWL_TIMEOUT_SECONDS, self._stop,
                            f"still open after {CRAWL_TIMEOUT_SECONDS:.0f}s"),
        ]
        if _ours(self._crawler.settings.get("SCHEDULER")):  # else Redis knows nothing
            self._calls.append(clock.callLater(_WAITING_GRACE_SECONDS, self._poll.start))

    def _cancel(self) -> None:
        for call in self._calls:
            if call.active():
                call.cancel()
        if self._poll is not None:
            self._poll.stop()
        if self._client is not None:
            self._client.close()

    def _stop_if_waiting(self) -> None:
        """The crawl is waiting for a first request when, on two polls in a row, it
        never had one queued or leased, has none queued or in flight, and no worker
        is still in its ``start()``: the add-on's own rule (``fleet_counts.lua``)."""
        from scrapy_redisspine.keys import CrawlKeys

        settings = self._crawler.settings
        keys = CrawlKeys(settings.get("REDISSPINE_KEY_PREFIX") or "redisspine",
                         settings.get("REDISSPINE_CRAWL_ID"))
        pipe = self._client.pipeline(transaction=True)
        pipe.hexists(keys.stats, "enqueued").hexists(keys.stats, "leased")
        pipe.hexists(keys.record, "finished_ms").zcard(keys.queue).hlen(keys.inflight)
        pipe.zcard(keys.starting)
        waiting = not any(pipe.execute())
        if waiting and self._seen_waiting:
            self._stop("never had a request queued, waiting for its first one")
        self._seen_waiting = waiting

    def _stop(self, why: str) -> None:
        self._cancel()
        if not self._crawler.crawling:
            return
        stopped = f"{self._crawler.settings.get('REDISSPINE_CRAWL_ID')} ({why})"
        _stopped.append(stopped)
        _counts["stopped_by_watchdog"] += 1
        sys.stderr.write(f"redisspine conformance: watchdog stopped {stopped}\n")
        if "twisted.internet.reactor" not in sys.modules:  # reactorless (Scrapy 2.15+)
            import asyncio

            self._stopping = asyncio.ensure_future(self._crawler.stop_async())
        elif hasattr(self._crawler, "stop_async"):  # Scrapy 2.14+; stop() warns there
            from scrapy.utils.defer import deferred_from_coro

            deferred_from_coro(self._crawler.stop_async())
        else:
            self._crawler.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    item.stash[_WATCHDOG_KEY] = len(_stopped)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    stopped = _stopped[item.stash.get(_WATCHDOG_KEY, len(_stopped)):]
    if report.when == "call" and stopped:
        message = (
            "redisspine conformance: stopped by the watchdog (reason shutdown): "
            + "; ".join(stopped)
        )
        _stopped_in[item.nodeid] = "; ".join(stopped)
        if report.failed:
            report.sections.append(("redisspine watchdog", message))
        else:
            report.outcome = "failed"
            report.longrepr = message
    return report


def pytest_configure(config: pytest.Config) -> None:
    global _session  # noqa: PLW0603 - one server per pytest session
    if _session is None:
        _session = _Session()


def pytest_unconfigure(config: pytest.Config) -> None:
    global _session  # noqa: PLW0603
    if _session is not None:
        _session.close()
        _session = None
