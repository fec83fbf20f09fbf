"""Bloom filter arithmetic (bloom.py): the plan the Lua code follows."""

from __future__ import annotations

import hashlib
import itertools

import pytest

from scrapy_redisspine import bloom
from scrapy_redisspine.bloom import BloomLayer, plan_layers


def _fingerprint(i: int) -> bytes:
    return hashlib.sha1(b"fp-%d" % i).digest()


class TestPlan:
    def test_layers_are_contiguous_and_grow(self) -> None:
        layers = plan_layers(10_000_000, 0.01)
        assert layers[0].offset == 0
        for before, after in itertools.pairwise(layers):
            assert after.offset == before.end
            assert after.capacity == before.capacity * bloom.GROWTH
            assert after.hashes >= before.hashes
        assert layers[-1].end <= bloom.MAX_BITMAP_BYTES

    def test_default_filter_holds_150_million_in_one_redis_string(self) -> None:
        layers = plan_layers(10_000_000, 0.01)
        assert bloom.total_capacity(layers) >= 100_000_000

    def test_first_layer_stays_under_one_and_a_half_bytes_per_fingerprint(self) -> None:
        first = plan_layers(10_000_000, 0.01)[0]
        assert first.end / first.capacity < 1.45

    def test_layer_error_rates_sum_to_at_most_the_target(self) -> None:
        total = sum(bloom.layer_error_rate(0.01, i) for i in range(bloom.MAX_LAYERS))
        assert total <= 0.01

    def test_each_layer_meets_its_own_rate_when_full(self) -> None:
        for index, layer in enumerate(plan_layers(1_000_000, 0.01)[:4]):
            bits_per_item = layer.blocks * bloom.BLOCK_BITS / layer.capacity
            rate = bloom.blocked_error_rate(bits_per_item, layer.hashes)
            assert rate <= bloom.layer_error_rate(0.01, index) * 1.001

    def test_blocked_layout_costs_a_little_more_than_a_classic_filter(self) -> None:
        bits, hashes = bloom.bits_per_item(0.005)
        classic = 11.03  # -ln(0.005) / ln(2)**2
        assert classic < bits < classic * 1.06
        assert hashes == 7

    def test_small_filters_count_exactly_big_ones_sample(self) -> None:
        assert plan_layers(1000, 0.01)[0].step == 1
        assert plan_layers(10_000_000, 0.01)[0].step == 64

    @pytest.mark.parametrize(("capacity", "rate"), [(0, 0.01), (10, 0.0), (10, 1.0), (10, -1)])
    def test_bad_parameters_are_refused(self, capacity: int, rate: float) -> None:
        with pytest.raises(ValueError, match="Bloom"):
            plan_layers(capacity, rate)

    def test_a_filter_too_big_for_one_string_is_refused(self) -> None:
        with pytest.raises(ValueError, match="does not fit"):
            plan_layers(10**10, 0.01)

    @pytest.mark.parametrize("placement", [bloom.PLACEMENT_PAIR, bloom.PLACEMENT_QUAD])
    def test_layer_spec_round_trips(self, placement: int) -> None:
        layer = BloomLayer(128, 7, 7, 300, 1, placement)
        assert BloomLayer.decode(layer.encode()) == layer

    def test_a_spec_of_five_fields_is_a_filter_created_before_placement_2(self) -> None:
        assert BloomLayer.decode("128 7 7 300 1").placement == bloom.PLACEMENT_PAIR
        assert BloomLayer(128, 7, 7, 300, 1).encode() == "128 7 7 300 1 2"
        assert plan_layers(1000, 0.01)[0].placement == bloom.PLACEMENT_QUAD

    @pytest.mark.parametrize("text", ["", "1 2 3 4", "1 2 3 4 x", "0 0 7 300 1", "-1 2 3 4 5",
                                      "1 2 3 4 5 1", "1 2 3 4 5 3", "1 2 3 4 5 2 2"])
    def test_bad_layer_spec_is_refused(self, text: str) -> None:
        with pytest.raises(ValueError, match="not a Bloom layer spec"):
            BloomLayer.decode(text)


class TestPositions:
    def test_all_bits_of_a_fingerprint_lie_in_one_block(self) -> None:
        layer = plan_layers(10_000, 0.01)[1]
        for i in range(200):
            positions = bloom.bit_positions(_fingerprint(i), layer)
            blocks = {position // bloom.BLOCK_BITS for position in positions}
            assert len(blocks) == 1
            assert layer.offset * 8 <= min(positions)
            assert max(positions) < layer.end * 8
            assert len(positions) == layer.hashes

    def test_a_block_has_two_to_the_36_patterns(self) -> None:
        # A new fingerprint whose whole pattern is that of one already in its block is
        # a false positive whatever the bits: the patterns must far outnumber a
        # block's fingerprints times 1 / the rate asked. Of 50,000 in one block, none
        # share one among 2^36; among 2^18 (a and b alone), ~4,700 do.
        def patterns(placement: int) -> int:
            layer = BloomLayer(0, 1, 30, 10, 1, placement)
            return len({frozenset(bloom.bit_positions(_fingerprint(i), layer))
                        for i in range(50_000)})

        assert patterns(bloom.PLACEMENT_QUAD) == 50_000
        assert patterns(bloom.PLACEMENT_PAIR) < 46_000

    def test_c_and_d_place_the_second_half(self) -> None:
        layer = BloomLayer(0, 1, 7, 10, 1)
        assert layer.split == 4
        digest = bytes(6) + (3 * 512**3 + 2 * 512**2 + 5 * 512 + 1).to_bytes(6, "big") + bytes(8)
        a, b, c, d = 1, 5, 2, 3
        assert bloom.bit_positions(digest, layer) == [
            (x + j * y + (j**3 - j) // 6) % 512
            for j, (x, y) in enumerate([(a, b)] * 4 + [(c, d)] * 3)]

    def test_blocks_are_used_evenly(self) -> None:
        layer = BloomLayer(0, 16, 7, 100, 1)
        counts = [0] * layer.blocks
        for i in range(16_000):
            counts[bloom.bit_positions(_fingerprint(i), layer)[0] // bloom.BLOCK_BITS] += 1
        assert min(counts) > 850
        assert max(counts) < 1150

    def test_hashes_of_a_digest_are_its_first_twelve_bytes(self) -> None:
        digest = bytes(range(20))
        assert bloom.fingerprint_hashes(digest) == (
            int.from_bytes(digest[:6], "big"), int.from_bytes(digest[6:12], "big")
        )

    def test_short_fingerprints_are_mixed(self) -> None:
        first, second = bloom.fingerprint_hashes(b"fp-a")
        assert (first, second) != bloom.fingerprint_hashes(b"fp-b")
        assert 0 <= first < 2**32
        assert 0 <= second < 2**32

    def test_sampled_counting_is_unbiased(self) -> None:
        layer = BloomLayer(0, 16, 7, 10**7, 64)
        counted = sum(bloom.counts_for(_fingerprint(i), layer) for i in range(64_000))
        assert 850 < counted < 1150  # 1000 expected
