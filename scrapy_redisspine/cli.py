"""``redisspine``: operate a running fleet from the command line.

    redisspine status CRAWL [--json] [--watch SECONDS] [--top N]
    redisspine seed CRAWL URL|JSON... | --file urls.txt ('-': stdin)
    redisspine pause|resume|drain CRAWL
    redisspine dead-letters CRAWL [--drop ID... | --all [--yes]]
    redisspine requeue-dead CRAWL
    redisspine export CRAWL -o FILE|- [--format FMT] [--follow] [--after ID]
    redisspine purge CRAWL [--yes]
    redisspine list
    redisspine metrics [CRAWL...] [--port 9410] [--host 127.0.0.1]
    redisspine dashboard CRAWL [--port 8410] [--host 127.0.0.1]

Global options (--redis-url, --prefix) go before or after the command.

Redis: ``--redis-url``, else the environment (``REDISSPINE_REDIS_URL``, ``REDIS_URL``),
else the Scrapy project's settings (when run inside a project), else the project's
embedded redis-server (``.scrapy/redisspine/``): joined if it runs, started from its
append-only file for the command if the last worker stopped it.

Exit codes: 0 done; 1 partly done (malformed seed lines, dead letters not found, a
question answered no, or asked with no terminal); 2 bad usage, unknown crawl or no
Redis configured; 3 Redis unreachable or answering with an error; 130 interrupted;
141 the output pipe closed (e.g. | head).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from scrapy_redisspine import cli_commands, cli_export, control
from scrapy_redisspine._cli_errors import (
    EXIT_INTERRUPTED,
    EXIT_PARTIAL,
    EXIT_PIPE_CLOSED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
)
from scrapy_redisspine._redis_urls import BadRedisUrl
from scrapy_redisspine.connection import (
    SOCKET_NAME,
    RedisServerNotFound,
    client_from_url,
    describe_url,
    ensure_embedded_server,
    shutdown_embedded_if_unused,
)
from scrapy_redisspine.frontier import Frontier
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.metrics import MAX_CRAWLS
from scrapy_redisspine.placement import PlacementCorrupt, locate
from scrapy_redisspine.settings import SpineConfig, load_config
from scrapy_redisspine.sharded import AnyFrontier, ShardedFrontier, stored_shards
from scrapy_redisspine.status import crawl_exists, list_crawls
from scrapy_redisspine.worker import default_embedded_dir

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "EXIT_INTERRUPTED", "EXIT_PARTIAL", "EXIT_PIPE_CLOSED", "EXIT_UNREACHABLE", "EXIT_USAGE",
    "CliError", "Context", "build_parser", "main",
]


def project_config() -> SpineConfig:
    """The Scrapy project's plugin settings when run inside a project, else defaults."""
    from scrapy.utils.project import get_project_settings, inside_project

    return load_config(get_project_settings() if inside_project() else {})


def resolve_redis_url(explicit: str | None, config: SpineConfig) -> tuple[str, Path | None]:
    """The URL to talk to, and the embedded server's directory when it is that one
    (started for the command if no worker runs it: stopped again after)."""
    for url in (explicit, os.environ.get("REDISSPINE_REDIS_URL"), os.environ.get("REDIS_URL"),
                config.redis_url):
        if url:
            return url, None
    directory = Path(config.embedded_dir or default_embedded_dir(createdir=False))
    if (directory / SOCKET_NAME).exists() or _holds_a_crawl(directory):
        try:
            return ensure_embedded_server(directory, config.redis_server_bin), directory
        except (RedisServerNotFound, RuntimeError, OSError, subprocess.SubprocessError) as exc:
            raise CliError(f"cannot start the project's embedded redis-server in {directory}: "
                           f"{exc}", EXIT_UNREACHABLE) from None
    raise CliError("no Redis to talk to: pass --redis-url, set REDISSPINE_REDIS_URL, or run "
                   "inside the Scrapy project whose crawl you operate")


def _holds_a_crawl(directory: Path) -> bool:
    """Did an embedded redis-server keep data here (its append-only file)?"""
    return (directory / "appendonlydir").is_dir() or (directory / "appendonly.aof").is_file()


def _client(url: str) -> redis.Redis:
    """A client with short timeouts: a command waits seconds, not forever, for Redis."""
    try:
        return client_from_url(url, socket_connect_timeout=3, socket_timeout=10)
    except BadRedisUrl as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    except redis.ConnectionError as exc:  # a cluster client connects at once
        raise CliError(f"cannot reach Redis at {describe_url(url)}: {_one_line(exc)}",
                       EXIT_UNREACHABLE) from None


class Context:
    """What every command needs: the client, the key prefix, the project config."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.config = project_config()
        self.url, self.embedded_dir = resolve_redis_url(args.redis_url, self.config)
        self.prefix: str = args.prefix or self.config.key_prefix
        self.client = _client(self.url)
        if self.embedded_dir is not None:
            self._hold_embedded()

    def _hold_embedded(self) -> None:
        """Connect now: a connected client keeps the last worker from stopping the
        embedded server under the command (``shutdown_embedded_if_unused`` counts
        clients). If it stopped in between, start it again."""
        assert self.embedded_dir is not None
        try:
            self.client.ping()
        except redis.ConnectionError:
            self.client.close()
            self.url = ensure_embedded_server(self.embedded_dir, self.config.redis_server_bin)
            self.client = _client(self.url)
            self.client.ping()

    def close(self) -> None:
        """Let go of Redis; an embedded server no worker uses any more stops again."""
        self.client.close()
        if self.embedded_dir is not None:
            shutdown_embedded_if_unused(self.embedded_dir)

    def keys(self, crawl: str, *, claim: bool = False) -> CrawlKeys:
        """The crawl's keys where it lives; ``claim``: a command that writes to it (a
        new crawl on a cluster is registered with its group first: placement.py)."""
        try:
            keys = CrawlKeys(self.prefix, crawl, self.config.politeness_group)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        # on Redis Cluster a crawl lives in its politeness group's slots: placement.py
        try:
            return locate(self.client, keys, claim=claim)
        except PlacementCorrupt as exc:
            raise CliError(str(exc)) from None

    def existing(self, crawl: str) -> CrawlKeys:
        """The keys of an existing crawl, in its layout (its number of shards: every
        command reads each shard's keys of a sharded crawl)."""
        keys = self.keys(crawl)
        if not crawl_exists(self.client, keys):
            known = list_crawls(self.client, keys.crawls, limit=20)
            raise CliError(
                f"no crawl {crawl!r} on {describe_url(self.url)} (prefix {self.prefix!r}); "
                f"crawls here: {', '.join(known) or 'none'}"
            )
        return replace(keys, shards=stored_shards(self.client, keys))

    def frontier(self, keys: CrawlKeys) -> AnyFrontier:
        """A handle on the crawl of ``keys`` in its layout (``existing`` gives the
        crawl's number of shards)."""
        if keys.shards > 1:
            return ShardedFrontier(self.client, keys, "cli",
                                   concurrency=self.config.host_concurrency)
        return Frontier(self.client, keys, "cli", concurrency=self.config.host_concurrency)


COMMANDS: dict[str, tuple[Callable[[Context, argparse.Namespace], int], str]] = {
    "status": (cli_commands.cmd_status, "queue, workers, hosts, dedup and fleet-wide stats"),
    "seed": (cli_commands.cmd_seed, "add start requests (deduplicated like the crawl's own)"),
    "pause": (cli_commands.order_command(control.PAUSED, True,
                                         "paused {crawl}: workers stop leasing"),
              "workers stop leasing and keep what they hold"),
    "resume": (cli_commands.order_command(control.PAUSED, False, "resumed {crawl}"),
               "undo pause (and drain)"),
    "drain": (cli_commands.order_command(control.DRAIN, True,
                                         "draining {crawl}: workers finish and exit"),
              "workers finish what is in progress and exit (reason 'drained')"),
    "dead-letters": (cli_commands.cmd_dead_letters,
                     "list dead letters with their reasons, or drop them for good"),
    "requeue-dead": (cli_commands.cmd_requeue_dead, "put dead letters back in the queue"),
    "sweep": (cli_commands.cmd_sweep,
              "requeue the leases of dead workers now (a crawl none of whose workers "
              "runs any more: its lanes' slots go back to the politeness group)"),
    "export": (cli_export.cmd_export,
               "write the crawl's items (REDISSPINE_ITEMS) to a file, resuming where the "
               "last export to it stopped"),
    "purge": (cli_commands.cmd_purge, "delete every key of a crawl"),
    "list": (cli_commands.cmd_list, "crawls on this Redis"),
    "metrics": (cli_commands.cmd_metrics,
                "serve Prometheus metrics of the crawls (needs the 'metrics' extra)"),
    "dashboard": (cli_commands.cmd_dashboard, "serve a live web page of a crawl"),
}


def plain(text: str) -> str:
    """Help text as plain text: the docstrings' ``literal`` markup taken out."""
    return text.replace("``", "")


def int_value(text: str) -> int:
    """An int option, with the one wording for a bad one: "must be an int"."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int, got {text!r}") from None


def seconds_value(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def _global_options(parser: argparse.ArgumentParser, default: object) -> None:
    """--redis-url and --prefix: on the main parser (default None) and again on each
    command (default SUPPRESS, so that one given before the command is kept)."""
    parser.add_argument("--redis-url", default=default,
                        help="Redis to talk to (default: the environment, the project)")
    parser.add_argument("--prefix", default=default,
                        help="key prefix (default: REDISSPINE_KEY_PREFIX)")


def _server_options(sub: argparse.ArgumentParser, port: int) -> None:
    sub.add_argument("--port", type=int_value, default=port, help=f"default {port}")
    sub.add_argument("--host", default="127.0.0.1",
                     help="address to listen on (default 127.0.0.1; 0.0.0.0 for every one)")
    sub.add_argument("--top", type=int_value, default=10, help="busiest lanes to show")


def _command_options(name: str, sub: argparse.ArgumentParser) -> None:
    if name == "metrics":
        sub.add_argument("crawls", nargs="*", metavar="CRAWL",
                         help=f"crawl ids (default: every crawl, at most {MAX_CRAWLS})")
        _server_options(sub, 9410)
        return
    if name == "dashboard":
        sub.add_argument("crawl", help="crawl id (by default the spider name)")
        _server_options(sub, 8410)
        return
    if name != "list":
        sub.add_argument("crawl", help="crawl id (by default the spider name)")
    if name == "status":
        sub.add_argument("--json", action="store_true", help="machine-readable output")
        sub.add_argument("--watch", type=seconds_value, metavar="SECONDS",
                         help="refresh every SECONDS (the screen is cleared on a terminal only)")
        sub.add_argument("--top", type=int_value, default=10, help="hosts to show")
    elif name == "seed":
        sub.add_argument("urls", nargs="*", metavar="ENTRY",
                         help="a URL, or a JSON object {url, method, meta, callback, "
                              "priority, headers, body, cb_kwargs}")
        sub.add_argument("--file", help="one entry per line ('-' for stdin)")
        sub.add_argument("--callback", help="spider method name (default: parse)")
        sub.add_argument("--priority", type=int_value, default=0)
    elif name in ("dead-letters", "requeue-dead"):
        sub.add_argument("--limit", type=int_value, default=1000, help="most to list")
    if name == "dead-letters":
        drop = sub.add_mutually_exclusive_group()
        drop.add_argument("--drop", nargs="+", metavar="ID",
                          help="drop these dead letters for good (IDs as listed)")
        drop.add_argument("--all", action="store_true", help="drop every dead letter (asks)")
        sub.add_argument("--yes", action="store_true", help="do not ask")
    elif name == "purge":
        sub.add_argument("--yes", action="store_true", help="do not ask")
    elif name == "export":
        sub.add_argument("-o", "--output", required=True, metavar="FILE",
                         help="output file, format by extension (.jsonl .json .csv .xml); "
                              "'-' for standard output")
        sub.add_argument("--format", choices=sorted(set(cli_export.FORMATS.values())),
                         help="format, whatever the extension (default for '-': jsonlines)")
        sub.add_argument("--follow", action="store_true",
                         help="keep reading a live crawl until it is finished")
        sub.add_argument("--after", metavar="ID",
                         help="start after this stream entry id (a fresh export only; "
                              "of a sharded crawl, in every shard's stream)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="redisspine", description=plain(__doc__ or ""),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    _global_options(parser, None)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        _global_options(sub, argparse.SUPPRESS)
        _command_options(name, sub)
    return parser


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _pipe_closed() -> int:
    """The reader went away (``| head``): end quietly. Python would complain again
    when it flushes stdout at exit, so stdout goes to /dev/null first."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return EXIT_PIPE_CLOSED


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    url = "Redis"
    ctx: Context | None = None
    try:
        ctx = Context(args)
        url = describe_url(ctx.url)
        code = COMMANDS[args.command][0](ctx, args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except CliError as exc:
        print(f"redisspine: {exc}", file=sys.stderr)
        return exc.code
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        print(f"redisspine: cannot reach Redis at {url}: {_one_line(exc)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except redis.RedisError as exc:  # MovedError (a cluster), WRONGTYPE, NOPERM, OOM ...
        print(f"redisspine: Redis at {url} answered with an error: {type(exc).__name__}: "
              f"{_one_line(exc)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except BrokenPipeError:
        return _pipe_closed()
    except OSError as exc:  # e.g. --file that does not exist
        print(f"redisspine: {_one_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    finally:
        if ctx is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                ctx.close()


if __name__ == "__main__":
    sys.exit(main())
