"""Add requests to a crawl from outside it: a running fleet picks them up at once.

This is the supported way to feed a crawl in service mode (``REDISSPINE_KEEP_ALIVE``)
or to add start URLs to a crawl that is already running. Requests go through the
same enqueue script as the workers' own, so they are deduplicated fleet-wide, with
the crawl's own host concurrency, backlog cap and tracking-parameter settings.

    python -m scrapy_redisspine.push --crawl myspider https://example.com/a
    python -m scrapy_redisspine.push --redis-url redis://host:6379/0 --crawl myspider \\
        --file urls.txt

Each argument or line is a URL or a JSON object (``{"url": ..., "meta": ...,
"callback": ...}``, see ``feed_entries``). It is ``redisspine seed`` under another
name: both find Redis the same way (``--redis-url``, the environment, the project)
and share one implementation (:func:`push_entries`, also what the workers' feed
drain uses).

Fingerprints use Scrapy's default request fingerprinter; a crawl with a custom
``REQUEST_FINGERPRINTER_CLASS`` should push from Python with its own fingerprinter.
"""

from __future__ import annotations

import sys

from scrapy_redisspine.pushing import (
    EntryEncoder,
    PushOptions,
    new_requests,
    push_entries,
    push_frontier,
    push_requests,
)

__all__ = [
    "EntryEncoder", "PushOptions", "main", "new_requests", "push_entries", "push_frontier",
    "push_requests",
]


def main(argv: list[str] | None = None) -> int:
    """``redisspine seed``, spelled the old way (``--crawl CRAWL``)."""
    from scrapy_redisspine import cli

    argv = list(sys.argv[1:] if argv is None else argv)
    globals_: list[str] = []
    crawl: list[str] = []
    rest: list[str] = []
    options = iter(argv)
    for arg in options:
        if arg in ("--redis-url", "--prefix"):
            globals_ += [arg, next(options, "")]
        elif arg == "--crawl":
            crawl = [next(options, "")]
        elif arg in ("-h", "--help"):
            print((__doc__ or "").replace("``", ""))
            return 0
        else:
            rest.append(arg)
    if not crawl:
        print("python -m scrapy_redisspine.push: --crawl CRAWL is required", file=sys.stderr)
        return 2
    return cli.main([*globals_, "seed", *crawl, *rest])


if __name__ == "__main__":
    sys.exit(main())
