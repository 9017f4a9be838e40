"""The triton split-KV heuristic: small-batch decode fills the device, every other grid keeps
the plan of the four-tile rule (large-batch decode, long contexts, prefill)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pagedattn.backends.triton.launch_config import (
    MAX_SPLITS,
    MIN_TILES_PER_SPLIT,
    SMALL_GRID_MIN_TILES,
    choose_num_splits,
    choose_tiles,
    min_tiles_per_split,
)

H200_SMS = 132
DECODE = choose_tiles(1, 4, 128, "bfloat16", 16)  # llama3-8b heads: 32 query, 8 KV, head_dim 128
PREFILL = choose_tiles(4096, 4, 128, "bfloat16", 16)


def four_tile_rule(num_programs: int, max_key_tiles: int, num_sms: int, resident: int) -> int:
    """The split count of a rule that always asks MIN_TILES_PER_SPLIT tiles of a split."""
    if num_programs <= 0:
        return 1
    splits = min(resident * num_sms // num_programs, max_key_tiles // MIN_TILES_PER_SPLIT, MAX_SPLITS)
    return splits if splits >= 2 else 1


def decode_splits(num_seqs: int, keys: int) -> tuple[int, int]:
    """(splits, programs) of llama3-8b decode of ``num_seqs`` x ``keys`` on an H200."""
    programs = num_seqs * 8 * DECODE.num_group_tiles
    splits = choose_num_splits(programs, -(-keys // DECODE.block_n), H200_SMS, DECODE.resident)
    return splits, programs * splits


@pytest.mark.parametrize("num_seqs, keys, splits", [(64, 4096, 1), (2, 65536, 33)])
def test_large_batch_decode_keeps_its_plan(num_seqs: int, keys: int, splits: int) -> None:
    assert decode_splits(num_seqs, keys)[0] == splits
    programs = num_seqs * 8
    tiles = keys // DECODE.block_n
    assert splits == four_tile_rule(programs, tiles, H200_SMS, DECODE.resident)


def test_prefill_keeps_its_plan() -> None:
    # causal 8 x 4,096: 8 x 4,096 / block_q work items, 8 KV heads each
    programs = 8 * (4096 // PREFILL.block_q) * 8 * PREFILL.num_group_tiles
    tiles = 4096 // PREFILL.block_n
    assert choose_num_splits(programs, tiles, H200_SMS, PREFILL.resident) == 1
    assert four_tile_rule(programs, tiles, H200_SMS, PREFILL.resident) == 1


@pytest.mark.parametrize("num_seqs, keys", [(1, 2048), (1, 32768), (4, 8192), (8, 2048), (16, 2048)])
def test_small_batch_decode_fills_one_wave(num_seqs: int, keys: int) -> None:
    splits, programs = decode_splits(num_seqs, keys)
    slots = DECODE.resident * H200_SMS
    assert splits == MAX_SPLITS or slots - programs < num_seqs * 8, "no room for one more split of every pair"
    assert programs <= slots, "one wave"
    assert -(-keys // DECODE.block_n) // splits >= SMALL_GRID_MIN_TILES


@given(num_programs=st.integers(1, 4096), max_key_tiles=st.integers(0, 8192),
       num_sms=st.sampled_from([4, 78, 108, 132]), resident=st.integers(1, 8))
def test_only_grids_that_cannot_fill_the_device_change(num_programs: int, max_key_tiles: int, num_sms: int,
                                                      resident: int) -> None:
    slots = resident * num_sms
    new = choose_num_splits(num_programs, max_key_tiles, num_sms, resident)
    old = four_tile_rule(num_programs, max_key_tiles, num_sms, resident)
    if num_programs * max_key_tiles >= MIN_TILES_PER_SPLIT * slots:
        assert new == old
    else:
        assert new >= old, "a small grid splits at least as finely"
    assert new == 1 or num_programs * new <= slots
    assert new == 1 or max_key_tiles // new >= min_tiles_per_split(num_programs, max_key_tiles, slots)
    assert 1 <= new <= MAX_SPLITS
