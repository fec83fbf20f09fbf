"""Each script's KEYS come from its header: parsed, checked, bound to one crawl."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import fakeredis
import pytest

from scrapy_redisspine import scripts
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.scripts import ScriptSet, ScriptSourceError
from scrapy_redisspine.scripts._header import parse_key_header
from scrapy_redisspine.scripts._source import read_package

if TYPE_CHECKING:
    from collections.abc import Iterator

KEYS = CrawlKeys("redisspine", "test")
_COPY = re.compile(r"^local ([\w, ]+?) = (KEYS\[\d+\](?:, KEYS\[\d+\])*)$", re.MULTILINE)


def _header(*lines: str) -> str:
    return "--[[\nsome script\n\n" + "\n".join(lines) + "\n]]\nreturn 1\n"


@pytest.mark.parametrize("name", scripts.SCRIPT_NAMES)
def test_the_lua_copies_keys_into_locals_named_as_in_the_header(name: str) -> None:
    names = scripts.key_names(name)
    copied: dict[int, str] = {}
    for local_names, keys in _COPY.findall(read_package(f"{name}.lua")):
        numbers = [int(number) for number in re.findall(r"KEYS\[(\d+)\]", keys)]
        copied.update(zip(numbers, local_names.split(", "), strict=True))
    assert copied == {i + 1: key for i, key in enumerate(names)}


@pytest.mark.parametrize("name", scripts.SCRIPT_NAMES)
def test_bound_keys_are_the_crawls_keys_in_header_order(name: str) -> None:
    bound = ScriptSet(fakeredis.FakeRedis(), KEYS).keys(name)
    assert bound == tuple(getattr(KEYS, key) for key in scripts.key_names(name))
    assert bound == scripts.bind_keys(name, KEYS)


def test_keys_are_bound_to_the_crawl_of_the_set() -> None:
    other = CrawlKeys("redisspine", "other")
    assert ScriptSet(fakeredis.FakeRedis(), other).keys("lease")[0] == other.queue


def test_more_keys_follow_the_named_ones_where_the_header_allows() -> None:
    script_set = ScriptSet(fakeredis.FakeRedis(), KEYS)
    assert scripts.takes_more_keys("register")
    assert script_set.keys("register", [KEYS.seen]) == (
        KEYS.workers, KEYS.record, KEYS.queue, KEYS.inflight, KEYS.stats, KEYS.starting,
        KEYS.busy, KEYS.group_busy, KEYS.seen,
    )
    assert not scripts.takes_more_keys("lease")
    with pytest.raises(ValueError, match=r"lease\.lua takes only the keys its header names"):
        script_set.keys("lease", [KEYS.queue])


class TestHeaderChecks:
    def test_a_good_header(self) -> None:
        parsed = parse_key_header(
            _header("KEYS[1]  queue  ZSET  x", "KEYS[2] host_next HASH", "KEYS[3 ..]  rest"),
            "ok.lua",
        )
        assert parsed.names == ("queue", "host_next")
        assert parsed.more

    @pytest.mark.parametrize(("lines", "error"), [
        (("KEYS[1]  queue", "KEYS[2]  nope"), r"KEYS\[2\] is 'nope', which is no key of a crawl"),
        (("KEYS[1]  crawls",), r"KEYS\[1\] is 'crawls', which is no key of a crawl"),
        (("KEYS[1]  queue", "KEYS[3]  seen"), r"KEYS\[2\] is missing"),
        (("KEYS[2]  queue",), r"KEYS\[1\] is missing"),
        (("KEYS[1]  queue", "KEYS[1]  seen"), r"KEYS\[1\] is declared twice"),
        (("KEYS[1]  queue", "KEYS[2]  queue"), r"'queue' is both KEYS\[1\] and KEYS\[2\]"),
        (("KEYS[1]  queue", "KEYS[3 ..]  rest"), r"KEYS\[3 \.\.\] must follow .* KEYS\[2 \.\.\]"),
        (("KEYS[1]  queue", "KEYS[2 ..]  a", "KEYS[2 ..]  b"), r"KEYS\[2\] is declared twice"),
        (("KEYS[1 ..]  everything",), "its header names no KEYS"),
        (("KEYS[x]  queue",), r"cannot read the KEYS line 'KEYS\[x\]  queue'"),
        ((), "its header names no KEYS"),
    ])
    def test_a_bad_header_fails(self, lines: tuple[str, ...], error: str) -> None:
        with pytest.raises(ScriptSourceError, match=r"^bad\.lua: " + error):
            parse_key_header(_header(*lines), "bad.lua")

    def test_a_script_without_a_header_fails(self) -> None:
        with pytest.raises(ScriptSourceError, match="no --"):
            parse_key_header("local x = KEYS[1]\n", "bad.lua")


@pytest.fixture
def fresh_headers() -> Iterator[None]:
    """Scripts read afresh in this test, and again after it (not its patched text)."""
    for cached in (scripts._key_header, scripts._expansion):
        cached.cache_clear()
    yield
    for cached in (scripts._key_header, scripts._expansion):
        cached.cache_clear()


@pytest.mark.usefixtures("fresh_headers")
def test_a_bad_header_fails_when_the_scripts_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def read(relative: str) -> str:
        text = read_package(relative)
        return text.replace("KEYS[2]  seq", "KEYS[2]  sequence") if relative == "enqueue.lua" \
            else text

    monkeypatch.setattr(scripts, "read_package", read)
    with pytest.raises(ScriptSourceError, match=r"enqueue\.lua: KEYS\[2\] is 'sequence'"):
        ScriptSet(fakeredis.FakeRedis(), KEYS)
