"""Spider middleware: tells the scheduler which requests ``start()`` yielded.

See ``_starts``: a request is a start request (entered once per crawl) because the
spider's ``start()`` yielded it, not because its meta says so; retries and
redirects of start requests copy that meta and must still be fetched. The add-on
puts this middleware outermost (priority 5, below Scrapy's own), so it sees the
very objects that reach the scheduler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_redisspine import signals

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from scrapy.crawler import Crawler


class StartRequests:
    """Notes every request of ``start()`` in the worker's start registry."""

    def __init__(self) -> None:
        self.worker: signals.WorkerView | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> StartRequests:
        middleware = cls()
        crawler.signals.connect(middleware.worker_opened, signal=signals.worker_opened)
        return middleware

    def worker_opened(self, worker: signals.WorkerView) -> None:
        self.worker = worker
        worker.starts.attach()

    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        from scrapy import Request

        async for item_or_request in start:
            if self.worker is not None and isinstance(item_or_request, Request):
                self.worker.starts.note(item_or_request)
            yield item_or_request
        if self.worker is not None:
            self.worker.starts.done()
