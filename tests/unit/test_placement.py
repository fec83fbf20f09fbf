"""Where a crawl's keys live (placement.py): on one server, where the settings say,
whatever any registry holds; the cluster cases run on a real cluster
(tests/integration/test_cluster_groups_e2e.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.placement import GroupShardsConflict, claim_group_shards, locate

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
