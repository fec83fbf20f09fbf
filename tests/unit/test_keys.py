from __future__ import annotations

import pytest

from scrapy_redisspine.keys import CrawlKeys


def _properties() -> list[str]:
    return [
        name for name, value in vars(CrawlKeys).items() if isinstance(value, property)
    ]


def _all_keys(keys: CrawlKeys) -> dict[str, str]:
    return {name: getattr(keys, name) for name in _properties()}


def test_every_crawl_key_shares_the_crawl_hash_tag() -> None:
    keys = CrawlKeys("redisspine", "books")
    for name, key in _all_keys(keys).items():
        if name == "crawls":
            continue
        assert key.startswith("redisspine:"), key
        # Redis Cluster hashes the text between the first "{" and the next "}".
        start = key.index("{")
        assert key[start + 1 : key.index("}", start)] == "books", key


def test_crawl_keys_are_distinct() -> None:
    keys = _all_keys(CrawlKeys("redisspine", "books"))
    assert len(set(keys.values())) == len(keys)


def test_two_crawls_share_no_key_but_the_registry() -> None:
    first = _all_keys(CrawlKeys("redisspine", "a"))
    second = _all_keys(CrawlKeys("redisspine", "b"))
    shared = set(first.values()) & set(second.values())
    assert shared == {first["crawls"]}


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


@pytest.mark.parametrize("prefix", ["red{is", "red}is"])
def test_braces_in_prefix_are_rejected(prefix: str) -> None:
    with pytest.raises(ValueError, match="hash tag"):
        CrawlKeys(prefix, "books")


def test_empty_crawl_id_is_rejected() -> None:
    with pytest.raises(ValueError, match="empty"):
        CrawlKeys("redisspine", "")


def test_all_crawl_keys_covers_every_property_but_the_registry() -> None:
    keys = CrawlKeys("redisspine", "books")
    expected = {value for name, value in _all_keys(keys).items() if name != "crawls"}
    assert set(keys.all_crawl_keys()) == expected
    assert len(keys.all_crawl_keys()) == len(expected)
    assert keys.crawls not in keys.all_crawl_keys()


def test_keys_are_frozen() -> None:
    keys = CrawlKeys("redisspine", "books")
    with pytest.raises(AttributeError):
        keys.crawl_id = "other"  # type: ignore[misc]
