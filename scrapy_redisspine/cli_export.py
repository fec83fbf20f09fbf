"""``redisspine export CRAWL -o FILE``: the crawl's items stream, through Scrapy's
own item exporters.

The format follows the file's extension as Scrapy's ``-o`` does (``.jsonl``/``.jl``,
``.json``, ``.csv``, ``.xml``; ``--format`` for ``-``, stdout, which defaults to
JSON lines). Entries are read in stream order with plain values only
(``item_codec.entry_fields``): the project's item classes are not needed.

Resuming. A ``.jsonl`` or ``.csv`` export appends, from where the previous export
to that file stopped. The cursor lives in a sidecar file beside the output,
``FILE.redisspine-export`` (JSON: crawl, last entry id, the file's size at that
point, the CSV columns), not in a Redis key: it belongs to that output file (two
exports to two files resume each on its own; deleting the file starts it afresh),
an export stays a pure reader of Redis (a full Redis that refuses writes does not
stop it), and the recorded size lets a resumed export cut off a batch written after
the cursor's last update (an export killed between the two), so the file never holds
an item twice. A ``.json`` or ``.xml`` file is one closed document: it is written
whole each time. ``-`` starts at the beginning, or after ``--after ID``.

``--follow`` keeps reading a live crawl until it is finished and its stream read to
the end (or Ctrl-C, which still closes the document and saves the cursor).

Shards (``REDISSPINE_SHARDS`` > 1). Each shard's items stream holds the items of the
pages its lanes served (an item goes in with its page's ack, so to the ack's shard):
the export reads every shard's stream and merges them in entry-id order (an id is
the Redis time of its write, ``ms-seq``), so one file holds every item of the crawl
once. The cursor keeps one last id per shard (``last_ids``; a sidecar written before
shards has only ``last_id``, which then stands for every shard); ``--after ID``
starts every shard after that time. The merge is in time order as far as the
shards' clocks agree (one server: one clock); a shard's entries are never skipped
nor doubled, whatever the order, since each has its own cursor. ``--follow`` polls
the shards (a blocking read of several streams would span slots on Redis Cluster)
and sleeps up to a second when none had anything new.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from scrapy_redisspine._cli_errors import EXIT_INTERRUPTED, EXIT_PARTIAL, CliError
from scrapy_redisspine.item_codec import entry_fields
from scrapy_redisspine.serialization import SerializationError

if TYPE_CHECKING:
    import argparse

    import redis
    from scrapy.exporters import BaseItemExporter

    from scrapy_redisspine._cli_context import CommandContext
    from scrapy_redisspine.keys import CrawlKeys

FORMATS = {".jsonl": "jsonlines", ".jl": "jsonlines", ".json": "json", ".csv": "csv",
           ".xml": "xml"}
RESUMABLE = frozenset({"jsonlines", "csv"})
SIDECAR_SUFFIX = ".redisspine-export"
_BATCH = 500
_BLOCK_MS = 1000
#: How long ``--follow`` on a sharded crawl sleeps when no shard had anything new.
_POLL_SECONDS = 1.0

Entry = tuple[bytes, dict[bytes, bytes]]


@dataclass
class Cursor:
    """Where the export to one file stopped (the sidecar's content)."""

    crawl: str
    last_id: str = "0-0"  # the last entry written (of a sharded crawl: of any shard)
    size: int = 0
    fields: list[str] | None = None  # the CSV columns, once chosen
    exported: int = 0  # items in the file
    #: A sharded crawl's cursor: shard index (as text) -> the last entry written of its
    #: stream. None: every shard starts after ``last_id`` (a fresh export, ``--after``,
    #: or a sidecar written before shards).
    last_ids: dict[str, str] | None = None


def entry_order(entry_id: str | bytes) -> tuple[int, int]:
    """A stream entry id (``ms-seq``) as numbers, to compare: ``"10-0"`` comes after
    ``"9-5"``, which text comparison would put first."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def merge_batches(batches: list[list[Entry]], full: list[bool]) -> list[tuple[int, Entry]]:
    """The shards' batches as one, in entry-id order, each entry with its shard: only
    the entries up to the earliest last entry of a full batch (that shard may have
    more before the later ones of the others; they come in the next read)."""
    horizon = min((entry_order(batch[-1][0]) for batch, more in zip(batches, full, strict=True)
                   if more and batch), default=None)
    merged = [(entry_order(entry[0]), shard, entry)
              for shard, batch in enumerate(batches) for entry in batch]
    merged.sort(key=lambda row: (row[0], row[1]))
    return [(shard, entry) for order, shard, entry in merged
            if horizon is None or order <= horizon]


def export_format(output: str, chosen: str | None) -> str:
    if chosen:
        return chosen
    if output == "-":
        return "jsonlines"
    fmt = FORMATS.get(Path(output).suffix.lower())
    if fmt is None:
        raise CliError(f"cannot tell the format of {output!r} from its extension: use one "
                       f"of {', '.join(FORMATS)} or pass --format")
    return fmt


def read_cursor(sidecar: Path, crawl: str) -> Cursor:
    try:
        data = json.loads(sidecar.read_text("utf-8"))
        cursor = Cursor(**data)
    except FileNotFoundError:
        return Cursor(crawl)
    except (ValueError, TypeError) as exc:
        raise CliError(f"cannot read the export cursor {sidecar}: {exc}; delete it (and the "
                       f"output) to export from the start") from None
    if cursor.crawl != crawl:
        raise CliError(f"{sidecar} is the cursor of an export of crawl {cursor.crawl!r}, "
                       f"not {crawl!r}: export to another file")
    return cursor


def save_cursor(sidecar: Path, cursor: Cursor) -> None:
    """Atomically: a reader never sees half a cursor."""
    temporary = sidecar.with_name(sidecar.name + ".tmp")
    temporary.write_text(json.dumps(asdict(cursor)), "utf-8")
    os.replace(temporary, sidecar)


def _exporter(fmt: str, stream: IO[bytes], cursor: Cursor, appending: bool) -> BaseItemExporter:
    from scrapy import exporters

    file: Any = stream  # Scrapy's exporters are typed for BytesIO; any binary file works
    if fmt == "jsonlines":
        return exporters.JsonLinesItemExporter(file)
    if fmt == "json":
        return exporters.JsonItemExporter(file)
    if fmt == "xml":
        return exporters.XmlItemExporter(file)
    return exporters.CsvItemExporter(file, include_headers_line=not appending,
                                     fields_to_export=cursor.fields)


def _exportable(value: Any) -> Any:
    """Bytes as text (JSON and CSV have no bytes); the rest as Scrapy exports it."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, dict):
        return {key: _exportable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_exportable(item) for item in value]
    return value


class Export:
    """One run of the command: reads entries after the cursor, writes them out (every
    shard's stream of a sharded crawl, merged: the module docstring)."""

    def __init__(self, client: redis.Redis, keys: CrawlKeys, exporter: BaseItemExporter,
                 cursor: Cursor) -> None:
        self.client = client
        self.keys = keys
        self.exporter = exporter
        self.cursor = cursor
        self.written = 0
        self.unreadable = 0
        self.streams = ([view.items for view in keys.shard_views()] if keys.shards > 1
                        else [keys.items])
        if keys.shards > 1:
            last_ids = cursor.last_ids or {}
            cursor.last_ids = {str(shard): last_ids.get(str(shard), cursor.last_id)
                               for shard in range(keys.shards)}
        else:  # one stream: ``last_id`` is its cursor (whatever an older layout left)
            cursor.last_ids = None

    def position(self, shard: int) -> str:
        """The last entry written of shard ``shard``'s stream."""
        if self.cursor.last_ids is None:
            return self.cursor.last_id
        return self.cursor.last_ids[str(shard)]

    def write(self, entries: list[tuple[int, Entry]]) -> None:
        for shard, (entry_id, values) in entries:
            self.cursor.last_id = entry_id.decode()
            if self.cursor.last_ids is not None:
                self.cursor.last_ids[str(shard)] = self.cursor.last_id
            try:
                entry = entry_fields(entry_id, values)
            except SerializationError as exc:
                self.unreadable += 1
                print(f"redisspine: entry {entry_id.decode()} skipped: {exc}", file=sys.stderr)
                continue
            self.exporter.export_item(_exportable(entry.fields))
            self.written += 1
            self.cursor.exported += 1

    def read_batch(self) -> list[tuple[int, Entry]]:
        """The next entries after the cursor, up to a batch per stream, in id order."""
        if len(self.streams) == 1:
            one: list[Any] = self.client.xrange(  # type: ignore[assignment]
                self.streams[0], f"({self.position(0)}", "+", count=_BATCH)
            return [(0, entry) for entry in one]
        pipe = self.client.pipeline(transaction=False)  # one call per shard's slot
        for shard, stream in enumerate(self.streams):
            pipe.xrange(stream, f"({self.position(shard)}", "+", count=_BATCH)
        batches: list[list[Entry]] = [list(batch) for batch in pipe.execute()]
        return merge_batches(batches, [len(batch) >= _BATCH for batch in batches])

    def wait(self) -> list[tuple[int, Entry]]:
        """New entries, waiting up to a second for them (``--follow``): one blocking
        read of one stream; a sharded crawl's streams are polled (a read of several
        would span slots on Redis Cluster)."""
        if len(self.streams) > 1:
            time.sleep(_POLL_SECONDS)
            return self.read_batch()
        reply: Any = self.client.xread({self.streams[0]: self.position(0)}, count=_BATCH,
                                       block=_BLOCK_MS)
        return [(0, entry) for entry in reply[0][1]] if reply else []

    def finished(self) -> bool:
        return self.client.hget(self.keys.record, "finished_ms") is not None


def cmd_export(ctx: CommandContext, args: argparse.Namespace) -> int:
    keys = ctx.existing(args.crawl)  # every shard's stream: Export
    fmt = export_format(args.output, args.format)
    to_stdout = args.output == "-"
    resumable = fmt in RESUMABLE and not to_stdout
    sidecar = Path(args.output + SIDECAR_SUFFIX)
    cursor = read_cursor(sidecar, args.crawl) if resumable else Cursor(args.crawl)
    stream, appending = _open(args.output, cursor, resumable)
    if args.after and not appending:
        cursor.last_id, cursor.last_ids = args.after, None  # every shard after that time
    exporter = _exporter(fmt, stream, cursor, appending)
    export = Export(ctx.client, keys, exporter, cursor)
    interrupted = False
    exporter.start_exporting()
    try:
        _run(export, stream, sidecar if resumable else None, follow=args.follow)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        exporter.finish_exporting()
        stream.flush()
        if resumable:
            _checkpoint(export, stream, sidecar)
        if not to_stdout:
            stream.close()
    where = "standard output" if to_stdout else args.output
    print(f"redisspine: exported {export.written} item(s) of crawl {args.crawl} to {where}"
          + (f" ({cursor.exported} in all)" if resumable else ""), file=sys.stderr)
    if interrupted:
        return EXIT_INTERRUPTED
    if export.unreadable:
        print(f"redisspine: {export.unreadable} entry(ies) could not be read",
              file=sys.stderr)
        return EXIT_PARTIAL
    return 0


def _open(output: str, cursor: Cursor, resumable: bool) -> tuple[IO[bytes], bool]:
    """The output, cut back to the cursor's size when resuming."""
    if output == "-":
        return sys.stdout.buffer, False
    path = Path(output)
    if not (resumable and path.exists() and cursor.size > 0):
        # a fresh document: whatever a cursor said of an older file no longer holds
        cursor.last_id, cursor.size, cursor.exported, cursor.fields = "0-0", 0, 0, None
        cursor.last_ids = None
        return path.open("wb"), False
    stream = path.open("r+b")
    stream.truncate(cursor.size)  # a batch written after the last cursor: again below
    stream.seek(cursor.size)
    return stream, True


def _run(export: Export, stream: IO[bytes], sidecar: Path | None, *, follow: bool) -> None:
    while True:
        batch = export.read_batch()
        if batch:
            export.write(batch)
            if sidecar is not None:
                _checkpoint(export, stream, sidecar)
            continue
        if not follow or export.finished():
            # One more read: entries written just before the crawl was marked finished.
            batch = export.read_batch()
            if not batch:
                return
            export.write(batch)
            continue
        batch = export.wait()
        if batch:
            export.write(batch)
            if sidecar is not None:
                _checkpoint(export, stream, sidecar)


def _checkpoint(export: Export, stream: IO[bytes], sidecar: Path) -> None:
    """Flush the output, then record how far it goes (see the module docstring)."""
    stream.flush()
    with contextlib.suppress(OSError):
        os.fsync(stream.fileno())
    cursor = export.cursor
    cursor.size = stream.tell()
    fields = getattr(export.exporter, "fields_to_export", None)
    if fields:
        cursor.fields = list(fields)
    save_cursor(sidecar, cursor)
