"""CI smoke runs of the benchmarks: tiny sizes, ours only, completeness not speed.

Keeps ``benchmarks/crawl_compare.py`` (and the latency proxy it uses for the
remote-Redis runs), ``scheduler_micro.py``, ``micro_breakdown.py``, ``queue_memory.py``,
``shard_scaling.py``, ``cluster_groups.py``, ``script_cost.py``, ``bloom_lua_costs.py``,
``lua_profile.py``, ``client_costs.py`` and ``packed_costs.py`` from rotting: every
reachable page fetched once, every queued request taken back.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load_runner() -> ModuleType:
    path = ROOT / "benchmarks" / "crawl_compare.py"
    spec = importlib.util.spec_from_file_location("bench_crawl_compare", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.e2e
@pytest.mark.parametrize(("mode", "rtt_ms"), [("spine1", 0.0), ("spine2", 0.0), ("spine1", 1.0)])
def test_crawl_benchmark_smoke(mode: str, rtt_ms: float) -> None:
    runner = _load_runner()
    args = argparse.Namespace(hosts=4, pages=10, fanout=4, latency=0.0, timeout=50)
    result = runner.one_run(mode, args, f"smoke-{mode}-{rtt_ms:g}", rtt_ms)
    assert result["finished"], result
    assert result["expected"] == 40
    assert result["missing"] == 0, result
    assert result["duplicates"] == 0, result
    assert result["pages"] == 40
    assert result["round_trips_per_page"] > 0  # the counting wrapper ran


@pytest.mark.e2e
def test_scheduler_micro_benchmark_smoke() -> None:
    # every request taken back (Scrapy's scheduler with its default queue too, which
    # asks a Downloader for each request's slot), through the 1 ms proxy too, and the
    # breakdown adds up
    command = [sys.executable, str(ROOT / "benchmarks" / "scheduler_micro.py"),
               "--impls", "scrapy,scrapy-default,spine", "--n", "300", "--runs", "1",
               "--rtt-ms", "1"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"run"')]
    assert {run["impl"] for run in runs} == {"scrapy", "scrapy-default", "spine", "spine@1ms"}
    assert "| scrapy-default |" in out.stdout
    assert "vs scrapy-default" in out.stdout
    assert all(run["taken"] == 300 for run in runs), runs
    assert next(run for run in runs if run["impl"] == "spine")["redis_bytes_per_request"] > 0
    assert next(run for run in runs if run["impl"] == "spine")["redis_calls"] == "inline"

    # driven on an asyncio loop, the spine's calls parked in greenlets: every request
    # taken back, each phase timed
    command = [sys.executable, str(ROOT / "benchmarks" / "scheduler_micro.py"),
               "--impls", "scrapy,spine", "--n", "300", "--runs", "1", "--mode", "loop",
               "--commandstats"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith('{"run"')]
    assert [(run["impl"], run["mode"], run["taken"], run["redis_calls"]) for run in runs] == [
        ("scrapy", "loop", 300, None), ("spine", "loop", 300, "greenlets")]
    assert all(run["enqueue_s"] > 0 and run["drain_s"] > 0 for run in runs), runs
    # the drain's turns counted (300 requests, at most 16 a turn), idle ones among them
    assert all(run["drain_turns"] >= 19 and 0 <= run["idle_turns"] < run["drain_turns"]
               for run in runs), runs
    # Redis's CPU during the drain read (the spine's only), and its leases alongside
    # counted: the scheduler's stat, read back (how many go depends on the machine's
    # load: none while Redis's replies take over 5 ms to come back, which a CI machine
    # running three test processes on two cores sees; test_lease_alongside_e2e.py
    # makes them go)
    spine = runs[1]
    assert spine["redis_cpu_drain_s"] >= 0, runs
    assert runs[0]["redis_cpu_drain_s"] is None, runs
    assert isinstance(spine["leases_alongside"], int), runs
    assert spine["leases_alongside"] >= 0, runs
    assert runs[0]["leases_alongside"] is None, runs
    # --commandstats: the spine's Redis's command table (the scripts, and the commands
    # they call: one ZRANGEBYLEX a leased request, each lane's first queue entry)
    assert "commandstats" not in runs[0], runs
    assert spine["commandstats"]["evalsha"]["calls"] > 0, runs
    assert spine["commandstats"]["zrangebylex"]["calls"] >= 300, runs
    assert "spine, last run: Redis's most costly commands" in out.stdout

    command = [sys.executable, str(ROOT / "benchmarks" / "micro_breakdown.py"), "--n", "300",
               "--by-script"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["server_scripts_us"] > 0
    assert report["send_and_lease_us"] > 0
    assert report["server_us_by_script"]["lease"] > 0  # every script's sha is named
    assert report["server_us_by_script"]["enqueue"] > 0
    assert "EVALSHA ?" not in report["server_us_by_script"]


@pytest.mark.e2e
def test_queue_memory_benchmark_smoke() -> None:
    # four requests a lane, in one batch: each lane's go to its list, in the compact
    # form (a plain GET: its URL); the queue ZSET holds one index entry per lane, and
    # the member of the request sent first to load the scripts (its lane's first)
    command = [sys.executable, str(ROOT / "benchmarks" / "queue_memory.py"), "--n", "400"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout.splitlines()[0])
    assert report["keys"]["queue lists"]["keys"] == 100
    assert report["keys"]["queue lists"]["bytes_per_request"] > 0
    assert report["queue_zset_members"] == 101
    assert report["used_memory_bytes_per_request"] > 0
    assert report["stored_as"] == "list items"
    assert report["stored_example"] == "b'http://h0.example/p/0'"


@pytest.mark.e2e
def test_shard_scaling_benchmark_smoke() -> None:
    # both set-ups ran, every master of the cluster did work, nothing was lost
    command = [sys.executable, str(ROOT / "benchmarks" / "shard_scaling.py"), "--seconds",
               "1", "--reps", "1", "--lanes", "100"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    report = json.loads(out.stdout)
    (single,), (cluster,) = report["all"]["single"], report["all"]["cluster"]
    for run in (single, cluster):
        assert run["pages_per_second"] > 0, run
        assert run["left_queued_inflight"] == [100, 0], run
    assert len(cluster["cpu_us_per_page_per_master"]) == 3
    assert all(cpu > 0 for cpu in cluster["cpu_us_per_page_per_master"]), cluster
    assert list(report["cluster_crawls_shards_per_master"].values()) == [[2, 2, 2]]


@pytest.mark.e2e
def test_cluster_groups_benchmark_smoke() -> None:
    # two crawls of one group on a cluster: every page of both, no gap below the delay
    command = [sys.executable, str(ROOT / "benchmarks" / "cluster_groups.py"), "--runs", "1",
               "--setups", "cluster", "--hosts", "2", "--pages", "3", "--workers", "1",
               "--delay", "0.2"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    [row] = [line for line in out.stdout.splitlines() if line.startswith("| cluster |")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[2] == "12", row  # 2 hosts x 3 pages, fetched by each of the two crawls
    assert cells[5].startswith("0 of "), row
    assert cells[6] == "0", row


def test_script_cost_benchmark_smoke() -> None:
    # every request enqueued, leased and acked once; each phase's figures present
    command = [sys.executable, str(ROOT / "benchmarks" / "script_cost.py"), "--rounds", "1",
               "--n", "200", "--hosts", "20", "--json"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert report["left_queued_inflight"] == {"queued": 0, "inflight": 0}, report
    for phase in ("enqueue", "lease", "ack"):
        assert report[phase]["requests"] == 200, report
        assert report[phase]["script_us"] > 0, report

    # the floor's scripts take the same workload through: all of it, once
    out = subprocess.run([*command, "--floor"], check=True, capture_output=True, text=True,
                         timeout=120)
    reports = json.loads(out.stdout)
    assert set(reports) == {"frontier", "floor"}
    for report in reports.values():
        assert report["left_queued_inflight"] == {"queued": 0, "inflight": 0}, report
        for phase in ("enqueue", "lease", "ack"):
            assert report[phase]["requests"] == 200, report


def test_bloom_lua_costs_benchmark_smoke(tmp_path: Path) -> None:
    # every part timed (the server ran each script), the real checks among them
    out = tmp_path / "costs.json"
    command = [sys.executable, str(ROOT / "benchmarks" / "bloom_lua_costs.py"), "--batch", "10",
               "--calls", "3", "--reps", "1", "--json", str(out)]
    subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    costs = json.loads(out.read_text())
    assert set(costs) == {"sadd", "hash_math", "getrange", "setrange", "bitfield_get",
                          "bitfield_set", "word_check", "hash_blocks", "set_check",
                          "bitmap_check", "hash_field_overhead_bytes"}, costs
    # Each layout and record checked itself before it was timed (a batch new, then
    # seen: the run stops otherwise). The times are differences of two short
    # timings (a part's and the empty script's), which a loaded machine can bring
    # to 0 or below: a benchmark's figures, not the smoke run's to assert on.
    assert all(math.isfinite(value) for value in costs.values()), costs
    assert costs["hash_field_overhead_bytes"] > 0, costs  # (a size, not a time)


def test_lua_profile_benchmark_smoke() -> None:
    # every mark still matches its script (else it exits naming the mark), every
    # request leased and acked through the instrumented scripts
    command = [sys.executable, str(ROOT / "benchmarks" / "lua_profile.py"), "--rounds", "1",
               "--n", "200", "--hosts", "20", "--json"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout)
    assert report["lease"]["requests"] == 200, report
    assert report["enqueue"]["requests"] == 200, report
    for name, labels in (("lease", {"libraries", "lanes_write", "tail"}),
                         ("enqueue", {"libraries", "acks", "dedup", "tail"})):
        assert labels <= set(report[name]["sections"]), report[name]


@pytest.mark.e2e
def test_script_instructions_benchmark_smoke() -> None:
    # the server runs under callgrind, every phase is dumped and counted, every request
    # leased and acked; the server settings reach it
    command = [sys.executable, str(ROOT / "benchmarks" / "script_instructions.py"),
               "--rounds", "1", "--n", "200", "--hosts", "20", "--json",
               "--redis-config", "hash-max-listpack-entries 16"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=300)
    report = json.loads(out.stdout)
    assert report["requests"] == {"enqueue": 200, "lease": 200, "ack": 200}, report
    assert report["left_queued_inflight"] == [0, 0], report
    assert all(n > 1000 for n in report["instructions_per_request"].values()), report


@pytest.mark.e2e
def test_client_costs_benchmark_smoke() -> None:
    # both packers and both encode paths timed, for each kind of call and request
    command = [sys.executable, str(ROOT / "benchmarks" / "client_costs.py"),
               "--number", "20", "--repeat", "1"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(report) == {
        f"pack_{call}_{packer}_us" for call in ("enqueue", "ack")
        for packer in ("redis_py", "hiredis_first")
    } | {
        f"encode_{request}_{path}_us" for request in ("bare", "callback_depth")
        for path in ("general", "plain")
    }
    assert all(value > 0 for value in report.values()), report


@pytest.mark.e2e
def test_packed_costs_benchmark_smoke() -> None:
    # the packed encodings where the defaults keep them, the hashed ones with the
    # thresholds of 16, each command timed
    command = [sys.executable, str(ROOT / "benchmarks" / "packed_costs.py"),
               "--lanes", "40", "--touched", "8", "--rounds", "5"]
    out = subprocess.run(command, check=True, capture_output=True, text=True, timeout=120)
    runs = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert [run["encodings"] for run in runs] == [["listpack", "listpack"],
                                                 ["skiplist", "hashtable"]], runs
    assert all(run["usec_per_call"][name] > 0 for run in runs
               for name in ("zadd", "zrem", "hmget")), runs
    assert "| ZADD | ZREM | HMGET |" in out.stdout
