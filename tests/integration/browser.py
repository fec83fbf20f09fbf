"""A real headless Chromium for the dashboard test: the system's (Debian's
``chromium``), driven by its own ``--dump-dom`` and ``--screenshot``.

A missing browser fails the test, with how to install it: CI installs it
(``.ci/run``), and a test that skipped would let CI go green without the page ever
having been loaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pathlib import Path

_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
#: Virtual time the page may use before the DOM is read: enough for several polls
#: (it passes at once while nothing is pending; network waits pause it).
_BUDGET_MS = 8000


def chromium() -> str:
    """The browser's path (``REDISSPINE_TEST_CHROMIUM``, else the first on PATH)."""
    found = os.environ.get("REDISSPINE_TEST_CHROMIUM") or next(
        (path for path in map(shutil.which, _NAMES) if path), None)
    if not found:
        pytest.fail("the dashboard test needs a headless Chromium: apt-get install -y "
                    "chromium (or set REDISSPINE_TEST_CHROMIUM)", pytrace=False)
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    command = [chromium(), "--headless", "--no-sandbox", "--disable-gpu",
               "--disable-dev-shm-usage", "--hide-scrollbars",
               f"--virtual-time-budget={_BUDGET_MS}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)


def dump_dom(url: str) -> str:
    """The page's DOM after its scripts ran (polls included)."""
    return _run("--dump-dom", url).stdout


def screenshot(url: str, path: Path, size: str = "1000,1150") -> None:
    _run(f"--window-size={size}", f"--screenshot={path}", url)
    assert path.stat().st_size > 10_000, "a screenshot of something"
