"""Commands packed by hiredis in one call, not argument by argument in Python.

redis-py's hiredis serializer passes every argument of a command through a generator
and its ``Encoder`` in Python before hiredis packs the tuple: about 0.5 µs an
argument against hiredis's 0.15 (benchmarks/RESULTS.md, session 15). The worker's
frontier calls carry many, five for each request enqueued and seven for each ack:
packing them took ~8.6 µs of the worker's CPU per crawled request, ~2 this way.

:class:`HiredisFirstPacker` hands the tuple to ``hiredis.pack_command`` as it is and
falls back to redis-py's own packer for whatever hiredis refuses (``bool``, ``None``,
``bytearray``: redis-py's conversions and its ``DataError`` stay as they are) and for
a command name with a space (redis-py splits ``"CLIENT SETNAME"`` into two words).
hiredis writes ``str`` as UTF-8 and numbers as ``repr`` does, as redis-py's encoder
does, so it is used only where the connection encodes UTF-8 strictly (the default):
the bytes on the wire are the same either way.

Every client :func:`~scrapy_redisspine.connection.client_from_url` makes gets it, by
the connection class it gives redis-py (:func:`hiredis_packed`): a plain server's
(parked on the loop or not), each Redis Cluster node's and a Sentinel service's
primary's. The cluster is where a large fleet runs, so its workers should not pay
the slower packer.
"""

from __future__ import annotations

import codecs
import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from redis.connection import AbstractConnection

_pack_command: Callable[[tuple[Any, ...]], bytes] | None
try:
    from hiredis import pack_command as _pack_command
except ImportError:  # no hiredis, or one without pack_command: redis-py's packer stays
    _pack_command = None


class HiredisFirstPacker:
    """redis-py's command packer interface (``pack``), hiredis first."""

    def __init__(self, fallback: Any) -> None:
        self._fallback = fallback

    def pack(self, *args: Any) -> list[bytes]:
        first = args[0] if args else None
        if (type(first) is str and " " not in first) or (
            type(first) is bytes and b" " not in first
        ):
            try:
                return [_pack_command(args)]  # type: ignore[misc]
            except TypeError:  # an argument hiredis does not take: redis-py decides
                pass
        return self._fallback.pack(*args)  # type: ignore[no-any-return]


def pack_with_hiredis(connection: AbstractConnection) -> bool:
    """Give ``connection`` a :class:`HiredisFirstPacker` where the bytes it writes are
    the same as redis-py's; whether it did."""
    packer = getattr(connection, "_command_packer", None)
    encoder = getattr(connection, "encoder", None)
    if _pack_command is None or packer is None or isinstance(packer, HiredisFirstPacker):
        return False
    try:
        utf8 = codecs.lookup(encoder.encoding).name == "utf-8"  # type: ignore[union-attr]
    except (AttributeError, LookupError, TypeError):
        return False
    if not utf8 or encoder.encoding_errors != "strict":  # type: ignore[union-attr]
        return False
    connection._command_packer = HiredisFirstPacker(packer)  # type: ignore[attr-defined]
    return True


@functools.cache
def hiredis_packed(base: type[AbstractConnection]) -> type[AbstractConnection]:
    """``base`` (a redis-py connection class: TCP, TLS, Unix socket, a Sentinel's
    managed connection) whose connections pack with :class:`HiredisFirstPacker`
    where :func:`pack_with_hiredis` allows it. Cached: one class per base, so pools
    and clusters built twice share it."""

    class HiredisPacked(base):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            pack_with_hiredis(self)  # the same bytes, packed in one call

    HiredisPacked.__name__ = HiredisPacked.__qualname__ = f"HiredisPacked{base.__name__}"
    return HiredisPacked
