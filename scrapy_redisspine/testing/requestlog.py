"""The test site's request log: the ground truth an end-to-end test checks.

Records are kept in memory and, optionally, appended as JSON lines to a file that
other processes (benchmarks, the example runner) read with :func:`read_log`. Each
line is written and flushed under a lock, so a reader never sees two records
interleaved; at worst it sees a last line still being written, which it skips.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterable


class RequestLog:
    """Thread-safe list of request records, mirrored to a JSON-lines file if asked."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self._records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._file: IO[str] | None = None

    def open(self) -> None:
        if self.path is not None:
            # Open for the site's lifetime; close() closes it.
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, sort_keys=True) + "\n"
        with self._lock:
            self._records.append(record)
            if self._file is not None:
                self._file.write(line)
                self._file.flush()

    def records(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._records)


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """The records of a site's JSON-lines log, written by this or another process.

    A last line without its newline is still being written and is left out.
    """
    with open(path, encoding="utf-8") as log_file:
        text = log_file.read()
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


def count_page_fetches(records: Iterable[dict[str, Any]]) -> Counter[str]:
    """How often each page was served completely (GET, 200, client still there)."""
    return Counter(
        record["page"]
        for record in records
        if record.get("page")
        and record["method"] == "GET"
        and record["status"] == 200
        and "error" not in record
    )
