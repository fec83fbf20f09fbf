"""Run a pinned Scrapy release's own tests with the add-on switched on, unmodified.

    .venv/bin/python tests/conformance/run.py [extra pytest args]
    .venv/bin/python tests/conformance/run.py tests/test_crawl.py -x   # a subset

1. Fetches Scrapy's sdist from PyPI (``pip download``) into ``.conformance-cache/``
   once, and unpacks it there.
2. Runs the selected test files from the sdist's own ``tests/`` with its own
   conftest, with ``-p redisspine_conformance``: every crawler the tests make is a
   worker of a crawl of its own on a throwaway redis-server.
3. Runs again, on Scrapy's stock scheduler (no plugin), the tests that failed, so a
   test that fails there too is not blamed on the add-on.
4. Runs again, with the add-on and the setting that lifts their reason
   (:data:`LIFTED_BY`), the tests listed for such a reason: each must pass then.
5. Compares with ``expected_failures.txt`` and prints a summary.

Exit status 1 on an unexpected failure, and also on a listed test that now passes
(an "xpass"): the list says what the add-on cannot do, so a test that passes must
leave the list, or the list stops being the truth. The one exception is a reason
starting with ``timing: ``: a test that times a crawl, which the add-on's politeness
makes slower, passes or fails with the machine's load; its passing is reported. A
listed test that is not collected any more fails the run the same way. Exit status
2 when the run itself broke (no sdist, pytest crashed, the watchdog fired).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from conformance_results import fold

SCRAPY_VERSION = "2.19.0"
HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = REPO / ".conformance-cache"
EXPECTED = HERE / "expected_failures.txt"

#: Scrapy's test files (or tests), the crawl-level ones: what a scheduler can change.
FILES = (
    "test_crawl.py",
    "test_engine.py",
    "test_engine_close_spider.py",
    "test_engine_download.py",
    "test_engine_loop.py",
    "test_engine_stop_download_bytes.py",
    "test_engine_stop_download_headers.py",
    "test_closespider.py",
    "test_scheduler.py",
    "test_scheduler_base.py",
    "test_spidermiddleware_base.py",
    "test_spidermiddleware_depth.py",
    "test_spidermiddleware_httperror.py",
    "test_spidermiddleware_metacopy.py",
    "test_spidermiddleware_output_chain.py",
    "test_spidermiddleware_process_start.py",
    "test_spidermiddleware_referer.py",
    "test_spidermiddleware_start.py",
    "test_spidermiddleware_urllength.py",
    "test_downloadermiddleware_retry.py",
    "test_downloadermiddleware_redirect.py",
    "test_request_attribute_binding.py",
    "test_feedexport.py",
    "test_spider_start.py",
    "test_contracts.py",
    "test_spider_sitemap.py",
    "test_crawler_runners.py",
    "test_crawler.py",
    "test_request_cb_kwargs.py",
    "test_request_left.py",
    "test_downloaderslotssettings.py",
    "test_downloadermiddleware_robotstxt.py",
    "test_pipeline_crawl.py",
    "test_signals.py",
    "test_spidermiddleware.py",
    "test_spider_crawl.py",
    "test_dupefilters.py",
    # Not test_command_check.py: it errors on the stock scheduler too, with pytest 9
    # (a PytestRemovedIn10Warning its class-scoped fixture raises, warnings being errors).
    # Crawls in child processes (reached through site/sitecustomize.py): one test per
    # runner and mode, not the whole file: its 63 tests all crawl a spider with no
    # requests in a child of its own, which costs about 6 s each here with the add-on
    # (7 minutes in all, over the time budget) and fails the same way every time.
    "test_crawler_subprocess.py::TestCrawlerProcessSubprocess::test_simple",
    "test_crawler_subprocess.py::TestCrawlerProcessSubprocess::test_multi",
    "test_crawler_subprocess.py::TestAsyncCrawlerProcessSubprocess::test_simple",
    "test_crawler_subprocess.py::TestAsyncCrawlerProcessSubprocess::test_reactorless_simple",
    "test_crawler_subprocess.py::TestCrawlerRunnerSubprocess::test_simple",
    "test_crawler_subprocess.py::TestAsyncCrawlerRunnerSubprocess::test_simple",
    "test_crawler_subprocess.py::TestAsyncCrawlerRunnerSubprocess::test_reactorless_simple",
)

#: A reason that starts so marks a test that fails or passes with the machine's load
#: (it times a crawl): its passing is reported, not an error.
TIMING = "timing: "

#: Reasons a setting of the add-on lifts: the tests listed with that reason are run
#: again with the setting on, and must all pass then (so the reason is the whole
#: story, and the way out the docs give works).
LIFTED_BY = {
    "a crawl that never had a request waits for its first one":
        {"REDISSPINE_WAIT_FOR_FIRST_REQUEST": False},
}
#: How redisspine_conformance.py takes extra settings (a JSON object).
SETTINGS_ENV = "REDISSPINE_CONFORMANCE_SETTINGS"

#: Per test (pytest-timeout) and for each whole pytest run (the watchdog), seconds.
TEST_TIMEOUT = 120
RUN_TIMEOUT = 900


def sdist_dir() -> Path:
    """The unpacked sdist, downloaded and unpacked on first use."""
    target = CACHE / f"scrapy-{SCRAPY_VERSION}"
    if (target / "tests" / "__init__.py").exists():
        return target
    archive = CACHE / f"scrapy-{SCRAPY_VERSION}.tar.gz"
    if not archive.exists():
        CACHE.mkdir(exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:",
             "--no-deps", f"scrapy=={SCRAPY_VERSION}", "-d", str(CACHE)],
            check=True,
        )
    with tarfile.open(archive) as tar:
        tar.extractall(CACHE, filter="data")
    return target


def read_expected() -> dict[str, str]:
    """``expected_failures.txt``: ``test id | reason`` (test ids may hold spaces);
    ``#`` starts a comment line."""
    expected = {}
    for number, raw in enumerate(EXPECTED.read_text("utf-8").splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        test_id, _, reason = (part.strip() for part in line.partition(" | "))
        if not reason.strip():
            raise SystemExit(f"{EXPECTED.name}:{number}: {test_id} has no reason")
        expected[test_id] = reason.strip()
    return expected


def run_pytest(
    root: Path, args: list[str], with_addon: bool, workdir: Path, label: str, *,
    broken: list[str], settings: dict[str, Any] | None = None,
) -> dict[str, str]:
    """One pytest run in the sdist; its outcome per test id (what it ran, if it broke:
    then ``broken`` says so).

    The watchdog kills the whole process group: a crawl that never closes must
    not hang CI, and pytest-timeout alone cannot stop a run stuck outside a test."""
    results = workdir / f"{label}.json"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(HERE), env.get("PYTHONPATH", "")) if p
    )
    env["REDISSPINE_CONFORMANCE_RESULTS"] = str(results)
    env["REDISSPINE_CONFORMANCE_REPORT"] = str(workdir / f"{label}-counts.json")
    if settings:
        env[SETTINGS_ENV] = json.dumps(settings)
    plugins = ["-p", "conformance_results"]
    if with_addon:
        plugins += ["-p", "redisspine_conformance"]
    command = [
        sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *plugins,
        "-o", f"timeout={TEST_TIMEOUT}", *args,
    ]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=root, env=env, start_new_session=True)
    try:
        process.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        broken.append(f"the {label} run took over {RUN_TIMEOUT}s: killed")
    finally:
        # Whatever is left in pytest's process group (a crawl script a test left
        # running, or everything, after a timeout) goes with it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    print(f"== {label} run: {time.monotonic() - started:.0f}s, pytest exit {process.returncode}")
    if process.returncode not in (0, 1) and not broken:
        broken.append(f"the {label} run broke (pytest exit {process.returncode})")
    lines = results.read_text("utf-8").splitlines() if results.exists() else []
    outcomes: dict[str, str] = fold(lines)
    return outcomes


def main(extra: list[str]) -> int:
    root = sdist_dir()
    expected = read_expected()
    broken: list[str] = []
    with tempfile.TemporaryDirectory(prefix="redisspine-conformance-") as tmp:
        workdir = Path(tmp)
        subset = any(arg.startswith("tests/") for arg in extra)
        selection = [] if subset else [f"tests/{name}" for name in FILES]
        print(f"== Scrapy {SCRAPY_VERSION}'s own tests, add-on on "
              f"({'a subset' if subset else f'{len(FILES)} files and tests'})")
        addon = run_pytest(root, [*selection, *extra], True, workdir, "add-on", broken=broken)
        counts_file = workdir / "add-on-counts.json"
        counts = json.loads(counts_file.read_text("utf-8")) if counts_file.exists() else {}
        failed = sorted(t for t, o in addon.items() if o == "failed")
        stock: dict[str, str] = {}
        if failed:
            print(f"== re-running {len(failed)} failed test(s) on Scrapy's stock scheduler")
            stock = run_pytest(root, failed, False, workdir, "stock", broken=broken)
        not_lifted = [] if subset else lift(root, failed, expected, workdir, broken)
    if subset or broken:  # the list is checked against a whole selection only
        expected = {t: r for t, r in expected.items() if t in addon}
    status = report(addon, stock, expected, counts)
    for test_id in not_lifted if not subset else []:
        print(f"   NOT LIFTED by its setting (see LIFTED_BY): {test_id}")
        status = 1
    for problem in broken:
        print(f"conformance: {problem}")
    return 2 if broken else status


def lift(
    root: Path, failed: list[str], expected: dict[str, str], workdir: Path,
    broken: list[str],
) -> list[str]:
    """Run the failures of each reason in :data:`LIFTED_BY` again with its setting;
    the ones that still do not pass."""
    still: list[str] = []
    for number, (reason, settings) in enumerate(LIFTED_BY.items()):
        ids = [test_id for test_id in failed if expected.get(test_id) == reason]
        if not ids:
            continue
        print(f"== re-running {len(ids)} test(s) listed for {reason!r} with {settings}")
        outcomes = run_pytest(root, ids, True, workdir, f"lifted-{number}", broken=broken,
                              settings=settings)
        lifted = [test_id for test_id in ids if outcomes.get(test_id) == "passed"]
        print(f"   {len(lifted)} of {len(ids)} pass with {settings}")
        still += [test_id for test_id in ids if test_id not in lifted]
    return still


def report(
    addon: dict[str, str], stock: dict[str, str], expected: dict[str, str],
    counts: dict[str, Any],
) -> int:
    failed = {t for t, o in addon.items() if o == "failed"}
    stock_too = sorted(t for t in failed if stock.get(t) == "failed" and t not in expected)
    listed = sorted(t for t in failed if t in expected)
    unexpected = sorted(t for t in failed - set(listed) - set(stock_too))
    passed_anyway = sorted(t for t in expected if t in addon and addon[t] != "failed")
    xpass = [t for t in passed_anyway if not expected[t].startswith(TIMING)]
    timing = [t for t in passed_anyway if expected[t].startswith(TIMING)]
    missing = sorted(t for t in expected if t not in addon)
    passed = sum(o == "passed" for o in addon.values())
    skipped = sum(o in ("skipped", "xfailed") for o in addon.values())
    print(
        f"== conformance: {passed} passed, {len(listed)} expected failures, "
        f"{len(stock_too)} fail on stock too, {len(unexpected)} unexpected failures, "
        f"{len(xpass)} xpass, {skipped} skipped/xfail by Scrapy's own marks"
    )
    if counts:
        print(
            f"   {counts.get('crawlers', 0)} crawler(s) ran with the add-on in pytest's process "
            f"({counts.get('own_scheduler', 0)} kept a scheduler their test sets); "
            f"{counts.get('crawls_in_redis', 0)} crawl(s) reached Redis, child processes included"
        )
        if counts.get("crawls_in_redis", 0) < 0:
            print("   the session's redis-server was gone at the end: failures may be that")
    for title, ids in (
        ("fails on stock too (not blamed on the add-on)", stock_too),
        ("UNEXPECTED FAILURE (passes on stock)", unexpected),
        ("XPASS: listed as expected to fail, now passes: remove it from the list", xpass),
        ("listed but not collected: remove it from the list", missing),
        ("listed as timing-dependent, passed this time", timing),
    ):
        for test_id in ids:
            print(f"   {title}: {test_id}")
    for test_id in listed:
        print(f"   expected failure: {test_id} ({expected[test_id]})")
    for test_id in sorted(failed):
        stopped = counts.get("watchdog", {}).get(test_id)
        if stopped:
            print(f"   watchdog during {test_id}: {stopped}")
    return 1 if unexpected or xpass or missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
