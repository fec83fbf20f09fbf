"""Dedup memory and throughput, measured on a real redis-server (issue 5).

Spawns its own throwaway redis-server (never touches yours) and measures, with
Redis's own INFO:

1. SET mode: ``used_memory`` growth per fingerprint at ``--set-size`` fingerprints.
2. The switch: that SET moved into a Bloom filter by ``migrate_dedup.lua`` chunks:
   longest and 99th-percentile chunk (server time, INFO commandstats per chunk; the
   total time includes that per-chunk INFO round trip).
3. Bloom mode (Lua bitmap): ``used_memory`` per fingerprint with ``--bloom-items``
   in a filter of ``--bloom-capacity`` at ``--error-rate``, then the share of
   ``--fresh`` new fingerprints wrongly answered "seen" (observed false positives).
4. Throughput: the frontier's enqueue of batches of 100 new requests (one round trip
   each), SET mode against Bloom mode on the same server: server time per batch
   (INFO commandstats) and client rate; also with 80 % duplicates (a crawl's usual
   mix) and the dedup check alone (``seen.lua``) next to a naive GETBIT/SETBIT loop.
5. RedisBloom (BF.*), when the server has it (e.g. ``--loadmodule`` redisbloom.so).

Usage (the numbers in benchmarks/RESULTS.md):

    .venv/bin/python benchmarks/dedup_memory.py
    .venv/bin/python benchmarks/dedup_memory.py --small        # a smoke run (CI)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from typing import TYPE_CHECKING, Any

from scrapy_redisspine.bloom import has_redisbloom
from scrapy_redisspine.dedup import MODE_BLOOM, MODE_MIGRATING, Dedup, DedupParams
from scrapy_redisspine.frontier import Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys
from scrapy_redisspine.testing.redis_server import RedisServer

if TYPE_CHECKING:
    from collections.abc import Iterator

    import redis

BATCH = 100  # links of one page: one enqueue round trip
LOAD_BATCH = 1000
PAYLOAD_BYTES = 150

NAIVE_BLOOM = """
-- The naive reference: a classic Bloom filter, one GETBIT per bit, SETBIT for new.
local bits, hashes = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
    local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12 = string.byte(ARGV[i], 1, 12)
    local h1 = ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6
    local h2 = ((((b7 * 256 + b8) * 256 + b9) * 256 + b10) * 256 + b11) * 256 + b12
    local new = false
    for j = 0, hashes - 1 do
        local p = (h1 + j * h2) % bits
        if redis.call("GETBIT", KEYS[1], p) == 0 then
            new = true
            redis.call("SETBIT", KEYS[1], p, 1)
        end
    end
    out[#out + 1] = new and "1" or "0"
end
return table.concat(out)
"""


def fingerprints(salt: str, count: int, start: int = 0) -> Iterator[list[bytes]]:
    """Deterministic SHA1 fingerprints (as Scrapy's are), in batches."""
    prefix = salt.encode()
    for first in range(start, start + count, LOAD_BATCH):
        last = min(first + LOAD_BATCH, start + count)
        yield [hashlib.sha1(b"%s-%d" % (prefix, i)).digest() for i in range(first, last)]


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def fresh_record(client: redis.Redis, name: str, **params: Any) -> Dedup:
    record = Dedup(client, CrawlKeys("bench", name), DedupParams(**params))
    record.open()
    record.add([b"warm-up: load the scripts before measuring"])
    return record


def measure_set(client: redis.Redis, size: int) -> tuple[dict[str, Any], Dedup]:
    record = fresh_record(client, "set", backend="none")
    before = used_memory(client)
    for batch in fingerprints("set", size):
        record.add(batch)
    grown = used_memory(client) - before
    key_bytes = int(client.memory_usage(record.keys.seen, samples=0) or 0)
    return {"fingerprints": size, "used_memory_bytes": grown, "bytes_per_url": grown / size,
            "set_key_bytes_per_url": key_bytes / size}, record


def measure_switch(client: redis.Redis, record: Dedup, size: int, chunk: int) -> dict[str, Any]:
    """Switch the SET of ``measure_set`` to a bitmap filter; time every chunk."""
    migrator = Dedup(record.client, record.keys, DedupParams(
        set_max_fingerprints=1, backend="bitmap", capacity=max(size, 1000), chunk_size=chunk,
    ))
    migrator.open()
    micros: list[float] = []
    started = time.perf_counter()
    assert migrator.switch_if_due() == (MODE_MIGRATING, True)
    mode = MODE_MIGRATING
    while mode == MODE_MIGRATING:
        client.config_resetstat()  # so the next line's stats are this one chunk's
        mode = migrator.migrate_chunk()[0]
        micros.append(client.info("commandstats")["cmdstat_evalsha"]["usec"])
    elapsed = time.perf_counter() - started
    sample = next(fingerprints("set", min(size, 10_000)))
    forgotten = sum(migrator.add(sample))
    micros.sort()
    return {
        "fingerprints": size, "chunk_size": chunk, "chunks": len(micros),
        "chunk_ms_max": micros[-1] / 1000, "chunk_ms_p99": micros[int(len(micros) * 0.99)] / 1000,
        "chunk_ms_mean": statistics.mean(micros) / 1000, "total_seconds": elapsed,
        "set_left": int(client.exists(record.keys.seen)), "forgotten_in_sample": forgotten,
        "filter_bytes": int(client.strlen(record.keys.bloom)),
    }


def measure_bloom(
    client: redis.Redis, backend: str, *, capacity: int, items: int, fresh: int,
    error_rate: float,
) -> dict[str, Any]:
    name = backend
    record = fresh_record(client, name, set_max_fingerprints=0, backend=backend,
                          capacity=capacity, error_rate=error_rate)
    before, lua_before = used_memory(client), client.info("memory")["used_memory_lua"]
    assert record.maintain().mode == MODE_BLOOM
    new = 0
    for batch in fingerprints(name, items):
        new += sum(record.add(batch))
    grown = used_memory(client) - before
    lua_grown = client.info("memory")["used_memory_lua"] - lua_before
    key_bytes = int(client.memory_usage(record.keys.bloom) or 0)
    key_bytes += int(client.memory_usage(record.keys.dedup) or 0)
    taken_for_seen = 0
    for batch in fingerprints(name + "-fresh", fresh):
        taken_for_seen += len(batch) - sum(record.add(batch))
    state = record.state()
    return {
        "backend": backend, "capacity": capacity, "error_rate": error_rate, "items": items,
        "used_memory_bytes": grown, "bytes_per_url": grown / items,
        "lua_vm_growth_bytes": lua_grown,
        "filter_keys_bytes": key_bytes, "filter_keys_bytes_per_url": key_bytes / items,
        "false_positives_while_filling": items - new,
        "fresh": fresh, "fresh_taken_for_seen": taken_for_seen,
        "observed_false_positive_rate": taken_for_seen / fresh,
        "layers_in_use": state.active_layers, "layer_counts": list(state.layer_counts),
    }


def _requests(salt: str, count: int, duplicates: float) -> list[NewRequest]:
    """``count`` requests, the first ``duplicates`` share of them already seen (pre-fill)."""
    seen = int(count * duplicates)
    prints = [f for batch in fingerprints(salt + "-dup", seen) for f in batch]
    prints += [f for batch in fingerprints(salt + "-new", count - seen) for f in batch]
    payload = os.urandom(PAYLOAD_BYTES)
    return [NewRequest(payload + b"%d" % i, fingerprint) for i, fingerprint in enumerate(prints)]


#: The filters the throughput is measured on: "bloom" is the Lua bitmap.
FILTER_BACKENDS = {"bloom": "bitmap", "redisbloom": "redisbloom"}


def _mode_setup(client: redis.Redis, mode: str, prefill: int) -> tuple[Frontier, Dedup]:
    if mode == "set":
        record = fresh_record(client, f"tp-{mode}", backend="none")
    else:
        record = fresh_record(client, f"tp-{mode}", set_max_fingerprints=0,
                              backend=FILTER_BACKENDS[mode], capacity=10_000_000)
        record.maintain()
    for batch in fingerprints("prefill", prefill):
        record.add(batch)
    return Frontier(client, record.keys, "bench"), record


def measure_throughput(
    client: redis.Redis, batches: int, reps: int, prefill: int
) -> dict[str, Any]:
    """Best of ``reps`` interleaved runs, so all modes see the same machine load
    (RedisBloom's ``redisbloom`` when the server has BF.*)."""
    modes = ["set", "bloom"] + (["redisbloom"] if has_redisbloom(client, "bench:probe") else [])
    setups = {mode: _mode_setup(client, mode, prefill) for mode in modes}
    naive = client.register_script(NAIVE_BLOOM)
    client.setbit("bench:naive", 110_000_000, 0)
    best: dict[str, float] = {}

    def record_best(name: str, value: float, lower_is_better: bool = True) -> None:
        old = best.get(name)
        if old is None or (value < old if lower_is_better else value > old):
            best[name] = value

    for rep in range(reps):
        for mode, (frontier, record) in setups.items():
            for mix, duplicates in (("fresh", 0.0), ("crawl_mix", 0.8)):
                salt = f"{mode}-{mix}-{rep}"
                requests = _requests(salt, batches * BATCH, duplicates)
                record.add([r.fingerprint for r in requests[: int(len(requests) * duplicates)]])
                client.config_resetstat()
                started = time.perf_counter()
                for i in range(0, len(requests), BATCH):
                    frontier.enqueue(requests[i : i + BATCH])
                wall = time.perf_counter() - started
                stats = client.info("commandstats")["cmdstat_evalsha"]
                record_best(f"enqueue_{mix}_{mode}_server_us_per_batch", stats["usec_per_call"])
                record_best(f"enqueue_{mix}_{mode}_client_requests_per_s", len(requests) / wall,
                            lower_is_better=False)
            prints = [f for batch in fingerprints(f"{mode}-check-{rep}", batches * BATCH)
                      for f in batch]
            client.config_resetstat()
            for i in range(0, len(prints), BATCH):
                record.add(prints[i : i + BATCH])
            record_best(f"check_{mode}_server_us_per_batch",
                        client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
        prints = [f for batch in fingerprints(f"naive-{rep}", batches * BATCH) for f in batch]
        client.config_resetstat()
        for i in range(0, len(prints), BATCH):
            naive(keys=["bench:naive"], args=[110_000_000, 7, *prints[i : i + BATCH]])
        record_best("check_naive_server_us_per_batch",
                    client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
    for mode, suffix in (("bloom", ""), ("redisbloom", "_redisbloom")):
        if mode not in setups:
            continue
        for mix in ("fresh", "crawl_mix"):
            best[f"enqueue_{mix}_ratio_server{suffix}"] = (
                best[f"enqueue_{mix}_set_server_us_per_batch"]
                / best[f"enqueue_{mix}_{mode}_server_us_per_batch"])
            best[f"enqueue_{mix}_ratio_client{suffix}"] = (
                best[f"enqueue_{mix}_{mode}_client_requests_per_s"]
                / best[f"enqueue_{mix}_set_client_requests_per_s"])
        best[f"check_ratio_server{suffix}"] = (best["check_set_server_us_per_batch"]
                                               / best[f"check_{mode}_server_us_per_batch"])
    best["check_naive_ratio_server"] = (best["check_set_server_us_per_batch"]
                                        / best["check_naive_server_us_per_batch"])
    return best


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set-size", type=int, default=1_000_000)
    parser.add_argument("--bloom-capacity", type=int, default=10_000_000)
    parser.add_argument("--bloom-items", type=int, default=10_000_000)
    parser.add_argument("--fresh", type=int, default=1_000_000)
    parser.add_argument("--error-rate", type=float, default=0.01)
    parser.add_argument("--chunk-size", type=int, default=DedupParams().chunk_size)
    parser.add_argument("--batches", type=int, default=200, help="enqueue batches per run")
    parser.add_argument("--reps", type=int, default=7, help="interleaved runs (best kept)")
    parser.add_argument("--prefill", type=int, default=100_000)
    parser.add_argument("--loadmodule", help="a Redis module to load (e.g. redisbloom.so)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--small", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--throughput-only", action="store_true",
                        help="measure only the enqueue throughput (part 4)")
    args = parser.parse_args(argv)
    if args.small:
        args.set_size, args.bloom_capacity, args.bloom_items = 3000, 3000, 3000
        args.fresh, args.batches, args.reps, args.prefill = 3000, 3, 1, 1000
    return args


def run(args: argparse.Namespace) -> dict[str, Any]:
    extra = ["--loadmodule", args.loadmodule] if args.loadmodule else []
    with RedisServer(extra_args=extra) as server:
        client = server.client()
        results: dict[str, Any] = {
            "redis_version": client.info("server")["redis_version"],
            "machine": f"{platform.machine()} {os.cpu_count()} CPUs, {platform.platform()}",
            "python": platform.python_version(),
        }
        if args.throughput_only:
            results["throughput"] = measure_throughput(client, args.batches, args.reps,
                                                       args.prefill)
            client.close()
            return results
        results["set"], record = measure_set(client, args.set_size)
        results["switch"] = measure_switch(client, record, args.set_size, args.chunk_size)
        client.flushall()
        sizes = {"capacity": args.bloom_capacity, "items": args.bloom_items,
                 "fresh": args.fresh, "error_rate": args.error_rate}
        results["bloom_bitmap"] = measure_bloom(client, "bitmap", **sizes)
        client.flushall()
        if has_redisbloom(client, "bench:probe"):
            results["bloom_redisbloom"] = measure_bloom(client, "redisbloom", **sizes)
            client.flushall()
        results["throughput"] = measure_throughput(client, args.batches, args.reps, args.prefill)
        client.close()
    return results


def report(results: dict[str, Any]) -> str:
    lines = [f"redis {results['redis_version']} on {results['machine']}"]
    if "set" not in results:
        return "\n".join(lines + _throughput_lines(results["throughput"]))
    s = results["set"]
    lines.append(f"SET mode: {s['fingerprints']:,} fingerprints, used_memory "
                 f"+{s['used_memory_bytes']:,} B = {s['bytes_per_url']:.1f} B/URL "
                 f"(MEMORY USAGE of the SET: {s['set_key_bytes_per_url']:.1f} B/URL)")
    w = results["switch"]
    lines.append(f"switch: {w['fingerprints']:,} moved in {w['chunks']} chunks of "
                 f"{w['chunk_size']} in {w['total_seconds']:.2f} s; chunk max "
                 f"{w['chunk_ms_max']:.2f} ms, p99 {w['chunk_ms_p99']:.2f} ms, mean "
                 f"{w['chunk_ms_mean']:.2f} ms; SET left: {w['set_left']}; forgotten in a "
                 f"sample: {w['forgotten_in_sample']}")
    for name in ("bloom_bitmap", "bloom_redisbloom"):
        if name in results:
            b = results[name]
            lines.append(
                f"Bloom ({b['backend']}): {b['items']:,} in capacity {b['capacity']:,} at "
                f"{b['error_rate']}: used_memory +{b['used_memory_bytes']:,} B = "
                f"{b['bytes_per_url']:.3f} B/URL (its keys: {b['filter_keys_bytes']:,} B = "
                f"{b['filter_keys_bytes_per_url']:.3f} B/URL; Lua VM grew "
                f"{b['lua_vm_growth_bytes']:,} B); {b['fresh']:,} fresh: "
                f"{b['fresh_taken_for_seen']:,} taken for seen = "
                f"{b['observed_false_positive_rate']:.4%}; layers {b['layer_counts']}")
    if "bloom_redisbloom" not in results:
        lines.append("Bloom (redisbloom): not measured, the server has no BF.* commands")
    return "\n".join(lines + _throughput_lines(results["throughput"]))


def _throughput_lines(t: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    for mix in ("fresh", "crawl_mix"):
        lines.append(
            f"enqueue {mix} (100/batch): SET {t[f'enqueue_{mix}_set_server_us_per_batch']:.0f} "
            f"us/batch, Bloom {t[f'enqueue_{mix}_bloom_server_us_per_batch']:.0f} us/batch "
            f"(server ratio {t[f'enqueue_{mix}_ratio_server']:.2f}); client "
            f"{t[f'enqueue_{mix}_set_client_requests_per_s']:,.0f} vs "
            f"{t[f'enqueue_{mix}_bloom_client_requests_per_s']:,.0f} req/s "
            f"(ratio {t[f'enqueue_{mix}_ratio_client']:.2f})")
    if "enqueue_fresh_ratio_server_redisbloom" in t:
        for mix in ("fresh", "crawl_mix"):
            lines.append(
                f"enqueue {mix} (100/batch), RedisBloom: "
                f"{t[f'enqueue_{mix}_redisbloom_server_us_per_batch']:.0f} us/batch (server "
                f"ratio {t[f'enqueue_{mix}_ratio_server_redisbloom']:.2f}); client "
                f"{t[f'enqueue_{mix}_redisbloom_client_requests_per_s']:,.0f} req/s (ratio "
                f"{t[f'enqueue_{mix}_ratio_client_redisbloom']:.2f})")
        lines.append(f"dedup check alone, RedisBloom: "
                     f"{t['check_redisbloom_server_us_per_batch']:.0f} us (ratio "
                     f"{t['check_ratio_server_redisbloom']:.2f})")
    lines.append(
        f"dedup check alone (100/batch, server): SET {t['check_set_server_us_per_batch']:.0f} us, "
        f"Bloom {t['check_bloom_server_us_per_batch']:.0f} us (ratio "
        f"{t['check_ratio_server']:.2f}), naive GETBIT/SETBIT "
        f"{t['check_naive_server_us_per_batch']:.0f} us (ratio "
        f"{t['check_naive_ratio_server']:.2f})")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    results = run(args)
    print(report(results))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as output:
            json.dump(results, output, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
