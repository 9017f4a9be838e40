"""The triton split-KV heuristic (a wave model of the grid) on the H200's decode and prefill
plans: the counts measured fastest there, splits of at least ``MIN_TILES_PER_SPLIT`` key tiles
in at most ``MAX_SPLIT_WAVES`` waves, and never a count the model holds slower than not
splitting or than filling one wave."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.backends.triton.launch_config import (
    MAX_SPLIT_WAVES,
    MAX_SPLITS,
    MIN_TILES_PER_SPLIT,
    choose_num_splits,
    choose_tiles,
    estimated_waves,
)

H200_SMS = 132
DECODE = choose_tiles(1, 4, 128, "bfloat16", 16)  # llama3-8b heads: 32 query, 8 KV, head_dim 128
PREFILL = choose_tiles(4096, 4, 128, "bfloat16", 16)


def decode_splits(num_seqs: int, keys: int, *, heads: tuple[int, int] = (32, 8),
                  head_dim: int = 128) -> tuple[int, int]:
    """(splits, programs) of bfloat16 decode of ``num_seqs`` x ``keys`` with ``heads`` (query, KV) on an H200."""
    tiles = choose_tiles(1, heads[0] // heads[1], head_dim, "bfloat16", 16)
    programs = num_seqs * heads[1] * tiles.num_group_tiles
    splits = choose_num_splits(programs, -(-keys // tiles.block_n), H200_SMS, tiles.resident, tiles.saturation)
    return splits, programs * splits


@pytest.mark.parametrize("num_seqs, keys, splits, programs", [
    (64, 4096, 1, 512),  # 3.9 programs a multiprocessor reach its bandwidth: no split
    (2, 65536, 33, 528),
    (1, 2048, 32, 256),  # 128 tiles: four a split
    (1, 32768, 64, 512),  # bounded by MAX_SPLITS
    (4, 8192, 16, 512),
    (8, 2048, 8, 512),
    (16, 2048, 4, 512),
    (40, 4096, 2, 640),  # 2.4 a multiprocessor is short of its bandwidth: 167 us in 2 splits, 205 unsplit
    (128, 4096, 3, 3072),  # a wave and a third unsplit: 506 us in 3 splits, 622 unsplit
    (96, 2048, 1, 768),  # one wave at 5.8 a multiprocessor: splitting measured slower
])
def test_decode_plans_on_the_h200(num_seqs: int, keys: int, splits: int, programs: int) -> None:
    assert decode_splits(num_seqs, keys) == (splits, programs)


@pytest.mark.parametrize("num_seqs, splits", [
    (16, 3),  # 128 programs: 3 a multiprocessor in one wave
    (24, 2),
    (32, 3),  # 256 programs: two full waves (258 us); 2 splits, a wave and a third (327 us)
    (64, 3),  # 500 us, against 631 unsplit
])
def test_head_dim_256_decode_plans_on_the_h200(num_seqs: int, splits: int) -> None:
    # gemma3-12b's global layers: 16 query and 8 KV heads of 256; 3 programs fit a multiprocessor
    assert decode_splits(num_seqs, 4096, heads=(16, 8), head_dim=256)[0] == splits


def test_prefill_is_not_split() -> None:
    # causal 8 x 4,096: 8 x 4,096 / block_q work items, 8 KV heads each
    programs = 8 * (4096 // PREFILL.block_q) * 8 * PREFILL.num_group_tiles
    assert choose_num_splits(programs, 4096 // PREFILL.block_n, H200_SMS, PREFILL.resident, PREFILL.saturation) == 1


@given(num_programs=st.integers(1, 4096), max_key_tiles=st.integers(0, 8192),
       num_sms=st.sampled_from([4, 78, 108, 132]), resident=st.integers(1, 8), saturation=st.integers(1, 8))
def test_splits_hold_four_tiles_and_beat_no_split_and_one_wave(num_programs: int, max_key_tiles: int, num_sms: int,
                                                              resident: int, saturation: int) -> None:
    saturation = min(saturation, resident)
    slots = resident * num_sms
    splits = choose_num_splits(num_programs, max_key_tiles, num_sms, resident, saturation)
    assert 1 <= splits <= MAX_SPLITS
    if splits > 1:
        assert max_key_tiles // splits >= MIN_TILES_PER_SPLIT, "never below four tiles a split"
        assert num_programs * splits <= MAX_SPLIT_WAVES * slots, "never more than MAX_SPLIT_WAVES waves"

    def estimate(count: int) -> float:
        return estimated_waves(num_programs, count, max_key_tiles, num_sms, resident, saturation)

    # the one-wave rule: as many splits as fill the slots, within the same bounds
    one_wave = max(1, min(slots // num_programs, max_key_tiles // MIN_TILES_PER_SPLIT, MAX_SPLITS))
    assert estimate(splits) <= estimate(1) and estimate(splits) <= estimate(one_wave)
    assert all(estimate(fewer) > estimate(splits) for fewer in range(1, splits)), "the smallest of equals"
