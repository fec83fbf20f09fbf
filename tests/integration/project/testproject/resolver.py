"""A DNS resolver for tests: names from the LINKS_HOST_MAP setting resolve to
loopback addresses, so several host names (``a.site.co.uk``, ``b.site.co.uk``) can
point at the local test site without touching /etc/hosts or any network."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from scrapy.resolver import CachingThreadedResolver
from twisted.internet import defer

if TYPE_CHECKING:
    from collections.abc import Sequence

    from scrapy.crawler import Crawler


class MappedResolver(CachingThreadedResolver):
    host_map: dict[str, str] = {}

    @classmethod
    def from_crawler(cls, crawler: Crawler, reactor: Any) -> MappedResolver:
        resolver = super().from_crawler(crawler, reactor)
        raw = crawler.settings.get("LINKS_HOST_MAP") or "{}"
        resolver.host_map = json.loads(raw) if isinstance(raw, str) else dict(raw)
        return resolver

    def getHostByName(self, name: str, timeout: Sequence[int] = ()) -> Any:
        if name in self.host_map:
            return defer.succeed(self.host_map[name])
        return super().getHostByName(name, timeout)
