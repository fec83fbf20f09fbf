"""A crawl persisted before issue 19's compact members still crawls to the end.

Half the test site is queued the way the old code wrote every request: a member with a
10-digit priority key (:func:`old_member`) holding a msgpack or JSON map of the
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
from scrapy_redisspine.members import parse_member, priority_key
from scrapy_redisspine.politeness import make_lane_function
from scrapy_redisspine.serialization import get_serializer
from tests.integration.crawlproc import assert_exactly_once, assert_finished

if TYPE_CHECKING:
    import redis

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


def old_member(member: bytes) -> bytes:
    """``member`` (priority 0) as the code before issue 19 built it."""
    parts = parse_member(member)
    assert parts.priority_key == priority_key(0)
    return b"%s\0%010d%s%s" % (parts.lane.encode(), 2**31 - 1, parts.order_key.encode(),
                                parts.payload)


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
    for member in real_redis.zrange(fleet.keys.queue, 0, -1):  # lane counts stay right
        real_redis.zrem(fleet.keys.queue, member)
        real_redis.zadd(fleet.keys.queue, {old_member(member): 0})
    queued = real_redis.zrange(fleet.keys.queue, 0, -1)
    assert all(member.split(b"\0", 1)[1][:10] == b"2147483647" for member in queued)
    assert sum(member.split(b"\0", 1)[1][25:26] in (b"\x83", b"{")
               for member in queued) == len(old)  # payloads in the old map form

    results = fleet.run(2, fleet.crawling(LINKS_JOIN_ONLY=True))

    assert_finished(results)
    assert_exactly_once(test_site)
    assert sum(r.stats.get("redisspine/scheduler/undecodable", 0) for r in results) == 0
    assert not real_redis.hlen(fleet.keys.dead)
