"""The hiredis-first packer writes the bytes redis-py's own packer writes, and leaves
to redis-py what hiredis does not take (its conversions and errors stay)."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from redis.connection import Connection

from scrapy_redisspine._loop_io import cooperative_connection
from scrapy_redisspine._packing import HiredisFirstPacker, pack_with_hiredis
from scrapy_redisspine.connection import client_from_url

ARGUMENTS: list[tuple[Any, ...]] = [
    ("EVALSHA", "a" * 40, 2, "P:{c}:queue", b"P:{c}:seq", 0, -1, 12, 2**70),
    ("SET", "k", "é ü 日本", b"\x00\xff\r\n"),
    ("ZADD", b"z", 1.5, "m", 1e-05, "n", 1e20, "o", float("inf"), "p", -0.0, "q"),
    (b"HSET", b"h", memoryview(b"field"), memoryview(b"value")),
    ("PING",),
]


def _connections(**options: Any) -> tuple[Connection, Connection]:
    ours = cooperative_connection(Connection)(**options)
    theirs = Connection(**options)
    return ours, theirs  # type: ignore[return-value]


@pytest.mark.parametrize("args", ARGUMENTS, ids=lambda args: str(args[0]))
def test_a_command_is_the_same_bytes_as_redis_py_packs(args: tuple[Any, ...]) -> None:
    ours, theirs = _connections()
    assert isinstance(ours._command_packer, HiredisFirstPacker)
    assert b"".join(ours.pack_command(*args)) == b"".join(
        bytes(chunk) for chunk in theirs.pack_command(*args))


def test_a_pipeline_packs_the_same_bytes() -> None:
    ours, theirs = _connections()
    commands = [args for args in ARGUMENTS if not any(isinstance(a, memoryview) for a in args)]
    assert b"".join(ours.pack_commands(commands)) == b"".join(
        bytes(chunk) for chunk in theirs.pack_commands(commands))


@pytest.mark.parametrize("command", ["CLIENT SETNAME", b"SCRIPT LOAD"])
def test_a_command_name_with_a_space_is_split_as_redis_py_splits_it(command: Any) -> None:
    ours, theirs = _connections()
    assert ours.pack_command(command, "x") == theirs.pack_command(command, "x")
    assert b"".join(ours.pack_command(command, "x")).startswith(b"*3\r\n")


@pytest.mark.parametrize("value", [True, None, object()])
def test_what_redis_py_refuses_it_still_refuses_with_its_own_error(value: Any) -> None:
    ours, theirs = _connections()
    with pytest.raises(redis.DataError) as their_error:
        theirs.pack_command("SET", "k", value)
    with pytest.raises(redis.DataError) as our_error:
        ours.pack_command("SET", "k", value)
    assert str(our_error.value) == str(their_error.value)


def test_a_bytearray_is_converted_as_redis_py_converts_it() -> None:
    ours, theirs = _connections()
    args = ("SET", "k", bytearray(b"\x01\x02"))
    assert b"".join(ours.pack_command(*args)) == b"".join(
        bytes(chunk) for chunk in theirs.pack_command(*args))


@pytest.mark.parametrize(("encoding", "errors"), [("latin-1", "strict"), ("utf-8", "replace")])
def test_another_encoding_keeps_redis_py_s_packer(encoding: str, errors: str) -> None:
    """hiredis writes str as strict UTF-8: another encoding would change the bytes."""
    ours, theirs = _connections(encoding=encoding, encoding_errors=errors)
    assert not isinstance(ours._command_packer, HiredisFirstPacker)
    assert ours.pack_command("SET", "k", "é") == theirs.pack_command("SET", "k", "é")


def test_a_connection_is_wrapped_once() -> None:
    ours, _ = _connections()
    assert not pack_with_hiredis(ours)
    assert isinstance(ours._command_packer, HiredisFirstPacker)
    assert not isinstance(ours._command_packer._fallback, HiredisFirstPacker)


@pytest.mark.parametrize("cooperative", [True, False], ids=["on the loop", "blocking"])
def test_a_worker_s_client_talks_to_a_real_server_through_it(
    redis_url: str, cooperative: bool
) -> None:
    """Scripts, numbers, binary values, errors: as they were. A blocking client (a
    worker's Redis thread, the CLI) packs the same way as one parked on the loop."""
    client = client_from_url(redis_url, cooperative=cooperative)
    try:
        connection = client.connection_pool.get_connection()
        assert isinstance(connection._command_packer, HiredisFirstPacker)
        client.connection_pool.release(connection)
        client.set("packing:k", b"\x00\xff\r\n")
        assert client.get("packing:k") == b"\x00\xff\r\n"
        client.zadd("packing:z", {"a": 1.5, "b": 2**40})
        assert client.zrange("packing:z", 0, -1, withscores=True) == [(b"a", 1.5),
                                                                       (b"b", 2.0**40)]
        script = client.register_script("return {ARGV[1], tonumber(ARGV[2]) + 1, KEYS[1]}")
        assert script(keys=["packing:k"], args=["é", 41]) == ["é".encode(), 42, b"packing:k"]
        with client.pipeline() as pipe:
            assert pipe.incr("packing:n").incr("packing:n", 2).execute() == [1, 3]
        with pytest.raises(redis.DataError):
            client.set("packing:k", None)  # type: ignore[arg-type]
        with pytest.raises(redis.ResponseError):
            client.execute_command("NO-SUCH-COMMAND", 1)
    finally:
        client.delete("packing:k", "packing:z", "packing:n")
        client.close()


def test_each_connection_class_is_made_once_and_keeps_its_base() -> None:
    from redis.connection import SSLConnection, UnixDomainSocketConnection

    from scrapy_redisspine._packing import hiredis_packed

    for base in (Connection, SSLConnection, UnixDomainSocketConnection):
        assert hiredis_packed(base) is hiredis_packed(base)
        assert issubclass(hiredis_packed(base), base)
    assert isinstance(hiredis_packed(UnixDomainSocketConnection)(path="/x")._command_packer,
                      HiredisFirstPacker)
