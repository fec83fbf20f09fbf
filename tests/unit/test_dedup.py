"""The dedup record (dedup.py, lib/dedup.lua and its scripts) on fakeredis and a real server.

One contract runs over every strategy: the exact SET, the Lua bitmap Bloom filter,
a record caught in the middle of its SET-to-Bloom switch, and RedisBloom's BF.*
(on fakeredis and on a real server with redisbloom.so loaded). Bloom filters here are a few
KB, because fakeredis copies a whole string on every write.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import TYPE_CHECKING

import fakeredis
import pytest
import redis

from scrapy_redisspine import bloom
from scrapy_redisspine.dedup import (
    MODE_BLOOM,
    MODE_MIGRATING,
    MODE_SET,
    SET_MEMBER_BYTES,
    Dedup,
    DedupConfigError,
    DedupParams,
    DedupState,
)
from scrapy_redisspine.frontier import CorruptKeyError, Frontier, NewRequest
from scrapy_redisspine.keys import CrawlKeys

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from scrapy_redisspine.testing.redis_server import RedisServer

KEYS = CrawlKeys("redisspine", "dedup-test")
TINY_RATE = 1e-6  # contract tests must not see a false positive
STRATEGIES = [
    ("set", "fakeredis"), ("set", "redis"),
    ("bitmap", "fakeredis"), ("bitmap", "redis"),
    ("migrating", "fakeredis"), ("migrating", "redis"),
    ("redisbloom", "fakeredis"), ("redisbloom", "redisbloom-server"),
]
# Where BF.* lives: fakeredis' imitation, and a real server with redisbloom.so loaded.
BF_BACKENDS = ["fakeredis", "redisbloom-server"]


def fps(count: int, salt: str = "") -> list[bytes]:
    return [hashlib.sha1(f"{salt}{i}".encode()).digest() for i in range(count)]


def seed_set(client: redis.Redis, fingerprints: list[bytes]) -> None:
    """Fingerprints seen in SET mode, stored as the record stores them."""
    client.sadd(KEYS.seen, *(f[:SET_MEMBER_BYTES] for f in fingerprints))


def _escaped(key: str) -> str:
    return key.replace("{", r"\{").replace("}", r"\}")


@pytest.fixture
def make_client(request: pytest.FixtureRequest) -> Iterator[Callable[[], redis.Redis]]:
    """Clients of one backend, chosen by the test's ``backend`` parameter."""
    backend = request.node.callspec.params.get("backend") or request.node.callspec.params[
        "strategy_backend"][1]
    clients: list[redis.Redis] = []
    if backend == "fakeredis":
        server = fakeredis.FakeServer()

        def make() -> redis.Redis:
            clients.append(fakeredis.FakeRedis(server=server))
            return clients[-1]
    else:
        real = "bloom_server" if backend == "redisbloom-server" else "redis_server"
        redis_server: RedisServer = request.getfixturevalue(real)
        request.getfixturevalue("bloom_redis_url" if real == "bloom_server" else "redis_url")

        def make() -> redis.Redis:
            clients.append(redis_server.client())
            return clients[-1]

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def client(make_client: Callable[[], redis.Redis]) -> redis.Redis:
    return make_client()


def bitmap_params(**overrides: float) -> DedupParams:
    values: dict[str, float | str] = {
        "set_max_fingerprints": 0, "backend": "bitmap", "capacity": 2000,
        "error_rate": TINY_RATE, "chunk_size": 50,
    }
    values.update(overrides)
    return DedupParams(**values)  # type: ignore[arg-type]


@pytest.fixture
def filter_params(impl: str) -> Callable[..., DedupParams]:
    """``bitmap_params`` with the test's filter (``impl``: ``bitmap`` or ``redisbloom``)."""
    return functools.partial(bitmap_params, backend=impl)


def filtered(record: Dedup, client: redis.Redis) -> int:
    """Fingerprints in the filter: the record's own layer counts for the Lua bitmap;
    RedisBloom keeps its count itself (``BF.CARD``), the record holds none for it."""
    if record.state().impl == "redisbloom":
        return int(client.execute_command("BF.CARD", KEYS.bloom))  # type: ignore[no-untyped-call]
    return record.state().filter_count


def opened(client: redis.Redis, params: DedupParams) -> Dedup:
    record = Dedup(client, KEYS, params)
    record.open()
    return record


# -- the contract, over every strategy ----------------------------------------------


@pytest.fixture(params=STRATEGIES, ids=["-".join(s) for s in STRATEGIES])
def strategy_backend(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def record(strategy_backend: tuple[str, str], client: redis.Redis) -> Dedup:
    strategy = strategy_backend[0]
    if strategy == "set":
        return opened(client, DedupParams(backend="none"))
    if strategy == "redisbloom":
        record = opened(client, bitmap_params(backend="redisbloom"))
    elif strategy == "bitmap":
        record = opened(client, bitmap_params())
    else:  # migrating: 300 fingerprints seen in SET mode, 100 of them moved so far
        seed_set(client, fps(300, "old"))
        record = opened(client, bitmap_params(set_max_fingerprints=100))
        record.maintain(0)
        record.migrate_chunk()
        assert record.state().mode == MODE_MIGRATING
        assert client.scard(KEYS.seen) == 200
        return record
    assert record.maintain().mode == MODE_BLOOM
    return record


class TestContract:
    def test_new_then_seen(self, record: Dedup) -> None:
        batch = fps(50)
        assert record.add(batch) == [True] * 50
        assert record.add(batch) == [False] * 50

    def test_a_duplicate_within_one_batch(self, record: Dedup) -> None:
        a, b = fps(2)
        assert record.add([a, b, a, b]) == [True, True, False, False]

    def test_distinct_fingerprints_are_all_new(self, record: Dedup) -> None:
        assert all(record.add(fps(500, "distinct")))

    def test_enqueue_script_decides_with_the_same_record(
        self, record: Dedup, client: redis.Redis
    ) -> None:
        frontier = Frontier(client, KEYS, "w1")
        first, second = fps(2)
        result = frontier.enqueue([NewRequest(b"a", first), NewRequest(b"a2", first)])
        assert result.statuses == "+d"
        assert record.add([first]) == [False]
        record.add([second])
        assert frontier.enqueue([NewRequest(b"b", second)]).statuses == "d"

    @pytest.mark.parametrize("backlog_cap", [0, 100])  # a batch at once, one at a time
    def test_enqueue_of_a_mixed_batch(
        self, record: Dedup, client: redis.Redis, backlog_cap: int
    ) -> None:
        frontier = Frontier(client, KEYS, "w1", backlog_cap=backlog_cap)
        seen, new, start, other = fps(4, "mixed")
        record.add([seen])
        batch = [NewRequest(b"1", new), NewRequest(b"2", seen), NewRequest(b"3", new),
                 NewRequest(b"4", start, is_start=True), NewRequest(b"5", start, is_start=True),
                 NewRequest(b"6", seen, dont_filter=True), NewRequest(b"7", other),
                 NewRequest(b"8", other, dont_filter=True)]
        assert frontier.enqueue(batch).statuses == "+dd+s+++"
        assert record.add([new, start, other]) == [False] * 3

    def test_dont_filter_bypasses_the_record_and_leaves_it_alone(
        self, record: Dedup, client: redis.Redis
    ) -> None:
        frontier = Frontier(client, KEYS, "w1")
        (fingerprint,) = fps(1)
        requests = [NewRequest(b"a", fingerprint, dont_filter=True)] * 2
        assert frontier.enqueue(requests).statuses == "++"
        assert record.add([fingerprint]) == [True]

    def test_hand_made_short_fingerprints(self, record: Dedup) -> None:
        assert record.add([b"fp-a", b"fp-b", b""]) == [True, True, True]
        assert record.add([b"fp-a", b"fp-b", b""]) == [False, False, False]

    def test_empty_batch(self, record: Dedup) -> None:
        assert record.add([]) == []


# -- the Lua bitmap filter -----------------------------------------------------------


@pytest.mark.parametrize("backend", ["fakeredis", "redis"])
class TestBitmapFilter:
    def test_lua_sets_exactly_the_reference_bits(self, backend: str, client: redis.Redis) -> None:
        record = opened(client, bitmap_params())
        record.maintain()
        layer = record.state().layers[0]
        for fingerprint in [*fps(3), b"short"]:
            record.add([fingerprint])
            positions = bloom.bit_positions(fingerprint, layer)
            assert all(client.getbit(KEYS.bloom, position) for position in positions)
        set_bits = int(client.bitcount(KEYS.bloom))
        expected = {p for f in [*fps(3), b"short"] for p in bloom.bit_positions(f, layer)}
        assert set_bits == len(expected)

    def test_grows_past_capacity_and_keeps_its_error_rate(
        self, backend: str, client: redis.Redis
    ) -> None:
        record = opened(client, bitmap_params(capacity=200, error_rate=0.02))
        record.maintain()
        assert sum(record.add(fps(3000, "in"))) > 2900
        state = record.state()
        assert state.active_layers == 4  # 200 + 400 + 800 + 1600 >= 3000
        assert state.layer_counts[:3] == (200, 400, 800)  # small layers count exactly
        assert client.strlen(KEYS.bloom) == state.layers[3].end
        fresh = fps(3000, "fresh")
        false_positives = 3000 - sum(record.add(fresh))
        # A single 200-fingerprint layer this full would answer "seen" almost always.
        assert false_positives / 3000 <= 0.02 * 1.5
        assert not state.full

    # A batch and the same fingerprints one call at a time must leave the same bits
    # and counts and give the same answers, or a crawl's record would depend on how
    # its requests were batched. (A batched path, one BITFIELD per layer for the
    # whole batch, was tried and dropped: benchmarks/RESULTS.md, session 14. These
    # tests are what such a path must pass.)

    def _both_ways(
        self, client: redis.Redis, params: DedupParams, before: list[bytes], batch: list[bytes]
    ) -> tuple[tuple[list[bool], bytes, DedupState], tuple[list[bool], bytes, DedupState]]:
        outcomes = []
        for one_by_one in (False, True):
            client.flushdb()
            record = opened(client, params)
            record.maintain()
            for fingerprint in before:
                record.add([fingerprint])
            answers = ([record.add([f])[0] for f in batch] if one_by_one
                       else record.add(batch))
            outcomes.append((answers, bytes(client.get(KEYS.bloom) or b""), record.state()))
        return outcomes[0], outcomes[1]

    def test_a_batch_sets_the_bits_and_counts_one_by_one_would(
        self, backend: str, client: redis.Redis
    ) -> None:
        # Two layers in use (the batch tests the full one, then sets the active one),
        # fingerprints seen in either layer, new ones, and repeats within the batch.
        fill = fps(250, "fill")
        new = fps(60, "new")
        batch = [*new[:30], fill[3], fill[240], new[0], *new[30:], new[59], b"short", b"short"]
        batched, single = self._both_ways(
            client, bitmap_params(capacity=200), fill, batch)
        assert batched[2].active_layers == 2
        assert batched[0] == single[0]
        assert batched[0][:30] == [True] * 30
        assert batched[0][30:33] == [False] * 3
        assert batched[0][-3:] == [False, True, False]
        assert batched[1] == single[1]
        assert batched[2].layer_counts == single[2].layer_counts == (200, 50 + 60 + 1)

    def test_a_batch_that_would_fill_a_layer_grows_as_one_by_one_would(
        self, backend: str, client: redis.Redis
    ) -> None:
        batched, single = self._both_ways(
            client, bitmap_params(capacity=200), fps(150, "fill"),
            fps(120, "over"))
        assert batched[2].active_layers == single[2].active_layers == 2
        assert batched[0] == single[0]
        assert batched[1] == single[1]
        assert batched[2].layer_counts == single[2].layer_counts

    def test_a_garbage_count_is_repaired_on_a_batch_too(
        self, backend: str, client: redis.Redis
    ) -> None:
        record = opened(client, bitmap_params(capacity=200, error_rate=0.02))
        record.maintain()
        client.hset(KEYS.dedup, "count:1", "garbage")
        assert record.add(fps(5, "after")) == [True] * 5
        state = record.state()  # taken as full: the next layer takes the rest
        assert state.active_layers == 2
        assert state.layer_counts[0] == 200


    def test_full_means_last_planned_layer_at_capacity(self, backend: str) -> None:
        layers = (bloom.BloomLayer(0, 1, 7, 10, 1), bloom.BloomLayer(64, 2, 8, 20, 1))
        assert not DedupState(MODE_BLOOM, "bitmap", 0, layers, 1, (10,)).full
        assert not DedupState(MODE_BLOOM, "bitmap", 0, layers, 2, (10, 19)).full
        assert DedupState(MODE_BLOOM, "bitmap", 0, layers, 2, (10, 20)).full


def _as_placement_pair(client: redis.Redis) -> None:
    """Rewrite the filter's layer specs as a filter created before placement 2 has them."""
    for field, spec in client.hgetall(KEYS.dedup).items():
        if field.startswith(b"layer:"):
            layer = bloom.BloomLayer.decode(spec.decode())
            client.hset(KEYS.dedup, field, dataclasses.replace(
                layer, placement=bloom.PLACEMENT_PAIR).encode())


@pytest.mark.parametrize(("placement", "least", "most"), [(bloom.PLACEMENT_QUAD, 0, 0),
                                                          (bloom.PLACEMENT_PAIR, 5, 1000)])
def test_a_tight_filter_keeps_its_rate(
    real_redis: redis.Redis, placement: int, least: int, most: int
) -> None:
    # Asked for 1e-7 from 2,000, a full layer and the layers growing after it must take
    # none of 100,000 new fingerprints for seen (0.01 expected). Placed by a and b
    # alone (2^18 patterns a block), the same filter takes some (17 here: a new one
    # sharing a whole pattern with one of the ~9 in its block, in each full layer,
    # ~3.5e-5 a lookup each): the floor that dropped a test crawl's page.
    record = opened(real_redis, bitmap_params(capacity=2000, error_rate=1e-7))
    record.maintain()
    if placement == bloom.PLACEMENT_PAIR:
        _as_placement_pair(real_redis)
    assert all(record.add(fps(2000, "full")))
    assert record.state().layer_counts == (2000, 0)  # full: the next layer takes new ones
    fresh = fps(100_000, "fresh")
    false_positives = sum(5000 - sum(record.add(fresh[i:i + 5000]))
                          for i in range(0, len(fresh), 5000))
    assert least <= false_positives <= most


def test_a_filter_created_before_placement_2_keeps_its_bits(real_redis: redis.Redis) -> None:
    # A crawl's filter outlives upgrades: its 5-field layer specs keep the old placement
    # (and count sampling), so what it has seen stays seen.
    record = opened(real_redis, bitmap_params(capacity=200, error_rate=0.01))
    record.maintain()
    _as_placement_pair(real_redis)
    layer = record.state().layers[0]
    assert layer.placement == bloom.PLACEMENT_PAIR
    assert layer.split == layer.hashes
    old = fps(50, "old")
    assert all(record.add(old))
    expected = {p for f in old for p in bloom.bit_positions(f, layer)}
    assert int(real_redis.bitcount(KEYS.bloom)) == len(expected)
    assert all(real_redis.getbit(KEYS.bloom, p) for p in expected)
    assert not any(opened(real_redis, bitmap_params()).add(old))


def test_a_batch_counts_sampled_fingerprints_as_one_by_one_would(real_redis: redis.Redis) -> None:
    # A layer of 400,000 counts one fingerprint in `step` (4 here), each for `step`.
    params = bitmap_params(capacity=400_000, error_rate=0.01)
    record = opened(real_redis, params)
    record.maintain()
    assert record.state().layers[0].step > 1
    counts = []
    for one_by_one in (False, True):
        real_redis.flushdb()
        record = opened(real_redis, params)
        record.maintain()
        batch = fps(2000, "sample")
        answers = [record.add([f])[0] for f in batch] if one_by_one else record.add(batch)
        assert all(answers)
        counts.append(record.state().layer_counts)
    layer = record.state().layers[0]
    sampled = layer.step * sum(bloom.counts_for(f, layer) for f in fps(2000, "sample"))
    assert counts[0] == counts[1] == (sampled,)
    assert sampled != 2000  # sampled, not exact


# -- the switch from SET to Bloom filter ----------------------------------------------


@pytest.mark.parametrize(
    ("backend", "impl"),
    [("fakeredis", "bitmap"), ("redis", "bitmap"),
     ("fakeredis", "redisbloom"), ("redisbloom-server", "redisbloom")],
)
class TestSwitch:
    def test_no_switch_below_the_threshold(
        self, backend: str, client: redis.Redis, filter_params: Callable[..., DedupParams]
    ) -> None:
        seed_set(client, fps(99))
        record = opened(client, filter_params(set_max_fingerprints=100))
        assert record.maintain().mode == MODE_SET
        assert not client.exists(KEYS.bloom, KEYS.dedup)

    def test_switch_drains_the_set_and_never_forgets(
        self, backend: str, client: redis.Redis,
        filter_params: Callable[..., DedupParams],
    ) -> None:
        old = fps(500, "old")
        seed_set(client, old)
        record = opened(client, filter_params(set_max_fingerprints=100, chunk_size=64))
        assert record.switch_if_due() == (MODE_MIGRATING, True)
        new = fps(100, "new")
        assert record.add(new) == [True] * 100
        assert client.scard(KEYS.seen) == 500, "new fingerprints go to the filter only"
        mode, chunks = MODE_MIGRATING, 0
        while mode == MODE_MIGRATING:
            mode, moved, _remaining = record.migrate_chunk()
            chunks += 1
            assert moved <= 64
            assert record.add(old[::7] + new[::7]) == [False] * len(old[::7] + new[::7])
        assert chunks == 8
        assert not client.exists(KEYS.seen), "the SET is freed"
        assert record.state().mode == MODE_BLOOM
        assert record.add(old + new) == [False] * 600

    def test_concurrent_runners_move_each_fingerprint_once(
        self, backend: str, make_client: Callable[[], redis.Redis],
        filter_params: Callable[..., DedupParams],
    ) -> None:
        first_client = make_client()
        seed_set(first_client, fps(500))
        params = filter_params(set_max_fingerprints=100, chunk_size=30)
        runners = [opened(first_client, params), opened(make_client(), params)]
        assert [r.switch_if_due()[1] for r in runners] == [True, False]
        moved, turn = 0, 0
        while runners[0].state().mode == MODE_MIGRATING:
            moved += runners[turn % 2].migrate_chunk()[1]
            turn += 1
        assert moved == 500
        assert filtered(runners[1], first_client) == 500

    def test_chunks_in_any_other_mode_change_nothing(
        self, backend: str, client: redis.Redis,
        filter_params: Callable[..., DedupParams],
    ) -> None:
        seed_set(client, fps(10))
        record = opened(client, filter_params(set_max_fingerprints=100))
        assert record.migrate_chunk() == (MODE_SET, 0, 10)
        assert client.scard(KEYS.seen) == 10

    def test_empty_set_switches_straight_to_bloom(
        self, backend: str, client: redis.Redis, filter_params: Callable[..., DedupParams]
    ) -> None:
        record = opened(client, filter_params())
        step = record.maintain()
        assert (step.mode, step.switched, step.finished) == (MODE_BLOOM, True, True)
        assert not step.more

    def test_maintain_moves_at_least_a_chunk_and_says_more_is_left(
        self, backend: str, client: redis.Redis,
        filter_params: Callable[..., DedupParams],
    ) -> None:
        seed_set(client, fps(300))
        record = opened(client, filter_params(set_max_fingerprints=1, chunk_size=50))
        step = record.maintain(budget_seconds=0)
        assert (step.mode, step.switched, step.moved, step.more) == (MODE_MIGRATING, True, 50, True)
        while record.maintain().more:
            pass
        assert filtered(record, client) == 300

    def test_a_worker_that_never_switches_still_helps(
        self, backend: str, client: redis.Redis,
        filter_params: Callable[..., DedupParams],
    ) -> None:
        seed_set(client, fps(200))
        never = opened(client, filter_params(set_max_fingerprints=1, backend="none"))
        assert never.maintain().mode == MODE_SET
        opened(client, filter_params(set_max_fingerprints=1)).switch_if_due()
        step = never.maintain(budget_seconds=10)
        assert (step.mode, step.moved, step.finished) == (MODE_BLOOM, 200, True)

    def test_switch_refuses_a_foreign_bloom_key(
        self, backend: str, client: redis.Redis, filter_params: Callable[..., DedupParams]
    ) -> None:
        record = opened(client, filter_params())
        client.set(KEYS.bloom, b"someone else's")
        with pytest.raises(redis.ResponseError, match=_escaped(KEYS.bloom)):
            record.switch_if_due()
        assert client.get(KEYS.bloom) == b"someone else's"


@pytest.mark.parametrize("backend", BF_BACKENDS)
def test_redisbloom_switch_and_migration(backend: str, client: redis.Redis) -> None:
    old = fps(300, "old")
    seed_set(client, old)
    record = opened(client, bitmap_params(set_max_fingerprints=100, backend="auto"))
    assert record.impl == "redisbloom"
    assert record.switch_if_due() == (MODE_MIGRATING, True)
    assert client.type(KEYS.bloom) == b"MBbloom--"
    while record.maintain().more:
        pass
    assert not client.exists(KEYS.seen)
    assert record.add(old) == [False] * 300
    assert record.add(fps(10, "new")) == [True] * 10


# -- backend detection ----------------------------------------------------------------


@pytest.mark.parametrize("backend", BF_BACKENDS)
def test_auto_picks_redisbloom_where_the_server_has_it(backend: str, client: redis.Redis) -> None:
    record = opened(client, bitmap_params(backend="auto"))
    assert record.impl == "redisbloom"


def test_auto_picks_the_bitmap_on_plain_redis(real_redis: redis.Redis) -> None:
    assert not bloom.has_redisbloom(real_redis, KEYS.bloom)
    assert opened(real_redis, bitmap_params(backend="auto")).impl == "bitmap"


def test_redisbloom_required_but_missing_is_a_clear_error(real_redis: redis.Redis) -> None:
    with pytest.raises(DedupConfigError, match="no BF"):
        opened(real_redis, bitmap_params(backend="redisbloom"))


@pytest.mark.parametrize("backend", BF_BACKENDS)
def test_detection_sees_the_module_through_a_bitmap_key(backend: str, client: redis.Redis) -> None:
    client.set(KEYS.bloom, b"\0")
    assert bloom.has_redisbloom(client, KEYS.bloom)


# -- bad input: a clear error at open, naming the key --------------------------------------


def _bitmap_record(client: redis.Redis) -> None:
    opened(client, bitmap_params()).maintain()


@pytest.mark.parametrize("backend", ["fakeredis", "redis"])
class TestCorruptKeys:
    @pytest.mark.parametrize("name", ["seen", "dedup"])
    def test_wrong_type(self, backend: str, client: redis.Redis, name: str) -> None:
        key = getattr(KEYS, name)
        client.set(key, b"oops")
        with pytest.raises(CorruptKeyError, match=_escaped(key) + ".*holds a string"):
            Dedup(client, KEYS, bitmap_params()).open()

    def test_bloom_key_in_set_mode(self, backend: str, client: redis.Redis) -> None:
        client.set(KEYS.bloom, b"oops")
        with pytest.raises(CorruptKeyError, match=_escaped(KEYS.bloom)):
            Dedup(client, KEYS, bitmap_params()).open()

    @pytest.mark.parametrize(
        ("field", "value", "problem"),
        [
            ("mode", "maybe", "unknown dedup mode"),
            ("impl", "cuckoo", "unknown filter implementation"),
            ("layer:1", "1 2 x", "bad Bloom filter parameters"),
            ("layers", "99", "bad layer count"),
            ("block_bytes", "32", "bad Bloom filter parameters"),
        ],
    )
    def test_bad_parameters(
        self, backend: str, client: redis.Redis, field: str, value: str, problem: str
    ) -> None:
        _bitmap_record(client)
        client.hset(KEYS.dedup, field, value)
        with pytest.raises(CorruptKeyError, match=_escaped(KEYS.dedup) + ".*" + problem):
            Dedup(client, KEYS, bitmap_params()).open()

    def test_truncated_bitmap(self, backend: str, client: redis.Redis) -> None:
        _bitmap_record(client)
        client.set(KEYS.bloom, b"short")
        with pytest.raises(CorruptKeyError, match=_escaped(KEYS.bloom) + ".*5 bytes"):
            Dedup(client, KEYS, bitmap_params()).open()

    def test_redisbloom_record_without_its_filter(self, backend: str, client: redis.Redis) -> None:
        client.hset(KEYS.dedup, mapping={"mode": "bloom", "impl": "redisbloom"})
        client.set(KEYS.bloom, b"oops")
        with pytest.raises(CorruptKeyError, match=_escaped(KEYS.bloom) + ".*RedisBloom"):
            Dedup(client, KEYS, bitmap_params()).open()

    def test_corruption_after_open_fails_the_script_before_it_writes(
        self, backend: str, client: redis.Redis
    ) -> None:
        _bitmap_record(client)
        frontier = Frontier(client, KEYS, "w1")
        client.hset(KEYS.dedup, "mode", "maybe")
        with pytest.raises(redis.ResponseError, match=_escaped(KEYS.dedup)):
            frontier.enqueue([NewRequest(b"a", fps(1)[0])])
        assert not client.exists(KEYS.queue, KEYS.seq, KEYS.stats)

    @pytest.mark.parametrize("tail", [" 3", " 2 2", " 1", "x"])
    def test_a_layer_of_an_unknown_placement_fails_the_script_before_it_writes(
        self, backend: str, client: redis.Redis, tail: str
    ) -> None:
        # (a filter laid out by a later version: its bits would be looked for elsewhere)
        record = opened(client, bitmap_params())
        record.maintain()
        five = " ".join(client.hget(KEYS.dedup, "layer:1").decode().split()[:5])
        client.hset(KEYS.dedup, "layer:1", five + tail)
        with pytest.raises(redis.ResponseError, match="bad spec of layer 1"):
            Frontier(client, KEYS, "w1").enqueue([NewRequest(b"a", fps(1)[0])])
        assert not client.exists(KEYS.queue, KEYS.seq, KEYS.stats)

    def test_bitmap_cut_short_after_open_names_the_bitmap(
        self, backend: str, client: redis.Redis
    ) -> None:
        record = opened(client, bitmap_params())
        record.maintain()
        client.set(KEYS.bloom, b"short")
        with pytest.raises(redis.ResponseError, match=_escaped(KEYS.bloom)):
            record.add(fps(1))
