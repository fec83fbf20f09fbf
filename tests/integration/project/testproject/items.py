"""Items of the test project, of every kind Scrapy handles through itemadapter."""

from __future__ import annotations

import dataclasses
from decimal import Decimal  # noqa: TC003 (a dataclass field's type, read at runtime)

import attr
import scrapy


class Page(scrapy.Item):
    url = scrapy.Field()
    seller = scrapy.Field()
    offers = scrapy.Field()


@dataclasses.dataclass(frozen=True)
class Seller:
    name: str
    rating: Decimal


@attr.s(auto_attribs=True)
class Offer:
    _price: float
    tags: frozenset[str] = frozenset()
