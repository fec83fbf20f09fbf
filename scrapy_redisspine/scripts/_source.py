"""Expanding ``-- #include NAME`` lines; the rules are in the package docstring.

Kept apart from the loader so that tests can expand any text with any reader (a
temporary directory, a dict) and check the rules without touching package data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    #: Reads a file of the scripts package by relative path ("lease.lua",
    #: "lib/batch.lua"); raises FileNotFoundError when there is none.
    Reader = Callable[[str], str]

_INCLUDE = re.compile(r"--\s*#include\b\s*(.*?)")
_LIBRARY_NAME = re.compile(r"\w+")


class ScriptSourceError(ValueError):
    """A script cannot be put together: bad include, include cycle, bad KEYS header."""


@dataclass(frozen=True)
class Expansion:
    """A script's text with every include expanded, and the libraries it took in in
    the order they were emitted (each after the libraries it includes)."""

    text: str
    libraries: tuple[str, ...]


def read_package(relative: str) -> str:
    """The text of a file shipped in the scripts package (``importlib.resources``)."""
    return resources.files(__package__).joinpath(relative).read_text("utf-8")


def expand(text: str, origin: str, read: Reader = read_package) -> Expansion:
    """``text`` (read from ``origin``, e.g. ``lease.lua``) with its includes expanded."""
    emitted: list[str] = []
    return Expansion(_expand(text, (origin,), read, emitted), tuple(emitted))


def _expand(text: str, chain: tuple[str, ...], read: Reader, emitted: list[str]) -> str:
    out: list[str] = []
    for line, include in _lines(text, chain[-1]):
        if include is None:
            out.append(line)
        elif not _LIBRARY_NAME.fullmatch(include):
            raise ScriptSourceError(f"{chain[-1]}: bad library name in {line.strip()!r}")
        else:
            out.append(_library(include, chain, read, emitted))
    return "".join(out)


def _lines(text: str, origin: str) -> Iterator[tuple[str, str | None]]:
    """Each line, with the library it includes (None for any other line).

    An include after the first line of code is an error: libraries come first, so no
    library can see (and come to rely on) a local of the file that includes it.
    """
    in_comment = code_seen = False
    for line in text.splitlines(keepends=True):
        stripped = line.strip()
        match = None if in_comment else _INCLUDE.fullmatch(stripped)
        if match and code_seen:
            raise ScriptSourceError(
                f"{origin}: {stripped!r} follows code; includes come right after the "
                f"header, before the first line of code"
            )
        if in_comment:
            in_comment = "]]" not in stripped
        elif stripped.startswith("--[["):
            in_comment = "]]" not in stripped[4:]
        elif stripped and not stripped.startswith("--"):
            code_seen = True
        yield line, match.group(1) if match else None


def _library(name: str, chain: tuple[str, ...], read: Reader, emitted: list[str]) -> str:
    """The text of ``lib/<name>.lua``, expanded, or "" when this script has it already."""
    path = f"lib/{name}.lua"
    if path in chain:
        cycle = " -> ".join((*chain[chain.index(path):], path))
        raise ScriptSourceError(f"include cycle: {cycle} (included from {chain[0]})")
    if name in emitted:
        return ""
    try:
        text = read(path)
    except FileNotFoundError:
        raise ScriptSourceError(
            f"unknown Lua library {name!r} (no scripts/{path}), included by "
            f"{' -> '.join(chain)}"
        ) from None
    expanded = _expand(text, (*chain, path), read, emitted)
    emitted.append(name)  # after its own includes: each library follows what it uses
    if not expanded.endswith("\n"):
        expanded += "\n"
    return expanded


#: Lua 5.1's tokens that may hold "--" or be a comment, in the order they are tried at
#: each place: a quoted string (backslash escapes), a long comment, a long comment
#: never closed, a line comment, a long string, and a quote or long bracket that opens
#: something never closed.
_LUA_TOKENS = re.compile(
    r"""(?P<string>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
    | (?P<comment>--\[(?P<c>=*)\[.*?\](?P=c)\])
    | (?P<open_comment>--\[=*\[)
    | (?P<line_comment>--[^\n]*)
    | (?P<long_string>\[(?P<s>=*)\[.*?\](?P=s)\])
    | (?P<unfinished>["']|\[=*\[)""",
    re.DOTALL | re.VERBOSE,
)


def strip_comments(text: str, origin: str = "script") -> str:
    """Lua ``text`` without its comments, each line where it was.

    Why: Redis keeps the text of every script it has loaded for as long as it runs
    (its script cache, counted in ``used_memory``), and half of these scripts' text
    is comments, the library headers repeated in every script that includes them:
    ~375 KB of a server's memory for the 29 scripts. A comment is replaced by the
    newlines it held, and each line loses its trailing blanks, so the code compiles
    to the same bytecode, line numbers included: a line number in an error from
    Redis (``user_script:123``) is the line of :func:`~scrapy_redisspine.scripts.annotated`.

    An include line (``-- #include NAME``) stays, for :func:`expand`: each file is
    stripped once, then the scripts are put together from the stripped files (the
    libraries come into many scripts).

    Lua 5.1's lexical rules: a comment starts at ``--`` outside a string, and runs to
    the end of the line, or to the matching ``]=*]`` when ``--`` is followed by a long
    bracket ``[=*[``; quoted strings honour backslash escapes, long strings
    (``[=*[ ... ]=*]``) hold anything, ``--`` included.
    """
    def replace(token: re.Match[str]) -> str:
        kind = token.lastgroup
        if kind == "line_comment" and _INCLUDE.fullmatch(token.group()):
            return token.group()  # for expand(): a file is stripped before it
        if kind in ("comment", "line_comment"):
            return "\n" * token.group().count("\n")
        if kind in ("open_comment", "unfinished"):
            line = text.count("\n", 0, token.start()) + 1
            raise ScriptSourceError(f"{origin}:{line}: unfinished string or comment")
        return token.group()

    stripped = _LUA_TOKENS.sub(replace, text)
    return "\n".join(line.rstrip() for line in stripped.split("\n"))
