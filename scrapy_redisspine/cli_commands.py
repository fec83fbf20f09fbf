"""The ``redisspine`` subcommands: each takes the command's context and its arguments
and returns the exit code (``cli.py`` parses, connects and reports errors)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy_redisspine import control
from scrapy_redisspine._cli_errors import EXIT_PARTIAL, CliError
from scrapy_redisspine._results import number as stored_number
from scrapy_redisspine.cli_output import print_dead_letters, render_status
from scrapy_redisspine.connection import describe_url
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.members import execute_reading_counts, queue_size, read_queue_size
from scrapy_redisspine.status import list_crawls, read_status
from scrapy_redisspine.status_eta import LanePace

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterable

    from scrapy_redisspine._cli_context import CommandContext
    from scrapy_redisspine.feed_entries import FeedEntry
    from scrapy_redisspine.settings import SpineConfig

#: Clear the screen and go home: only ever written to a terminal.
CLEAR_SCREEN = "\033[2J\033[H"
_DROP_BATCH = 500


def lane_pace(config: SpineConfig) -> LanePace:
    """Each lane's pace by the project's settings (DOWNLOAD_DELAY, DOWNLOAD_SLOTS,
    REDISSPINE_HOST_DELAYS, REDISSPINE_HOST_CONCURRENCY), as the workers apply them."""
    slot_delays = {slot: delay for slot, _, delay in config.download_slots if delay >= 0}
    return LanePace(config.download_delay, {**slot_delays, **dict(config.host_delays)},
                    config.host_concurrency)


def confirm(question: str) -> bool:
    """Ask on the terminal; with no terminal to ask on (a pipe, a cron job, CI), the
    answer is no, and the command says so (``--yes`` is how a script says yes)."""
    if not sys.stdin.isatty():
        print(f"{question} [y/N] no: standard input is not a terminal (pass --yes)",
              file=sys.stderr)
        return False
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        print(file=sys.stderr)
        return False
    return answer.strip().lower() in ("y", "yes")


def cmd_status(ctx: CommandContext, args: argparse.Namespace) -> int:
    keys = ctx.existing(args.crawl)
    timeout_ms = ctx.config.worker_timeout_ms
    pace = lane_pace(ctx.config)
    clear = sys.stdout.isatty()  # never screen codes into a pipe or a file
    while True:
        status = read_status(ctx.client, keys, timeout_ms=timeout_ms, top_hosts=args.top,
                             pace=pace, memory_budget_bytes=ctx.config.memory_budget_bytes)
        if args.json:
            print(json.dumps(status, indent=2, sort_keys=True))
        else:
            if args.watch and clear:
                print(CLEAR_SCREEN, end="")
            print(render_status(status))
        if not args.watch:
            return 0
        if not clear:
            print()  # a blank line between two readings
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


def parse_seeds(
    lines: Iterable[tuple[str, str]], priority: int, callback: str | None = None
) -> tuple[list[FeedEntry], int]:
    """Entries for the well-formed lines (a URL or a JSON object, ``feed_entries``);
    each bad one is reported on stderr. ``callback`` is the default of an entry that
    names none."""
    from scrapy_redisspine.feed_entries import BadEntry, FeedEntry, parse_entry

    entries, bad = [], 0
    for where, text in lines:
        try:
            entry = parse_entry(text, priority)
        except BadEntry as exc:
            print(f"redisspine: {where}: skipping malformed {text[:200]!r}: {exc}",
                  file=sys.stderr)
            bad += 1
            continue
        entries.append(FeedEntry(entry.request, entry.callback or callback))
    return entries, bad


def cmd_seed(ctx: CommandContext, args: argparse.Namespace) -> int:
    from scrapy_redisspine.pushing import PushOptions, push_entries

    keys = ctx.keys(args.crawl, claim=True)
    if not args.urls and not args.file:
        raise CliError("nothing to seed: give URLs or --file")
    entries, bad = parse_seeds(_read_lines(args), args.priority, args.callback)
    result = push_entries(ctx.client, keys, entries, PushOptions.from_config(ctx.config))
    ctx.client.sadd(keys.crawls, keys.crawl_id)
    print(f"{result.enqueued} new, {len(entries) - result.enqueued} already seen, "
          f"{bad} malformed")
    return EXIT_PARTIAL if bad else 0


def order_command(
    name: str, on: bool, message: str
) -> Callable[[CommandContext, argparse.Namespace], int]:
    def command(ctx: CommandContext, args: argparse.Namespace) -> int:
        keys = ctx.existing(args.crawl)  # orders are crawl-wide
        if name == control.PAUSED and not on:
            control.give_order(ctx.client, keys, control.DRAIN, False)
        control.give_order(ctx.client, keys, name, on)
        print(message.format(crawl=args.crawl))
        return 0

    return command


def cmd_dead_letters(ctx: CommandContext, args: argparse.Namespace) -> int:
    upkeep = ctx.frontier(ctx.existing(args.crawl)).upkeep
    if args.drop:
        dropped = upkeep.drop_dead(args.drop)
        print(f"dropped {dropped} dead letter(s)")
        if dropped < len(set(args.drop)):
            print(f"redisspine: {len(set(args.drop)) - dropped} of the IDs given are no dead "
                  "letter of this crawl (see `redisspine dead-letters CRAWL`)", file=sys.stderr)
            return EXIT_PARTIAL
        return 0
    if args.all:
        return _drop_all(ctx, args)
    print_dead_letters(upkeep.dead_letters(args.limit))
    return 0


def _drop_all(ctx: CommandContext, args: argparse.Namespace) -> int:
    keys = ctx.existing(args.crawl)
    upkeep = ctx.frontier(keys).upkeep
    total = sum(int(ctx.client.hlen(view.dead))  # type: ignore[arg-type]
                for view in (keys.shard_views() if keys.shards > 1 else (keys,)))
    if not total:
        print("no dead letters")
        return 0
    if not args.yes and not confirm(f"Drop all {total} dead letter(s) of crawl "
                                    f"{args.crawl!r} for good?"):
        print("no dead letter dropped")
        return EXIT_PARTIAL
    dropped = 0
    for _ in range(total // _DROP_BATCH + 2):  # bounded: batches of HSCAN, then stop
        names = upkeep.dead_letter_names(_DROP_BATCH)
        if not names:
            break
        dropped += upkeep.drop_dead(names)
    print(f"dropped {dropped} dead letter(s)")
    return 0


def cmd_requeue_dead(ctx: CommandContext, args: argparse.Namespace) -> int:
    frontier = ctx.frontier(ctx.existing(args.crawl))
    letters = frontier.upkeep.dead_letters(args.limit)
    print_dead_letters(letters)
    count = frontier.upkeep.reinject_dead(letter.field for letter in letters)
    print(f"re-injected {count} request(s)")
    return 0


def cmd_sweep(ctx: CommandContext, args: argparse.Namespace) -> int:
    """What a live worker's sweep does, once, from outside: a crawl whose workers all
    died holds its lanes' slots in the politeness group until someone sweeps it."""
    config = ctx.config
    result = ctx.frontier(ctx.existing(args.crawl)).upkeep.requeue_stale(
        timeout_ms=config.worker_timeout_ms, ceiling_ms=config.lease_ceiling_ms,
        max_requeues=config.max_requeues, rest_ms=int(config.download_delay * 1000),
    )
    print(f"swept {args.crawl!r}: {result.requeued} lease(s) requeued, "
          f"{result.dead_lettered} dead-lettered, {result.workers_removed} dead worker(s) "
          "removed")
    return 0


def cmd_purge(ctx: CommandContext, args: argparse.Namespace) -> int:
    keys = ctx.existing(args.crawl)
    if not args.yes:
        alive = ctx.frontier(keys).upkeep.workers_alive(ctx.config.worker_timeout_ms)
        warning = f" ({alive} worker(s) still alive!)" if alive else ""
        if not confirm(f"Delete every key of crawl {args.crawl!r} on "
                       f"{describe_url(ctx.url)}{warning}?"):
            print("not purged")
            return EXIT_PARTIAL
    deleted = ctx.frontier(keys).upkeep.purge()
    print(f"purged crawl {args.crawl!r}: {deleted} key(s) deleted")
    return 0


def cmd_list(ctx: CommandContext, args: argparse.Namespace) -> int:
    crawls = list_crawls(ctx.client, CrawlKeys(ctx.prefix, "_").crawls)
    if not crawls:
        print(f"no crawls on {describe_url(ctx.url)} (prefix {ctx.prefix!r})")
        return 0
    named: dict[str, CrawlKeys] = {}
    for crawl in crawls:
        try:
            named[crawl] = ctx.keys(crawl)
        except CliError as exc:  # an id no crawl may have now (a '/'): said, not read
            print(f"{crawl}\tnot read: {exc}")
    pipe = ctx.client.pipeline(transaction=False)  # its number of shards, then counts
    for keys in named.values():
        pipe.hget(keys.record, "shards")
    layouts = [replace(keys, shards=stored_number(shards, 1))
               for keys, shards in zip(named.values(), pipe.execute(), strict=True)]
    pipe = ctx.client.pipeline(transaction=False)  # one round trip for every crawl
    counts_at: list[int] = []
    for keys in layouts:
        views = keys.shard_views()
        for view in views:
            counts_at.append(read_queue_size(pipe, view.queue, view.queue_counts))
            pipe.hlen(view.inflight)
        pipe.zcard(keys.workers)
    replies = execute_reading_counts(pipe, set(counts_at))
    at = 0
    for keys in layouts:
        counts = replies[at:at + 3 * keys.shards]
        workers = replies[at + 3 * keys.shards]
        at += 3 * keys.shards + 1
        queued = sum(queue_size(zcard, listed)
                     for zcard, listed in zip(counts[0::3], counts[1::3], strict=True))
        inflight = sum(counts[2::3])
        sharded = f"\t{keys.shards} shards" if keys.shards > 1 else ""
        print(f"{keys.crawl_id}\t{queued} queued\t{inflight} in flight\t{workers} "
              f"worker(s){sharded}")
    return 0


def _served(what: str, host: str, port: int, serve: Callable[[], None]) -> int:
    """Run a server in the foreground; a port that cannot be had is one line."""
    try:
        serve()
    except OSError as exc:
        raise CliError(f"cannot serve {what} on {host}:{port}: {exc.strerror or exc}") from None
    return 0


def cmd_metrics(ctx: CommandContext, args: argparse.Namespace) -> int:
    try:
        import prometheus_client  # noqa: F401 (only: is it there?)
    except ImportError:
        raise CliError("redisspine metrics needs prometheus_client: "
                       "pip install 'scrapy-redisspine[metrics]'") from None
    from scrapy_redisspine import metrics

    crawls = [ctx.existing(crawl).crawl_id for crawl in args.crawls]
    read = metrics.read_for(ctx.client, timeout_ms=ctx.config.worker_timeout_ms,
                            top_lanes=args.top, pace=lane_pace(ctx.config),
                            memory_budget_bytes=ctx.config.memory_budget_bytes)
    collector = metrics.FleetCollector(ctx.client, ctx.keys, crawls, read)
    shown = ", ".join(crawls) or "every crawl"

    def announce(url: str) -> None:
        print(f"serving Prometheus metrics of {shown} on {url} (Ctrl-C stops)", flush=True)

    return _served("metrics", args.host, args.port,
                   lambda: metrics.serve(collector, args.host, args.port, announce))


def cmd_dashboard(ctx: CommandContext, args: argparse.Namespace) -> int:
    from scrapy_redisspine import _serving
    from scrapy_redisspine.dashboard_app import Dashboard

    keys = ctx.existing(args.crawl)
    pace = lane_pace(ctx.config)

    def read() -> dict[str, Any]:
        return read_status(ctx.client, keys, timeout_ms=ctx.config.worker_timeout_ms,
                           top_hosts=args.top, pace=pace,
                           memory_budget_bytes=ctx.config.memory_budget_bytes)

    def announce(url: str) -> None:
        print(f"serving the dashboard of {args.crawl} on {url} (Ctrl-C stops)", flush=True)

    def serve() -> None:
        app = Dashboard(ctx.frontier(keys), read)
        _serving.serve(_serving.wsgi_server(app, args.host, args.port), "/", announce)

    return _served("the dashboard", args.host, args.port, serve)
