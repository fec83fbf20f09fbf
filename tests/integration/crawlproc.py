"""Run real ``scrapy crawl`` worker processes and read back how they ended.

End-to-end tests must run the plugin the way users do: separate processes, each
with its own reactor, sharing only Redis. Each worker writes its own Scrapy log
(``LOG_FILE``) plus a file with its raw stdout/stderr (tracebacks from before
logging is set up land there), and its outcome is parsed from the stats Scrapy
dumps when the spider closes.

:class:`Fleet` is how the tests start them: one spider of the test project, one
crawl's settings, one log directory per test. The ``assert_*`` checks read a run's
outcome from the workers' stats and from the test site's own request log.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

import scrapy_redisspine
from scrapy_redisspine.keys import DEFAULT_GROUP, CrawlKeys

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from scrapy_redisspine.testing.site import TestSite

PACKAGE_ROOT = Path(scrapy_redisspine.__file__).resolve().parent.parent
#: For a crawl in which no worker dies but which asks for a short heartbeat: a worker
#: that a loaded 2-core machine starves for a second or two is not presumed dead (its
#: leases would be fetched again, by design, and an exactly-once count would fail).
UNHURRIED = {"REDISSPINE_WORKER_TIMEOUT_SECONDS": 15}
_STATS_MARKER = "Dumping Scrapy stats:"
_LOG_LINE_START = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", re.MULTILINE)
_DATETIME_CALL = re.compile(r"datetime\.datetime\([^()]*\)")
_STAT_LINE = re.compile(r"^\s*\{?\s*'([^']+)':\s*(-?\d+(?:\.\d+)?|'[^']*')")
_TAIL_LINES = 40


class WorkersTimedOut(AssertionError):
    """Workers ran past the deadline; all were killed. The message has their log tails."""


@dataclass
class Worker:
    """A started worker process and where it writes."""

    index: int
    process: subprocess.Popen[bytes]
    log_path: Path
    output_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL: the crash the plugin must survive without losing a request."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        """SIGTERM: Scrapy's graceful shutdown (finish_reason ``shutdown``)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def log_text(self) -> str:
        return _read(self.log_path)

    def output_text(self) -> str:
        return _read(self.output_path)


@dataclass(frozen=True)
class WorkerResult:
    """How one worker ended."""

    index: int
    returncode: int
    log: str
    output: str
    finish_reason: str | None
    stats: dict[str, Any]
    log_path: Path


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _setting_value(value: Any) -> str:
    """Render a value for ``-s KEY=VALUE``; Scrapy parses dicts and lists as JSON."""
    if isinstance(value, (dict, list, tuple)):
        return json.dumps(value)
    return str(value)


def crawl_command(
    spider: str,
    settings: Mapping[str, Any],
    spider_args: Mapping[str, Any] | None = None,
) -> list[str]:
    """The argv of one worker (without its per-worker log settings)."""
    command = [sys.executable, "-m", "scrapy", "crawl", spider]
    for key, value in settings.items():
        command += ["-s", f"{key}={_setting_value(value)}"]
    for key, value in (spider_args or {}).items():
        command += ["-a", f"{key}={value}"]
    return command


def worker_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a worker: the package importable, no outer Scrapy project."""
    merged = dict(os.environ)
    for name in ("SCRAPY_SETTINGS_MODULE", "SCRAPY_PROJECT", "SCRAPY_PYTHON_SHELL"):
        merged.pop(name, None)
    merged.update(env or {})
    paths = [str(PACKAGE_ROOT), merged.get("PYTHONPATH", "")]
    merged["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)
    merged["PYTHONUNBUFFERED"] = "1"
    return merged


def start_workers(
    project_dir: str | Path,
    spider: str,
    n: int,
    settings: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    spider_args: Mapping[str, Any] | None = None,
    log_dir: str | Path | None = None,
) -> list[Worker]:
    """Start ``n`` workers at once in ``project_dir``; they run until they finish."""
    logs = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="workers-"))
    logs.mkdir(parents=True, exist_ok=True)
    command = crawl_command(spider, settings, spider_args)
    workers = []
    for index in range(n):
        log_path = logs / f"worker-{index}.log"
        output_path = logs / f"worker-{index}.out"
        argv = [*command, "-s", f"LOG_FILE={log_path}", "-s", "LOG_FILE_APPEND=False"]
        with open(output_path, "wb") as output:
            process = subprocess.Popen(
                argv, cwd=project_dir, env=worker_env(env),
                stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
            )
        workers.append(Worker(index, process, log_path, output_path))
    return workers


def wait_workers(workers: Sequence[Worker], timeout: float = 120) -> list[WorkerResult]:
    """Wait for every worker; past ``timeout`` seconds kill them all and fail."""
    deadline = time.monotonic() + timeout
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for other in workers:
                other.kill()
                other.process.wait()
            raise WorkersTimedOut(
                f"workers still running after {timeout:.0f}s, killed:\n"
                + describe_workers(workers)
            ) from None
    return [_result(worker) for worker in workers]


def run_workers(
    project_dir: str | Path,
    spider: str,
    n: int,
    settings: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120,
    spider_args: Mapping[str, Any] | None = None,
    log_dir: str | Path | None = None,
) -> list[WorkerResult]:
    """Start ``n`` workers, wait for all of them, and return how each ended."""
    workers = start_workers(
        project_dir, spider, n, settings, env=env, spider_args=spider_args, log_dir=log_dir
    )
    return wait_workers(workers, timeout)


def _result(worker: Worker) -> WorkerResult:
    log = worker.log_text()
    stats = parse_stats(log)
    reason = stats.get("finish_reason")
    return WorkerResult(
        index=worker.index,
        returncode=worker.process.returncode,
        log=log,
        output=worker.output_text(),
        finish_reason=reason if isinstance(reason, str) else None,
        stats=stats,
        log_path=worker.log_path,
    )


def parse_stats(log: str) -> dict[str, Any]:
    """The last stats dump in a Scrapy log; ``{}`` if the spider never closed.

    Datetime values come back as their repr strings.
    """
    marker = log.rfind(_STATS_MARKER)
    if marker < 0:
        return {}
    block = log[marker + len(_STATS_MARKER):]
    next_line = _LOG_LINE_START.search(block)
    if next_line:
        block = block[: next_line.start()]
    block = _DATETIME_CALL.sub(lambda match: repr(match.group(0)), block.strip())
    try:
        parsed = ast.literal_eval(block)
    except (SyntaxError, ValueError):
        parsed = None
    if isinstance(parsed, dict):
        return parsed
    # A stat Scrapy could not print as a literal: keep the simple lines.
    return {
        match.group(1): ast.literal_eval(match.group(2))
        for match in map(_STAT_LINE.match, block.splitlines())
        if match
    }


def describe_workers(workers: Sequence[Worker], lines: int = _TAIL_LINES) -> str:
    """The tail of each worker's log and output, for failure messages."""
    parts = []
    for worker in workers:
        log_tail = "\n".join(worker.log_text().splitlines()[-lines:])
        output_tail = "\n".join(worker.output_text().splitlines()[-lines:])
        parts.append(
            f"--- worker {worker.index} (pid {worker.pid}, rc {worker.process.returncode}) "
            f"log {worker.log_path} ---\n{log_tail}\n"
            f"--- worker {worker.index} stdout/stderr ---\n{output_tail}"
        )
    return "\n".join(parts)


@dataclass
class Fleet:
    """The workers of one test: ``spider`` of the project in ``project_dir``, on the
    crawl of ``settings``, each worker logging under ``log_dir``.

    ``settings`` (the test's crawl: Redis, crawl id, start URLs) is the default of
    :meth:`start` and :meth:`run`; :meth:`crawling` adds to it.
    """

    project_dir: Path
    settings: dict[str, Any]
    log_dir: Path
    spider: str = "links"
    keys: CrawlKeys = field(init=False)

    def __post_init__(self) -> None:
        self.keys = CrawlKeys("redisspine", str(self.settings["REDISSPINE_CRAWL_ID"]))

    def crawling(self, site: TestSite | None = None, **extra: Any) -> dict[str, Any]:
        """This crawl's settings and ``extra``; with ``site``, from its start pages."""
        starts = {} if site is None else {"LINKS_START_URLS": ",".join(site.start_urls())}
        return {**self.settings, **starts, **extra}

    def start(
        self, n: int, settings: Mapping[str, Any] | None = None, *, log: str = "",
        **options: Any,
    ) -> list[Worker]:
        """Start ``n`` workers (logging in the subdirectory ``log``, if given)."""
        return start_workers(self.project_dir, self.spider, n, self._settings(settings),
                             log_dir=self.log_dir / log, **options)

    def run(
        self, n: int, settings: Mapping[str, Any] | None = None, *, log: str = "",
        **options: Any,
    ) -> list[WorkerResult]:
        """Run ``n`` workers to their end (logging in the subdirectory ``log``, if given)."""
        return run_workers(self.project_dir, self.spider, n, self._settings(settings),
                           log_dir=self.log_dir / log, **options)

    def _settings(self, settings: Mapping[str, Any] | None) -> Mapping[str, Any]:
        return self.settings if settings is None else settings


def cluster_keys(crawl: str, group: str = DEFAULT_GROUP, shards: int = 1) -> CrawlKeys:
    """A crawl's keys on Redis Cluster as this version's workers lay a new crawl out:
    in its politeness group's slots (placement.py)."""
    return CrawlKeys("redisspine", crawl, group, cluster=True, colocated=True, shards=shards)


def assert_finished(results: Sequence[WorkerResult], reason: str = "finished") -> None:
    """Every worker exited with code 0 and closed its spider for ``reason``."""
    for result in results:
        assert (result.returncode, result.finish_reason) == (0, reason), (
            f"worker {result.index}: rc={result.returncode} reason={result.finish_reason}\n"
            + result.log[-4000:]
        )


def assert_refused(result: WorkerResult, reason: str, *said: str) -> str:
    """The worker closed with ``reason`` and a non-zero exit, saying why in one ERROR
    line (no traceback) that holds every text of ``said``; that line."""
    detail = f"rc={result.returncode}\n{result.log[-3000:]}\n{result.output[-2000:]}"
    assert result.returncode != 0, detail
    assert result.finish_reason == reason, detail
    assert "Traceback" not in result.log + result.output, detail
    errors = [line for line in result.log.splitlines() if " ERROR: " in line]
    assert len(errors) == 1, errors
    for text in said:
        assert text in errors[0], errors[0]
    return errors[0]


def assert_all_fetched(site: TestSite) -> dict[str, int]:
    """Assert the site served every page; return the pages it served more than once."""
    counts = site.fetch_counts()
    missing = site.all_urls() - set(counts)
    assert not missing, f"{len(missing)} page(s) never fetched, e.g. {sorted(missing)[:3]}"
    return {url: n for url, n in counts.items() if n > 1}


def assert_exactly_once(site: TestSite) -> None:
    """The site served every page, and none twice."""
    twice = assert_all_fetched(site)
    assert not twice, f"page(s) fetched more than once: {twice}"


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not in {timeout:.0f}s: {what}")
        time.sleep(0.02)


def wait_joined(redis_url: str, keys: CrawlKeys, workers: int, timeout: float = 60) -> None:
    """Wait until ``workers`` workers are in the crawl's ``workers``: before a fault
    that is about the crawl's state (a restart, a purge), so that no worker is still
    joining when it strikes (a join rides a restart and joins what it finds)."""
    client = redis.Redis.from_url(redis_url)
    try:
        wait_for(lambda: client.zcard(keys.workers) == workers, timeout,
                 f"{workers} worker(s) joined")
    finally:
        client.close()
