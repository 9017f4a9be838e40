"""The triton split-KV heuristic on the H200's llama3-8b decode and prefill plans: splits fill
at most one wave of resident programs and never hold fewer than ``MIN_TILES_PER_SPLIT`` key
tiles, small batches included (finer splits measured slower there)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.backends.triton.launch_config import (
    MAX_SPLITS,
    MIN_TILES_PER_SPLIT,
    choose_num_splits,
    choose_tiles,
)

H200_SMS = 132
DECODE = choose_tiles(1, 4, 128, "bfloat16", 16)  # llama3-8b heads: 32 query, 8 KV, head_dim 128
PREFILL = choose_tiles(4096, 4, 128, "bfloat16", 16)


def decode_splits(num_seqs: int, keys: int) -> tuple[int, int]:
    """(splits, programs) of llama3-8b decode of ``num_seqs`` x ``keys`` on an H200."""
    programs = num_seqs * 8 * DECODE.num_group_tiles
    splits = choose_num_splits(programs, -(-keys // DECODE.block_n), H200_SMS, DECODE.resident)
    return splits, programs * splits


@pytest.mark.parametrize("num_seqs, keys, splits, programs", [
    (64, 4096, 1, 512),  # large batch: no split
    (2, 65536, 33, 528),
    (1, 2048, 32, 256),  # 128 tiles: four a split, half the slots
    (1, 32768, 64, 512),  # bounded by MAX_SPLITS
    (4, 8192, 16, 512),
    (8, 2048, 8, 512),
    (16, 2048, 4, 512),
])
def test_decode_plans_on_the_h200(num_seqs: int, keys: int, splits: int, programs: int) -> None:
    assert decode_splits(num_seqs, keys) == (splits, programs)


def test_prefill_is_not_split() -> None:
    # causal 8 x 4,096: 8 x 4,096 / block_q work items, 8 KV heads each
    programs = 8 * (4096 // PREFILL.block_q) * 8 * PREFILL.num_group_tiles
    assert choose_num_splits(programs, 4096 // PREFILL.block_n, H200_SMS, PREFILL.resident) == 1


@given(num_programs=st.integers(1, 4096), max_key_tiles=st.integers(0, 8192),
       num_sms=st.sampled_from([4, 78, 108, 132]), resident=st.integers(1, 8))
def test_splits_fit_one_wave_and_hold_four_tiles(num_programs: int, max_key_tiles: int, num_sms: int,
                                                 resident: int) -> None:
    slots = resident * num_sms
    splits = choose_num_splits(num_programs, max_key_tiles, num_sms, resident)
    assert 1 <= splits <= MAX_SPLITS
    if splits > 1:
        assert num_programs * splits <= slots, "one wave"
        assert max_key_tiles // splits >= MIN_TILES_PER_SPLIT, "never below four tiles a split"
    else:
        # no split: a second would overfill the wave or cut a range below four tiles
        assert 2 * num_programs > slots or max_key_tiles < 2 * MIN_TILES_PER_SPLIT
    if splits < MAX_SPLITS:
        # the largest count under both bounds
        assert num_programs * (splits + 1) > slots or max_key_tiles // (splits + 1) < MIN_TILES_PER_SPLIT


@pytest.mark.parametrize("head_dim, cache_bytes, keys_per_tile", [
    (128, 2, 16),  # the table's tiles
    (64, 2, 32),  # half the row bytes: twice the keys
    (128, 1, 64),  # fp8 caches: FP8_DECODE_TILES, twice the bytes
    (64, 1, 64),
    (256, 2, 32),  # head_dim 256 takes the wide tiles, not the table's
    (32, 2, 16),  # below 64: the table's tiles as they are
])
def test_decode_tiles_scale_with_head_dim_and_fp8_caches(head_dim: int, cache_bytes: int, keys_per_tile: int) -> None:
    tiles = choose_tiles(1, 4, head_dim, "bfloat16", 16, cache_bytes=cache_bytes)
    assert tiles.block_n == keys_per_tile
