"""The dedup memory benchmark runs (tiny sizes): a smoke test that keeps it working."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from types import ModuleType

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "dedup_memory.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dedup_memory", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.bench
def test_benchmark_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "dedup.json"
    assert _load().main(["--small", "--json", str(output)]) == 0
    results = json.loads(output.read_text())
    assert 20 < results["set"]["bytes_per_url"] < 200
    assert results["switch"]["set_left"] == 0
    assert results["switch"]["forgotten_in_sample"] == 0
    assert results["bloom_bitmap"]["observed_false_positive_rate"] < 0.05
    assert results["throughput"]["enqueue_fresh_ratio_server"] > 0
    assert "SET mode:" in capsys.readouterr().out
