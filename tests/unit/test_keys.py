from __future__ import annotations

import pytest

from scrapy_redisspine.keys import GROUP_KEY_NAMES, REGISTRY_KEY_NAMES, CrawlKeys


def _properties() -> list[str]:
    return [
        name for name, value in vars(CrawlKeys).items() if isinstance(value, property)
    ]


def _all_keys(keys: CrawlKeys) -> dict[str, str]:
    return {name: getattr(keys, name) for name in _properties()}


def _tag(key: str) -> str:
    # Redis Cluster hashes the text between the first "{" and the next "}".
    start = key.index("{")
    return key[start + 1 : key.index("}", start)]


def test_every_crawl_key_shares_the_crawl_hash_tag() -> None:
    keys = CrawlKeys("redisspine", "books")
    for name, key in _all_keys(keys).items():
        if name in REGISTRY_KEY_NAMES or name in GROUP_KEY_NAMES:
            continue
        assert key.startswith("redisspine:"), key
        assert _tag(key) == "books", key


def test_group_keys_share_the_groups_own_hash_tag() -> None:
    keys = CrawlKeys("redisspine", "books", "shops")
    assert {_tag(key) for key in keys.group_keys()} == {"g:shops"}
    assert all(key.startswith("redisspine:") for key in keys.group_keys())
    assert CrawlKeys("redisspine", "books").group == "default"


def test_crawls_of_one_group_share_its_keys_and_no_other() -> None:
    first = CrawlKeys("redisspine", "a", "shops")
    second = CrawlKeys("redisspine", "b", "shops")
    other = CrawlKeys("redisspine", "a", "news")
    assert first.group_keys() == second.group_keys()
    assert not set(first.group_keys()) & set(other.group_keys())
    assert not set(first.all_crawl_keys()) & set(second.all_crawl_keys())
    assert first.all_crawl_keys() == other.all_crawl_keys()


def test_crawl_keys_are_distinct() -> None:
    keys = _all_keys(CrawlKeys("redisspine", "books"))
    assert len(set(keys.values())) == len(keys)


def test_two_crawls_share_no_key_but_the_registry_and_their_group() -> None:
    first = _all_keys(CrawlKeys("redisspine", "a"))
    second = _all_keys(CrawlKeys("redisspine", "b"))
    shared = set(first.values()) & set(second.values())
    assert shared == {*(first[name] for name in REGISTRY_KEY_NAMES),
                      *(first[name] for name in GROUP_KEY_NAMES)}


def test_crawl_ids_that_prefix_each_other_share_no_key() -> None:
    first = CrawlKeys("redisspine", "a").all_crawl_keys()
    second = CrawlKeys("redisspine", "ab").all_crawl_keys()
    assert not set(first) & set(second)


def test_registry_key_is_outside_any_crawl() -> None:
    keys = CrawlKeys("redisspine", "books")
    assert keys.crawls == "redisspine:crawls"
    assert "{" not in keys.crawls


@pytest.mark.parametrize("crawl_id", ["a{b", "a}b", "{ab}", "}"])
def test_braces_in_crawl_id_are_rejected(crawl_id: str) -> None:
    with pytest.raises(ValueError, match="hash tag"):
        CrawlKeys("redisspine", crawl_id)


@pytest.mark.parametrize("crawl_id", ["a/b", "/", "books/0"])
def test_a_slash_in_crawl_id_is_rejected(crawl_id: str) -> None:
    """``{books/0}`` is shard 0's tag of crawl ``books``: no crawl may be named so."""
    with pytest.raises(ValueError, match="must not contain '/'"):
        CrawlKeys("redisspine", crawl_id)
    assert CrawlKeys("redisspine", "books", shards=2).shard_view(0).tag() == "books/0"


@pytest.mark.parametrize("group", ["sh{ops", "shops}", ""])
def test_braces_or_nothing_in_group_are_rejected(group: str) -> None:
    with pytest.raises(ValueError, match=r"hash tag|empty"):
        CrawlKeys("redisspine", "books", group)


@pytest.mark.parametrize("prefix", ["red{is", "red}is"])
def test_braces_in_prefix_are_rejected(prefix: str) -> None:
    with pytest.raises(ValueError, match="hash tag"):
        CrawlKeys(prefix, "books")


def test_empty_crawl_id_is_rejected() -> None:
    with pytest.raises(ValueError, match="empty"):
        CrawlKeys("redisspine", "")


def test_all_crawl_keys_covers_every_property_but_the_registry_and_the_group() -> None:
    keys = CrawlKeys("redisspine", "books")
    expected = {value for name, value in _all_keys(keys).items()
                if name not in REGISTRY_KEY_NAMES and name not in GROUP_KEY_NAMES}
    assert set(keys.all_crawl_keys()) == expected
    assert len(keys.all_crawl_keys()) == len(expected)
    assert keys.crawls not in keys.all_crawl_keys()


def test_keys_are_frozen() -> None:
    keys = CrawlKeys("redisspine", "books")
    with pytest.raises(AttributeError):
        keys.crawl_id = "other"  # type: ignore[misc]


def test_on_a_cluster_every_key_but_the_registry_takes_the_crawls_tag() -> None:
    # One slot per script: the group's keys move into the crawl's slot (politeness
    # per crawl there), and stay apart from the crawl's own keys.
    keys = CrawlKeys("redisspine", "books", "shops", cluster=True)
    tags = {name: _tag(key) for name, key in _all_keys(keys).items()
            if name not in ("crawls", "crawl_groups", "group_shards")}
    assert set(tags.values()) == {"books"}, tags
    assert len(set(_all_keys(keys).values())) == len(_all_keys(keys))
    other = CrawlKeys("redisspine", "news", "shops", cluster=True)
    assert not set(keys.group_keys()) & set(other.group_keys())


def test_a_colocated_crawl_lives_in_its_groups_slot_beside_the_groups_keys() -> None:
    """Redis Cluster, politeness shared: every key a lease or an ack touches, the
    crawl's and its group's, hashes to the group's one slot."""
    keys = CrawlKeys("redisspine", "books", "shops", cluster=True, colocated=True)
    tags = {name: _tag(key) for name, key in _all_keys(keys).items()
            if name not in ("crawls", "crawl_groups")}
    assert set(tags.values()) == {"g:shops"}, tags
    assert len(set(_all_keys(keys).values())) == len(_all_keys(keys))
    assert keys.queue == "redisspine:{g:shops}:books/queue"
    assert keys.group_busy == "redisspine:{g:shops}:group_busy"
    other = CrawlKeys("redisspine", "news", "shops", cluster=True, colocated=True)
    assert keys.group_keys() == other.group_keys()
    assert not set(keys.all_crawl_keys()) & set(other.all_crawl_keys())
    # the same names as one server's group keys: one group, one budget
    assert keys.group_keys() == CrawlKeys("redisspine", "books", "shops").group_keys()


def test_a_colocated_sharded_crawl_puts_each_shard_beside_its_lanes_group_keys() -> None:
    keys = CrawlKeys("redisspine", "books", "shops", cluster=True, colocated=True, shards=3)
    other = CrawlKeys("redisspine", "news", "shops", cluster=True, colocated=True, shards=3)
    for index in range(3):
        view, twin = keys.shard_view(index), other.shard_view(index)
        named = [getattr(view, name) for name in ("queue", "hosts", "busy", "inflight",
                                                  "record", "control", "workers")]
        assert {_tag(key) for key in named + list(view.group_keys())} == {f"g:shops/{index}"}
        assert view.group_keys() == twin.group_keys()
        assert view.queue != twin.queue
    # the crawl-wide keys keep the crawl's own tag, as a sharded crawl's always did
    assert _tag(keys.workers) == "books"
    assert _tag(keys.record) == "books"
    assert _tag(keys.group_crawls) == "g:shops"


def test_only_a_crawl_on_a_cluster_is_colocated() -> None:
    with pytest.raises(ValueError, match="Cluster"):
        CrawlKeys("redisspine", "books", colocated=True)
