"""The crawl's fleet-wide record of seen fingerprints: a SET, then a Bloom filter.

No Scrapy here. Whether a fingerprint is new is decided in Lua (``lib/dedup.lua``,
included by ``enqueue.lua`` and ``seen.lua``) in the same atomic step that acts on
the answer. This module sets up and drives the record from Python:

- :meth:`Dedup.open` checks the keys (a wrong type or a corrupt parameter HASH is an
  error naming the key, at open rather than mid-crawl) and detects RedisBloom once.
- :meth:`Dedup.maintain`, called from a worker's timer, switches the crawl from the
  exact SET to a Bloom filter once the SET holds
  ``REDISSPINE_DEDUP_SET_MAX_FINGERPRINTS``, then moves the SET into the filter in
  bounded chunks while the crawl goes on. Any worker may do either, at any time,
  concurrently: both steps are idempotent Lua scripts.

Keys touched: ``seen`` (SET), ``dedup`` (HASH: mode and filter parameters),
``bloom`` (bitmap or RedisBloom filter). Invariant kept: a fingerprint once recorded
is in the SET or in the filter at every moment, so it is never taken for new again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_redisspine._results import fields, number, repairs_of
from scrapy_redisspine.bloom import (
    BLOCK_BYTES,
    TIGHTENING,
    BloomLayer,
    has_redisbloom,
    plan_layers,
)
from scrapy_redisspine.frontier import CorruptKeyError
from scrapy_redisspine.scripts import ScriptSet

if TYPE_CHECKING:
    from collections.abc import Sequence

    import redis

    from scrapy_redisspine.keys import CrawlKeys
    from scrapy_redisspine.settings import SpineConfig

logger = logging.getLogger("scrapy_redisspine.dedup")

MODE_SET, MODE_MIGRATING, MODE_BLOOM = "set", "migrating", "bloom"
#: Bytes the SET keeps of a 20-byte fingerprint (``lib/dedup.lua`` explains why).
SET_MEMBER_BYTES = 14
IMPL_BITMAP, IMPL_REDISBLOOM = "bitmap", "redisbloom"
_MODES = (MODE_SET, MODE_MIGRATING, MODE_BLOOM)
_BUILTIN_TYPES = (b"string", b"list", b"set", b"zset", b"hash", b"stream")


class DedupConfigError(RuntimeError):
    """The configured Bloom backend cannot run on this server."""


@dataclass(frozen=True)
class DedupParams:
    """What a worker would create if it is the one to switch (see ``settings.py``)."""

    set_max_fingerprints: int = 2_000_000
    backend: str = "auto"  # auto | redisbloom | bitmap | none
    capacity: int = 10_000_000
    error_rate: float = 0.01
    chunk_size: int = 200

    @classmethod
    def from_config(cls, config: SpineConfig) -> DedupParams:
        return cls(
            config.dedup_set_max_fingerprints,
            config.bloom_backend,
            config.bloom_capacity,
            config.bloom_error_rate,
            config.dedup_migration_chunk_size,
        )


@dataclass(frozen=True)
class DedupState:
    """The record as stored: mode, filter kind, and for a bitmap its layers."""

    mode: str
    impl: str | None
    set_size: int
    layers: tuple[BloomLayer, ...] = ()  # planned layers (bitmap)
    active_layers: int = 0
    layer_counts: tuple[int, ...] = ()  # fingerprints added to each active layer

    @property
    def filter_count(self) -> int:
        return sum(self.layer_counts)

    @property
    def full(self) -> bool:
        """The bitmap's last planned layer is at capacity: errors will climb now."""
        if not self.layers or self.active_layers < len(self.layers):
            return False
        return self.layer_counts[-1] >= self.layers[-1].capacity


@dataclass(frozen=True)
class MaintenanceStep:
    """What one :meth:`Dedup.maintain` call did."""

    mode: str
    switched: bool = False  # this call started the switch to a Bloom filter
    moved: int = 0  # fingerprints this call moved from the SET to the filter
    finished: bool = False  # this call completed the migration

    @property
    def more(self) -> bool:
        """Migration work is left: call again soon."""
        return self.mode == MODE_MIGRATING


def _text(value: bytes | str | None) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


class Dedup:
    """One worker's handle on the crawl's dedup record.

    Keys touched: ``seen``, ``dedup``, ``bloom``. A fingerprint is recorded at most
    once fleet-wide (each add is one atomic script) and, once recorded, stays seen
    through the SET-to-Bloom switch.
    """

    def __init__(self, client: redis.Redis, keys: CrawlKeys, params: DedupParams) -> None:
        self.client = client
        self.keys = keys
        self.params = params
        self._scripts = ScriptSet(client, keys)
        self.impl: str | None = None  # filter this worker would create; None: never
        self._layers = plan_layers(params.capacity, params.error_rate)

    # -- open ------------------------------------------------------------------------

    def open(self) -> DedupState:
        """Check the keys and pick the filter this worker would create."""
        state = self.state()
        detected = has_redisbloom(self.client, self.keys.bloom)
        backend = self.params.backend
        if backend == "auto":
            self.impl = IMPL_REDISBLOOM if detected else IMPL_BITMAP
        elif backend == "redisbloom" and not detected:
            raise DedupConfigError(
                "REDISSPINE_BLOOM_BACKEND is 'redisbloom' but this Redis has no BF.* "
                "commands (no RedisBloom module); use 'auto' or 'bitmap'"
            )
        else:
            self.impl = None if backend == "none" else backend
        if state.impl == IMPL_REDISBLOOM and not detected:
            raise DedupConfigError(
                f"the crawl's dedup filter {self.keys.bloom!r} is a RedisBloom filter but "
                f"this Redis has no BF.* commands (no RedisBloom module)"
            )
        return state

    def state(self) -> DedupState:
        """The record as stored, checked; raises :class:`CorruptKeyError` naming the key."""
        k = self.keys
        pipe = self.client.pipeline(transaction=False)
        for key in (k.seen, k.dedup, k.bloom):
            pipe.type(key)
        types = [t if isinstance(t, bytes) else t.encode() for t in pipe.execute()]
        seen_type, meta_type, bloom_type = types
        self._expect_type(k.seen, seen_type, b"set")
        self._expect_type(k.dedup, meta_type, b"hash")
        raw = self.client.hgetall(k.dedup) if meta_type == b"hash" else {}
        meta = {_text(field): _text(value) for field, value in raw.items()}  # type: ignore[union-attr]
        mode = meta.get("mode") or MODE_SET
        if mode not in _MODES:
            raise self._corrupt(k.dedup, f"has an unknown dedup mode {mode!r}")
        set_size = int(self.client.scard(k.seen)) if seen_type == b"set" else 0  # type: ignore[arg-type]
        if mode == MODE_SET:
            if bloom_type != b"none":
                raise self._corrupt(k.bloom, "exists while the crawl's dedup mode is 'set'")
            return DedupState(MODE_SET, None, set_size)
        impl = meta.get("impl")
        if impl == IMPL_REDISBLOOM:
            if bloom_type in _BUILTIN_TYPES or bloom_type == b"none":
                raise self._corrupt(k.bloom, f"should hold a RedisBloom filter, holds a "
                                             f"{bloom_type.decode()}")
            return DedupState(mode, impl, set_size)
        if impl != IMPL_BITMAP:
            raise self._corrupt(k.dedup, f"names an unknown filter implementation {impl!r}")
        return self._bitmap_state(mode, meta, bloom_type, set_size)

    def _bitmap_state(
        self, mode: str, meta: dict[str | None, str | None], bloom_type: bytes, set_size: int
    ) -> DedupState:
        k = self.keys
        try:
            active, planned = int(meta.get("layers") or ""), int(meta.get("max_layers") or "")
            if int(meta.get("block_bytes") or "") != BLOCK_BYTES:
                raise ValueError(f"block size {meta.get('block_bytes')!r}")
            layers = tuple(BloomLayer.decode(meta.get(f"layer:{i}") or "")
                           for i in range(1, planned + 1))
        except ValueError as exc:
            raise self._corrupt(k.dedup, f"has bad Bloom filter parameters ({exc})") from None
        if not 1 <= active <= planned:
            raise self._corrupt(k.dedup, f"has a bad layer count {active}/{planned}")
        # A count that is no number: the layer is taken as full, as lib/dedup.lua
        # repairs it (never as empty: an overfull layer takes new for seen).
        counts = tuple(number(meta.get(f"count:{i}") or 0, layers[i - 1].capacity)
                       for i in range(1, active + 1))
        needed = layers[active - 1].end
        length = int(self.client.strlen(k.bloom)) if bloom_type == b"string" else 0  # type: ignore[arg-type]
        if bloom_type != b"string" or length < needed:
            found = f"a {bloom_type.decode()}" if bloom_type != b"string" else f"{length} bytes"
            raise self._corrupt(k.bloom, f"should be a Bloom bitmap of at least {needed} "
                                         f"bytes, holds {found}")
        return DedupState(mode, IMPL_BITMAP, set_size, layers, active, counts)

    @staticmethod
    def _expect_type(key: str, found: bytes, expected: bytes) -> None:
        if found not in (b"none", expected):
            raise Dedup._corrupt(key, f"holds a {found.decode()}, expected a {expected.decode()}")

    @staticmethod
    def _corrupt(key: str, problem: str) -> CorruptKeyError:
        return CorruptKeyError(
            f"Redis key {key!r} {problem}; it was not written by scrapy_redisspine. "
            f"Delete it (the crawl forgets what it has seen) or use another crawl id."
        )

    # -- the record ------------------------------------------------------------------

    def add(self, fingerprints: Sequence[bytes]) -> list[bool]:
        """Record fingerprints in one round trip; True for each one that was new."""
        if not fingerprints:
            return []
        statuses, repairs = fields(self._scripts.run("seen", list(fingerprints)), 2)
        _log_repairs(repairs)
        return [status == ord("1") for status in bytes(statuses or b"")]

    # -- the switch --------------------------------------------------------------------

    def switch_if_due(self) -> tuple[str, bool]:
        """Start the switch if the SET is past its limit; (mode now, started by us)."""
        if self.impl is None:
            mode = _text(self.client.hget(self.keys.dedup, "mode"))  # type: ignore[arg-type]
            return mode or MODE_SET, False
        args: list[str | int | float] = [
            self.params.set_max_fingerprints, self.impl, repr(self.params.error_rate),
            self.params.capacity,
        ]
        if self.impl == IMPL_REDISBLOOM:
            args += [repr(self.params.error_rate * (1 - TIGHTENING)), 2]
        else:
            args += [BLOCK_BYTES, *(layer.encode() for layer in self._layers)]
        mode, switched = self._scripts.run("dedup_switch", args)
        return _text(mode) or MODE_SET, bool(switched)

    def migrate_chunk(self) -> tuple[str, int, int]:
        """Move one chunk of the SET into the filter: (mode now, moved, left in SET)."""
        reply = self._scripts.run("migrate_dedup", [self.params.chunk_size])
        mode, moved, remaining, repairs = fields(reply, 4)
        _log_repairs(repairs)
        return _text(mode or b"") or MODE_SET, number(moved), number(remaining)

    def maintain(self, budget_seconds: float = 0.02) -> MaintenanceStep:
        """Switch if due, then migrate chunks for up to ``budget_seconds``."""
        mode, switched = self.switch_if_due()
        moved = 0
        deadline = time.monotonic() + budget_seconds
        while mode == MODE_MIGRATING:
            mode, chunk_moved, _ = self.migrate_chunk()
            moved += chunk_moved
            if time.monotonic() >= deadline:
                break
        finished = mode == MODE_BLOOM and (moved > 0 or switched)
        return MaintenanceStep(mode, switched, moved, finished)


def _log_repairs(repairs: object) -> None:
    """Malformed values the dedup scripts repaired (a Bloom layer's count): few, each
    repaired once, so each is logged."""
    for repair in repairs_of(repairs):
        logger.warning("redisspine: repaired a malformed value in Redis: %s", repair)
