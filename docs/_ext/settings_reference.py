"""Sphinx extension: the settings reference, generated from ``scrapy_redisspine.settings``.

Every setting is declared once, with its default and its text, in
``scrapy_redisspine/settings.py``. This extension replaces the marker line
``<!-- settings-reference -->`` in a page with a table made from those declarations
when the page is read, so the reference cannot drift from the code: there is no copy
to forget.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_redisspine.settings import SETTINGS

if TYPE_CHECKING:
    from sphinx.application import Sphinx

MARKER = "<!-- settings-reference -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_table() -> str:
    """The Markdown table: name, default (as Python writes it), meaning."""
    rows = ["| Setting | Default | Meaning |", "|---|---|---|"]
    rows += [
        f"| `{setting.name}` | `{setting.default!r}` | {_cell(setting.doc)} |"
        for setting in SETTINGS
    ]
    return "\n".join(rows) + "\n"


def _fill(app: Sphinx, docname: str, source: list[str]) -> None:
    if MARKER in source[0]:
        source[0] = source[0].replace(MARKER, settings_table())


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("source-read", _fill)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
