"""Where a crawl's keys live (placement.py): on one server, where the settings say,
whatever any registry holds; the cluster cases run on a real cluster
(tests/integration/test_cluster_groups_e2e.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.placement import (
    GroupShardsConflict,
    PlacementCorrupt,
    claim_group_shards,
    locate,
    locate_on_cluster,
)

if TYPE_CHECKING:
    import redis


def test_on_one_server_a_crawl_is_where_its_settings_say(client: redis.Redis) -> None:
    keys = CrawlKeys("redisspine", "books", "shops", shards=3)
    client.hset(keys.crawl_groups, "books", "elsewhere")  # (a cluster's registry)
    placed = locate(client, keys)
    assert placed == keys
    assert not placed.cluster
    assert not placed.colocated


def test_one_servers_crawls_claim_no_group_layout(client: redis.Redis) -> None:
    keys = CrawlKeys("redisspine", "books", "shops", shards=3)
    claim_group_shards(client, keys)
    assert not client.exists(keys.group_shards)


def test_a_group_shards_conflict_names_both_numbers_and_the_ways_out() -> None:
    keys = CrawlKeys("redisspine", "books", "shops", cluster=True, colocated=True, shards=1)
    message = str(GroupShardsConflict(keys, 3))
    for said in ("'shops'", "REDISSPINE_SHARDS = 3", "REDISSPINE_SHARDS = 1",
                 "REDISSPINE_POLITENESS_GROUP"):
        assert said in message
    with pytest.raises(ValueError, match="spreads its lanes over 3 slot"):
        raise GroupShardsConflict(keys, 3)


def _colocated(crawl: str, group: str = "default", shards: int = 1) -> CrawlKeys:
    return CrawlKeys("redisspine", crawl, group, cluster=True, colocated=True, shards=shards)


class TestOnACluster:
    """locate_on_cluster's decisions, on any server (a real cluster runs them in
    tests/integration/test_cluster_groups_e2e.py)."""

    def test_a_new_crawl_goes_to_its_groups_slots(self, client: redis.Redis) -> None:
        placed = locate_on_cluster(client, CrawlKeys("redisspine", "books", "shops"))
        assert placed == _colocated("books", "shops")

    def test_a_registered_crawl_is_found_in_its_group(self, client: redis.Redis) -> None:
        client.hset(_colocated("books").crawl_groups, "books", "shops")
        assert locate_on_cluster(client, CrawlKeys("redisspine", "books")) == _colocated(
            "books", "shops")

    def test_a_crawl_an_earlier_version_laid_out_stays_in_its_own_slot(
        self, client: redis.Redis
    ) -> None:
        old = CrawlKeys("redisspine", "books", "shops", cluster=True)
        client.hset(old.record, "epoch", "e")
        assert locate_on_cluster(client, CrawlKeys("redisspine", "books", "shops")) == old

    def test_the_groups_number_of_slots_is_claimed_once(self, client: redis.Redis) -> None:
        claim_group_shards(client, _colocated("one", "shops", shards=2))
        assert locate_on_cluster(client, CrawlKeys("redisspine", "two", "shops")).shards == 2
        claim_group_shards(client, _colocated("two", "shops", shards=2))
        with pytest.raises(GroupShardsConflict, match="REDISSPINE_SHARDS = 2"):
            claim_group_shards(client, _colocated("three", "shops", shards=3))

    @pytest.mark.parametrize("garbage", [b"abc", b"0", b"-2", b"2.5", b""])
    def test_garbage_in_the_groups_number_of_slots_is_a_clear_error(
        self, client: redis.Redis, garbage: bytes
    ) -> None:
        keys = _colocated("books", "shops")
        client.set(keys.group_shards, garbage)
        with pytest.raises(PlacementCorrupt, match=r"shards holds .* set it to"):
            locate_on_cluster(client, CrawlKeys("redisspine", "books", "shops"))
        with pytest.raises(PlacementCorrupt):
            claim_group_shards(client, keys)

    def test_a_registered_group_no_crawl_can_have_is_a_clear_error(
        self, client: redis.Redis
    ) -> None:
        client.hset(_colocated("books").crawl_groups, "books", "sh{ops")
        with pytest.raises(PlacementCorrupt, match="delete that field"):
            locate_on_cluster(client, CrawlKeys("redisspine", "books"))


class TestJoiningANewCrawlAtOnce:
    """CI found it: three workers joining a new sharded crawl on a cluster at once;
    one saw the first's record (a sharded crawl keeps it under its own tag, where an
    earlier version's crawl has it) before the group was registered, took the crawl
    for an earlier version's and crawled every page a second time in that layout."""

    def test_a_crawl_whose_group_is_registered_is_never_taken_for_an_earlier_ones(
        self, client: redis.Redis
    ) -> None:
        first = locate_on_cluster(client, CrawlKeys("redisspine", "new", "g", shards=3),
                                  claim=True)
        assert first.colocated
        client.hset(first.record, "epoch", "e")  # the first worker registered
        later = locate_on_cluster(client, CrawlKeys("redisspine", "new", "g", shards=3))
        assert later == first

    def test_the_group_is_registered_before_anything_of_the_crawl(
        self, client: redis.Redis
    ) -> None:
        keys = CrawlKeys("redisspine", "new", "g")
        locate_on_cluster(client, keys, claim=True)
        assert client.hget(keys.crawl_groups, "new") == b"g"
        assert client.dbsize() == 1  # the registry only

    def test_the_first_claim_wins_for_every_joiner(self, client: redis.Redis) -> None:
        locate_on_cluster(client, CrawlKeys("redisspine", "new", "first"), claim=True)
        placed = locate_on_cluster(client, CrawlKeys("redisspine", "new", "second"),
                                   claim=True)
        assert placed.group == "first"

    def test_a_reader_claims_nothing(self, client: redis.Redis) -> None:
        keys = CrawlKeys("redisspine", "new", "g")
        assert locate_on_cluster(client, keys).colocated
        assert not client.exists(keys.crawl_groups)
