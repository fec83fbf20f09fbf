"""The settings reference of the docs is made from the one declaration in settings.py."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from scrapy_redisspine.settings import SETTINGS

if TYPE_CHECKING:
    from types import ModuleType

DOCS = Path(__file__).resolve().parent.parent / "docs"


def load_settings_reference() -> ModuleType:
    """docs/_ext/settings_reference.py, the Sphinx extension that writes the reference."""
    spec = importlib.util.spec_from_file_location(
        "settings_reference", DOCS / "_ext" / "settings_reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_reference_has_one_row_per_declared_setting_with_its_default() -> None:
    table = load_settings_reference().settings_table()
    rows = [line for line in table.splitlines() if line.startswith("| `REDISSPINE_")]
    assert [row.split("`")[1] for row in rows] == [setting.name for setting in SETTINGS]
    for row, setting in zip(rows, SETTINGS, strict=True):
        default = row.split(" | ")[1].strip("`")
        assert ast.literal_eval(default) == setting.default
        assert len(row.split(" | ")) == 3, f"a '|' in {setting.name}'s text broke its row"


def test_the_settings_page_is_filled_by_theload_settings_reference() -> None:
    assert load_settings_reference().MARKER in (DOCS / "settings.md").read_text()
    conf = (DOCS / "conf.py").read_text()
    assert '"settings_reference"' in conf
