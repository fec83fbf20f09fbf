"""The ``links`` spider: follow every link of the test site, one item per page.

Deliberately ordinary (no plugin-specific code), because the plugin's promise is
that spiders stay ordinary spiders. Start URLs come from ``-a start_urls=a,b`` or,
failing that, the ``LINKS_START_URLS`` setting (a comma-separated string or list).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from typing import TYPE_CHECKING, Any

import scrapy

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator

    from scrapy.http import Response


class LinkSpider(scrapy.Spider):
    name = "links"

    def __init__(self, start_urls: str | list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        allowed = kwargs.get("allowed_domains")
        if isinstance(allowed, str):
            self.allowed_domains = [d for d in allowed.split(",") if d]
        if isinstance(start_urls, str):
            start_urls = [url.strip() for url in start_urls.split(",") if url.strip()]
        self.start_urls = start_urls or []

    async def start(self) -> AsyncIterator[scrapy.Request]:
        if self.settings.getbool("LINKS_JOIN_ONLY"):
            return  # a worker that only joins the crawl others seed
        urls = self.start_urls or self.settings.getlist("LINKS_START_URLS")
        if not urls:
            raise ValueError("no start URLs: pass -a start_urls=... or -s LINKS_START_URLS=...")
        # Scrapy's default start requests use dont_filter=True: the plugin must still
        # inject each only once per crawl.
        dont_filter = self.settings.getbool("LINKS_START_DONT_FILTER")
        pause = self.settings.getfloat("LINKS_START_PAUSE_SECONDS")
        for url in urls:
            if pause:  # a slow start(): e.g. start URLs read from a slow source
                await asyncio.sleep(pause)
            yield scrapy.Request(url, callback=self.parse, dont_filter=dont_filter)
        # Requests that end without a callback's output: 404s, refused connections
        # (retried, then errback), offsite (IgnoreRequest in the downloader).
        for url in self.settings.getlist("LINKS_EXTRA_START_URLS"):
            yield scrapy.Request(url, callback=self.parse, errback=self.failed)

    def failed(self, failure: Any) -> None:
        self.logger.info("request failed: %s", failure.request)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any] | AsyncIterator[Any]:
        slow = self.settings.getfloat("LINKS_PARSE_SLEEP_SECONDS")
        if slow:  # a slow callback (it waits on something): the worker's loop runs on
            return self._parse_slowly(response, slow)
        return self._parse(response)

    async def _parse_slowly(self, response: Response, seconds: float) -> AsyncIterator[Any]:
        await asyncio.sleep(seconds)
        for output in self._parse(response):
            yield output

    def _parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url}
        kill_page = self.settings.get("LINKS_KILL_PAGE")
        if kill_page and response.url.endswith(kill_page):
            # Crash inside the callback after some requests were yielded: they sit in
            # the scheduler's outbox and die with the process; the page's lease must
            # bring them back.
            for href in response.css("a::attr(href)").getall()[:2]:
                yield response.follow(href, callback=self.parse)
            os.kill(os.getpid(), signal.SIGKILL)
        bad_page = self.settings.get("LINKS_BAD_META_PAGE")
        if bad_page and response.url.endswith(bad_page):
            # A request that cannot be stored: the worker must log it and go on.
            yield response.follow("/unstorable", meta={"handle": object()})
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    def parse_fed(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        """A callback named by a JSON entry of the feed key: it logs what arrived."""
        self.logger.info("fed page: %s", json.dumps({
            "url": response.url, "fed": response.meta.get("fed"), "cb_kwargs": kwargs,
        }, sort_keys=True))
        yield {"url": response.url}
