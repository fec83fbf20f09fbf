"""``redisspine`` in a project that runs on the embedded redis-server.

The last worker to leave stops the embedded server (its append-only file keeps the
crawl). The command must still find the crawl then: it starts the server for
itself, from that file, and stops it again after; it leaves a server that workers
use running; and when it cannot start one, it says so with exit code 3.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_redisspine import cli
from scrapy_redisspine.connection import (
    SOCKET_NAME,
    ensure_embedded_server,
    shutdown_embedded_if_unused,
)
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.settings import load_config

if TYPE_CHECKING:
    from collections.abc import Iterator

KEYS = CrawlKeys("redisspine", "books")


@pytest.fixture
def embedded_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A project's embedded-server directory (short: unix socket paths are short)."""
    directory = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    for name in ("REDISSPINE_REDIS_URL", "REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(
        cli, "project_config", lambda: load_config({"REDISSPINE_EMBEDDED_DIR": str(directory)})
    )
    yield directory
    shutdown_embedded_if_unused(directory)
    shutil.rmtree(directory, ignore_errors=True)


def _crawl_left_by_the_last_worker(directory: Path) -> None:
    url = ensure_embedded_server(directory)
    client = redis.Redis.from_url(url)
    frontier = Frontier(client, KEYS, "w1")
    frontier.register(flush=False, alive_ms=30_000, spider="books")
    frontier.enqueue([NewRequest(b"payload", b"fp", lane="a.test")])
    client.close()
    assert shutdown_embedded_if_unused(directory), "the last worker stops the server"
    assert not (directory / SOCKET_NAME).exists()


def test_status_after_the_last_worker_left(
    embedded_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _crawl_left_by_the_last_worker(embedded_dir)
    assert cli.main(["status", "books", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["queued"] == 1
    assert not (embedded_dir / SOCKET_NAME).exists(), "stopped again after the command"


def test_drain_then_resume_with_no_worker_running(
    embedded_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _crawl_left_by_the_last_worker(embedded_dir)
    assert cli.main(["drain", "books"]) == 0
    assert cli.main(["resume", "books"]) == 0
    capsys.readouterr()
    assert cli.main(["status", "books", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["queued"] == 1
    assert (status["paused"], status["draining"]) == (False, False), "resume undid the drain"


def test_a_server_that_workers_use_keeps_running(embedded_dir: Path) -> None:
    _crawl_left_by_the_last_worker(embedded_dir)
    worker = redis.Redis.from_url(ensure_embedded_server(embedded_dir))
    try:
        worker.ping()
        assert cli.main(["pause", "books"]) == 0
        assert worker.hget(KEYS.control, "paused") == b"1"
        assert (embedded_dir / SOCKET_NAME).exists()
    finally:
        worker.close()


def test_no_server_to_start_is_exit_code_3(
    embedded_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _crawl_left_by_the_last_worker(embedded_dir)
    missing = embedded_dir / "no-such-redis-server"
    monkeypatch.setattr(cli, "project_config", lambda: load_config({
        "REDISSPINE_EMBEDDED_DIR": str(embedded_dir),
        "REDISSPINE_REDIS_SERVER_BIN": str(missing),
    }))
    assert cli.main(["status", "books"]) == cli.EXIT_UNREACHABLE
    error = capsys.readouterr().err
    assert "embedded redis-server" in error
    assert str(missing) in error
    assert "Traceback" not in error
