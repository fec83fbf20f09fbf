"""The Lua scripts, loaded once from package data.

Each ``<name>.lua`` file is one atomic operation on a crawl's keys. :class:`ScriptSet`
registers them on a client with ``register_script``: calls go out as EVALSHA, and a
NOSCRIPT reply (after a server restart or SCRIPT FLUSH) makes redis-py load the
script again by itself.

Libraries. Redis scripts cannot call each other, so code shared by several scripts
lives in ``lib/<name>.lua`` and is pasted in by a line ``-- #include <name>``:

- Includes expand recursively: a library includes the libraries it calls, and a
  script (or library) names only those it calls itself, never what they need.
- Each library appears once per script, after every library it includes; a later
  include of a library the script has already is dropped.
- Includes come right after the header, before the file's first line of code. A
  library therefore cannot see any local of the file that includes it: it takes
  its keys and numbers as arguments, or through an ``<library>_init`` function the
  script calls at its top (which keeps them in upvalues, as fast as locals).
- An include cycle (named in the error: ``lib/a.lua -> lib/b.lua -> lib/a.lua``), an
  unknown library or a bad name fails when the script is loaded.

Comments. The server gets each script without its comments (half of the text: the
library headers repeat in every script that includes them), since Redis keeps every
loaded script's text for as long as it runs; lines stay where they are, so the
bytecode is the same, line numbers included, and a line number in a script's error
is a line of :func:`annotated` (``_source.strip_comments``).

KEYS. A script's header lists its keys, one line each, ``KEYS[i]  name  TYPE ...``,
where ``name`` is a :class:`~scrapy_redisspine.keys.CrawlKeys` property; a last line
``KEYS[n ..]  ...`` means the caller adds keys of its own after the named ones (e.g.
every other key of the crawl, to delete them). The header is the only record of the
order: :meth:`ScriptSet.keys` builds each script's KEYS from it, once per crawl. A
name that is no crawl key, a gap, or a number or name given twice fails at load.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, Any

import redis

from scrapy_redisspine.scripts._header import KeyHeader, parse_key_header
from scrapy_redisspine.scripts._source import (
    Expansion,
    ScriptSourceError,
    expand,
    read_package,
    strip_comments,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from redis.commands.core import Script

    from scrapy_redisspine.keys import CrawlKeys

SCRIPT_NAMES = (
    "enqueue",
    "lease",
    "release",
    "bury",
    "register",
    "heartbeat",
    "purge_if_done",
    "purge_shard",
    "requeue_stale",
    "reinject_dead",
    "drop_dead",
    "release_orphans",
    "repair_unindexed",
    "seen",
    "dedup_switch",
    "migrate_dedup",
    "add_fleet_stats",
    "mark_finished",
    "purge",
    "fleet_counts",
    "record_progress",
    "add_shed",
    "take_slot",
    "count_limits",
    "feed_done",
    "shard_counts",
    "forget_workers",
    "copy_workers",
    "take_pages",
)

__all__ = [
    "SCRIPT_NAMES", "ScriptSet", "ScriptSourceError", "annotated", "bind_keys", "key_names",
    "libraries", "script_error", "source", "takes_more_keys",
]

# How Redis 6.2 words a command that a script ran and the server refused for lack of
# memory, inside the script's own error ("Error running script ...: -OOM command ...").
_WRAPPED_OOM = "-OOM command not allowed"


def script_error(exc: redis.exceptions.ResponseError) -> redis.exceptions.ResponseError:
    """The error as the workers must see it, whichever server raised it.

    Redis 7.0+ and Valkey pass on the error code of a command refused inside a script,
    so redis-py raises ``OutOfMemoryError`` for a full Redis; Redis 6.2 wraps it in the
    script's generic error. A full Redis must shed load, not be backed off as a broken
    script, so on 6.2 the wrapped refusal becomes ``OutOfMemoryError`` too.
    """
    if not isinstance(exc, redis.exceptions.OutOfMemoryError) and _WRAPPED_OOM in str(exc):
        return redis.exceptions.OutOfMemoryError(str(exc))
    return exc


def source(name: str) -> str:
    """The text of ``scripts/<name>.lua`` as the server gets it: includes expanded,
    comments out (``_source.strip_comments``: they would sit in Redis's script cache),
    every line where :func:`annotated` has it."""
    return _stripped(name)


def annotated(name: str) -> str:
    """:func:`source` with its comments: where a line number in a script's error
    from Redis points."""
    return _expansion(name).text


def libraries(name: str) -> tuple[str, ...]:
    """The libraries ``source(name)`` holds, in the order they appear."""
    return _expansion(name).libraries


def key_names(name: str) -> tuple[str, ...]:
    """The CrawlKeys properties a script takes as KEYS[1], KEYS[2] ..., in order."""
    return _key_header(name).names


def takes_more_keys(name: str) -> bool:
    """Whether the caller adds keys after the named ones (``KEYS[n ..]``)."""
    return _key_header(name).more


def bind_keys(name: str, keys: CrawlKeys) -> tuple[str, ...]:
    """The named KEYS of a script, for one crawl."""
    return tuple(getattr(keys, key) for key in key_names(name))


@cache
def _expansion(name: str) -> Expansion:
    return expand(read_package(_file(name)), _file(name))


@cache
def _stripped(name: str) -> str:
    return expand(_stripped_file(_file(name)), _file(name), _stripped_file).text


@cache
def _stripped_file(relative: str) -> str:
    """A file of the package without its comments (its includes kept)."""
    return strip_comments(read_package(relative), relative)


@cache
def _key_header(name: str) -> KeyHeader:
    return parse_key_header(read_package(_file(name)), _file(name))


def _file(name: str) -> str:
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no Lua script named {name!r}")
    return f"{name}.lua"


class ScriptSet:
    """All scripts registered on one client, with their KEYS bound to one crawl.

    Building it expands every script and reads every header, so a broken script
    fails when a frontier opens, not at its first call.
    """

    def __init__(self, client: redis.Redis, keys: CrawlKeys) -> None:
        self._client = client
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name)) for name in SCRIPT_NAMES
        }
        self._keys = {name: bind_keys(name, keys) for name in SCRIPT_NAMES}

    def load_all(self) -> None:
        """Load every script (one round trip): after a NOSCRIPT reply, which means the
        server lost its script cache (a restart, SCRIPT FLUSH). Loading one script
        at a time as each is next called would leave the cache partial, and a
        pipeline of two calls (acks, then a lease) whose first script is missing
        runs its second one first."""
        pipe = self._client.pipeline(transaction=False)
        for script in self._scripts.values():
            pipe.script_load(script.script)
        pipe.execute()

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]

    def keys(self, name: str, more: Sequence[str] = ()) -> tuple[str, ...]:
        """The KEYS of a call: the script's named keys, then ``more`` (only for a
        script whose header ends with ``KEYS[n ..]``)."""
        named = self._keys[name]
        if not more:
            return named
        if not takes_more_keys(name):
            raise ValueError(f"{name}.lua takes only the keys its header names")
        return (*named, *more)

    def run(self, name: str, args: Sequence[bytes | str | int | float],
            more_keys: Sequence[str] = ()) -> Any:
        """Run a script with its KEYS (and ``more_keys``, see :meth:`keys`)."""
        return self.call(name, self.keys(name, more_keys), args)

    def call(self, name: str, keys: Sequence[str],
             args: Sequence[bytes | str | int | float]) -> Any:
        """Run a script with the KEYS given; its errors as :func:`script_error` has them."""
        try:
            return self._scripts[name](keys=keys, args=args)
        except redis.exceptions.ResponseError as exc:
            seen = script_error(exc)
            if seen is exc:
                raise
            raise seen from exc
