"""Sphinx configuration: Markdown pages (MyST), Scrapy's own theme, warnings are errors
in CI (``sphinx-build -W``, see run_tests.sh)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE / "_ext"), str(HERE.parent)]

import scrapy_redisspine  # noqa: E402  (after the path is set)

project = "scrapy-redisspine"
author = "the scrapy-redisspine authors"
copyright = "2026, the scrapy-redisspine authors"
release = scrapy_redisspine.__version__
version = release

extensions = ["myst_parser", "settings_reference"]
source_suffix = {".md": "markdown"}
myst_heading_anchors = 3
exclude_patterns = ["_build"]
html_theme = "sphinx_rtd_theme"
html_title = f"scrapy-redisspine {release}"
nitpicky = True
