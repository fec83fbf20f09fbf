"""The queue member format, Python side (``scripts/lib/member.lua`` is the Lua side).

A queue member is ``lane \0 priority key (5 characters) order key (15 digits) payload``;
every member has score 0, so one lex range of the queue ZSET is one lane's queue,
highest priority first, then FIFO or LIFO by order key.

The priority key is the complemented 32-bit priority written in five characters that
sort as bytes: a first one from ``:`` up (69 symbols) and four from ``!`` to ``~``
(94 symbols). Members queued before issue 19 carry a 10-digit priority key instead; a
digit sorts before ``:``, so the first byte tells the two apart, and in a lane that
holds both the old ones are leased first. Five bytes less in every queued member: the
queue stores one member per request. Enqueue builds members in
Lua (the order number comes from ``seq`` in the same atomic step); the frontier reads
them here. ``tests/unit/test_members.py`` runs both sides against each other, so the
two definitions cannot drift apart.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any, NamedTuple

from redis.exceptions import ResponseError

if TYPE_CHECKING:
    from collections.abc import Collection

ORDER_KEY_LENGTH = 15
PRIORITY_KEY_LENGTH = 5
#: The priority key of members queued before issue 19: 10 digits.
OLD_PRIORITY_KEY_LENGTH = 10

_PRIORITY_MAX = 2**31 - 1
_FIRST_SYMBOL, _SYMBOL, _SYMBOLS = 0x3A, 0x21, 94  # ":" sorts after every digit
#: LIFO order keys are this minus the request's number: later requests sort first,
#: and the complement keeps 15 digits.
LIFO_TOP = 10**ORDER_KEY_LENGTH - 1


class MemberParts(NamedTuple):
    """A queue member taken apart (``member_parts`` in Lua returns the same)."""

    lane: str
    priority_key: str
    order_key: str
    payload: bytes


@lru_cache(maxsize=4096)  # a crawl uses few priorities, and every request needs one
def priority_key(priority: int) -> str:
    """5 characters that sort the higher priority first (clamped to 32 bits)."""
    clamped = max(-_PRIORITY_MAX - 1, min(_PRIORITY_MAX, priority))
    value, chars = _PRIORITY_MAX - clamped, []
    for _ in range(PRIORITY_KEY_LENGTH - 1):
        value, symbol = divmod(value, _SYMBOLS)
        chars.append(chr(_SYMBOL + symbol))
    chars.append(chr(_FIRST_SYMBOL + value))  # value < 56 here: 2**32 / 94**4
    return "".join(reversed(chars))


def _order_key_start(member: bytes, sep: int) -> int:
    """Where the order key starts: after a 10-digit (old) or 5-character priority key."""
    old = sep + 1 < len(member) and member[sep + 1] < _FIRST_SYMBOL
    return sep + 1 + (OLD_PRIORITY_KEY_LENGTH if old else PRIORITY_KEY_LENGTH)


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
    start = _order_key_start(member, sep)
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
    start = _order_key_start(member, sep)
    return (
        member[:sep].decode("utf-8", "replace"),
        member[start:start + ORDER_KEY_LENGTH].decode("ascii"),
        member[start + ORDER_KEY_LENGTH:],
    )


def queue_size(zcard: int, counts: list[Any] | None) -> int:
    """Requests queued: the queue ZSET's members (requests put back, or queued by an
    earlier version, and one index entry per list) plus what the lists hold beyond
    their entries (``scripts/lib/lists.lua``). ``counts``: HMGET of the queue's
    counts HASH, fields ``requests`` and ``lists``; counts that are no numbers add
    nothing (the next enqueue or lease counts again), so a queue that holds anything
    never reads as empty."""
    try:
        requests, lists = (int(value or 0) for value in (counts or (0, 0)))
    except (TypeError, ValueError):
        return int(zcard)
    return int(zcard) + max(requests - lists, 0)


def read_queue_size(pipe: Any, queue: str, counts: str) -> int:
    """Add to ``pipe`` the two reads :func:`queue_size` takes, in its order; returns
    where the counts' reply will be, for :func:`execute_reading_counts`."""
    pipe.zcard(queue)
    pipe.hmget(counts, "requests", "lists")
    return len(pipe) - 1


def execute_reading_counts(pipe: Any, counts_at: Collection[int]) -> list[Any]:
    """``pipe.execute()``, where a counts HASH of the wrong type (garbage written by
    hand; the next enqueue or lease counts again) reads as no counts instead of
    failing the whole read: the queue then reads as its ZSET's size, never empty
    while it holds anything. Any other error raises as ``execute()`` would."""
    replies: list[Any] = pipe.execute(raise_on_error=False)
    for at, reply in enumerate(replies):
        if isinstance(reply, Exception):
            if at in counts_at and isinstance(reply, ResponseError):
                replies[at] = None
            else:
                raise reply
    return replies


#: The last byte of a list's index entry (``scripts/lib/lists.lua``): FIFO's sorts
#: after every order key's digits (older members and put-back requests of the same
#: priority go first), LIFO's before them (the list's newest requests go first).
INDEX_ENTRY_ENDS = {"fifo": b"~", "lifo": b"!"}


def index_entry(lane: str, priority_key: str, lifo: bool = False) -> bytes:
    """The queue ZSET's entry for the list of ``lane``'s requests of one priority."""
    end = INDEX_ENTRY_ENDS["lifo" if lifo else "fifo"]
    return b"%s\0%s%s" % (lane.encode(), priority_key.encode("ascii"), end)


def index_entry_parts(entry: bytes) -> tuple[str, str] | None:
    """(lane, priority key) of an index entry; None for a request's member (which
    has 20 or more bytes after its first NUL)."""
    if len(entry) < 7 or entry[-1:] not in INDEX_ENTRY_ENDS.values():
        return None
    if entry.find(b"\0") != len(entry) - 7:
        return None
    return entry[:-7].decode("utf-8", "replace"), entry[-6:-1].decode("ascii", "replace")
