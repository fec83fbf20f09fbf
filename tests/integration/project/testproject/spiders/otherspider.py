"""The ``other`` spider: a second, different spider of the project, for the tests
of two spiders pointed at one crawl id."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import scrapy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from scrapy.http import Response


class OtherSpider(scrapy.Spider):
    name = "other"

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for url in self.settings.getlist("LINKS_START_URLS"):
            yield scrapy.Request(url, callback=self.parse_other)

    def parse_other(self, response: Response, **kwargs: Any) -> None:
        self.logger.info("other spider got %s", response.url)
