"""Bloom filter arithmetic for the fleet-wide dedup, and RedisBloom detection.

No Scrapy and no Redis state here: this module decides the shape of a filter and
``scripts/lib/dedup.lua`` follows that plan, read from the crawl's ``dedup`` HASH,
so the Lua side has no constants to keep in sync.

**Blocked layers.** A fingerprint's k bits all lie in one 64-byte block of its
layer. Testing it is then one ``GETRANGE`` and adding it one ``SETRANGE`` of the few
bytes that change, whatever k is. Measured on Redis 7, every number passed from Lua
to a Redis command costs about as much as a whole ``SADD`` (it is formatted as
text), so one ``SETBIT``/``BITFIELD u1`` per bit is several times slower. The price
is a slightly higher error rate for a given size, which :func:`bits_per_item`
accounts for (about 11.5 bits per fingerprint at 0.5 % instead of 11).

**Scalable.** Layer ``i`` (from 0) holds ``capacity * GROWTH**i`` fingerprints at an
error rate of ``error_rate * (1 - TIGHTENING) * TIGHTENING**i``. The rates sum to at
most ``error_rate`` however many layers are added, so the observed rate stays at or
under the target instead of climbing towards 100 % once the first layer is full. All
layers live in ONE Redis string, one after the other; a new layer is allocated when
the previous one reaches its capacity.

**Positions.** A fingerprint is already uniformly random (Scrapy's is a SHA1 digest):
its first 12 bytes give two 48-bit numbers. ``h1`` picks the block; ``h2`` gives four
coefficients, ``a``, ``b``, ``c``, ``d``: its 9-bit digits from the lowest (``B`` = 512
bits per block). Bit ``j`` of the block is ``(a + j*b + (j**3 - j)/6) mod B`` for the
first half of the ``k`` bits and ``(c + j*d + (j**3 - j)/6) mod B`` for the rest
(enhanced double hashing, twice). Every intermediate value stays under 2**53, so Lua's
doubles compute it exactly; bits are numbered as Redis numbers them (bit 0 is the high
bit of byte 0). :func:`bit_positions` is the reference the Lua code is tested against.

Why four coefficients: a block holds ~512 / bits-per-fingerprint fingerprints (5 to 50),
and a new fingerprint whose whole pattern equals one of theirs is a false positive
whatever the bits. With ``a`` and ``b`` alone (``PLACEMENT_PAIR``, the layout filters
had before) a block has 2**18 patterns, which puts a floor of ~4e-5 under the error
rate: a filter asked for 1e-6 dropped 40-60 times the URLs it promised (measured:
benchmarks/RESULTS.md, session 22). Four give 2**36 patterns, a floor near 1e-10.
A layer's spec says its placement: filters created before keep theirs, and a worker
that does not know a placement refuses the spec instead of looking at other bits.

**Counting.** Each layer's fill is counted in the HASH, but to keep the hot path at
two Redis calls, only fingerprints whose ``h2 div B**4`` (``B**2`` in a
``PLACEMENT_PAIR`` layer: the digits above those that place bits) is 0 modulo the
layer's ``step`` count, each for ``step``: an unbiased count whose relative error at
a layer's capacity stays near 0.2 % (``step`` is 1 for small layers: exact).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import redis

#: A Redis string holds at most 512 MB.
MAX_BITMAP_BYTES = 2**29
#: Bytes per block: all of a fingerprint's bits lie in one block of its layer.
BLOCK_BYTES = 64
BLOCK_BITS = BLOCK_BYTES * 8
#: Each new layer holds this many times the fingerprints of the previous one.
GROWTH = 2
#: Each new layer's error rate is this fraction of the previous one's.
TIGHTENING = 0.5
#: Layers planned at most (the bitmap's size limit usually stops the plan earlier).
MAX_LAYERS = 16
#: Most hash functions per fingerprint (positions stay distinct enough below it).
MAX_HASHES = 32
#: Count each layer exactly up to this capacity, sampled above it.
_EXACT_COUNT_CAPACITY = 100_000
_MAX_COUNT_STEP = 64
_SHORT_MOD = 2**32
#: How a layer places a fingerprint's bits in its block (see "Positions" above).
PLACEMENT_PAIR = 1  # a, b: layers of filters created before placement 2 (5-field specs)
PLACEMENT_QUAD = 2  # a, b, c, d: every layer planned now


@dataclass(frozen=True)
class BloomLayer:
    """One layer of the bitmap filter.

    ``offset``: its first byte in the bitmap; ``blocks``: its size in blocks;
    ``hashes``: bits per fingerprint (k); ``capacity``: fingerprints it is sized for;
    ``step``: its counter's sampling step; ``placement``: how its bits are placed
    (see the module docstring).
    """

    offset: int
    blocks: int
    hashes: int
    capacity: int
    step: int = 1
    placement: int = PLACEMENT_QUAD

    def encode(self) -> str:
        """The form stored in the ``dedup`` HASH and parsed by ``lib/dedup.lua``: a
        ``PLACEMENT_PAIR`` layer has the five fields it always had, a later one a sixth
        (which a worker that does not know it refuses)."""
        spec = f"{self.offset} {self.blocks} {self.hashes} {self.capacity} {self.step}"
        return spec if self.placement == PLACEMENT_PAIR else f"{spec} {self.placement}"

    @classmethod
    def decode(cls, text: str) -> BloomLayer:
        parts = text.split(" ")
        if len(parts) not in (5, 6) or not all(part.isdigit() for part in parts):
            raise ValueError(f"not a Bloom layer spec: {text!r}")
        offset, blocks, hashes, capacity, step, *rest = (int(part) for part in parts)
        placement = rest[0] if rest else PLACEMENT_PAIR
        if min(blocks, hashes, capacity, step) < 1 or (rest and placement != PLACEMENT_QUAD):
            raise ValueError(f"not a Bloom layer spec: {text!r}")
        return cls(offset, blocks, hashes, capacity, step, placement)

    @property
    def split(self) -> int:
        """The bits placed by ``a`` and ``b``; ``c`` and ``d`` place the rest."""
        return self.hashes if self.placement == PLACEMENT_PAIR else (self.hashes + 1) // 2

    @property
    def count_shift(self) -> int:
        """``h2``'s digits under it place the bits; those above sample counts."""
        return BLOCK_BITS**2 if self.placement == PLACEMENT_PAIR else BLOCK_BITS**4

    @property
    def end(self) -> int:
        """One past the layer's last byte."""
        return self.offset + self.blocks * BLOCK_BYTES


def _poisson_terms(mean: float) -> list[tuple[int, float]]:
    spread = 10 * math.sqrt(mean) + 10
    low, high = max(0, int(mean - spread)), int(mean + spread) + 1
    return [(n, math.exp(-mean + n * math.log(mean) - math.lgamma(n + 1)))
            for n in range(low, high)]


def blocked_error_rate(bits_per_item: float, hashes: int, block_bits: int = BLOCK_BITS) -> float:
    """Expected false-positive rate of a full blocked layer: the fill of a block
    varies (Poisson), and a fingerprint is tested against its block alone."""
    miss = 1 - 1 / block_bits
    return sum(
        weight * (1 - miss ** (hashes * items)) ** hashes
        for items, weight in _poisson_terms(block_bits / bits_per_item)
    )


def _best_rate(bits_per_item: float) -> tuple[float, int]:
    guess = min(MAX_HASHES, max(1, round(bits_per_item * math.log(2))))
    candidates = range(max(1, guess - 2), min(MAX_HASHES, guess + 2) + 1)
    return min((blocked_error_rate(bits_per_item, k), k) for k in candidates)


@cache
def bits_per_item(error_rate: float) -> tuple[float, int]:
    """(bits per fingerprint, hashes) a blocked layer needs to stay under ``error_rate``."""
    low, high = 1.0, 256.0
    while high - low > 0.01:
        middle = (low + high) / 2
        if _best_rate(middle)[0] <= error_rate:
            high = middle
        else:
            low = middle
    return high, _best_rate(high)[1]


def layer_error_rate(error_rate: float, index: int) -> float:
    """Target rate of layer ``index`` (from 0): the series sums to ``error_rate``."""
    return error_rate * (1 - TIGHTENING) * TIGHTENING**index


def _count_step(capacity: int) -> int:
    step = 1
    while step < _MAX_COUNT_STEP and capacity >= _EXACT_COUNT_CAPACITY * step * 2:
        step *= 2
    return step


@cache
def plan_layers(
    capacity: int, error_rate: float, max_bytes: int = MAX_BITMAP_BYTES
) -> tuple[BloomLayer, ...]:
    """The layers of a scalable filter that fit in one bitmap of ``max_bytes``."""
    if capacity < 1:
        raise ValueError(f"Bloom capacity must be >= 1, got {capacity}")
    if not 0 < error_rate < 1:
        raise ValueError(f"Bloom error rate must be between 0 and 1, got {error_rate}")
    layers: list[BloomLayer] = []
    offset = 0
    for index in range(MAX_LAYERS):
        layer_capacity = capacity * GROWTH**index
        bits, hashes = bits_per_item(layer_error_rate(error_rate, index))
        blocks = math.ceil(layer_capacity * bits / BLOCK_BITS)
        if offset + blocks * BLOCK_BYTES > max_bytes:
            break
        layer = BloomLayer(offset, blocks, hashes, layer_capacity, _count_step(layer_capacity))
        layers.append(layer)
        offset = layer.end
    if not layers:
        raise ValueError(
            f"a Bloom filter for {capacity} fingerprints at {error_rate} does not fit in "
            f"one Redis string ({max_bytes} bytes); lower the capacity"
        )
    return tuple(layers)


def total_capacity(layers: tuple[BloomLayer, ...]) -> int:
    return sum(layer.capacity for layer in layers)


def fingerprint_hashes(fingerprint: bytes) -> tuple[int, int]:
    """The two 48-bit hashes of a fingerprint (the Lua code does the same)."""
    if len(fingerprint) >= 12:
        return int.from_bytes(fingerprint[:6], "big"), int.from_bytes(fingerprint[6:12], "big")
    # Not a digest (hand-made in tests or tools): mix the few bytes there are.
    first, second = 5381, 52711
    for byte in fingerprint:
        first = (first * 33 + byte) % _SHORT_MOD
        second = (second * 65599 + byte) % _SHORT_MOD
    return first, second


def bit_positions(fingerprint: bytes, layer: BloomLayer) -> list[int]:
    """Absolute bit offsets of ``fingerprint`` in ``layer`` (reference for the Lua)."""
    first, second = fingerprint_hashes(fingerprint)
    start = (layer.offset + (first % layer.blocks) * BLOCK_BYTES) * 8
    a, b, c, d = ((second // BLOCK_BITS**i) % BLOCK_BITS for i in range(4))
    coefficients = [(a, b) if j < layer.split else (c, d) for j in range(layer.hashes)]
    return [start + (x + j * y + (j * j * j - j) // 6) % BLOCK_BITS
            for j, (x, y) in enumerate(coefficients)]


def counts_for(fingerprint: bytes, layer: BloomLayer) -> bool:
    """Whether adding ``fingerprint`` to ``layer`` bumps its sampled counter."""
    return (fingerprint_hashes(fingerprint)[1] // layer.count_shift) % layer.step == 0


def has_redisbloom(client: redis.Redis, probe_key: str) -> bool:
    """Whether the server runs the BF.* commands (Redis Stack, Redis 8, valkey-bloom).

    ``BF.EXISTS`` on the crawl's own filter key is harmless: it only reads, it answers
    0 for a missing key, and WRONGTYPE (the key holds our bitmap) also proves that the
    command exists. Only "unknown command" (or no permission) means no module.
    """
    import redis as redis_module

    from scrapy_redisspine.connection import routed_to

    try:
        client.execute_command(  # type: ignore[no-untyped-call]
            "BF.EXISTS", probe_key, b"", **routed_to(client, probe_key))
    except redis_module.ResponseError as exc:
        return str(exc).startswith("WRONGTYPE")
    return True
