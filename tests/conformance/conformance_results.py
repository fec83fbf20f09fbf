"""pytest plugin: one outcome per test id, written as JSON for ``run.py``.

Loaded in both runs (add-on and stock), so the two are compared by test id rather
than by parsing pytest's output. A test is ``failed`` if any of its phases failed
(an error in a fixture's teardown counts: it is a crawl that did not close cleanly).
Each phase's outcome is appended as one JSON line as soon as it is known, so a run
the watchdog had to kill still says what it ran.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pytest

RESULTS_ENV = "REDISSPINE_CONFORMANCE_RESULTS"
_RANK = {"passed": 0, "skipped": 1, "xfailed": 2, "xpassed": 3, "failed": 4}


def _outcome(report: pytest.TestReport) -> str:
    if hasattr(report, "wasxfail"):
        return "xpassed" if report.passed else "xfailed"
    return str(report.outcome)


def _write(test_id: str, outcome: str) -> None:
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as results:
            results.write(json.dumps([test_id, outcome]) + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    outcome = _outcome(report)
    if report.when != "call" and outcome == "passed":
        return
    _write(report.nodeid, outcome)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _write(report.nodeid or "<collection>", "failed")


def fold(lines: list[str]) -> dict[str, str]:
    """One outcome per test id: the worst of its phases."""
    outcomes: dict[str, str] = {}
    for line in lines:
        test_id, outcome = json.loads(line)
        previous = outcomes.get(test_id, outcome)
        outcomes[test_id] = max(outcome, previous, key=_RANK.__getitem__)
    return outcomes
