"""``redisspine``: operate a running fleet from the command line.

    redisspine status CRAWL [--json] [--watch SECONDS]
    redisspine seed CRAWL URL... | --file urls.txt ('-': stdin)
    redisspine pause|resume|drain CRAWL
    redisspine dead-letters CRAWL / requeue-dead CRAWL
    redisspine purge CRAWL [--yes]
    redisspine list

Redis: ``--redis-url``, else the environment (``REDISSPINE_REDIS_URL``, ``REDIS_URL``),
else the Scrapy project's settings (when run inside a project), else the project's
embedded redis-server (``.scrapy/redisspine/``): joined if it runs, started from its
append-only file for the command if the last worker stopped it.

Exit codes: 0 done, 1 partly done (e.g. malformed seed lines), 2 bad usage or unknown
crawl, 3 Redis unreachable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from scrapy_redisspine import control
from scrapy_redisspine.cli_output import print_dead_letters, render_status
from scrapy_redisspine.connection import (
    SOCKET_NAME,
    RedisServerNotFound,
    describe_url,
    ensure_embedded_server,
    shutdown_embedded_if_unused,
)
from scrapy_redisspine.frontier import Frontier
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.settings import SpineConfig, load_config
from scrapy_redisspine.status import crawl_exists, list_crawls, read_status
from scrapy_redisspine.status_eta import LanePace
from scrapy_redisspine.worker import default_embedded_dir

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from scrapy import Request

EXIT_PARTIAL, EXIT_USAGE, EXIT_UNREACHABLE = 1, 2, 3


class CliError(Exception):
    """A user-facing failure: its message is printed, its code is the exit code."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


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


class Context:
    """What every command needs: the client, the key prefix, the project config."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.config = project_config()
        self.url, self.embedded_dir = resolve_redis_url(args.redis_url, self.config)
        self.prefix: str = args.prefix or self.config.key_prefix
        self.client = redis.Redis.from_url(self.url, socket_connect_timeout=3, socket_timeout=10)
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
            self.client = redis.Redis.from_url(self.url, socket_connect_timeout=3,
                                               socket_timeout=10)
            self.client.ping()

    def close(self) -> None:
        """Let go of Redis; an embedded server no worker uses any more stops again."""
        self.client.close()
        if self.embedded_dir is not None:
            shutdown_embedded_if_unused(self.embedded_dir)

    def keys(self, crawl: str) -> CrawlKeys:
        try:
            return CrawlKeys(self.prefix, crawl)
        except ValueError as exc:
            raise CliError(str(exc)) from exc

    def existing(self, crawl: str) -> CrawlKeys:
        keys = self.keys(crawl)
        if not crawl_exists(self.client, keys):
            known = list_crawls(self.client, keys.crawls, limit=20)
            raise CliError(
                f"no crawl {crawl!r} on {describe_url(self.url)} (prefix {self.prefix!r}); "
                f"crawls here: {', '.join(known) or 'none'}"
            )
        return keys

    def frontier(self, keys: CrawlKeys) -> Frontier:
        return Frontier(self.client, keys, "cli", concurrency=self.config.host_concurrency)


def lane_pace(config: SpineConfig) -> LanePace:
    """Each lane's pace by the project's settings (DOWNLOAD_DELAY, DOWNLOAD_SLOTS,
    REDISSPINE_HOST_DELAYS, REDISSPINE_HOST_CONCURRENCY), as the workers apply them."""
    slot_delays = {slot: delay for slot, _, delay in config.download_slots if delay >= 0}
    return LanePace(config.download_delay, {**slot_delays, **dict(config.host_delays)},
                    config.host_concurrency)


def cmd_status(ctx: Context, args: argparse.Namespace) -> int:
    keys = ctx.existing(args.crawl)
    timeout_ms = ctx.config.worker_timeout_ms
    pace = lane_pace(ctx.config)
    while True:
        status = read_status(ctx.client, keys, timeout_ms=timeout_ms, top_hosts=args.top,
                             pace=pace)
        if args.json:
            print(json.dumps(status, indent=2, sort_keys=True))
        else:
            if args.watch:
                print("\033[2J\033[H", end="")
            print(render_status(status))
        if not args.watch:
            return 0
        sys.stdout.flush()
        time.sleep(args.watch)


def _read_lines(args: argparse.Namespace) -> Iterable[tuple[str, str]]:
    for number, url in enumerate(args.urls, 1):
        yield f"argument {number}", url.strip()
    if args.file:
        stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")  # noqa: SIM115
        with stream:
            for number, line in enumerate(stream, 1):
                text = line.strip()
                if text and not text.startswith("#"):
                    yield f"line {number}", text


def parse_seeds(lines: Iterable[tuple[str, str]], priority: int) -> tuple[list[Request], int]:
    """Requests for the well-formed URLs; each malformed one is reported on stderr."""
    from urllib.parse import urlsplit

    from scrapy import Request

    requests, bad = [], 0
    for where, url in lines:
        parts = urlsplit(url)
        problem = None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problem = "not an absolute http(s) URL"
        else:
            try:
                requests.append(Request(url, priority=priority))
            except ValueError as exc:
                problem = str(exc)
        if problem:
            print(f"redisspine: {where}: skipping {url!r}: {problem}", file=sys.stderr)
            bad += 1
    return requests, bad


def cmd_seed(ctx: Context, args: argparse.Namespace) -> int:
    from scrapy_redisspine.push import push_requests

    keys = ctx.keys(args.crawl)
    if not args.urls and not args.file:
        raise CliError("nothing to seed: give URLs or --file")
    requests, bad = parse_seeds(_read_lines(args), args.priority)
    config = ctx.config
    result = push_requests(
        ctx.client, args.crawl, requests, callback=args.callback, prefix=ctx.prefix,
        serializer=config.serializer, order=config.queue_order,
        strip_tracking_params=config.dedup_strip_tracking_params,
        politeness_key=config.politeness_key,
    )
    ctx.client.sadd(keys.crawls, keys.crawl_id)
    print(f"{result.enqueued} new, {len(requests) - result.enqueued} already seen, "
          f"{bad} malformed")
    return EXIT_PARTIAL if bad else 0


def _order(name: str, on: bool, message: str) -> Callable[[Context, argparse.Namespace], int]:
    def command(ctx: Context, args: argparse.Namespace) -> int:
        keys = ctx.existing(args.crawl)
        if name == control.PAUSED and not on:
            control.give_order(ctx.client, keys, control.DRAIN, False)
        control.give_order(ctx.client, keys, name, on)
        print(message.format(crawl=args.crawl))
        return 0

    return command


def cmd_dead_letters(ctx: Context, args: argparse.Namespace) -> int:
    letters = ctx.frontier(ctx.existing(args.crawl)).upkeep.dead_letters(args.limit)
    print_dead_letters(letters)
    return 0


def cmd_requeue_dead(ctx: Context, args: argparse.Namespace) -> int:
    frontier = ctx.frontier(ctx.existing(args.crawl))
    letters = frontier.upkeep.dead_letters(args.limit)
    print_dead_letters(letters)
    count = frontier.upkeep.reinject_dead(letter.field for letter in letters)
    print(f"re-injected {count} request(s)")
    return 0


def cmd_purge(ctx: Context, args: argparse.Namespace) -> int:
    keys = ctx.existing(args.crawl)
    if not args.yes:
        alive = ctx.frontier(keys).upkeep.workers_alive(ctx.config.worker_timeout_ms)
        warning = f" ({alive} worker(s) still alive!)" if alive else ""
        answer = input(f"Delete every key of crawl {args.crawl!r} on "
                       f"{describe_url(ctx.url)}{warning}? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("not purged")
            return EXIT_PARTIAL
    deleted = ctx.frontier(keys).upkeep.purge()
    print(f"purged crawl {args.crawl!r}: {deleted} key(s) deleted")
    return 0


def cmd_list(ctx: Context, args: argparse.Namespace) -> int:
    crawls = list_crawls(ctx.client, CrawlKeys(ctx.prefix, "_").crawls)
    if not crawls:
        print(f"no crawls on {describe_url(ctx.url)} (prefix {ctx.prefix!r})")
    pipe = ctx.client.pipeline(transaction=False)  # one round trip for every crawl
    for crawl in crawls:
        keys = ctx.keys(crawl)
        pipe.zcard(keys.queue)
        pipe.hlen(keys.inflight)
        pipe.zcard(keys.workers)
    replies = pipe.execute() if crawls else []
    for i, crawl in enumerate(crawls):
        queued, inflight, workers = replies[3 * i:3 * i + 3]
        print(f"{crawl}\t{queued} queued\t{inflight} in flight\t{workers} worker(s)")
    return 0


COMMANDS: dict[str, tuple[Callable[[Context, argparse.Namespace], int], str]] = {
    "status": (cmd_status, "queue, workers, hosts, dedup and fleet-wide stats"),
    "seed": (cmd_seed, "add start requests (deduplicated like the crawl's own)"),
    "pause": (_order(control.PAUSED, True, "paused {crawl}: workers stop leasing"),
              "workers stop leasing and keep what they hold"),
    "resume": (_order(control.PAUSED, False, "resumed {crawl}"), "undo pause (and drain)"),
    "drain": (_order(control.DRAIN, True, "draining {crawl}: workers finish and exit"),
              "workers finish what is in progress and exit (reason 'drained')"),
    "dead-letters": (cmd_dead_letters, "list dead letters with their reasons"),
    "requeue-dead": (cmd_requeue_dead, "put dead letters back in the queue"),
    "purge": (cmd_purge, "delete every key of a crawl"),
    "list": (cmd_list, "crawls on this Redis"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="redisspine", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--redis-url", help="default: see above")
    parser.add_argument("--prefix", help="key prefix (default: REDISSPINE_KEY_PREFIX)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name != "list":
            sub.add_argument("crawl", help="crawl id (by default the spider name)")
        if name == "status":
            sub.add_argument("--json", action="store_true", help="machine-readable output")
            sub.add_argument("--watch", type=float, metavar="SECONDS", help="refresh")
            sub.add_argument("--top", type=int, default=10, help="hosts to show")
        elif name == "seed":
            sub.add_argument("urls", nargs="*", metavar="URL")
            sub.add_argument("--file", help="one URL per line ('-' for stdin)")
            sub.add_argument("--callback", help="spider method name (default: parse)")
            sub.add_argument("--priority", type=int, default=0)
        elif name in ("dead-letters", "requeue-dead"):
            sub.add_argument("--limit", type=int, default=1000)
        elif name == "purge":
            sub.add_argument("--yes", action="store_true", help="do not ask")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    url = "Redis"
    ctx: Context | None = None
    try:
        ctx = Context(args)
        url = describe_url(ctx.url)
        return COMMANDS[args.command][0](ctx, args)
    except CliError as exc:
        print(f"redisspine: {exc}", file=sys.stderr)
        return exc.code
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        print(f"redisspine: cannot reach Redis at {url}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except OSError as exc:  # e.g. --file that does not exist
        print(f"redisspine: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
    finally:
        if ctx is not None:
            with contextlib.suppress(redis.RedisError, OSError):
                ctx.close()


if __name__ == "__main__":
    sys.exit(main())
