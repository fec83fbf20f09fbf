"""The ``contracted`` spider: a callback with Scrapy contracts, for ``scrapy check``
in a project that enables the add-on. Its page is a ``data:`` URL: no site needed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import scrapy

if TYPE_CHECKING:
    from collections.abc import Iterator

    from scrapy.http import Response


class ContractedSpider(scrapy.Spider):
    name = "contracted"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        """A page with one link: one item, one request.

        @url data:text/html,<a%20href="http://example.com/next">next</a>
        @returns items 1 1
        @returns requests 1 1
        @scrapes title
        """
        yield {"title": "a page"}
        yield from response.follow_all(css="a", callback=self.parse)
