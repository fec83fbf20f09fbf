"""What a ``redisspine`` command is given: the interface of ``cli.Context``.

The command modules (``cli_commands``, ``cli_export``) type their ``ctx`` with this
Protocol, so they never import ``cli``, which imports them to build its table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.settings import SpineConfig
    from scrapy_redisspine.sharded import AnyFrontier


class CommandContext(Protocol):
    """The client, the key prefix and the project config every command needs."""

    config: SpineConfig
    url: str
    prefix: str
    client: redis.Redis

    def keys(self, crawl: str, *, claim: bool = False) -> CrawlKeys: ...

    def existing(self, crawl: str) -> CrawlKeys: ...

    def frontier(self, keys: CrawlKeys) -> AnyFrontier: ...
