"""The ``redisspine`` command, run in-process against the session's real redis-server."""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING

import pytest
from scrapy import Spider

from scrapy_redisspine import cli, deadletters
from scrapy_redisspine.control import StatsPusher, read_orders, record_progress
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from tests.queue_view import queued_count

if TYPE_CHECKING:
    from pathlib import Path

    import redis

pytestmark = pytest.mark.usefixtures("outside_any_project")

KEYS = CrawlKeys("redisspine", "books")


def run(url: str, *args: str) -> int:
    return cli.main(["--redis-url", url, *args])


def _seed(url: str, *urls: str) -> None:
    assert run(url, "seed", "books", *urls) == 0


def test_seed_file_reports_malformed_lines_and_adds_the_good_ones(
    redis_url: str, real_redis: redis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    urls = tmp_path / "urls.txt"
    urls.write_text("http://a.test/1\n\nnot a url\nhttp://b.test/2\nftp://c.test/x\n"
                    "http://a.test/1\n")
    assert run(redis_url, "seed", "books", "--file", str(urls)) == cli.EXIT_PARTIAL
    out, err = capsys.readouterr()
    assert "line 3" in err
    assert "'not a url'" in err
    assert "line 5" in err
    assert "2 new, 1 already seen, 2 malformed" in out
    assert queued_count(real_redis, KEYS) == 2
    assert real_redis.sismember(KEYS.crawls, "books")


def test_seed_from_stdin_goes_through_the_crawl_dedup(
    redis_url: str, real_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _seed(redis_url, "http://a.test/1")
    monkeypatch.setattr("sys.stdin", io.StringIO("http://a.test/1\nhttp://a.test/2\n"))
    assert run(redis_url, "seed", "books", "--file", "-") == 0
    assert "1 new, 1 already seen, 0 malformed" in capsys.readouterr().out
    assert queued_count(real_redis, KEYS) == 2


class _BooksSpider(Spider):
    name = "books"

    def parse_item(self, response: object) -> None:
        pass


def test_seed_and_push_take_the_same_json_entries_with_the_crawl_settings(
    redis_url: str, real_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    from scrapy_redisspine import push
    from scrapy_redisspine.request_codec import RequestCodec
    from scrapy_redisspine.serialization import get_serializer

    entry = json.dumps({"url": "http://a.test/j", "meta": {"k": 1}, "callback": "parse_item",
                        "priority": 4})
    assert run(redis_url, "seed", "books", entry, '{"url": "http://a.test/j", "x": 1}') == (
        cli.EXIT_PARTIAL)
    assert "unknown key(s) x" in capsys.readouterr().err
    assert push.main(["--redis-url", redis_url, "--crawl", "books", entry,
                      "http://b.test/k"]) == 0
    assert "1 new, 1 already seen, 0 malformed" in capsys.readouterr().out
    batch = Frontier(real_redis, KEYS, "w1").lease(10)
    codec = RequestCodec(_BooksSpider(), get_serializer("msgpack"))
    requests = {request.url: request for request in
                (codec.decode(lease.payload) for lease in batch.leases)}
    assert set(requests) == {"http://a.test/j", "http://b.test/k"}
    fed = requests["http://a.test/j"]
    assert (fed.meta, fed.priority) == ({"k": 1}, 4)
    assert getattr(fed.callback, "__name__", "") == "parse_item"


def test_seed_without_urls_is_a_usage_error(redis_url: str) -> None:
    assert run(redis_url, "seed", "books") == cli.EXIT_USAGE


def test_status_json_shape(
    redis_url: str, real_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(redis_url, "http://a.test/1", "http://a.test/2", "http://b.test/1")
    frontier = Frontier(real_redis, KEYS, "w1")
    frontier.register(flush=False, alive_ms=30_000)
    batch = frontier.lease(1)
    frontier.ack([batch.leases[0].handle])
    StatsPusher(real_redis, KEYS).push({"response_received_count": 3, "log_count/ERROR": 1})
    StatsPusher(real_redis, KEYS).push({"response_received_count": 2})
    record_progress(real_redis, KEYS, "w1", 0, 0)
    capsys.readouterr()
    assert run(redis_url, "status", "books", "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert status["queued"] == 2
    assert status["in_flight"] == 0
    assert status["done"] == 1
    assert status["dead_letters"] == 0
    assert status["workers_alive"] == 1
    assert [w["id"] for w in status["workers"]] == ["w1"]
    assert status["fleet_stats"]["response_received_count"] == 5
    assert status["errors"] == {"log_count/ERROR": 1}
    assert status["dedup"]["mode"] == "set"
    assert status["dedup"]["set_size"] == 3
    assert {h["lane"]: h["backlog"] for h in status["hosts"]} == {"a.test": 1, "b.test": 1}
    assert status["paused"] is False
    assert set(status) >= {"rate_per_minute", "eta_seconds", "counters", "time_ms"}


def test_status_table_is_readable(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _seed(redis_url, "http://a.test/1")
    capsys.readouterr()
    assert run(redis_url, "status", "books") == 0
    out = capsys.readouterr().out
    assert "crawl books: waiting for workers" in out
    assert "queued 1" in out
    assert "a.test" in out


def test_unknown_crawl_is_a_clear_error(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(redis_url, "http://a.test/1")
    for command in ("status", "pause", "drain", "dead-letters", "purge"):
        assert run(redis_url, command, "nope") == cli.EXIT_USAGE
        err = capsys.readouterr().err
        assert "no crawl 'nope'" in err
        assert "crawls here: books" in err


def test_unreachable_redis_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("redis://127.0.0.1:1/0", "status", "books") == cli.EXIT_UNREACHABLE
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in capsys.readouterr().err


def test_pause_resume_drain_set_the_control_hash(
    redis_url: str, real_redis: redis.Redis
) -> None:
    _seed(redis_url, "http://a.test/1")
    assert run(redis_url, "pause", "books") == 0
    assert read_orders(real_redis, KEYS).paused
    assert run(redis_url, "drain", "books") == 0
    assert read_orders(real_redis, KEYS).drain
    assert run(redis_url, "resume", "books") == 0
    orders = read_orders(real_redis, KEYS)
    assert not orders.paused
    assert not orders.drain


def test_purge_asks_for_confirmation(
    redis_url: str, real_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _seed(redis_url, "http://a.test/1")
    assert run(redis_url, "pause", "books") == 0
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)  # a terminal to ask on
    monkeypatch.setattr("builtins.input", lambda prompt: "n")
    assert run(redis_url, "purge", "books") == cli.EXIT_PARTIAL
    assert queued_count(real_redis, KEYS) == 1
    asked: list[str] = []
    monkeypatch.setattr("builtins.input", lambda prompt: asked.append(prompt) or "y")
    assert run(redis_url, "purge", "books") == 0
    assert "books" in asked[0]
    left = [key for key in KEYS.all_crawl_keys() if real_redis.exists(key)]
    assert left == [KEYS.record], "only the tombstone that tells running workers"
    assert list(real_redis.hgetall(KEYS.record)) == [b"purged_ms"]
    assert not real_redis.sismember(KEYS.crawls, "books")
    capsys.readouterr()
    assert run(redis_url, "list") == 0
    assert "no crawls" in capsys.readouterr().out


def test_purge_yes_does_not_ask(
    redis_url: str, real_redis: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    _seed(redis_url, "http://a.test/1")

    def refuse(prompt: str) -> str:
        raise AssertionError("asked")

    monkeypatch.setattr("builtins.input", refuse)
    assert run(redis_url, "purge", "books", "--yes") == 0
    assert not real_redis.exists(KEYS.queue)


def test_list_shows_crawls(redis_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _seed(redis_url, "http://a.test/1")
    assert run(redis_url, "seed", "other", "http://a.test/1") == 0
    capsys.readouterr()
    assert run(redis_url, "list") == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("\t")[0] for line in lines] == ["books", "other"]
    assert "1 queued" in lines[0]


def _bury_one(real_redis: redis.Redis) -> None:
    frontier = Frontier(real_redis, KEYS, "w1")
    frontier.register(flush=False, alive_ms=30_000)
    frontier.push([NewRequest(b"junk", b"f" * 20, 0, lane="a.test")])
    lease = frontier.lease(1).leases[0]
    assert frontier.bury(lease.handle, "spider bug")


def test_dead_letters_and_requeue(
    redis_url: str, real_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    _bury_one(real_redis)
    assert run(redis_url, "dead-letters", "books") == 0
    out = capsys.readouterr().out
    assert "spider bug" in out
    assert "lane=a.test" in out
    assert run(redis_url, "requeue-dead", "books") == 0
    assert "re-injected 1 request(s)" in capsys.readouterr().out
    assert real_redis.hlen(KEYS.dead) == 0
    assert queued_count(real_redis, KEYS) == 1


def test_deadletters_module_is_an_alias(
    redis_url: str, real_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    _bury_one(real_redis)
    assert deadletters.main(["--redis-url", redis_url, "--crawl", "books", "--reinject"]) == 0
    assert "re-injected 1" in capsys.readouterr().out


def test_redis_url_from_environment(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(redis_url, "http://a.test/1")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("REDISSPINE_REDIS_URL", redis_url)
    assert cli.main(["list"]) == 0
    assert "books" in capsys.readouterr().out


def test_no_redis_configured_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == cli.EXIT_USAGE
    assert "no Redis to talk to" in capsys.readouterr().err


def test_status_watch_refreshes_until_interrupted(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(redis_url, "http://a.test/1")
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("scrapy_redisspine.cli_commands.time.sleep", sleep)
    capsys.readouterr()
    assert run(redis_url, "status", "books", "--watch", "2") == 130
    assert sleeps == [2.0, 2.0]
    assert capsys.readouterr().out.count("crawl books: waiting for workers") == 2


def test_sweep_gives_a_dead_crawls_slots_back_to_the_politeness_group(
    redis_url: str, real_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crawl whose only worker died holding a lane: another crawl of the group waits
    for that lane until someone sweeps the dead crawl."""
    import hashlib

    dead = Frontier(real_redis, KEYS, "gone")
    other = Frontier(real_redis, CrawlKeys("redisspine", "papers"), "alive")
    for frontier, name in ((dead, b"books"), (other, b"papers")):
        frontier.enqueue([NewRequest(name, hashlib.sha1(name).digest(), lane="shared.test")])
    dead.heartbeat()
    assert len(dead.lease(1).leases) == 1
    seconds, _ = real_redis.time()
    real_redis.zadd(KEYS.workers, {"gone": (seconds - 3600) * 1000})
    assert other.lease(1).leases == [], "the lane's one slot is the dead crawl's"
    assert run(redis_url, "sweep", "books") == 0
    assert "1 lease(s) requeued" in capsys.readouterr().out
    assert not real_redis.exists(KEYS.group_busy)
    real_redis.zadd(other.keys.hosts, {"shared.test": 0}, xx=True)  # skip the re-check wait
    assert [lease.payload for lease in other.lease(1).leases] == [b"papers"]


def test_a_sharded_crawl_is_seeded_in_its_shards_and_not_misread(
    redis_url: str, real_redis: redis.Redis, capsys: pytest.CaptureFixture[str],
) -> None:
    """A crawl created sharded (ShardedFrontier): `seed` routes each URL to its lane's
    shard, orders work, and `export` reads the shards' (empty) items streams."""
    from scrapy_redisspine.sharded import ShardedFrontier

    sharded = CrawlKeys("redisspine", "books", shards=3)
    ShardedFrontier(real_redis, sharded, "w1").register(flush=False, alive_ms=30_000,
                                                         spider="books")
    _seed(redis_url, "http://a.test/1", "http://b.test/1", "http://c.test/1")
    assert "3 new" in capsys.readouterr().out
    queued = {view.shard: queued_count(real_redis, view) for view in sharded.shard_views()}
    expected: dict[int | None, int] = dict.fromkeys(range(3), 0)
    for lane in ("a.test", "b.test", "c.test"):
        expected[sharded.shard_of(lane)] += 1
    assert queued == expected
    assert not real_redis.exists(KEYS.queue)
    assert run(redis_url, "export", "books", "-o", "-") == 0
    assert "exported 0 item(s) of crawl books" in capsys.readouterr().err
    assert sum(queued_count(real_redis, view) for view in sharded.shard_views()) == 3  # kept
    assert run(redis_url, "pause", "books") == 0
    assert read_orders(real_redis, KEYS).paused
    assert run(redis_url, "list") == 0
    assert "books\t3 queued\t0 in flight\t1 worker(s)\t3 shards" in capsys.readouterr().out


def test_the_frontier_commands_read_every_shard_of_a_sharded_crawl(
    redis_url: str, real_redis: redis.Redis, capsys: pytest.CaptureFixture[str],
) -> None:
    """dead-letters, requeue-dead, sweep and purge go through the crawl's shards."""
    import hashlib

    from scrapy_redisspine.sharded import ShardedFrontier

    sharded = CrawlKeys("redisspine", "books", shards=3)
    worker = ShardedFrontier(real_redis, sharded, "gone", concurrency=10)
    worker.register(flush=False, alive_ms=30_000, spider="books")
    lanes = [f"h{n}.test" for n in range(12)]
    worker.enqueue([NewRequest(f"https://{lane}/".encode(),
                               hashlib.sha1(lane.encode()).digest(), lane=lane)
                    for lane in lanes])
    leases = worker.lease(12).leases
    assert len(leases) == 12
    for lease in leases[:2]:
        worker.bury((lease.key, lease.token), "poison")
    seconds, _ = real_redis.time()
    real_redis.zadd(sharded.workers, {"gone": (seconds - 3600) * 1000})
    assert run(redis_url, "sweep", "books") == 0
    assert "10 lease(s) requeued" in capsys.readouterr().out
    assert run(redis_url, "dead-letters", "books") == 0
    listed = capsys.readouterr().out
    assert listed.count("poison") == 2, listed
    assert run(redis_url, "status", "books", "--json") == 0
    status = json.loads(capsys.readouterr().out)
    assert (status["shards"], status["queued"], status["in_flight"], status["dead_letters"]) == (
        3, 10, 0, 2)
    assert status["counters"]["requeued"] == 10, "every shard's counters, summed"
    assert status["dedup"]["set_size"] == 12
    assert sum(row["backlog"] for row in status["hosts"]) == 10
    assert run(redis_url, "requeue-dead", "books") == 0
    assert "re-injected 2 request(s)" in capsys.readouterr().out
    assert sum(queued_count(real_redis, view) for view in sharded.shard_views()) == 12
    assert run(redis_url, "purge", "books", "--yes") == 0
    assert "purged crawl 'books'" in capsys.readouterr().out
    left = [view.queue for view in sharded.shard_views() if real_redis.exists(view.queue)]
    assert left == []


def test_a_crawl_id_with_a_slash_is_refused_in_one_line(
    redis_url: str, capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(redis_url, "seed", "a/b", "http://a.test/") != 0
    err = capsys.readouterr().err
    assert "'/'" in err
    assert len(err.strip().splitlines()) == 1
