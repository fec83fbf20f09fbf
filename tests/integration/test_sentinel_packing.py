"""A Sentinel service's primary is reached through connections that pack commands
with hiredis, as a plain server's are (scrapy_redisspine/_packing.py): the scripts,
a pipeline and binary values go through them unchanged."""

from __future__ import annotations

from scrapy_redisspine._packing import HiredisFirstPacker
from scrapy_redisspine.connection import client_from_url, sentinel_primary
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.testing.redis_cluster import SentinelServers


def test_the_primary_s_connections_pack_with_hiredis() -> None:
    with SentinelServers() as sentinel:
        client = client_from_url(sentinel.url)
        try:
            assert sentinel_primary(client) == ("127.0.0.1", sentinel.primary_port())
            frontier = Frontier(client, CrawlKeys("redisspine", "packing"), "w1")
            frontier.register(flush=False, alive_ms=30_000, spider="s")
            frontier.enqueue([NewRequest(b"\x00\xffpayload", b"fp-1", lane="a.test")])
            assert [lease.payload for lease in frontier.lease(1).leases] == [b"\x00\xffpayload"]
            with client.pipeline() as pipe:
                assert pipe.incr("packing:n").incr("packing:n", 2).execute() == [1, 3]
            pool = client.connection_pool
            connection = pool.get_connection()
            try:
                assert isinstance(connection._command_packer, HiredisFirstPacker)
            finally:
                pool.release(connection)
        finally:
            client.close()
