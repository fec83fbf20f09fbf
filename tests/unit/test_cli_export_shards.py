"""``redisspine export`` of a crawl over 3 shards, run in-process against the session's
real redis-server: every shard's stream, merged in entry-id order; the cursor keeps
one last id per shard (an export killed between batches resumes without loss or
double); a sidecar of before shards still reads; ``--after`` and ``--follow``."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

import pytest

from scrapy_redisspine import cli_export
from scrapy_redisspine._items import ItemClasses
from scrapy_redisspine.cli_export import SIDECAR_SUFFIX, entry_order, merge_batches
from scrapy_redisspine.item_codec import ItemCodec
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.request_codec import RequestCodec
from scrapy_redisspine.serialization import get_serializer
from scrapy_redisspine.sharded import ShardedFrontier
from tests.unit.test_cli_export import run

if TYPE_CHECKING:
    from pathlib import Path

    import redis

pytestmark = pytest.mark.usefixtures("outside_any_project")

SHARDS = 3
KEYS = CrawlKeys("redisspine", "shop", shards=SHARDS)
_REQUESTS = RequestCodec(None, get_serializer("msgpack"), (), ItemClasses())
CODEC = ItemCodec(_REQUESTS.serializer, _REQUESTS.items, _REQUESTS)
#: (shard, entry id) of each item, in the order of their ids: ids of 1 and 2 digits,
#: so that comparing them as text ("10-0" < "9-0") would misorder them.
LAYOUT = [(1, "1-0"), (0, "2-0"), (0, "2-1"), (2, "3-0"), (1, "9-0"), (2, "10-0"),
          (0, "11-0"), (0, "12-0")]


@pytest.fixture
def shop(real_redis: redis.Redis) -> ShardedFrontier:
    frontier = ShardedFrontier(real_redis, KEYS, "w1")
    frontier.register(flush=False, alive_ms=30_000, spider="shop")
    return frontier


def _add(client: redis.Redis, layout: list[tuple[int, str]], first: int = 0) -> None:
    """One item ``{"n": k}`` per (shard, id) of ``layout``, k counting from ``first``."""
    for n, (shard, entry_id) in enumerate(layout, start=first):
        item = CODEC.encode({"n": n}, f"https://s.test/{n}")
        client.xadd(KEYS.shard_view(shard).items,
                    {"class": item.class_path, "url": item.url, "item": item.payload},
                    id=entry_id)


def _numbers(path: Path) -> list[int]:
    return [json.loads(line)["n"] for line in path.read_text().splitlines()]


def _sidecar(out: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((out.parent / (out.name + SIDECAR_SUFFIX)).read_text())
    return loaded


def test_entry_ids_compare_as_numbers() -> None:
    assert entry_order("10-0") > entry_order("9-5") > entry_order("9-0")
    assert entry_order(b"1700000000000-3") == (1700000000000, 3)


def test_the_merge_stops_at_the_earliest_end_of_a_full_batch() -> None:
    a: list[cli_export.Entry] = [(b"1-0", {}), (b"5-0", {})]  # full: may have more
    b: list[cli_export.Entry] = [(b"2-0", {}), (b"7-0", {})]  # not full: all up to now
    merged = merge_batches([a, b], [True, False])
    assert [(shard, entry[0]) for shard, entry in merged] == [
        (0, b"1-0"), (1, b"2-0"), (0, b"5-0")]
    assert [entry[0] for _, entry in merge_batches([a, b], [False, False])] == [
        b"1-0", b"2-0", b"5-0", b"7-0"]


@pytest.mark.parametrize("batch", [2, 500])
def test_every_shards_items_are_exported_once_in_id_order(
    redis_url: str, shop: ShardedFrontier, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    batch: int,
) -> None:
    monkeypatch.setattr(cli_export, "_BATCH", batch)
    _add(shop.client, LAYOUT)
    out = tmp_path / "items.jsonl"
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    assert _numbers(out) == list(range(len(LAYOUT)))
    assert _sidecar(out)["last_ids"] == {"0": "12-0", "1": "9-0", "2": "10-0"}


def test_a_resumed_export_takes_each_shards_new_entries(
    redis_url: str, shop: ShardedFrontier, real_redis: redis.Redis, tmp_path: Path,
) -> None:
    _add(real_redis, LAYOUT)
    out = tmp_path / "items.jsonl"
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    # shard 1 gets an entry older than shard 0's last exported (another master's
    # clock): its own cursor still finds it
    _add(real_redis, [(1, "10-1"), (2, "13-0")], first=len(LAYOUT))
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    assert sorted(_numbers(out)) == list(range(len(LAYOUT) + 2))
    assert _numbers(out)[len(LAYOUT):] == [len(LAYOUT), len(LAYOUT) + 1]
    assert _sidecar(out)["exported"] == len(LAYOUT) + 2


def test_an_export_killed_between_batches_resumes_without_loss_or_double(
    redis_url: str, shop: ShardedFrontier, real_redis: redis.Redis, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli_export, "_BATCH", 2)
    _add(real_redis, LAYOUT)
    out = tmp_path / "items.jsonl"
    sidecar = tmp_path / f"items.jsonl{SIDECAR_SUFFIX}"
    saved: list[str] = []
    real_save = cli_export.save_cursor

    def save(path: Path, cursor: cli_export.Cursor) -> None:
        real_save(path, cursor)
        saved.append(path.read_text())

    monkeypatch.setattr(cli_export, "save_cursor", save)
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    assert len(saved) > 2, "several batches, each checkpointed"
    whole = out.read_bytes()
    # Killed after the second batch was written to the file and before its cursor
    # was saved: the file holds more than the first cursor says.
    sidecar.write_text(saved[0])
    assert len(whole) > json.loads(saved[0])["size"]
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    assert _numbers(out) == list(range(len(LAYOUT)))
    assert out.read_bytes() == whole


def test_a_sidecar_of_before_shards_is_read(
    redis_url: str, shop: ShardedFrontier, real_redis: redis.Redis, tmp_path: Path,
) -> None:
    _add(real_redis, LAYOUT)
    out = tmp_path / "items.jsonl"
    out.write_text('{"n": 0}\n')
    # written by an export of before shards: one last_id, no last_ids
    (tmp_path / f"items.jsonl{SIDECAR_SUFFIX}").write_text(json.dumps(
        {"crawl": "shop", "last_id": "1-0", "size": out.stat().st_size, "fields": None,
         "exported": 1}))
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    assert _numbers(out) == list(range(len(LAYOUT)))
    assert _sidecar(out)["last_ids"] == {"0": "12-0", "1": "9-0", "2": "10-0"}


def test_after_applies_to_every_shard(
    redis_url: str, shop: ShardedFrontier, real_redis: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _add(real_redis, LAYOUT)
    assert run(redis_url, "export", "shop", "-o", "-", "--after", "3-0") == 0
    out = capsys.readouterr().out
    assert [json.loads(line)["n"] for line in out.splitlines()] == [4, 5, 6, 7]


def test_follow_polls_every_shard_until_the_crawl_is_finished_and_read(
    redis_url: str, shop: ShardedFrontier, real_redis: redis.Redis, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _add(real_redis, LAYOUT[:3])
    naps: list[float] = []

    def sleep(seconds: float) -> None:  # the crawl goes on while the export waits
        naps.append(seconds)
        if len(naps) == 1:
            _add(real_redis, LAYOUT[3:6], first=3)
        elif len(naps) == 2:
            _add(real_redis, LAYOUT[6:], first=6)
            real_redis.hset(KEYS.record, "finished_ms", 1)

    monkeypatch.setattr(time, "sleep", sleep)
    out = tmp_path / "items.jsonl"
    assert run(redis_url, "export", "shop", "-o", str(out), "--follow") == 0
    assert _numbers(out) == list(range(len(LAYOUT)))
    assert naps == [cli_export._POLL_SECONDS] * 2


def test_status_counts_the_items_of_every_shard(
    redis_url: str, shop: ShardedFrontier, real_redis: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _add(real_redis, LAYOUT)
    assert run(redis_url, "status", "shop", "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert status["items"]["in_stream"] == len(LAYOUT)
