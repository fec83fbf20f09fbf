"""Add requests to a crawl from outside it: a running fleet picks them up at once.

This is the supported way to feed a crawl in service mode (``REDISSPINE_KEEP_ALIVE``)
or to add start URLs to a crawl that is already running. Requests go through the
same enqueue script as the workers' own, so they are deduplicated fleet-wide.

    python -m scrapy_redisspine.push --redis-url redis://host:6379/0 --crawl myspider \\
        https://example.com/a https://example.com/b
    python -m scrapy_redisspine.push --redis-url ... --crawl myspider --file urls.txt

Fingerprints use Scrapy's default request fingerprinter; a crawl with a custom
``REQUEST_FINGERPRINTER_CLASS`` should push from Python with its own fingerprinter.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from scrapy_redisspine.connection import client_from_url
from scrapy_redisspine.dupefilter import fingerprint_request
from scrapy_redisspine.frontier import EnqueueResult, Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.politeness import make_lane_function
from scrapy_redisspine.request_codec import RequestCodec
from scrapy_redisspine.serialization import get_serializer
from scrapy_redisspine.tracking import tracking_params
from scrapy_redisspine.worker import new_worker_id

if TYPE_CHECKING:
    from collections.abc import Iterable

    import redis
    from scrapy.utils.request import RequestFingerprinterProtocol


def push_requests(
    client: redis.Redis,
    crawl_id: str,
    requests: Iterable[Request],
    *,
    callback: str | None = None,
    prefix: str = "redisspine",
    serializer: str = "msgpack",
    order: str = "fifo",
    fingerprinter: RequestFingerprinterProtocol | None = None,
    strip_tracking_params: bool = False,
    politeness_key: str = "host",
) -> EnqueueResult:
    """Enqueue requests (callbacks by name: ``callback`` or None for ``parse``).

    ``strip_tracking_params`` and ``politeness_key`` must match the crawl's
    ``REDISSPINE_DEDUP_STRIP_TRACKING_PARAMS`` and ``REDISSPINE_POLITENESS_KEY``.
    """
    fingerprinter = fingerprinter or RequestFingerprinter()
    tracking = tracking_params() if strip_tracking_params else None
    lane = make_lane_function(politeness_key)
    codec = RequestCodec(None, get_serializer(serializer))
    entries = [
        NewRequest(
            codec.encode(request, callback_name=callback),
            fingerprint_request(fingerprinter, request, tracking),
            request.priority,
            dont_filter=request.dont_filter,
            lane=lane(request.url),
        )
        for request in requests
    ]
    frontier = Frontier(client, CrawlKeys(prefix, crawl_id), f"push:{new_worker_id()}", order)
    return frontier.push(entries)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scrapy_redisspine.push",
                                     description=(__doc__ or "").replace("``", ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--crawl", required=True, help="crawl id (default crawl id: spider name)")
    parser.add_argument("--prefix", default="redisspine")
    parser.add_argument("--callback", default=None, help="spider method name (default: parse)")
    parser.add_argument("--priority", type=int, default=0)
    parser.add_argument("--serializer", default="msgpack", choices=("msgpack", "json"))
    parser.add_argument("--strip-tracking-params", action="store_true",
                        help="as the crawl's REDISSPINE_DEDUP_STRIP_TRACKING_PARAMS")
    parser.add_argument("--politeness-key", default="host", choices=("host", "domain"),
                        help="as the crawl's REDISSPINE_POLITENESS_KEY")
    parser.add_argument("--file", help="file with one URL per line ('-' for stdin)")
    parser.add_argument("urls", nargs="*")
    args = parser.parse_args(argv)
    urls = list(args.urls)
    if args.file:
        lines = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
        with lines:
            urls += [line.strip() for line in lines if line.strip()]
    requests, bad = [], 0
    for number, url in enumerate(urls, 1):
        try:
            requests.append(Request(url, priority=args.priority))
        except ValueError as exc:
            print(f"skipping malformed URL #{number} {url!r}: {exc}", file=sys.stderr)
            bad += 1
    result = push_requests(
        client_from_url(args.redis_url), args.crawl, requests,
        callback=args.callback, prefix=args.prefix, serializer=args.serializer,
        strip_tracking_params=args.strip_tracking_params, politeness_key=args.politeness_key,
    )
    print(f"{result.enqueued} new, {len(requests) - result.enqueued} already seen, {bad} malformed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
