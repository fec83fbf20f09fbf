"""The conformance run's list of expected failures stays short, explicit and documented.

Every entry of ``tests/conformance/expected_failures.txt`` names one test of Scrapy's
and a reason, and every reason is one of the differences the docs list on their page
"Differences from Scrapy's scheduler" (``docs/differences-from-scrapy.md``): a test
may only be expected to fail for a difference users are told about.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "conformance"))
try:
    import run as conformance_run
finally:
    sys.path.pop(0)


def _differences() -> str:
    page = (ROOT / "docs" / "differences-from-scrapy.md").read_text("utf-8")
    match = re.fullmatch(r"# Differences from Scrapy's scheduler\n(.+)", page, re.DOTALL)
    assert match, "docs/differences-from-scrapy.md does not start with its title"
    return " ".join(match.group(1).split())  # as one line: the page wraps its text


def test_every_expected_failure_is_a_test_of_the_selection_with_a_reason() -> None:
    expected = conformance_run.read_expected()
    assert expected, "the list is empty: then it should not exist"
    for test_id, reason in expected.items():
        selected = [f"tests/{entry}" for entry in conformance_run.FILES]
        assert any(test_id == entry or test_id.startswith(f"{entry}::")
                   for entry in selected), f"{test_id} is not in run.py's selection"
        assert "::" in test_id, f"{test_id}: one test, not a file"
        assert reason, test_id


def test_every_reason_is_a_documented_difference() -> None:
    differences = _differences()
    for test_id, reason in conformance_run.read_expected().items():
        difference = reason.removeprefix(conformance_run.TIMING)
        assert difference in differences, (
            f"{test_id}: {difference!r} is not in the docs' list"
        )


def _report(addon: dict[str, str], stock: dict[str, str], expected: dict[str, str]) -> int:
    return int(conformance_run.report(addon, stock, expected, {}))


def test_only_a_failure_that_passes_on_stock_and_is_not_listed_fails_the_run() -> None:
    assert _report({"a": "passed", "b": "failed"}, {"b": "failed"}, {}) == 0, (
        "fails on stock too: not the add-on's"
    )
    assert _report({"a": "passed", "b": "failed"}, {"b": "passed"}, {}) == 1
    assert _report({"b": "failed"}, {"b": "passed"}, {"b": "some difference"}) == 0
    assert _report({"b": "failed"}, {}, {}) == 1, "not re-run on stock: not excused"


def test_a_listed_test_that_passes_or_is_gone_fails_the_run_unless_it_is_timing() -> None:
    assert _report({"b": "passed"}, {}, {"b": "some difference"}) == 1, "xpass"
    assert _report({}, {}, {"b": "some difference"}) == 1, "no longer collected"
    assert _report({"b": "passed"}, {}, {"b": conformance_run.TIMING + "slow"}) == 0
    assert _report({"b": "skipped"}, {}, {"b": "some difference"}) == 1, "skipped now"
