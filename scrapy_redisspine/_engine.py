"""The only place that touches Scrapy's private engine internals.

Scrapy has no public hook for "the engine is done with this request" (Scrapy issue
7978). The engine keeps every request it downloads in ``engine._slot.inprogress`` and
removes it with ``_slot.remove_request(request)`` only after the scraper has fully
processed the response or failure: callback/errback output consumed, the requests it
yielded already passed to the scheduler. That call is exactly the moment a lease may
be acked, so we wrap it. Waking the engine when work appears in Redis uses
``_slot.nextcall.schedule()``.

:func:`check_engine` verifies at start-up that these internals look as expected and
fails loudly, naming the Scrapy version, instead of silently never acking.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    downloader = getattr(getattr(crawler, "engine", None), "downloader", None)
    if not isinstance(getattr(downloader, "active", None), set):
        problems.append("engine.downloader.active is not a set")
    if problems:
        raise UnsupportedScrapyError(
            f"scrapy_redisspine cannot run on Scrapy {scrapy.__version__}: "
            + "; ".join(problems)
            + ". Supported: Scrapy 2.13 to 2.19."
        )


class EngineHooks:
    """Acks on request completion, wakes the engine, reads free download slots."""

    def __init__(self, crawler: Crawler) -> None:
        check_engine(crawler)
        self._crawler = crawler
        self._slot = _slot(crawler)
        self._original_remove: Callable[[Request], None] | None = None

    def on_request_done(self, callback: Callable[[Request], None]) -> None:
        """Call ``callback(request)`` just before the engine forgets a request.

        Ours runs first so that the ack (and the children flushed with it) is in
        Redis before the engine can decide that the spider is idle or closed.
        """
        slot = self._slot
        original = slot.remove_request
        self._original_remove = original

        def remove_request(request: Request) -> None:
            try:
                callback(request)
            finally:
                original(request)

        slot.remove_request = remove_request

    def uninstall(self) -> None:
        if self._original_remove is not None:
            self._slot.remove_request = self._original_remove
            self._original_remove = None

    def wake(self) -> None:
        """Ask the engine to call ``next_request()`` soon."""
        slot = _slot(self._crawler)
        if slot is not None:
            slot.nextcall.schedule()

    def free_download_slots(self) -> int:
        downloader = self._crawler.engine.downloader  # type: ignore[union-attr]
        total = int(getattr(downloader, "total_concurrency", 0) or 0)
        return max(total - len(downloader.active), 0) if total else 1
