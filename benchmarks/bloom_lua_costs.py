"""What a Lua bitmap Bloom check is made of, per fingerprint, against SET mode's SADD.

Issue 19 asks the Bloom mode's enqueue to cost Redis at most 1/0.8 of the SET mode's.
With RedisBloom it does (``dedup_memory.py --throughput-only``); the Lua bitmap
(``lib/dedup.lua``, for servers without the module) does not, and this says why: it
times, on a throwaway redis-server, the parts such a check can be built from, each
in a script over a batch of fingerprints (server µs from ``INFO commandstats``, best
of ``--reps``; the empty script's time is taken off every part):

- ``sadd``: SET mode's whole check, one ``SADD`` of the 14-byte member;
- ``hash_math``: the two 48-bit hashes and the k = 7 bit positions, in Lua, no call;
- ``getrange`` / ``setrange``: one ``GETRANGE`` of a 64-byte block, one ``SETRANGE``
  of 4 bytes, each a call per fingerprint (the bitmap's path: a block read, its bits
  tested in Lua, the changed bytes written);
- ``bitfield_get`` / ``bitfield_set``: the k bits read (or set, which answers the old
  bits: test and record in one) as ``u1`` fields of one ``BITFIELD`` per batch, the
  arguments built in Lua: no call per fingerprint, but one field per bit;
- ``word_check``: a layout not built, for comparison: all of a fingerprint's bits
  in one 32-bit word, the batch's words read by one ``BITFIELD`` and the changed
  ones written by another (its false-positive rate, worse than a 64-byte block's at
  the same bits per fingerprint, not measured here);
- ``hash_blocks``: another layout not built: the filter's 64-byte blocks kept 16 to a
  field of a HASH (1 KB values), so that a batch reads every block it needs with
  one ``HMGET`` and writes the changed fields with one ``HSET``, no call per
  fingerprint and the bitmap's own bit positions (also printed: what a field costs
  Redis beyond its 1,024 bytes, ``MEMORY USAGE`` of the HASH);
- ``bitmap_check`` / ``set_check``: the real thing, ``seen.lua`` on a bitmap record
  and on a SET record (new fingerprints).

    .venv/bin/python benchmarks/bloom_lua_costs.py            # batches of 100, best of 5
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scrapy_redisspine.dedup import Dedup, DedupParams  # noqa: E402
from scrapy_redisspine.keys import CrawlKeys  # noqa: E402
from scrapy_redisspine.testing.redis_server import RedisServer  # noqa: E402

#: Each part as a script over ARGV (the batch's fingerprints); KEYS[1] a bitmap,
#: KEYS[2] a SET, KEYS[3] a HASH of 1 KB blocks (``hash_blocks``).
PARTS = {
    "empty": "return #ARGV",
    "sadd": """
for i = 1, #ARGV do redis.call("SADD", KEYS[2], string.sub(ARGV[i], 1, 14)) end
return 1""",
    "hash_math": """
local n = 0
for i = 1, #ARGV do
  local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12 = string.byte(ARGV[i], 1, 12)
  local first = ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6
  local second = ((((b7 * 256 + b8) * 256 + b9) * 256 + b10) * 256 + b11) * 256 + b12
  local a = second % 512
  local b = ((second - a) / 512) % 512
  for j = 0, 6 do n = n + (first + a + j * b + (j * j * j - j) / 6) % 512 end
end
return n""",
    "getrange": """
for i = 1, #ARGV do
  local start = (string.byte(ARGV[i], 1) * 256 + string.byte(ARGV[i], 2)) * 64
  redis.call("GETRANGE", KEYS[1], start, start + 63)
end
return 1""",
    "setrange": """
for i = 1, #ARGV do
  local start = (string.byte(ARGV[i], 1) * 256 + string.byte(ARGV[i], 2)) * 64
  redis.call("SETRANGE", KEYS[1], start, string.sub(ARGV[i], 3, 6))
end
return 1""",
    "bitfield_get": """
local args, m = {}, 0
for i = 1, #ARGV do
  local base = (string.byte(ARGV[i], 1) * 256 + string.byte(ARGV[i], 2)) * 512
  for j = 0, 6 do
    args[m + 1], args[m + 2], args[m + 3] = "GET", "u1", base + j * 37
    m = m + 3
  end
end
return #redis.call("BITFIELD", KEYS[1], unpack(args, 1, m))""",
    "bitfield_set": """
local args, m = {}, 0
for i = 1, #ARGV do
  local base = (string.byte(ARGV[i], 1) * 256 + string.byte(ARGV[i], 2)) * 512
  for j = 0, 6 do
    args[m + 1], args[m + 2], args[m + 3], args[m + 4] = "SET", "u1", base + j * 37, "1"
    m = m + 4
  end
end
return #redis.call("BITFIELD", KEYS[1], unpack(args, 1, m))""",
    # A layout not built: all k = 7 bits of a fingerprint in one 32-bit word, every
    # word of the batch read by one BITFIELD (GET u32 #word), tested in Lua (bitop),
    # the changed words written by a second one (SET u32); a word two fingerprints of
    # the batch share is read once and kept up to date in Lua.
    "word_check": """
local get, words_at = {}, {}
for i = 1, #ARGV do
  local b1, b2, b3 = string.byte(ARGV[i], 1, 3)
  words_at[i] = "#" .. ((b1 * 256 + b2) * 256 + b3) % 65536
  get[3 * i - 2], get[3 * i - 1], get[3 * i] = "GET", "u32", words_at[i]
end
local words = redis.call("BITFIELD", KEYS[1], unpack(get))
local set, m, known, new = {}, 0, {}, 0
for i = 1, #ARGV do
  local at = words_at[i]
  local value = known[at] or bit.tobit(words[i])
  local b4, b5 = string.byte(ARGV[i], 4, 5)
  local a, b = b4 % 32, b5 % 31 + 1
  local mask = 0
  for j = 0, 6 do
    mask = bit.bor(mask, bit.lshift(1, (a + j * b + (j * j * j - j) / 6) % 32))
  end
  if bit.band(value, mask) ~= mask then
    value = bit.bor(value, mask)
    known[at] = value
    set[m + 1], set[m + 2], set[m + 3] = "SET", "u32", at
    set[m + 4] = value < 0 and value + 4294967296 or value
    m = m + 4
    new = new + 1
  end
end
if m > 0 then
  redis.call("BITFIELD", KEYS[1], unpack(set, 1, m))
end
return new""",
    # A layout not built: 64-byte blocks (the bitmap's bit positions), 16 to a 1 KB
    # field of a HASH; one HMGET reads the batch's fields, the bits are tested in
    # Lua, the changed fields are rebuilt (slices around the changed bytes) and
    # written by one HSET. A field two fingerprints share is read once.
    "hash_blocks": """
local byte, fmt, char, sub = string.byte, string.format, string.char, string.sub
local masks = { 128, 64, 32, 16, 8, 4, 2, 1 }
local names, index_of, field_of, start_of, second_of = {}, {}, {}, {}, {}
for i = 1, #ARGV do
  local b1, b2, b3, b4, b5, b6, b7, b8, b9, b10, b11, b12 = byte(ARGV[i], 1, 12)
  local first = ((((b1 * 256 + b2) * 256 + b3) * 256 + b4) * 256 + b5) * 256 + b6
  local block = first % 65536
  local within = block % 16
  local field = fmt("%d", (block - within) / 16)
  if not index_of[field] then names[#names + 1] = field; index_of[field] = #names end
  field_of[i], start_of[i] = field, within * 64
  second_of[i] = ((((b7 * 256 + b8) * 256 + b9) * 256 + b10) * 256 + b11) * 256 + b12
end
local values = redis.call("HMGET", KEYS[3], unpack(names))
local changes, new = {}, 0
for i = 1, #ARGV do
  local field, start, second = field_of[i], start_of[i], second_of[i]
  local value, change = values[index_of[field]], changes[field_of[i]]
  local a = second % 512
  local b = ((second - a) / 512) % 512
  local fresh = false
  for j = 0, 6 do
    local position = (a + j * b + (j * j * j - j) / 6) % 512
    local bit = position % 8
    local mask = masks[bit + 1]
    local at = start + (position - bit) / 8 + 1
    local current = change and change[at] or byte(value, at)
    if current % (mask + mask) < mask then
      if not change then change = {}; changes[field] = change end
      change[at] = current + mask
      fresh = true
    end
  end
  if fresh then new = new + 1 end
end
local args, m = {}, 0
for field, change in pairs(changes) do
  local value, ats = values[index_of[field]], {}
  for at in pairs(change) do ats[#ats + 1] = at end
  table.sort(ats)
  local parts, p, from = {}, 0, 1
  for k = 1, #ats do
    parts[p + 1], parts[p + 2] = sub(value, from, ats[k] - 1), char(change[ats[k]])
    p, from = p + 2, ats[k] + 1
  end
  parts[p + 1] = sub(value, from)
  args[m + 1], args[m + 2] = field, table.concat(parts)
  m = m + 2
end
if m > 0 then redis.call("HSET", KEYS[3], unpack(args, 1, m)) end
return new""",
}


def _best_us(client: Any, run: Any, reps: int, calls: int) -> float:
    best = float("inf")
    for _ in range(reps):
        client.config_resetstat()
        for _ in range(calls):
            run()
        best = min(best, float(client.info("commandstats")["cmdstat_evalsha"]["usec_per_call"]))
    return best


#: ``hash_blocks``' HASH: 4,096 fields of 16 blocks, the bitmap's 65,536 blocks.
HASH_FIELDS, FIELD_BYTES = 4096, 1024


def _fill_blocks(client: Any, key: str) -> None:
    pipe = client.pipeline(transaction=False)
    for field in range(HASH_FIELDS):
        pipe.hset(key, str(field), b"\0" * FIELD_BYTES)
    pipe.execute()


def _check_layout(client: Any, name: str, fingerprints: list[bytes]) -> None:
    """A layout's part is a working filter, or its time means nothing: a batch of new
    fingerprints is all new, the same batch again all seen (no false negative)."""
    script = client.register_script(PARTS[name])
    keys = ["bench:check:words", "bench:check:unused", "bench:check:blocks"]
    _fill_blocks(client, keys[2])
    first, again = script(keys=keys, args=fingerprints), script(keys=keys, args=fingerprints)
    client.delete(*keys)
    if again != 0 or not 0 < first <= len(fingerprints):
        raise SystemExit(f"{name} is no filter: {first} new, then {again} new again")


def measure(batch: int, reps: int, calls: int) -> tuple[dict[str, float], float]:
    """Server µs per fingerprint of each part (the empty script's time taken off), and
    the bytes ``hash_blocks``' HASH takes per field beyond the field's value."""
    with RedisServer() as server:
        client = server.client()
        client.setrange("bench:bitmap", 65536 * 64, b"\0")  # every block the parts touch
        _fill_blocks(client, "bench:blocks")
        field_overhead = (client.memory_usage("bench:blocks", samples=0) / HASH_FIELDS
                          - FIELD_BYTES)
        per_call: dict[str, float] = {}
        salt = iter(range(10**9))

        def batch_of_new() -> list[bytes]:
            tag = next(salt)
            return [hashlib.sha1(f"{tag}-{i}".encode()).digest() for i in range(batch)]

        for layout in ("word_check", "hash_blocks"):
            _check_layout(client, layout, batch_of_new())
        for name, source in PARTS.items():
            script = client.register_script(source)

            def run(script: Any = script) -> None:
                script(keys=["bench:bitmap", "bench:set", "bench:blocks"], args=batch_of_new())

            per_call[name] = _best_us(client, run, reps, calls)
        params = {"set_check": DedupParams(backend="none"),
                  "bitmap_check": DedupParams(set_max_fingerprints=0, backend="bitmap",
                                              capacity=10_000_000)}
        for name, dedup_params in params.items():
            record = Dedup(client, CrawlKeys("bench", name), dedup_params)
            record.open()
            record.maintain()
            # a working record, or its time means nothing (as _check_layout)
            fingerprints = batch_of_new()
            first, again = sum(record.add(fingerprints)), sum(record.add(fingerprints))
            if again != 0 or not 0 < first <= len(fingerprints):
                raise SystemExit(f"{name} is no filter: {first} new, then {again} new again")
            per_call[name] = _best_us(client, lambda r=record: r.add(batch_of_new()), reps, calls)
        client.close()
    empty = per_call.pop("empty")
    return {name: (us - empty) / batch for name, us in per_call.items()}, field_overhead


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--batch", type=int, default=100, help="fingerprints per script call")
    parser.add_argument("--calls", type=int, default=200, help="script calls per repetition")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (best kept)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    costs, field_overhead = measure(args.batch, args.reps, args.calls)
    print(f"server µs per fingerprint (batches of {args.batch}, best of {args.reps}):")
    for name, us in costs.items():
        print(f"  {name:13} {us:6.2f}")
    print(f"hash_blocks' HASH: {field_overhead:.0f} bytes per {FIELD_BYTES}-byte field beyond "
          f"its value ({field_overhead / FIELD_BYTES:.1%})")
    if args.json:
        args.json.write_text(json.dumps({**costs, "hash_field_overhead_bytes": field_overhead},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
