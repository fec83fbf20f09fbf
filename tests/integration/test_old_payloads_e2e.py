"""A crawl persisted before issue 19's compact members still crawls to the end.

Half the test site is queued the way the old code wrote every request: a member of the
queue ZSET (no lists, no counts: issue 19's later layout) with a 10-digit priority key
(:func:`old_member`) holding a msgpack or JSON map of the
request's fields (:func:`old_payload`); the other half is left for the workers to
discover and queue in the compact form. Real ``scrapy crawl`` workers then drain the
mixed queue. Checked from the test site's own request log:
every page fetched, none twice, and no payload dead-lettered as undecodable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from scrapy import Request
from scrapy.utils.request import fingerprint

from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.members import index_entry_parts, order_key, parse_member, priority_key
from scrapy_redisspine.politeness import make_lane_function
from scrapy_redisspine.serialization import get_serializer
from tests.integration.crawlproc import assert_exactly_once, assert_finished

if TYPE_CHECKING:
    import redis

    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.testing.site import TestSite
    from tests.integration.crawlproc import Fleet

pytestmark = pytest.mark.e2e


def old_payload(url: str, serializer: str) -> bytes:
    """What the codec wrote before issue 19 for ``Request(url, callback=parse,
    meta={"depth": 1})``: the map of its non-default fields, URL included (the format
    of ``tests/unit/golden_payloads.json``)."""
    return get_serializer(serializer).dumps(
        {"url": url, "meta": {"depth": 1}, "callback": "parse"}
    )


def old_member(lane: str, order: int, payload: bytes) -> bytes:
    """A request of priority 0 as the code before issue 19 queued it: a member with a
    10-digit priority key and its order key."""
    return b"%s\0%010d%s%s" % (lane.encode(), 2**31 - 1, order_key(order).encode(), payload)


def make_old_queue(client: redis.Redis, keys: CrawlKeys) -> None:
    """Rewrite the queue the way the code before issue 19 held it: every request a
    member of the queue ZSET (in its lane's order, order keys from ``seq`` as then),
    no lists and no counts HASH."""
    for entry in client.zrange(keys.queue, 0, -1):
        client.zrem(keys.queue, entry)
        parts = index_entry_parts(entry)
        if parts is None:  # a member (its lane had fewer than 4 requests)
            member = parse_member(entry)
            assert member.priority_key == priority_key(0)
            client.zadd(keys.queue, {old_member(member.lane, int(member.order_key),
                                                member.payload): 0})
            continue
        lane, key = parts
        assert key == priority_key(0)
        payloads = client.lrange(keys.queue_list(lane, key), 0, -1)
        client.delete(keys.queue_list(lane, key))
        client.zadd(keys.queue, {old_member(lane, client.incr(keys.seq), payload): 0
                                 for payload in payloads})
    client.delete(keys.queue_counts)


def test_a_queue_of_old_members_crawls_to_the_end(
    fleet: Fleet, test_site: TestSite, real_redis: redis.Redis
) -> None:
    writer = Frontier(real_redis, fleet.keys, "old-writer")
    assert writer.register(flush=False, alive_ms=30_000, spider="links").status != "conflict"
    lane = make_lane_function("host")
    urls = sorted(test_site.all_urls())
    old = [NewRequest(old_payload(url, ("msgpack", "json")[i % 2]),
                      fingerprint(Request(url)), lane=lane(url))
           for i, url in enumerate(urls) if i % 2 == 0 or url in test_site.start_urls()]
    assert writer.enqueue(old).enqueued == len(old)
    writer.done_starting()
    writer.leave()
    make_old_queue(real_redis, fleet.keys)  # the lanes' counts stay right
    assert not list(real_redis.scan_iter(fleet.keys.queue + ":*"))
    queued = real_redis.zrange(fleet.keys.queue, 0, -1)
    assert all(member.split(b"\0", 1)[1][:10] == b"2147483647" for member in queued)
    assert sum(member.split(b"\0", 1)[1][25:26] in (b"\x83", b"{")
               for member in queued) == len(old) == len(queued)  # in the old map form

    results = fleet.run(2, fleet.crawling(LINKS_JOIN_ONLY=True))

    assert_finished(results)
    assert_exactly_once(test_site)
    assert sum(r.stats.get("redisspine/scheduler/undecodable", 0) for r in results) == 0
    assert not real_redis.hlen(fleet.keys.dead)
