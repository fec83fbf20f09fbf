"""The queue member format, Python side (``scripts/lib/member.lua`` is the Lua side).

A queue member is ``lane \0 priority key (10 digits) order key (15 digits) payload``;
every member has score 0, so one lex range of the queue ZSET is one lane's queue,
highest priority first, then FIFO or LIFO by order key. Enqueue builds members in
Lua (the order number comes from ``seq`` in the same atomic step); the frontier reads
them here. ``tests/unit/test_members.py`` runs both sides against each other, so the
two definitions cannot drift apart.
"""

from __future__ import annotations

from typing import NamedTuple

ORDER_KEY_LENGTH = 15
PRIORITY_KEY_LENGTH = 10

_PRIORITY_MAX = 2**31 - 1
#: LIFO order keys are this minus the request's number: later requests sort first,
#: and the complement keeps 15 digits.
LIFO_TOP = 10**ORDER_KEY_LENGTH - 1


class MemberParts(NamedTuple):
    """A queue member taken apart (``member_parts`` in Lua returns the same)."""

    lane: str
    priority_key: str
    order_key: str
    payload: bytes


def priority_key(priority: int) -> str:
    """10 digits that sort the higher priority first (clamped to 32 bits)."""
    clamped = max(-_PRIORITY_MAX - 1, min(_PRIORITY_MAX, priority))
    return f"{_PRIORITY_MAX - clamped:010d}"


def order_key(number: int, lifo: bool = False) -> str:
    """The 15-digit order key of the request numbered ``number`` (from ``seq``)."""
    return f"{LIFO_TOP - number if lifo else number:015d}"


def build_member(lane: str, priority_key: str, order_key: str, payload: bytes) -> bytes:
    """The queue member of a request (what ``member_make`` in Lua returns)."""
    if "\0" in lane:
        raise ValueError(f"a lane cannot hold a NUL byte: {lane!r}")
    return b"%s\0%s%s%s" % (lane.encode(), priority_key.encode("ascii"),
                            order_key.encode("ascii"), payload)


def parse_member(member: bytes) -> MemberParts:
    """All parts of a queue member; ValueError if it has no NUL after its lane."""
    sep = member.index(b"\0")
    start = sep + 1 + PRIORITY_KEY_LENGTH
    return MemberParts(
        member[:sep].decode("utf-8", "replace"),
        member[sep + 1:start].decode("ascii"),
        member[start:start + ORDER_KEY_LENGTH].decode("ascii"),
        member[start + ORDER_KEY_LENGTH:],
    )


def split_member(member: bytes) -> tuple[str, str, bytes]:
    """(lane, order key, payload) of a queue member: the lease path's reader, which
    skips the priority key (it has no use for it, and each lease pays for this)."""
    sep = member.index(b"\0")
    start = sep + 1 + PRIORITY_KEY_LENGTH
    return (
        member[:sep].decode("utf-8", "replace"),
        member[start:start + ORDER_KEY_LENGTH].decode("ascii"),
        member[start + ORDER_KEY_LENGTH:],
    )
