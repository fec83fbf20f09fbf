"""The ``meta`` spider: every request carries items, a nested request and typed values
in meta and cb_kwargs, and every callback checks that they arrived as they left.

With ``REDISSPINE_LOCAL_REQUEST_CACHE = 0`` every request a worker gets back was
decoded from its payload in Redis, often one another worker wrote. Counted in stats:
``meta/checked`` (a callback found everything as expected) and ``meta/wrong``.
"""

from __future__ import annotations

import datetime as dt
import uuid
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import scrapy

from testproject.items import Offer, Page, Seller

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy.http import Response

WHEN = dt.datetime(2024, 3, 9, 12, 30, 15, 123456, tzinfo=dt.timezone(dt.timedelta(hours=5)))


class MetaSpider(scrapy.Spider):
    name = "meta"

    async def start(self) -> AsyncIterator[scrapy.Request]:
        for url in self.settings.getlist("LINKS_START_URLS"):
            yield self._request(url, depth=0)

    def _request(self, url: str, depth: int) -> scrapy.Request:
        page = Page(url=url, seller=Seller("shop", Decimal("4.50")),
                    offers=[Offer(1.5, frozenset({"new"})), Offer(2**70)])
        return scrapy.Request(
            url, callback=self._parse_detail,
            meta={"page": page, "when": WHEN, "pair": (depth, str(depth)),
                  "id": uuid.UUID(int=depth), "by_int": {depth: {depth}},
                  "then": scrapy.Request(url + "#then", callback=self._parse_detail,
                                         meta={"seller": page["seller"]})},
            cb_kwargs={"expected_url": url, "offer": Offer(9.99)},
        )

    def _parse_detail(self, response: Response, expected_url: str, offer: Offer) -> Iterator[Any]:
        problems = self._check(response, expected_url, offer)
        stats = self.crawler.stats
        if problems:
            self.logger.error("meta arrived changed at %s: %s", response.url, problems)
            stats.inc_value("meta/wrong")
        else:
            stats.inc_value("meta/checked")
        yield {"url": response.url}
        for href in response.css("a::attr(href)").getall():
            yield self._request(response.urljoin(href), depth=response.meta["pair"][0] + 1)

    def _check(self, response: Response, expected_url: str, offer: Offer) -> list[str]:
        meta = response.meta
        depth = meta["pair"][0]
        page, then = meta["page"], meta["then"]
        checks = {
            "page": type(page) is Page and page["url"] == expected_url,
            "seller": page["seller"] == Seller("shop", Decimal("4.50")),
            "offers": [type(o) for o in page["offers"]] == [Offer, Offer]
            and page["offers"][1]._price == 2**70 and page["offers"][0].tags == {"new"},
            "when": meta["when"] == WHEN and meta["when"].utcoffset() == WHEN.utcoffset(),
            "pair": meta["pair"] == (depth, str(depth)),
            "id": meta["id"] == uuid.UUID(int=depth),
            "by_int": meta["by_int"] == {depth: {depth}},
            "then": type(then) is scrapy.Request and then.callback == self._parse_detail
            and type(then.meta["seller"]) is Seller,
            "cb_kwargs": type(offer) is Offer and offer._price == 9.99,
        }
        return [name for name, ok in checks.items() if not ok]
