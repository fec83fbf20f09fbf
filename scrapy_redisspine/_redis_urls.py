"""What a Redis URL asks for: one server, a Redis Cluster, or a Sentinel-managed primary.

redis-py's ``from_url`` knows only one server (``redis://``, ``rediss://``,
``unix://``). A cluster or a Sentinel set-up is named by several addresses, so it has
schemes of its own, in the form other Redis tools use::

    redis+cluster://[user:password@]host:port[,host:port...]
    redis+sentinel://[user:password@]host:port[,host:port...]/service_name[/db]

(``rediss+cluster://`` and ``rediss+sentinel://`` for TLS.) Parsing lives here, with no
redis import, so that the settings check rejects a bad URL at start-up with the same
words the connection would use. Errors never show the password.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

__all__ = ["CLUSTER", "SENTINEL", "SINGLE", "BadRedisUrl", "RedisTarget", "masked", "parse"]

SINGLE = "single"
CLUSTER = "cluster"
SENTINEL = "sentinel"

_SCHEMES = {
    "redis": (SINGLE, False), "rediss": (SINGLE, True), "unix": (SINGLE, False),
    "redis+cluster": (CLUSTER, False), "rediss+cluster": (CLUSTER, True),
    "redis+sentinel": (SENTINEL, False), "rediss+sentinel": (SENTINEL, True),
}

#: Every scheme, for messages.
SCHEMES = tuple(f"{scheme}://" for scheme in _SCHEMES)


class BadRedisUrl(ValueError):
    """A Redis URL that names no server we can connect to (the message masks secrets)."""


@dataclass(frozen=True)
class RedisTarget:
    """A parsed URL: ``kind`` says which client; ``url`` is kept for a single server
    (redis-py's ``from_url`` reads its options itself)."""

    kind: str
    url: str
    tls: bool = False
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    db: int = 0
    username: str | None = None
    password: str | None = None


def masked(url: str) -> str:
    """The URL with any password replaced by ``***``."""
    scheme, separator, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if at and ":" in userinfo:
        rest = f"{userinfo.split(':', 1)[0]}:***@{host}"
    return f"{scheme}{separator}{rest}"


def parse(url: str) -> RedisTarget:
    """Which client ``url`` asks for, with its addresses; :class:`BadRedisUrl` if none."""
    scheme, separator, _ = url.partition("://")
    kind, tls = _SCHEMES.get(scheme.lower(), ("", False))
    if not separator or not kind:
        raise BadRedisUrl(f"{masked(url)!r} is no Redis URL: use one of {', '.join(SCHEMES)}")
    if kind == SINGLE:
        return RedisTarget(SINGLE, url, tls)
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    target = RedisTarget(
        kind, url, tls, nodes=_nodes(url, hosts),
        username=unquote(username) or None, password=unquote(password) or None,
    )
    if parts.query or parts.fragment:
        raise BadRedisUrl(f"{masked(url)!r}: {scheme}:// URLs take no ?options")
    if kind == SENTINEL:
        return _with_service(url, target, parts.path)
    if parts.path.strip("/"):
        raise BadRedisUrl(f"{masked(url)!r}: a cluster URL has no path (a cluster has "
                          f"only database 0)")
    return target


def _nodes(url: str, hosts: str) -> tuple[tuple[str, int], ...]:
    nodes = []
    for address in hosts.split(","):
        host, colon, port = address.strip().rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise BadRedisUrl(f"{masked(url)!r}: {address.strip()!r} is no host:port")
        nodes.append((host.strip("[]"), int(port)))
    return tuple(nodes)


def _with_service(url: str, target: RedisTarget, path: str) -> RedisTarget:
    service, _, db = path.strip("/").partition("/")
    if not service:
        raise BadRedisUrl(f"{masked(url)!r}: a sentinel URL names the service after the "
                          f"addresses: redis+sentinel://host:port/service_name[/db]")
    if db and not db.isdigit():
        raise BadRedisUrl(f"{masked(url)!r}: the database after the service must be a "
                          f"number, got {db!r}")
    return RedisTarget(SENTINEL, url, target.tls, target.nodes, service, int(db or 0),
                       target.username, target.password)
