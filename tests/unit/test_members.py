"""The queue member format is defined twice, once per language: members.py and
scripts/lib/member.lua. These tests run the Lua functions on the server (both
backends) next to the Python ones and check that each side reads what the other
builds, byte for byte."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine.members import (
    LIFO_TOP,
    MemberParts,
    build_member,
    order_key,
    parse_member,
    priority_key,
    split_member,
)
from scrapy_redisspine.scripts._source import expand

if TYPE_CHECKING:
    import redis

#: A test script over the library, expanded by the loader as the real scripts are.
_CHECK = expand("""
-- #include member
if ARGV[1] == "make" then
    return member_make(ARGV[2], ARGV[3], member_order_key(tonumber(ARGV[4]), ARGV[5] == "lifo"),
                       ARGV[6])
end
local lane, priority, key, payload = member_parts(ARGV[2])
if not lane then
    return false
end
local lane_only, key_only = member_lane(ARGV[2])
return { lane, priority, key, payload, lane_only, key_only }
""", "member_check.lua").text

LANES = ("", "example.com", "ü.example", "☃", "a b\tc\n", "%d[.*-]^$", "\x01\x7f\x1b",
         "xn--bcher-kva.example", "l" * 300)
PRIORITIES = (priority_key(0), priority_key(-5), priority_key(2**40))
NUMBERS = (1, 42, 10**14 + 7, LIFO_TOP - 1)
PAYLOADS = (b"", b"\x00\xffpayload\n\x00")


def _lua_make(client: redis.Redis, lane: str, priority: str, number: int, *, order: str,
              payload: bytes) -> bytes:
    return bytes(client.eval(_CHECK, 0, "make", lane, priority, number, order, payload))


def _lua_parts(client: redis.Redis, member: bytes) -> MemberParts | None:
    reply = client.eval(_CHECK, 0, "parse", member)
    if reply is None:
        return None
    lane, priority, key, payload, lane_only, key_only = (bytes(part) for part in reply)
    assert (lane_only, key_only) == (lane, key), "member_lane and member_parts disagree"
    return MemberParts(lane.decode(), priority.decode(), key.decode(), payload)


@pytest.mark.parametrize("order", ["fifo", "lifo"])
def test_both_sides_build_and_read_the_same_members(client: redis.Redis, order: str) -> None:
    cases = itertools.product(LANES, PRIORITIES, NUMBERS, PAYLOADS)
    for lane, priority, number, payload in cases:
        key = order_key(number, lifo=order == "lifo")
        parts = MemberParts(lane, priority, key, payload)
        from_python = build_member(lane, priority, key, payload)
        from_lua = _lua_make(client, lane, priority, number, order=order, payload=payload)
        assert from_lua == from_python, parts
        assert _lua_parts(client, from_python) == parts
        assert parse_member(from_lua) == parts
        assert split_member(from_lua) == (lane, key, payload)


def test_order_keys_sort_by_number_fifo_and_against_it_lifo(client: redis.Redis) -> None:
    numbers = (1, 2, 10, 999, 10**14)
    for order in ("fifo", "lifo"):
        keys = [parse_member(_lua_make(client, "a", priority_key(0), n, order=order,
                                          payload=b"")).order_key
                for n in numbers]
        assert keys == [order_key(n, lifo=order == "lifo") for n in numbers]
        assert all(len(key) == 15 for key in keys)
        assert keys == sorted(keys, reverse=order == "lifo")


@pytest.mark.parametrize("member", [
    b"no separator", b"lane\x00short", b"lane\x000000000000not-digits-here1",
])
def test_lua_finds_no_lane_in_a_malformed_member(client: redis.Redis, member: bytes) -> None:
    assert _lua_parts(client, member) is None


def test_python_refuses_a_lane_with_a_nul() -> None:
    with pytest.raises(ValueError, match="NUL"):
        build_member("a\0b", priority_key(0), order_key(1), b"")


def old_member(lane: str, priority: int, key: str, payload: bytes) -> bytes:
    """A member as the code before issue 19 built it: a 10-digit priority key."""
    return b"%s\0%010d%s%s" % (lane.encode(), 2**31 - 1 - priority, key.encode(), payload)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_members_queued_before_issue_19_read_the_same_on_both_sides(
    client: redis.Redis, payload: bytes
) -> None:
    for lane, priority, number in itertools.product(LANES, (0, -5, 2**31 - 1), NUMBERS):
        key = order_key(number)
        member = old_member(lane, priority, key, payload)
        parts = MemberParts(lane, f"{2**31 - 1 - priority:010d}", key, payload)
        assert parse_member(member) == parts
        assert _lua_parts(client, member) == parts
        assert split_member(member) == (lane, key, payload)


def test_in_a_lane_holding_both_forms_the_old_members_sort_first() -> None:
    old = [old_member("a", p, order_key(n), b"") for n, p in ((5, 9), (6, -9))]
    new = [build_member("a", priority_key(p), order_key(n), b"") for n, p in ((1, 9), (2, -9))]
    assert sorted(old + new) == old + new
