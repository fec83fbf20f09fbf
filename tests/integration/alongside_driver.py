"""Drives a spine scheduler as a crawl's engine does, on a real asyncio loop in a
process of its own (no Twisted reactor installed, so its Redis calls park on the
loop in greenlets as under Scrapy's asyncio reactor, or run on threads with
``REDISSPINE_REDIS_GREENLETS=false``), for
``test_lease_alongside_e2e.py``: a page's links enqueued per turn of the loop, then
every free slot filled and reported done at once, until all is handed out.

    python -m tests.integration.alongside_driver URL N \
        [--fail-alongside reply-lost|never-sent | --die-in-alongside K] [--no-enqueue]
        [--idle-seconds S] [--setting NAME=JSON ...]

Prints a line ``taken <url>`` as each request is handed out (so that a worker that
dies leaves its record behind), then one JSON line: the URLs handed out, the
scheduler's stats, and the warnings it logged. ``--die-in-alongside K``: once Redis
took the K-th lease alongside (or the first after it that goes while the lease
carrying the outbox is on its way too), the process kills itself (SIGKILL) before
the reply is handled.
``--no-enqueue``: a worker joining to drain what is left, until nothing was handed
out for ``--idle-seconds``. Redis always counts as near here (see ``main``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

import redis
import scrapy
from scrapy.utils.test import get_crawler

from scrapy_redisspine import _redis_io
from scrapy_redisspine.scheduler import Scheduler
from scrapy_redisspine.testing.engine import StandInEngine

if TYPE_CHECKING:
    from collections.abc import Callable

SLOTS = 16
HOSTS = 100
PAGE_LINKS = 100
STALL_SECONDS = 30.0


class Spider(scrapy.Spider):
    name = "alongside"

    def parse(self, response: Any) -> None:
        pass


def _open(redis_url: str, **settings: Any) -> tuple[Scheduler, StandInEngine]:
    crawler = get_crawler(Spider, {
        "REDISSPINE_REDIS_URL": redis_url, "REDISSPINE_CRAWL_ID": "alongside",
        "ADDONS": {"scrapy_redisspine.Addon": 0}, "LOG_LEVEL": "INFO",
        "TELNETCONSOLE_ENABLED": False, **settings,
    })
    spider = Spider.from_crawler(crawler)
    crawler.spider = spider
    engine = StandInEngine(SLOTS)
    scheduler = Scheduler.from_crawler(crawler, engine=engine)
    scheduler.open(spider)
    return scheduler, engine


async def _settled(scheduler: Scheduler) -> None:
    deadline = time.monotonic() + STALL_SECONDS
    while (not scheduler.outbox.empty or scheduler.io.busy) and time.monotonic() < deadline:
        await asyncio.sleep(0)


def urls(n: int) -> list[str]:
    return [f"http://h{i % HOSTS}.test/p/{i}" for i in range(n)]


async def crawl(redis_url: str, n: int, *, before: Callable[[Scheduler], None] = lambda s: None,
                enqueue: bool = True, idle_seconds: float = STALL_SECONDS,
                **settings: Any) -> tuple[list[str], Scheduler]:
    """Enqueue ``n`` requests over ``HOSTS`` hosts (unless not ``enqueue``), then
    drain; the URLs handed out."""
    scheduler, engine = _open(redis_url, **settings)
    before(scheduler)
    await _settled(scheduler)
    if enqueue:
        wanted = urls(n)
        for first in range(0, n, PAGE_LINKS):
            for url in wanted[first:first + PAGE_LINKS]:
                scheduler.enqueue_request(scrapy.Request(url))
            await asyncio.sleep(0)
        scheduler.outbox.try_flush()
        await _settled(scheduler)
    taken: list[str] = []
    idle_since = time.monotonic()
    while len(taken) < n and time.monotonic() - idle_since < idle_seconds:
        for _ in range(SLOTS):
            request = scheduler.next_request()
            if request is None:
                break
            taken.append(request.url)
            sys.stdout.write(f"taken {request.url}\n")
            idle_since = time.monotonic()
            engine.done(request)
        await asyncio.sleep(0)
    scheduler.outbox.try_flush()
    await _settled(scheduler)
    scheduler.close("finished")
    return taken, scheduler



#: How many requests the failed lease alongside took in Redis (its reply lost).
LOST: list[int] = []


def fail_one_alongside(applied: bool, nth: int = 1) -> Callable[[Scheduler], None]:
    """Make the ``nth`` lease alongside fail: after Redis applied it (``applied``: its
    reply lost; what it leased is counted in ``LOST``) or before it was sent."""

    def lost(call: Callable[[], Any], scheduler: Scheduler) -> Any:
        if applied:
            LOST.append(len(call().leases))
        raise redis.ConnectionError("the reply was lost")

    return _on_alongside(nth, lost)


def die_in_alongside(nth: int) -> Callable[[Scheduler], None]:
    """SIGKILL this process right after Redis applied a lease alongside (the ``nth``
    or a later one) while the lease carrying the outbox is on its way too."""

    def die(call: Callable[[], Any], scheduler: Scheduler) -> Any:
        batch = call()
        if not scheduler.leaser.in_flight:  # its reply came in meanwhile: the next one
            return batch
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("not reached")

    return _on_alongside(nth, die, every_after=True)


def _on_alongside(
    nth: int, fault: Callable[[Callable[[], Any], Scheduler], Any], *,
    every_after: bool = False,
) -> Callable[[Scheduler], None]:
    """Run the ``nth`` lease alongside (or, ``every_after``, each from it on) as
    ``fault(call, scheduler)``."""

    def install(scheduler: Scheduler) -> None:
        io = scheduler.upkeep_io
        submit = io.submit
        seen = 0

        def wrapped(name: str, call: Any, done: Any, failed: Any) -> None:
            nonlocal seen
            if name == "lease":  # the only lease on the upkeep queue goes alongside
                seen += 1
                if seen == nth or (every_after and seen > nth):
                    submit(name, lambda: fault(call, scheduler), done, failed)
                    return
            submit(name, call, done, failed)

        io.submit = wrapped  # type: ignore[method-assign]

    return install


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _as_is(scheduler: Scheduler) -> None:
    """No fault."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("n", type=int)
    parser.add_argument("--fail-alongside", choices=("reply-lost", "never-sent"))
    parser.add_argument("--die-in-alongside", type=int, default=0)
    parser.add_argument("--no-enqueue", action="store_true")
    parser.add_argument("--idle-seconds", type=float, default=STALL_SECONDS)
    parser.add_argument("--setting", action="append", default=[])
    args = parser.parse_args()
    # Redis counts as near however slowly a loaded test machine's loop delivers the
    # replies: these tests are about what a lease alongside does, and must see some
    # (when Redis counts as near is unit-tested: test_redis_io.py).
    _redis_io.NEAR_SECONDS = _redis_io.OVERDUE_SECONDS = 5.0
    settings: dict[str, Any] = {}
    for item in args.setting:
        name, value = item.split("=", 1)
        settings[name] = json.loads(value)
    before = _as_is
    if args.fail_alongside:
        before = fail_one_alongside(args.fail_alongside == "reply-lost")
    elif args.die_in_alongside:
        before = die_in_alongside(args.die_in_alongside)
    warnings = _Warnings()
    logging.getLogger("scrapy_redisspine").addHandler(warnings)
    taken, scheduler = asyncio.run(crawl(args.url, args.n, before=before,
                                         enqueue=not args.no_enqueue,
                                         idle_seconds=args.idle_seconds, **settings))
    print(json.dumps({"taken": taken, "stats": scheduler.stats.get_stats(),
                      "warnings": warnings.lines, "lost": sum(LOST)}, default=str))


if __name__ == "__main__":
    main()
