"""Fleet items: every item that reaches the end of the item pipelines, stored once.

With ``REDISSPINE_ITEMS`` the add-on enables this extension. It listens to Scrapy's
``item_scraped``, which Scrapy sends for an item that passed every item pipeline
(not for one a pipeline dropped), with the response (or, for an errback's items, the
failure) it came from. That signal is the end of the user's pipelines by
definition, whatever their priorities, and it names the request: a pipeline of our
own would see neither the response nor items yielded by errbacks, and would have to
find the request again from the item's identity, which an earlier pipeline that
returns a new object breaks.

The item goes to the worker's ``ItemBox`` (``_itembox``): it waits there for the
ack of its request and enters the crawl's items stream in the same Lua step as
that ack, only if the ack passes the fencing check (``scripts/enqueue.lua``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import signals as scrapy_signals
from scrapy.exceptions import NotConfigured

from scrapy_redisspine import signals
from scrapy_redisspine._components import component_config

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

    from scrapy_redisspine._itembox import ItemBox


class FleetItems:
    """Hands each scraped item to the worker's item box, under its request."""

    def __init__(self) -> None:
        self.box: ItemBox | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> FleetItems:
        if not component_config(crawler).items:
            raise NotConfigured  # REDISSPINE_ITEMS is off
        extension = cls()
        crawler.signals.connect(extension.worker_opened, signal=signals.worker_opened)
        crawler.signals.connect(extension.item_scraped, signal=scrapy_signals.item_scraped)
        return extension

    def worker_opened(self, worker: signals.WorkerView) -> None:
        self.box = worker.items

    def item_scraped(self, item: Any, response: Any = None, **_: Any) -> None:
        """``response`` is a Response, a Failure (errback items) or None (items that
        ``start()`` yielded); the first two carry the request."""
        if self.box is None:
            return  # the worker refused to start: it stores nothing
        request = getattr(response, "request", None)
        url = getattr(response, "url", None) or getattr(request, "url", "")
        self.box.add(item, request, str(url))


def feed_uri_params(params: dict[str, Any], spider: Any) -> dict[str, Any]:
    """Scrapy's ``FEEDS`` ``uri_params`` hook adding ``%(worker)s``: this process's host
    and pid, so that each worker of a fleet writes a feed of its own (``%(time)s``
    alone is the same for two workers started in one second)."""
    import os
    import socket

    return {**params, "worker": f"{socket.gethostname()}-{os.getpid()}"}
