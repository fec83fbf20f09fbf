"""The frontier core on a real 3-master Redis Cluster: the calls a worker makes, with
the crawl's keys on a master that does not hold the crawl registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from redis.crc import key_slot

from scrapy_redisspine.bloom import has_redisbloom
from scrapy_redisspine.connection import client_from_url, is_cluster, same_slot
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.status import crawl_exists, list_crawls, read_status
from scrapy_redisspine.testing.redis_cluster import ClusterServers
from tests.integration.crawlproc import cluster_keys
from tests.integration.test_cluster_e2e import crawl_ids_away_from_registry

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    import redis

    from scrapy_redisspine.keys import CrawlKeys


@pytest.fixture(scope="module")
def cluster() -> Iterator[ClusterServers]:
    with ClusterServers(masters=3) as servers:
        yield servers


@pytest.fixture
def client(cluster: ClusterServers) -> Iterator[redis.Redis]:
    client = client_from_url(cluster.url)
    yield client
    client.flushall()  # every master: each test starts on an empty cluster
    client.close()


@pytest.fixture
def keys(cluster: ClusterServers) -> CrawlKeys:
    """As a worker lays a new crawl out on a cluster: in its politeness group's slot
    (the crawl's own group here, so that its id places it away from the registry)."""
    crawl = crawl_ids_away_from_registry(cluster, 1)[0]
    return cluster_keys(crawl, crawl)


def _frontier(client: redis.Redis, keys: CrawlKeys) -> Frontier:
    frontier = Frontier(client, keys, "w1", concurrency=1)
    frontier.register(flush=False, alive_ms=30_000, spider="links")
    return frontier


def test_the_crawl_and_its_registry_are_on_different_masters(
    cluster: ClusterServers, client: redis.Redis, keys: CrawlKeys
) -> None:
    assert is_cluster(client)
    assert not same_slot(client, keys.crawls, keys.queue)
    crawl_node = cluster.master_of_slot(key_slot(keys.queue.encode()))
    registry_node = cluster.master_of_slot(key_slot(keys.crawls.encode()))
    assert crawl_node.port != registry_node.port
    _frontier(client, keys)
    assert crawl_exists(client, keys)
    assert list_crawls(client, keys.crawls) == [keys.crawl_id]
    with crawl_node.client() as node:
        assert node.exists(keys.record)
    with registry_node.client() as node:
        assert node.sismember(keys.crawls, keys.crawl_id)


def test_acks_free_their_lane_before_the_lease_of_the_same_call(
    client: redis.Redis, keys: CrawlKeys
) -> None:
    """The pipelined EVALSHA pair is refused by the cluster client: the two scripts
    run one after the other, and the guarantee of the pair still holds."""
    frontier = _frontier(client, keys)
    frontier.enqueue([NewRequest(b"a1", b"fp-a1", lane="a"), NewRequest(b"a2", b"fp-a2",
                                                                       lane="a")])
    [first] = frontier.lease(5).leases
    assert frontier.lease(5).leases == [], "one request of lane a at a time"
    sent, batch = frontier.enqueue_and_lease(
        [NewRequest(b"a3", b"fp-a3", lane="a")], [(first.key, first.token)], 5)
    assert not isinstance(sent, Exception)
    assert (sent.acked, sent.enqueued) == (1, 1)
    assert [lease.payload for lease in batch.leases] == [b"a2"]


def test_acks_that_bring_nothing_go_in_the_lease_s_own_call(
    client: redis.Redis, keys: CrawlKeys
) -> None:
    # The cluster client runs a batch's scripts one by one: acks alone ride in the
    # lease's script, one round trip instead of two, and still free their lane first.
    frontier = _frontier(client, keys)
    frontier.enqueue([NewRequest(b"d1", b"fp-d1", lane="d"), NewRequest(b"d2", b"fp-d2",
                                                                       lane="d")])
    [first] = frontier.lease(5).leases
    calls: list[str] = []
    one_by_one = frontier._one_by_one

    def counted(call: tuple[str, Sequence[str], Sequence[bytes | str | int]]) -> object:
        calls.append(call[0])
        return one_by_one(call)

    frontier._one_by_one = counted  # type: ignore[method-assign,assignment]
    sent, batch = frontier.enqueue_and_lease([], [(first.key, first.token)], 5)
    assert calls == ["lease"]
    assert not isinstance(sent, Exception)
    assert sent.acked == 1
    assert [lease.payload for lease in batch.leases] == [b"d2"]


def test_scripts_load_again_on_the_crawls_master_after_a_script_flush(
    cluster: ClusterServers, client: redis.Redis, keys: CrawlKeys
) -> None:
    frontier = _frontier(client, keys)
    frontier.enqueue([NewRequest(b"b1", b"fp-b1", lane="b")])
    for master in cluster.masters:
        with master.client() as node:
            node.script_flush()
    sent, batch = frontier.enqueue_and_lease([NewRequest(b"c1", b"fp-c1", lane="c")], [], 5)
    assert not isinstance(sent, Exception)
    assert sent.enqueued == 1
    assert sorted(lease.payload for lease in batch.leases) == [b"b1", b"c1"]


def test_the_module_probe_the_memory_and_the_clock_reads_go_to_the_crawls_master(
    cluster: ClusterServers, client: redis.Redis, keys: CrawlKeys
) -> None:
    # Unrouted, redis-py cannot place BF.EXISTS (no module: not in its command table).
    assert has_redisbloom(client, keys.bloom) is False
    frontier = _frontier(client, keys)
    used = frontier.upkeep.memory().used
    crawl_node = cluster.master_of_slot(key_slot(keys.queue.encode()))
    with crawl_node.client() as node:
        assert abs(used - int(node.info("memory")["used_memory"])) < 1_000_000
    status = read_status(client, keys)
    assert status["redis_memory"]["used_bytes"] > 0
    assert frontier.upkeep.workers_alive(30_000) == 1, "TIME from the crawl's master"
    assert [worker["state"] for worker in status["workers"]] == ["alive"]


def test_status_reads_the_frontier_keys_encodings_on_the_crawls_master(
    client: redis.Redis, keys: CrawlKeys
) -> None:
    # OBJECT ENCODING routed by its key: the nodes keep Redis's defaults. The enqueue
    # script converts `backlog` and `hosts` past 16 lanes (lib/hashed.lua, on the
    # crawl's master too), so status finds nothing packed; after what a restart does
    # (an RDB load packs them again: DUMP and RESTORE here), it names them
    frontier = _frontier(client, keys)
    frontier.enqueue([NewRequest(f"h{i}/0".encode(), f"fp-{i}".encode(), lane=f"h{i}.test")
                      for i in range(20)])
    assert read_status(client, keys)["packed_keys"] == []
    for key in (keys.backlog, keys.hosts):
        client.restore(key, 0, client.dump(key), replace=True)  # type: ignore[arg-type]
    packed = read_status(client, keys)["packed_keys"]
    assert {key["key"]: key["entries"] for key in packed} == {"backlog": 20, "hosts": 20}


def test_every_node_s_connections_pack_with_hiredis(
    client: redis.Redis, keys: CrawlKeys
) -> None:
    # the cluster client's connections, to whichever node, are made by the class that
    # packs with hiredis: a pipeline and the scripts go through them
    from scrapy_redisspine._packing import HiredisFirstPacker

    frontier = _frontier(client, keys)
    frontier.enqueue([NewRequest(b"a/0", b"fp-a", lane="a.test")])
    assert [lease.payload for lease in frontier.lease(1).leases] == [b"a/0"]
    nodes = client.get_nodes()  # type: ignore[attr-defined]
    assert nodes
    for node in nodes:
        connection = node.redis_connection.connection_pool.get_connection()
        try:
            assert isinstance(connection._command_packer, HiredisFirstPacker), node
        finally:
            node.redis_connection.connection_pool.release(connection)
