"""List and re-inject a crawl's dead letters.

A request lands in the dead letters when its workers kept dying while holding it
(``REDISSPINE_MAX_REQUEUES``) or when its payload cannot be rebuilt. Once the cause is
fixed (a spider bug, a memory limit), put them back:

    python -m scrapy_redisspine.deadletters --redis-url redis://host:6379/0 --crawl myspider
    python -m scrapy_redisspine.deadletters --redis-url ... --crawl myspider --reinject
"""

from __future__ import annotations

import argparse
import sys

from scrapy_redisspine.connection import client_from_url
from scrapy_redisspine.frontier import Frontier
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.serialization import SerializationError, loads_any


def _describe(payload: bytes) -> str:
    try:
        data = loads_any(payload)
    except SerializationError:
        return f"<{len(payload)} undecodable bytes>"
    return f"{data.get('method', 'GET')} {data.get('url')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scrapy_redisspine.deadletters", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--crawl", required=True, help="crawl id (default crawl id: spider name)")
    parser.add_argument("--prefix", default="redisspine")
    parser.add_argument("--limit", type=int, default=100, help="most dead letters to handle")
    parser.add_argument("--reinject", action="store_true", help="put them back in the queue")
    args = parser.parse_args(argv)
    frontier = Frontier(
        client_from_url(args.redis_url), CrawlKeys(args.prefix, args.crawl), "deadletters-cli"
    )
    letters = frontier.dead_letters(args.limit)
    for letter in letters:
        print(f"{letter.field}\tlane={letter.lane or '-'}\t{_describe(letter.payload)}"
              f"\t{letter.reason}")
    if args.reinject:
        count = frontier.reinject_dead(letter.field for letter in letters)
        print(f"re-injected {count} request(s)")
    elif not letters:
        print("no dead letters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
