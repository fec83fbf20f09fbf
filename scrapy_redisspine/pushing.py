"""Add requests to a crawl from outside it, from Python: the one implementation
behind ``redisspine seed``, ``python -m scrapy_redisspine.push`` (``push.py``, its
command line) and the workers' feed drain. Requests go through the same enqueue
script as the workers' own, so they are deduplicated fleet-wide, with the crawl's
own host concurrency, backlog cap and tracking-parameter settings.

Fingerprints use Scrapy's default request fingerprinter; a crawl with a custom
``REQUEST_FINGERPRINTER_CLASS`` should push from Python with its own fingerprinter.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from scrapy.utils.request import RequestFingerprinter

from scrapy_redisspine.dupefilter import fingerprint_request
from scrapy_redisspine.feed_entries import FeedEntry
from scrapy_redisspine.fingerprints import same_fingerprinter
from scrapy_redisspine.frontier import EnqueueResult, Frontier, NewRequest
from scrapy_redisspine.keys import DEFAULT_GROUP, CrawlKeys
from scrapy_redisspine.placement import locate
from scrapy_redisspine.politeness import make_lane_function
from scrapy_redisspine.request_codec import RequestCodec
from scrapy_redisspine.serialization import get_serializer
from scrapy_redisspine.sharded import AnyFrontier, ShardedFrontier, stored_shards
from scrapy_redisspine.tracking import tracking_params
from scrapy_redisspine.worker import new_worker_id

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import redis
    from scrapy import Request
    from scrapy.utils.request import RequestFingerprinterProtocol

    from scrapy_redisspine.settings import SpineConfig


@dataclass(frozen=True)
class PushOptions:
    """The crawl's settings a push must share with its workers, or it would
    fingerprint, lane or cap requests differently from them."""

    serializer: str = "msgpack"
    order: str = "fifo"
    strip_tracking_params: bool = False
    extra_tracking_params: tuple[str, ...] = ()
    politeness_key: str = "host"
    host_concurrency: int = 1
    backlog_cap: int = 0
    politeness_group: str = DEFAULT_GROUP

    @classmethod
    def from_config(cls, config: SpineConfig) -> PushOptions:
        return cls(
            serializer=config.serializer, order=config.queue_order,
            strip_tracking_params=config.dedup_strip_tracking_params,
            extra_tracking_params=config.dedup_extra_tracking_params,
            politeness_key=config.politeness_key, host_concurrency=config.host_concurrency,
            backlog_cap=config.host_backlog_cap, politeness_group=config.politeness_group,
        )


class EntryEncoder:
    """Turns entries into the frontier's form (payload, fingerprint, lane), with what
    it needs built once: a drain encodes every entry of every batch through one."""

    def __init__(
        self, options: PushOptions, fingerprinter: RequestFingerprinterProtocol | None = None
    ) -> None:
        self._fingerprinter = same_fingerprinter(fingerprinter or RequestFingerprinter())
        self._tracking = (tracking_params(options.extra_tracking_params)
                          if options.strip_tracking_params else None)
        self._lane = make_lane_function(options.politeness_key)
        self._codec = RequestCodec(None, get_serializer(options.serializer))

    def encode(self, entry: FeedEntry) -> NewRequest:
        """Raises ``RequestEncodeError`` for an entry whose meta cannot be serialized."""
        request = entry.request
        return NewRequest(
            self._codec.encode(request, callback_name=entry.callback),
            fingerprint_request(self._fingerprinter, request, self._tracking),
            request.priority, dont_filter=request.dont_filter, lane=self._lane(request.url),
        )


def new_requests(
    entries: Iterable[FeedEntry], options: PushOptions,
    fingerprinter: RequestFingerprinterProtocol | None = None,
) -> list[NewRequest]:
    """The frontier's form of each entry (see :class:`EntryEncoder`)."""
    encoder = EntryEncoder(options, fingerprinter)
    return [encoder.encode(entry) for entry in entries]


def push_frontier(
    client: redis.Redis, keys: CrawlKeys, options: PushOptions, worker_id: str = ""
) -> AnyFrontier:
    """A frontier handle that enqueues as the crawl's workers do (in the layout of
    ``keys``: a sharded one routes each request to its lane's shard)."""
    worker_id = worker_id or f"push:{new_worker_id()}"
    if keys.shards > 1:
        return ShardedFrontier(client, keys, worker_id, options.order,
                               concurrency=options.host_concurrency,
                               backlog_cap=options.backlog_cap)
    return Frontier(client, keys, worker_id, options.order,
                    concurrency=options.host_concurrency, backlog_cap=options.backlog_cap)


def push_entries(
    client: redis.Redis, keys: CrawlKeys, entries: Sequence[FeedEntry],
    options: PushOptions, fingerprinter: RequestFingerprinterProtocol | None = None,
) -> EnqueueResult:
    """Enqueue entries through the crawl's dedup, in one round trip (one per shard
    the entries fall in, for a crawl created sharded: ``sharded.py``)."""
    requests = new_requests(entries, options, fingerprinter)
    shards = stored_shards(client, keys)
    return push_frontier(client, replace(keys, shards=shards), options).push(requests)


def push_requests(
    client: redis.Redis,
    crawl_id: str,
    requests: Iterable[Request],
    *,
    callback: str | None = None,
    prefix: str = "redisspine",
    options: PushOptions | None = None,
    fingerprinter: RequestFingerprinterProtocol | None = None,
) -> EnqueueResult:
    """Enqueue requests from Python (callbacks by name: ``callback`` or None for
    ``parse``); ``options`` must match the crawl's settings."""
    entries = [FeedEntry(request, callback) for request in requests]
    options = options or PushOptions()
    keys = locate(client, CrawlKeys(prefix, crawl_id, options.politeness_group), claim=True)
    return push_entries(client, keys, entries,
                        options, fingerprinter)
