"""``redisspine`` behaves as a user of Unix tools expects: options anywhere, no screen
codes in a pipe, a quiet end when the reader goes away, no question without a
terminal, plain help, one wording, documented exit codes for every failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis

from scrapy_redisspine import cli
from scrapy_redisspine.cli_commands import CLEAR_SCREEN
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from tests.queue_view import queued_count

if TYPE_CHECKING:
    from collections.abc import Callable

pytestmark = pytest.mark.usefixtures("outside_any_project")

KEYS = CrawlKeys("redisspine", "books")
COMMAND = str(Path(sys.executable).with_name("redisspine"))  # the installed console script


def _seed(url: str) -> None:
    assert cli.main(["--redis-url", url, "seed", "books", "http://a.test/1"]) == 0


@pytest.mark.parametrize("where", ["before", "after"])
def test_global_options_before_or_after_the_command(
    redis_url: str, where: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(redis_url)
    capsys.readouterr()
    options = ["--redis-url", redis_url, "--prefix", "redisspine"]
    argv = [*options, "list"] if where == "before" else ["list", *options]
    assert cli.main(argv) == 0
    assert capsys.readouterr().out.startswith("books\t1 queued")


def test_an_option_after_the_command_wins_over_one_before(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(redis_url)
    capsys.readouterr()
    assert cli.main(["--prefix", "redisspine", "list", "--prefix", "other",
                     "--redis-url", redis_url]) == 0
    assert "no crawls on" in capsys.readouterr().out


def _watch_twice(monkeypatch: pytest.MonkeyPatch, url: str) -> int:
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr("scrapy_redisspine.cli_commands.time.sleep", sleep)
    return cli.main(["--redis-url", url, "status", "books", "--watch", "1"])


def test_watch_writes_no_screen_codes_into_a_pipe(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(redis_url)
    capsys.readouterr()
    assert _watch_twice(monkeypatch, redis_url) == cli.EXIT_INTERRUPTED
    out = capsys.readouterr().out
    assert "\033" not in out
    assert out.count("crawl books:") == 2
    assert "\n\ncrawl books:" in out, "readings apart by a blank line"


def test_watch_clears_the_screen_on_a_terminal(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(redis_url)
    capsys.readouterr()
    monkeypatch.setattr("sys.stdout.isatty", lambda: True)
    assert _watch_twice(monkeypatch, redis_url) == cli.EXIT_INTERRUPTED
    assert capsys.readouterr().out.count(CLEAR_SCREEN) == 2


def test_a_closed_pipe_ends_quietly(redis_url: str) -> None:
    _seed(redis_url)
    process = subprocess.Popen(
        [COMMAND, "--redis-url", redis_url, "status", "books", "--watch", "0.05"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    assert process.stdout.readline().startswith(b"crawl books:")
    process.stdout.close()  # what `| head -1` does after its line
    _, err = process.communicate(timeout=30)
    assert err == b"", "no BrokenPipeError, no traceback"
    assert process.returncode == cli.EXIT_PIPE_CLOSED


def test_purge_with_no_terminal_answers_no_and_says_so(redis_url: str) -> None:
    _seed(redis_url)
    done = subprocess.run([COMMAND, "--redis-url", redis_url, "purge", "books"],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30,
                          check=False)
    assert done.returncode == cli.EXIT_PARTIAL
    assert "no: standard input is not a terminal (pass --yes)" in done.stderr
    assert "Traceback" not in done.stderr
    assert "EOFError" not in done.stderr
    assert done.stdout.strip() == "not purged"
    assert redis.Redis.from_url(redis_url).zcard(KEYS.queue) == 1, "nothing deleted"


def test_a_terminal_that_closes_at_the_question_is_a_no(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed(redis_url)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)

    def eof(prompt: str) -> str:
        raise EOFError

    monkeypatch.setattr("builtins.input", eof)
    assert cli.main(["--redis-url", redis_url, "purge", "books"]) == cli.EXIT_PARTIAL
    assert "not purged" in capsys.readouterr().out


@pytest.mark.parametrize("command", [None, *cli.COMMANDS])
def test_help_is_plain_text(command: str | None, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--help"] if command is None else [command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "usage: redisspine" in text
    assert "``" not in text
    assert "--redis-url" in text, "the global options are shown with every command"


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["dead-letters", "books", "--limit", "x"], "argument --limit: must be an int, got 'x'"),
     (["status", "books", "--top", "1.5"], "argument --top: must be an int, got '1.5'"),
     (["seed", "books", "--priority", "high"], "argument --priority: must be an int"),
     (["status", "books", "--watch", "soon"], "argument --watch: must be a number")],
)
def test_bad_numbers_say_must_be_an_int(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == cli.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_malformed_is_the_word_for_a_bad_seed_line(
    redis_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["--redis-url", redis_url, "seed", "books", "nope"]) == cli.EXIT_PARTIAL
    out, err = capsys.readouterr()
    assert "skipping malformed 'nope'" in err
    assert "0 new, 0 already seen, 1 malformed" in out


def _bury(real_redis: redis.Redis, count: int) -> list[str]:
    frontier = Frontier(real_redis, KEYS, "w1", concurrency=count)
    frontier.register(flush=False, alive_ms=30_000)
    frontier.enqueue([NewRequest(b"junk%d" % i, b"fp-junk%d" % i, 0, lane=f"h{i}.test")
                   for i in range(count)])
    leases = frontier.lease(count).leases
    assert len(leases) == count
    for lease in leases:
        assert frontier.bury(lease.handle, "spider bug")
    return [lease.key for lease in leases]


def test_dead_letters_drop_ids(
    redis_url: str, real_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    first, second, third = _bury(real_redis, 3)
    run = ["--redis-url", redis_url, "dead-letters", "books"]
    assert cli.main([*run, "--drop", first, second]) == 0
    assert "dropped 2 dead letter(s)" in capsys.readouterr().out
    assert [k.decode() for k in real_redis.hkeys(KEYS.dead)] == [third]
    assert cli.main([*run, "--drop", third, "000000000000999"]) == cli.EXIT_PARTIAL
    out, err = capsys.readouterr()
    assert "dropped 1 dead letter(s)" in out
    assert "1 of the IDs given are no dead letter of this crawl" in err
    assert real_redis.hlen(KEYS.dead) == 0
    assert queued_count(real_redis, KEYS) == 0, "dropped, not requeued"


def test_dead_letters_drop_all_asks_and_yes_does_not(
    redis_url: str, real_redis: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    _bury(real_redis, 4)
    run = ["--redis-url", redis_url, "dead-letters", "books", "--all"]
    assert cli.main(run) == cli.EXIT_PARTIAL, "no terminal: no"
    assert "no dead letter dropped" in capsys.readouterr().out
    assert real_redis.hlen(KEYS.dead) == 4
    assert cli.main([*run, "--yes"]) == 0
    assert "dropped 4 dead letter(s)" in capsys.readouterr().out
    assert not real_redis.exists(KEYS.dead)
    assert cli.main([*run, "--yes"]) == 0
    assert "no dead letters" in capsys.readouterr().out


def test_drop_and_all_do_not_go_together(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main(["dead-letters", "books", "--all", "--drop", "x"])
    assert exit_.value.code == cli.EXIT_USAGE
    assert "not allowed with argument" in capsys.readouterr().err


def _raising(exc: Exception) -> Callable[..., object]:
    def read(*_: object, **__: object) -> object:
        raise exc

    return read


@pytest.mark.parametrize("exc", [
    redis.exceptions.MovedError("3999 127.0.0.1:6381"),
    redis.exceptions.NoPermissionError("this user has no permissions to run 'zcard'"),
    redis.exceptions.ResponseError("OOM command not allowed\nwhen used memory > 'maxmemory'"),
])
def test_any_redis_error_is_exit_3_in_one_line(
    redis_url: str, exc: Exception, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _seed(redis_url)
    capsys.readouterr()
    monkeypatch.setattr("scrapy_redisspine.cli_commands.read_status", _raising(exc))
    assert cli.main(["--redis-url", redis_url, "status", "books"]) == cli.EXIT_UNREACHABLE
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"redisspine: Redis at {redis_url} answered with an error: "
                          f"{type(exc).__name__}: ")


def test_a_key_of_the_wrong_type_is_exit_3_in_one_line(redis_url: str) -> None:
    _seed(redis_url)
    client = redis.Redis.from_url(redis_url)
    client.delete(KEYS.queue)
    client.set(KEYS.queue, "not a zset")
    done = subprocess.run([COMMAND, "--redis-url", redis_url, "status", "books"],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == cli.EXIT_UNREACHABLE
    assert done.stderr.count("\n") == 1, done.stderr
    assert "WRONGTYPE" in done.stderr
    assert "Traceback" not in done.stderr
