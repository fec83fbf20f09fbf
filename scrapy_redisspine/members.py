"""The queue member format, shared by the frontier and its Lua scripts.

A queue member is ``lane \0 priority key (10 digits) order key (15 digits) payload``;
every member has score 0, so one lex range of the queue ZSET is one lane's queue,
highest priority first, then FIFO or LIFO by order key (``scripts/lib/hosts.lua``
reads the same layout).
"""

from __future__ import annotations

ORDER_KEY_LENGTH = 15
PRIORITY_KEY_LENGTH = 10

_PRIORITY_MAX = 2**31 - 1


def priority_key(priority: int) -> str:
    """10 digits that sort the higher priority first (clamped to 32 bits)."""
    clamped = max(-_PRIORITY_MAX - 1, min(_PRIORITY_MAX, priority))
    return f"{_PRIORITY_MAX - clamped:010d}"


def split_member(member: bytes) -> tuple[str, str, bytes]:
    """(lane, order key, payload) of a queue member."""
    sep = member.index(b"\0")
    start = sep + 1 + PRIORITY_KEY_LENGTH
    return (
        member[:sep].decode("utf-8", "replace"),
        member[start:start + ORDER_KEY_LENGTH].decode("ascii"),
        member[start + ORDER_KEY_LENGTH:],
    )
