"""The ``example`` spider: an ordinary Scrapy spider, nothing plugin-specific.

That is the point: the same spider runs alone or as one of many workers sharing a
Redis frontier; only the settings change. Start URLs come from
``-a start_urls=URL,URL`` or the ``EXAMPLE_START_URLS`` setting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import scrapy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy.http import Response


class ExampleSpider(scrapy.Spider):
    name = "example"

    def __init__(self, start_urls: str | list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if isinstance(start_urls, str):
            start_urls = [url.strip() for url in start_urls.split(",") if url.strip()]
        self.start_urls = start_urls or []

    async def start(self) -> AsyncIterator[scrapy.Request]:
        urls = self.start_urls or self.settings.getlist("EXAMPLE_START_URLS")
        if not urls:
            raise ValueError(
                "no start URLs: pass -a start_urls=URL,URL or set EXAMPLE_START_URLS "
                "(run_example.py does this for you)"
            )
        for url in urls:
            yield scrapy.Request(url, callback=self.parse)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield {"url": response.url, "links": len(response.css("a"))}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)
