"""List and re-inject a crawl's dead letters (an alias of ``redisspine dead-letters``).

A request lands in the dead letters when its workers kept dying while holding it
(``REDISSPINE_MAX_REQUEUES``) or when its payload cannot be rebuilt. Once the cause is
fixed (a spider bug, a memory limit), put them back:

    python -m scrapy_redisspine.deadletters --redis-url redis://host:6379/0 --crawl myspider
    python -m scrapy_redisspine.deadletters --redis-url ... --crawl myspider --reinject

(the same as ``redisspine --redis-url ... dead-letters|requeue-dead myspider``).
"""

from __future__ import annotations

import argparse
import sys

from scrapy_redisspine import cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scrapy_redisspine.deadletters", description=cli.plain(__doc__ or ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--crawl", required=True, help="crawl id (default crawl id: spider name)")
    parser.add_argument("--prefix", default="redisspine")
    parser.add_argument("--limit", type=int, default=100, help="most dead letters to handle")
    parser.add_argument("--reinject", action="store_true", help="put them back in the queue")
    args = parser.parse_args(argv)
    command = "requeue-dead" if args.reinject else "dead-letters"
    return cli.main([
        "--redis-url", args.redis_url, "--prefix", args.prefix,
        command, args.crawl, "--limit", str(args.limit),
    ])


if __name__ == "__main__":
    sys.exit(main())
