"""The Lua scripts, loaded once from package data.

Each ``.lua`` file is one atomic operation on a crawl's keys. :class:`ScriptSet`
registers them on a client with ``register_script``: calls go out as EVALSHA, and a
NOSCRIPT reply (after a server restart or SCRIPT FLUSH) makes redis-py load the
script again by itself.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

from scrapy_redisspine.scripts._source import (
    Expansion,
    ScriptSourceError,
    expand,
    read_package,
)

if TYPE_CHECKING:
    import redis
    from redis.commands.core import Script

SCRIPT_NAMES = (
    "enqueue",
    "lease",
    "release",
    "bury",
    "register",
    "heartbeat",
    "purge_if_done",
    "requeue_stale",
    "reinject_dead",
    "release_orphans",
    "seen",
    "dedup_switch",
    "migrate_dedup",
)

__all__ = ["SCRIPT_NAMES", "ScriptSet", "ScriptSourceError", "libraries", "source"]


@cache
def source(name: str) -> str:
    """The text of ``scripts/<name>.lua``, with ``-- #include lib`` lines expanded.

    Redis scripts cannot call each other; a shared library (e.g. the dedup check
    every enqueue path needs) is pasted in instead, so it stays written once.
    """
    return _expansion(name).text


def libraries(name: str) -> tuple[str, ...]:
    """The libraries ``source(name)`` holds, in the order they appear."""
    return _expansion(name).libraries


@cache
def _expansion(name: str) -> Expansion:
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no Lua script named {name!r}")
    return expand(read_package(f"{name}.lua"), f"{name}.lua")


class ScriptSet:
    """All scripts registered on one client."""

    def __init__(self, client: redis.Redis) -> None:
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name)) for name in SCRIPT_NAMES
        }

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]
