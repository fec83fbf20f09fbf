"""The Lua scripts, loaded once from package data.

Each ``.lua`` file is one atomic operation on a crawl's keys. :class:`ScriptSet`
registers them on a client with ``register_script``: calls go out as EVALSHA, and a
NOSCRIPT reply (after a server restart or SCRIPT FLUSH) makes redis-py load the
script again by itself.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import TYPE_CHECKING

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
)


@cache
def source(name: str) -> str:
    """The text of ``scripts/<name>.lua``."""
    if name not in SCRIPT_NAMES:
        raise KeyError(f"no Lua script named {name!r}")
    return resources.files(__package__).joinpath(f"{name}.lua").read_text("utf-8")


class ScriptSet:
    """All scripts registered on one client."""

    def __init__(self, client: redis.Redis) -> None:
        self._scripts: dict[str, Script] = {
            name: client.register_script(source(name)) for name in SCRIPT_NAMES
        }

    def __getitem__(self, name: str) -> Script:
        return self._scripts[name]
