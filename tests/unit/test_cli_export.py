"""``redisspine export`` and the item count of ``status``, run in-process against the
session's real redis-server."""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from decimal import Decimal
from typing import TYPE_CHECKING

import pytest

from scrapy_redisspine import cli
from scrapy_redisspine._items import ItemClasses
from scrapy_redisspine.cli_export import SIDECAR_SUFFIX
from scrapy_redisspine.frontier import Frontier
from scrapy_redisspine.item_codec import ItemCodec
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.request_codec import RequestCodec
from scrapy_redisspine.serialization import get_serializer

if TYPE_CHECKING:
    from pathlib import Path

    import redis

pytestmark = pytest.mark.usefixtures("outside_any_project")

KEYS = CrawlKeys("redisspine", "shop")


def run(url: str, *args: str) -> int:
    return cli.main(["--redis-url", url, *args])


@pytest.fixture
def shop(real_redis: redis.Redis) -> Frontier:
    frontier = Frontier(real_redis, KEYS, "w1")
    frontier.register(flush=False, alive_ms=30_000, spider="shop")
    return frontier


def _store(frontier: Frontier, *numbers: int) -> None:
    requests = RequestCodec(None, get_serializer("msgpack"), (), ItemClasses())
    codec = ItemCodec(requests.serializer, requests.items, requests)
    frontier.enqueue([], [], loose=[
        codec.encode({"n": n, "price": Decimal(f"{n}.5"), "raw": b"x"}, f"https://s.test/{n}")
        for n in numbers
    ])


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_export_resumes_where_the_last_one_stopped(
    redis_url: str, shop: Frontier, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "items.jsonl"
    _store(shop, 1, 2)
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    assert [line["n"] for line in _lines(out)] == [1, 2]
    assert _lines(out)[0] == {"n": 1, "price": "1.5", "raw": "x"}
    _store(shop, 3)
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    assert [line["n"] for line in _lines(out)] == [1, 2, 3]
    assert "exported 1 item(s) of crawl shop" in capsys.readouterr().err
    assert (tmp_path / f"items.jsonl{SIDECAR_SUFFIX}").exists()


def test_a_batch_written_after_the_cursor_is_cut_off_not_doubled(
    redis_url: str, shop: Frontier, tmp_path: Path
) -> None:
    out = tmp_path / "items.jsonl"
    _store(shop, 1, 2)
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    with out.open("ab") as stream:  # an export killed after writing, before its cursor
        stream.write(b'{"n": 3}\n{"n": 4')
    _store(shop, 3)
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    assert [line["n"] for line in _lines(out)] == [1, 2, 3]


def test_a_deleted_output_starts_afresh(redis_url: str, shop: Frontier, tmp_path: Path) -> None:
    out = tmp_path / "items.jsonl"
    _store(shop, 1)
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    out.unlink()
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    assert [line["n"] for line in _lines(out)] == [1]


def test_csv_appends_under_the_header_it_wrote(
    redis_url: str, shop: Frontier, tmp_path: Path
) -> None:
    out = tmp_path / "items.csv"
    _store(shop, 1)
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    _store(shop, 2)
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    rows = list(csv.reader(out.read_text().splitlines()))
    assert rows == [["n", "price", "raw"], ["1", "1.5", "x"], ["2", "2.5", "x"]]


@pytest.mark.parametrize("suffix", [".json", ".xml"])
def test_json_and_xml_are_whole_documents_written_anew(
    redis_url: str, shop: Frontier, tmp_path: Path, suffix: str
) -> None:
    out = tmp_path / f"items{suffix}"
    _store(shop, 1)
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    _store(shop, 2)
    assert run(redis_url, "export", "shop", "-o", str(out)) == 0
    if suffix == ".json":
        assert [item["n"] for item in json.loads(out.read_text())] == [1, 2]
    else:
        root = ET.fromstring(out.read_text())
        assert [element.findtext("n") for element in root] == ["1", "2"]


def test_standard_output_and_after(
    redis_url: str, shop: Frontier, real_redis: redis.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _store(shop, 1, 2)
    first_id = real_redis.xrange(KEYS.items, count=1)[0][0].decode()
    assert run(redis_url, "export", "shop", "-o", "-", "--after", first_id) == 0
    out = capsys.readouterr().out
    assert [json.loads(line)["n"] for line in out.splitlines()] == [2]


def test_follow_stops_when_the_crawl_is_finished_and_read_to_the_end(
    redis_url: str, shop: Frontier, real_redis: redis.Redis, tmp_path: Path
) -> None:
    _store(shop, 1)
    real_redis.hset(KEYS.record, "finished_ms", 1)
    out = tmp_path / "items.jsonl"
    assert run(redis_url, "export", "shop", "-o", str(out), "--follow") == 0
    assert [line["n"] for line in _lines(out)] == [1]


def test_a_malformed_entry_is_skipped_with_one_line_and_exit_1(
    redis_url: str, shop: Frontier, real_redis: redis.Redis, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    real_redis.xadd(KEYS.items, {"class": "dict", "url": "u", "item": b"\xc1garbage"})
    _store(shop, 1)
    out = tmp_path / "items.jsonl"
    assert run(redis_url, "export", "shop", "-o", str(out)) == cli.EXIT_PARTIAL
    assert [line["n"] for line in _lines(out)] == [1]
    err = capsys.readouterr().err
    assert "skipped: not a msgpack payload" in err
    assert "1 entry(ies) could not be read" in err
    assert "Traceback" not in err


def test_an_unknown_extension_is_one_line_and_exit_2(
    redis_url: str, shop: Frontier, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(redis_url, "export", "shop", "-o", str(tmp_path / "x.parquet")) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "cannot tell the format" in err[0]


def test_a_cursor_of_another_crawl_is_refused(
    redis_url: str, shop: Frontier, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "items.jsonl"
    out.write_text("")
    (tmp_path / f"items.jsonl{SIDECAR_SUFFIX}").write_text(json.dumps({"crawl": "other"}))
    assert run(redis_url, "export", "shop", "-o", str(out)) == cli.EXIT_USAGE
    assert "not 'shop'" in capsys.readouterr().err


def test_status_shows_the_item_count(
    redis_url: str, shop: Frontier, capsys: pytest.CaptureFixture[str]
) -> None:
    _store(shop, 1, 2)
    assert run(redis_url, "status", "shop") == 0
    assert "items: 2 in the stream   stored 2   shed 0   fenced 0" in capsys.readouterr().out
    assert run(redis_url, "status", "shop", "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert status["items"] == {"in_stream": 2, "stored": 2, "shed": 0, "fenced": 0}
