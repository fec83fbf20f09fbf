"""Reading a script's KEYS from its header; the rules are in the package docstring.

The header is the one place a script's key order is written down. Python callers
get their KEYS lists from here, so the order cannot drift between the Lua and the
Python side; a header that does not name keys a crawl has fails at load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.scripts._source import ScriptSourceError

_HEADER = re.compile(r"\A\s*--\[\[(.*?)\]\]", re.DOTALL)
_KEY_LINE = re.compile(r"KEYS\[(\d+)\]\s+(\S+)")
_MORE_LINE = re.compile(r"KEYS\[(\d+)\s*\.\.\]")
#: Every key of one crawl, by CrawlKeys property. ``crawls`` is left out: it lies
#: outside the crawl's hash tag, so no script may take it (one Cluster slot each).
CRAWL_KEY_NAMES = frozenset(
    name for name, value in vars(CrawlKeys).items()
    if isinstance(value, property) and name != "crawls"
)


@dataclass(frozen=True)
class KeyHeader:
    """A script's KEYS: the named ones in order, and whether the caller may add more
    (a ``KEYS[n ..]`` line)."""

    names: tuple[str, ...]
    more: bool


def parse_key_header(text: str, origin: str) -> KeyHeader:
    """The KEYS lines of the header that opens ``text``, checked."""
    header = _HEADER.match(text)
    if header is None:
        raise ScriptSourceError(f"{origin}: no --[[ header ]] at the top")
    named: dict[int, str] = {}
    more: int | None = None
    for line in header.group(1).splitlines():
        stripped = line.strip()
        if not stripped.startswith("KEYS["):
            continue
        key, rest = _KEY_LINE.match(stripped), _MORE_LINE.match(stripped)
        if rest:
            number = int(rest.group(1))
            _no_twice(origin, number, named, more)
            more = number
        elif key:
            number, name = int(key.group(1)), key.group(2)
            _no_twice(origin, number, named, more)
            _known(origin, number, name, named)
            named[number] = name
        else:
            raise ScriptSourceError(f"{origin}: cannot read the KEYS line {stripped!r}")
    names = _in_order(origin, named)
    if more is not None and more != len(names) + 1:
        raise ScriptSourceError(
            f"{origin}: KEYS[{more} ..] must follow the last named key, as "
            f"KEYS[{len(names) + 1} ..]"
        )
    return KeyHeader(names, more is not None)


def _no_twice(origin: str, number: int, named: dict[int, str], more: int | None) -> None:
    if number in named or number == more:
        raise ScriptSourceError(f"{origin}: KEYS[{number}] is declared twice")


def _known(origin: str, number: int, name: str, named: dict[int, str]) -> None:
    if name not in CRAWL_KEY_NAMES:
        raise ScriptSourceError(
            f"{origin}: KEYS[{number}] is {name!r}, which is no key of a crawl "
            f"(no such CrawlKeys property, or one outside the crawl's hash tag)"
        )
    for other, other_name in named.items():
        if other_name == name:
            raise ScriptSourceError(f"{origin}: {name!r} is both KEYS[{other}] and "
                                    f"KEYS[{number}]")


def _in_order(origin: str, named: dict[int, str]) -> tuple[str, ...]:
    if not named:
        raise ScriptSourceError(f"{origin}: its header names no KEYS")
    for number in range(1, max(named) + 1):
        if number not in named:
            raise ScriptSourceError(
                f"{origin}: KEYS[{number}] is missing (KEYS[1] to KEYS[{max(named)}] "
                f"must each be named)"
            )
    return tuple(named[number] for number in range(1, len(named) + 1))
