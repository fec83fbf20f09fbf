"""The only place that touches Scrapy's private engine internals.

Scrapy has no public hook for "the engine is done with this request" (Scrapy issue
7978). The engine keeps every request it downloads in ``engine._slot.inprogress`` and
removes it with ``_slot.remove_request(request)`` only after the scraper has fully
processed the response or failure: callback/errback output consumed, the requests it
yielded already passed to the scheduler. That call is exactly the moment a lease may
be acked, so we wrap it. ``engine._start`` is the spider's start iterator until it
is exhausted: while it is, the fleet must not finish. Waking the engine when work
appears in Redis uses ``_slot.nextcall.schedule()``; closing it from the scheduler
(a drain order) uses the engine's close call, which changed between Scrapy
versions; a crawl whose work is not done exits non-zero by Scrapy's own rule for a
crawler without a spider (:meth:`EngineHooks.mark_failed`).

The scheduler sees all of this through :class:`EnginePort` only.

:func:`check_engine` verifies at start-up that these internals look as expected and
fails loudly, naming the Scrapy version, instead of silently never acking.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import scrapy

if TYPE_CHECKING:
    from collections.abc import Callable

    from scrapy import Request
    from scrapy.crawler import Crawler


class UnsupportedScrapyError(RuntimeError):
    """Scrapy's engine internals are not what this plugin relies on."""


def _slot(crawler: Crawler) -> Any:
    engine = getattr(crawler, "engine", None)
    return getattr(engine, "_slot", None)


def check_engine(crawler: Crawler) -> None:
    """Raise if the engine internals this plugin uses are missing."""
    slot = _slot(crawler)
    problems = []
    if slot is None:
        problems.append("crawler.engine._slot is missing")
    else:
        if not isinstance(getattr(slot, "inprogress", None), set):
            problems.append("engine._slot.inprogress is not a set")
        if not callable(getattr(slot, "remove_request", None)):
            problems.append("engine._slot.remove_request() is missing")
        if not callable(getattr(getattr(slot, "nextcall", None), "schedule", None)):
            problems.append("engine._slot.nextcall.schedule() is missing")
    engine = getattr(crawler, "engine", None)
    if not hasattr(engine, "_start"):
        problems.append("engine._start (the start requests in progress) is missing")
    downloader = getattr(engine, "downloader", None)
    if not isinstance(getattr(downloader, "active", None), set):
        problems.append("engine.downloader.active is not a set")
    if problems:
        raise UnsupportedScrapyError(
            f"scrapy_redisspine cannot run on Scrapy {scrapy.__version__}: "
            + "; ".join(problems)
            + ". Supported: Scrapy 2.13 to 2.19."
        )


class EnginePort(Protocol):
    """What the scheduler needs from Scrapy's engine: the one port to its internals.

    Tests pass a fake through ``Scheduler(engine=...)``; a crawl passes
    :class:`EngineHooks`.
    """

    def attach(self, on_request_done: Callable[[Request], None]) -> None:
        """Call ``on_request_done(request)`` when the engine is done with a request."""

    def detach(self) -> None:
        """Stop calling it (the scheduler closes)."""

    def wake(self) -> None:
        """Ask the engine to call ``next_request()`` soon."""

    def free_download_slots(self) -> int:
        """How many more requests the downloader would take now."""

    def starting(self) -> bool:
        """Is the spider still producing start requests?"""

    def close_spider(self, reason: str) -> None:
        """Ask the engine to close the spider with ``reason``."""

    def mark_failed(self) -> None:
        """Make the process exit non-zero once the engine stopped: the crawl's work
        is not done (or was lost), whatever the close reason says to Scrapy."""


class EngineHooks:
    """:class:`EnginePort` over a running crawler's engine.

    Built in ``Scheduler.from_crawler``, before the engine has its slot; the
    internals are checked (and the hook installed) by :meth:`attach`, at open.
    """

    def __init__(self, crawler: Crawler) -> None:
        self._crawler = crawler
        self._slot: Any = None
        self._original_remove: Callable[[Request], None] | None = None
        self._failed = False

    def attach(self, on_request_done: Callable[[Request], None]) -> None:
        """Call ``on_request_done(request)`` just before the engine forgets a request.

        Ours runs first so that the ack (and the children flushed with it) is in
        Redis before the engine can decide that the spider is idle or closed.
        """
        check_engine(self._crawler)
        slot = self._slot = _slot(self._crawler)
        original = slot.remove_request
        self._original_remove = original

        def remove_request(request: Request) -> None:
            try:
                on_request_done(request)
            finally:
                original(request)

        slot.remove_request = remove_request

    def detach(self) -> None:
        if self._original_remove is not None:
            self._slot.remove_request = self._original_remove
            self._original_remove = None

    def wake(self) -> None:
        slot = _slot(self._crawler)
        if slot is not None:
            slot.nextcall.schedule()

    def free_download_slots(self) -> int:
        downloader = self._crawler.engine.downloader  # type: ignore[union-attr]
        total = int(getattr(downloader, "total_concurrency", 0) or 0)
        return max(total - len(downloader.active), 0) if total else 1

    def mark_failed(self) -> None:
        """Scrapy's ``crawl``/``runspider`` commands exit with 1 when a crawler ends
        without a spider (their sign of a crawl that failed to start); the spider is
        dropped from the crawler once the engine stopped, when nothing needs it."""
        if not self._failed:
            self._failed = True
            from scrapy import signals as scrapy_signals

            self._crawler.signals.connect(
                self._drop_spider, signal=scrapy_signals.engine_stopped, weak=False
            )

    def _drop_spider(self) -> None:
        self._crawler.spider = None  # type: ignore[assignment]

    def starting(self) -> bool:
        """``engine._start``: the spider's start iterator until it is exhausted."""
        return getattr(self._crawler.engine, "_start", None) is not None

    def close_spider(self, reason: str) -> None:
        """The engine's close call differs across Scrapy versions."""
        engine: Any = self._crawler.engine
        if engine is None:
            return
        if hasattr(engine, "close_spider_async"):
            from scrapy.utils.defer import deferred_from_coro

            deferred_from_coro(engine.close_spider_async(reason=reason))
        else:
            engine.close_spider(self._crawler.spider, reason)
