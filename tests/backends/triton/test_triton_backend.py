"""The ``triton`` backend against the spec, in Triton's CPU interpreter (``TRITON_INTERPRET=1``).

Every numeric comparison uses the spec's error model; bit-level rules (garbage in unused
slots, placement, repeatability, write_kv, copy_blocks) are checked bit for bit.
Skipped, with the reason, only where triton or torch cannot be imported.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("triton and torch are needed (pip install 'pagedattn[triton]')", allow_module_level=True)

from triton_mode import interpreter_setting

os.environ.setdefault("TRITON_INTERPRET", interpreter_setting())  # before any kernel module is imported

import torch
from cases import paged_configs
from hypothesis import given, settings
from hypothesis import strategies as st

from pagedattn.backends.triton.backend import TritonBackend, interpreter_mode
from pagedattn.backends.triton.launch_config import (
    DECODE_TILES,
    FP8_DECODE_TILES,
    MAX_HEAD_DIM,
    choose_num_splits,
    choose_tiles,
)
from pagedattn.errors import PagedAttentionError, UnsupportedError
from pagedattn.spec import exact_attention, kv_ops, tolerance
from pagedattn.spec.case import AttentionCase
from pagedattn.spec.dtypes import numpy_dtype
from pagedattn.spec.error_model import merge_tolerance
from pagedattn.spec.online_softmax import merge_states as spec_merge
from pagedattn.spec.pools import random_paged_inputs

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning")
BACKEND = TritonBackend()
CALL = "backend=triton"


def block_size_of(case: AttentionCase) -> int:
    return int(case.key_cache.shape[1 if case.kv_layout == "NHD" else 2])


def run(backend: TritonBackend, case: AttentionCase, **options) -> tuple[np.ndarray, np.ndarray]:
    """Run the backend on device copies of ``case``; return host ``(out, lse)``."""
    args = [None if a is None else backend.to_device(a) for a in case.args()]
    out, lse = backend.paged_attention(*args, kv_layout=case.kv_layout, return_lse=True, **options)
    return backend.to_numpy(out), backend.to_numpy(lse)


def assert_within_model(case: AttentionCase, *, backend: TritonBackend = BACKEND, cache_dtype: str | None = None,
                        **options) -> tuple[np.ndarray, np.ndarray]:
    """Compare out and lse with the exact answer under the error model; report the worst element."""
    dtype = str(case.query.dtype) if case.query.dtype != numpy_dtype("bfloat16") else "bfloat16"
    expected = exact_attention(*case.args(), kv_layout=case.kv_layout, **options)
    out, lse = run(backend, case, **options)
    assert out.dtype == case.query.dtype, f"out dtype {out.dtype}, expected {case.query.dtype}"
    assert lse.dtype == np.float32, f"lse dtype {lse.dtype}"
    tol = tolerance(dtype, case.query.shape[-1], cache_dtype=cache_dtype,
                    tf32=backend.capabilities().tf32)
    bound = tol.out_bound(expected.out, expected.value_scale, expected.score_scale, expected.num_visible)
    err = np.abs(out.astype(np.float64) - expected.out)
    assert not np.isnan(out).any(), f"NaN in out [{CALL}, {dtype}, {case.kv_layout}, {options}]"
    bad = ~(err <= bound)
    if bad.any():
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(
            f"{int(bad.sum())} of {bad.size} outside the error model; worst (token, head, dim)={worst}: "
            f"actual {out[worst]!r}, expected {expected.out[worst]!r}, |err| {err[worst]:.3g} > {bound[worst]:.3g}"
            f" [{CALL}, {dtype}, {case.kv_layout}, block_size={block_size_of(case)}, {options}]")
    empty = np.isneginf(expected.lse)
    assert np.array_equal(np.isneginf(lse), empty), "lse = -inf exactly where no key is visible"
    assert (out[empty] == 0).all(), "rows with no visible key must be exactly 0"
    lse_bound = tol.lse_bound(expected.score_scale, expected.num_visible)
    lse_err = np.abs(lse.astype(np.float64)[~empty] - expected.lse[~empty])
    assert (lse_err <= lse_bound[~empty]).all(), f"lse: worst error {lse_err.max():.3g}"
    return out, lse


def assert_out_within_model(out: Any, expected: Any, dtype: str, cache_dtype: str | None = None) -> None:
    """The backend's ``out`` (a device array) within the error model of the spec's ``expected``."""
    tol = tolerance(dtype, expected.out.shape[-1], cache_dtype=cache_dtype)
    bound = tol.out_bound(expected.out, expected.value_scale, expected.score_scale, expected.num_visible)
    assert (np.abs(BACKEND.to_numpy(out).astype(np.float64) - expected.out) <= bound).all()


# -- meaning: decode, prefill, chunked prefill; GQA; layouts; masks; softcap; ALiBi; dtypes ---------

@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_decode_with_padding_entry(dtype: str, kv_layout: str) -> None:
    case = random_paged_inputs([5, 40, 0, 17], None, dtype=dtype, kv_layout=kv_layout, num_q_heads=4, num_kv_heads=2)
    out, lse = assert_within_model(case)
    assert np.isneginf(lse[2]).all() and (out[2] == 0).all(), "L = 0 padding entry: out 0, lse -inf"


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_chunked_prefill_mixed_batch(dtype: str, kv_layout: str) -> None:
    # full prefill (q_len = L), chunked prefill (q_len < L), decode (q_len 1) and q_len 0 together
    case = random_paged_inputs([37, 70, 9, 21], [37, 25, 1, 0], dtype=dtype, kv_layout=kv_layout,
                               num_q_heads=6, num_kv_heads=2, seed=1)
    assert_within_model(case)


@pytest.mark.parametrize(("num_q_heads", "num_kv_heads"), [(3, 3), (8, 2), (7, 1), (4, 1)])
def test_gqa_mqa_group_sizes(num_q_heads: int, num_kv_heads: int) -> None:
    case = random_paged_inputs([33, 12], [5, 12], dtype="float16", num_q_heads=num_q_heads, num_kv_heads=num_kv_heads,
                               seed=2)
    assert_within_model(case)


@pytest.mark.parametrize("block_size", [1, 12, 16, 32, 64, 128])
def test_block_sizes(block_size: int) -> None:
    case = random_paged_inputs([70, 3, 130], [4, 3, 1], block_size=block_size, dtype="bfloat16", seed=3)
    assert_within_model(case)


@pytest.mark.parametrize(("block_size", "block_n", "pick_in_registers", "mode"), [
    (4, 16, False, 2), (1, 16, False, 2), (16, 16, False, 1), (16, 16, True, 2), (64, 16, False, 1),
    (64, 16, True, 1), (48, 16, False, 1), (12, 16, False, 0)])
@pytest.mark.parametrize("garbage", ["nan", "wild"])
def test_table_reads_by_block_match_per_key(block_size: int, block_n: int, pick_in_registers: bool, mode: int,
                                            garbage: str) -> None:
    """One block-table read per tile or per block gives the same bits as one per key, garbage beyond L unread."""
    case = random_paged_inputs([70, 3, 33, 0], [4, 3, 33, 0], block_size=block_size, dtype="bfloat16",
                               num_q_heads=4, num_kv_heads=2, seed=8, garbage=garbage)
    by_block = replace(choose_tiles(4, 2, 16, "bfloat16", block_size), block_n=block_n,
                       pick_in_registers=pick_in_registers)
    assert by_block.table_mode(block_size) == mode
    per_key = replace(by_block, table_by_block=False)
    assert per_key.table_mode(block_size) == 0
    out_block, lse_block = assert_within_model(case, backend=TritonBackend(tiles=by_block))
    out_key, lse_key = run(TritonBackend(tiles=per_key), case)
    assert np.array_equal(out_block.view(np.uint16), out_key.view(np.uint16))
    assert np.array_equal(lse_block, lse_key)


@pytest.mark.parametrize("head_dim", [8, 24, 64])
def test_head_dims(head_dim: int) -> None:
    case = random_paged_inputs([20, 45], [20, 2], head_dim=head_dim, dtype="float16", seed=4)
    assert_within_model(case)


@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_fp8_decode_takes_the_fp8_tiles_at_head_dims_64_and_128(block_size: int) -> None:
    # the fp8 tiles (64 keys, 5 stages, one table read per block) at both head dims; 16-bit caches
    # keep the table's tiles, scaled to its bytes a tile (twice the keys at head_dim 64)
    fp8 = FP8_DECODE_TILES
    for head_dim in (64, 128):
        tiles = choose_tiles(1, 4, head_dim, "bfloat16", block_size, cache_bytes=1)
        assert (tiles.block_n, tiles.num_warps, tiles.num_stages, tiles.resident, tiles.pick_in_registers) == (
            fp8.block_n, fp8.num_warps, fp8.num_stages, fp8.resident, fp8.pick_in_registers)
        sixteen = choose_tiles(1, 4, head_dim, "bfloat16", block_size)
        assert sixteen.block_n == DECODE_TILES.block_n * 128 // head_dim
        assert sixteen.num_stages == DECODE_TILES.num_stages
    assert choose_tiles(1, 4, 32, "bfloat16", block_size, cache_bytes=1).block_n == DECODE_TILES.block_n


@pytest.mark.parametrize("head_dim", [384, 512])
def test_head_dims_past_256_take_the_huge_tiles(head_dim: int) -> None:
    # Gemma 4's global layers (head_dim 512): decode in 16-key tiles of 2 warps, prefill in 64 x 32
    # tiles of 8 warps, float32 in 32 x 16 ones (larger ones pass an SM's shared memory)
    decode = choose_tiles(1, 2, head_dim, "bfloat16", 16)
    assert (decode.head_dim_pad, decode.block_m, decode.block_n, decode.num_warps) == (512, 16, 16, 2)
    assert decode.resident == 4
    prefill = choose_tiles(40, 2, head_dim, "float16", 16)
    assert (prefill.block_m, prefill.block_n, prefill.num_warps) == (64, 32, 8)
    wide = choose_tiles(40, 2, head_dim, "float32", 16)
    assert (wide.block_m, wide.block_n, wide.num_warps) == (32, 16, 8)
    case = random_paged_inputs([40, 7], [9, 1], head_dim=head_dim, dtype="bfloat16", num_q_heads=4,
                               num_kv_heads=2, seed=5)
    assert_within_model(case)  # out and lse
    decode = random_paged_inputs([100, 3], None, head_dim=head_dim, dtype="bfloat16", num_q_heads=4,
                                 num_kv_heads=2, seed=6)
    assert_within_model(decode, backend=TritonBackend(num_splits=3))


@pytest.mark.parametrize("options", [
    {"causal": False},
    {"sliding_window": 1},
    {"sliding_window": 9},
    {"sliding_window": 9, "causal": False},
    {"softcap": 2.5},
    {"softcap": 30.0, "sliding_window": 20},
    {"scale": 0.7},
], ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_masks_and_softcap(options: dict) -> None:
    case = random_paged_inputs([70, 31, 0], [30, 31, 0], dtype="bfloat16", kv_layout="HND", num_q_heads=4,
                               num_kv_heads=2, seed=5)
    assert_within_model(case, **options)


def test_alibi_with_window_and_softcap() -> None:
    case = random_paged_inputs([50, 19], [12, 1], dtype="float32", num_q_heads=8, num_kv_heads=2, seed=6)
    slopes = (2.0 ** -np.arange(1, 9)).astype(np.float32)
    assert_within_model(case, alibi_slopes=slopes)
    assert_within_model(case, alibi_slopes=slopes, sliding_window=7, softcap=8.0, causal=False)


@pytest.mark.parametrize("cache_dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_fp8_caches_with_scales(dtype: str, cache_dtype: str) -> None:
    case = random_paged_inputs([40, 9], [6, 1], dtype=dtype, cache_dtype=cache_dtype, kv_layout="HND", seed=7)
    assert_within_model(case, cache_dtype=cache_dtype, k_scale=0.37, v_scale=2.5)


def test_empty_batches() -> None:
    """No sequences; decode where every entry is padding (L = 0, no table columns); q_len 0 everywhere."""
    cache = BACKEND.to_device(np.zeros((3, 16, 2, 16), dtype=np.float32))
    out, lse = BACKEND.paged_attention(BACKEND.to_device(np.zeros((0, 4, 16), np.float32)), cache, cache,
                                       np.zeros((0, 2), np.int32), np.zeros((0,), np.int32), return_lse=True)
    assert tuple(out.shape) == (0, 4, 16) and tuple(lse.shape) == (0, 4)
    query = np.ones((2, 4, 16), np.float32)
    out, lse = BACKEND.paged_attention(BACKEND.to_device(query), cache, cache, np.zeros((2, 0), np.int32),
                                       np.zeros((2,), np.int32), return_lse=True)
    assert (BACKEND.to_numpy(out) == 0).all() and np.isneginf(BACKEND.to_numpy(lse)).all()
    out = BACKEND.paged_attention(BACKEND.to_device(np.zeros((0, 4, 16), np.float32)), cache, cache,
                                  np.zeros((2, 1), np.int32), np.array([3, 5], np.int32), np.zeros(3, np.int32))
    assert tuple(out.shape) == (0, 4, 16)


def test_lse_only_when_asked() -> None:
    case = random_paged_inputs([9, 4], None, dtype="float16", seed=8)
    args = [None if a is None else BACKEND.to_device(a) for a in case.args()]
    out = BACKEND.paged_attention(*args)
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == case.query.shape


# -- split-KV: a launch choice that never changes which keys count ---------------------------------

def test_a_small_grid_keeps_four_key_tiles_a_split_and_matches_spec() -> None:
    # interpreter: 4 "SMs" x 4 resident = 16 slots; 1 sequence x 2 KV heads of 19 key tiles:
    # 8 splits would fill the slots, but splits keep MIN_TILES_PER_SPLIT tiles, so 4
    case = random_paged_inputs([300], None, block_size=16, dtype="bfloat16", num_q_heads=8, num_kv_heads=2, seed=12)
    plan = BACKEND.plan(*case.args())
    assert plan.state.num_splits == 4
    assert_within_model(case)


@pytest.mark.parametrize("num_splits", [2, 3, 7])
def test_split_kv_matches_spec(num_splits: int) -> None:
    case = random_paged_inputs([300, 65, 0, 129], None, block_size=16, dtype="bfloat16", num_q_heads=4,
                               num_kv_heads=1, seed=9)
    assert_within_model(case, backend=TritonBackend(num_splits=num_splits))
    assert_within_model(case, backend=TritonBackend(num_splits=num_splits), sliding_window=100)
    prefill = random_paged_inputs([150, 40], [20, 3], dtype="float16", seed=10)
    assert_within_model(prefill, backend=TritonBackend(num_splits=num_splits), softcap=5.0)


@pytest.mark.parametrize("q_lens", [None, [9, 1, 30]], ids=["decode", "prefill"])
def test_launch_orders_give_the_same_bits(q_lens: list[int] | None) -> None:
    case = random_paged_inputs([40, 75, 30], q_lens, dtype="bfloat16", num_q_heads=6, num_kv_heads=3, seed=18)
    base = choose_tiles(1 if q_lens is None else 30, 2, 16, "bfloat16")
    results = []
    for heads_fastest in (True, False):
        backend = TritonBackend(num_splits=2, tiles=replace(base, heads_fastest=heads_fastest))
        results.append(assert_within_model(case, backend=backend))
    assert results[0][0].tobytes() == results[1][0].tobytes(), "launch order changed the output bits"


@pytest.mark.parametrize("options", [
    {},
    {"sliding_window": 9},
    {"softcap": 4.0, "causal": False},
    {"alibi_slopes": (2.0 ** -np.arange(1, 9)).astype(np.float32), "sliding_window": 30},
], ids=["plain", "window", "softcap", "alibi+window"])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_keys_major_tiles_match_spec(num_splits: int, options: dict) -> None:
    # scores as [keys, rows]: the same contract, with padding entries, GQA 8/2, both layouts
    for kv_layout, dtype in (("NHD", "bfloat16"), ("HND", "float16")):
        case = random_paged_inputs([45, 0, 130, 1], None, dtype=dtype, kv_layout=kv_layout, num_q_heads=8,
                                   num_kv_heads=2, seed=21)
        tiles = replace(choose_tiles(1, 4, 16, dtype), block_n=32, keys_major=True)
        assert_within_model(case, backend=TritonBackend(num_splits=num_splits, tiles=tiles), **options)
    chunked = random_paged_inputs([70, 9], [5, 1], dtype="bfloat16", num_q_heads=8, num_kv_heads=2, seed=22)
    tiles = replace(choose_tiles(5, 4, 16, "bfloat16"), block_n=16, keys_major=True)
    assert_within_model(chunked, backend=TritonBackend(num_splits=num_splits, tiles=tiles), **options)


@pytest.mark.parametrize("cache_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_keys_major_tiles_with_fp8_caches(cache_dtype: str) -> None:
    case = random_paged_inputs([40, 9], None, dtype="bfloat16", cache_dtype=cache_dtype, seed=23)
    tiles = replace(choose_tiles(1, 2, 16, "bfloat16"), block_n=16, keys_major=True)
    assert_within_model(case, backend=TritonBackend(tiles=tiles), cache_dtype=cache_dtype, k_scale=0.37,
                        v_scale=2.5)


def test_register_cap_and_short_tiles_match_spec() -> None:
    # prefill tiles of 64 rows x 32 keys under a register cap (a launch option only)
    case = random_paged_inputs([90, 40], [50, 40], dtype="bfloat16", num_q_heads=8, num_kv_heads=2, seed=24)
    tiles = replace(choose_tiles(50, 4, 16, "bfloat16"), block_m=64, block_n=32, max_registers=128)
    assert_within_model(case, backend=TritonBackend(tiles=tiles), sliding_window=33)


def test_split_heuristic_from_batch_shape() -> None:
    # 2 sequences x 8 KV heads on 132 SMs of 2 slots: one wave of 16 splits; 64 x 8 programs
    # already fill every slot: no split
    assert choose_num_splits(16, 512, 132) == 16
    assert choose_num_splits(512, 32, 132) == 1
    assert choose_num_splits(150, 64, 132) == 5  # 1.1 programs a multiprocessor; 5 splits: 3 waves, nearly full
    assert choose_num_splits(150, 64, 132, saturation=1) == 1  # one program already reaches the bandwidth
    assert choose_num_splits(16, 8, 132) == 2  # at least MIN_TILES_PER_SPLIT tiles per split
    assert choose_num_splits(16, 7, 132) == 1
    assert choose_num_splits(1, 10_000, 132) == 64  # bounded
    assert choose_num_splits(16, 512, 132, resident=4) == 32  # more resident programs, more splits
    decode = choose_tiles(1, 4, 128, "bfloat16")
    prefill = choose_tiles(4096, 4, 128, "bfloat16")
    assert (decode.block_m, decode.block_q, decode.group_tile) == (16, 1, 16) and decode.heads_fastest
    # decode tiles (so the compiled kernel) do not depend on the group size up to 16 heads
    assert {choose_tiles(1, group, 128, "bfloat16") for group in (1, 2, 3, 7, 16)} == {decode}
    assert choose_tiles(1, 32, 128, "bfloat16").block_m == 32
    assert (prefill.block_m, prefill.block_q, prefill.num_warps) == (128, 32, 8) and not prefill.heads_fastest


def test_decode_table_by_block_size() -> None:
    from pagedattn.backends.triton import launch_config as lc

    table = {None: lc.DecodeTiles(64, 4, 5, 2, True), 32: lc.DecodeTiles(32, 4, 5, 4, False)}
    at_32 = choose_tiles(1, 4, 128, "bfloat16", block_size=32, decode_table=table)
    at_64 = choose_tiles(1, 4, 128, "bfloat16", block_size=64, decode_table=table)
    assert (at_32.block_n, at_32.resident, at_32.keys_major) == (32, 4, False)
    assert (at_64.block_n, at_64.num_stages, at_64.keys_major) == (64, 5, True)
    assert not choose_tiles(1, 4, 128, "float32", block_size=32, decode_table=table).keys_major  # not from it
    case = random_paged_inputs([70, 0, 33], None, block_size=32, dtype="bfloat16", num_q_heads=8, num_kv_heads=2,
                               seed=25)
    backend = TritonBackend(decode_table=table)
    plan = backend.plan(*case.args(), kv_layout=case.kv_layout)
    tiles = plan.state.tiles
    assert (tiles.block_n, tiles.keys_major) == (32, False), "the backend's table, not the module's"
    assert_within_model(case, backend=backend)
    with pytest.raises(PagedAttentionError, match="decode_table"):
        TritonBackend(decode_table={32: table[32]})


# -- never: garbage in unused entries, placement, repeatability ---------------------------------

def _poisoned(case: AttentionCase, seed: int) -> AttentionCase:
    """The same logical K/V with NaN/inf in every unread slot and wild unread table entries."""
    rng = np.random.default_rng(seed)
    bs = block_size_of(case)
    tables = case.block_tables.copy()
    k, v = case.key_cache.copy(), case.value_cache.copy()
    slots_k, slots_v = kv_ops.slot_view(k, case.kv_layout), kv_ops.slot_view(v, case.kv_layout)
    used = np.zeros((k.shape[0], bs), dtype=bool)
    for s, length in enumerate(case.seq_lens):
        n = -(-int(length) // bs)
        for p in range(int(length)):
            used[tables[s, p // bs], p % bs] = True
        tables[s, n:] = rng.choice([-1, 2**31 - 1, -(2**31), 0], size=tables.shape[1] - n)
    garbage = rng.choice(np.array([np.nan, np.inf, -np.inf, 1e4]), size=(int((~used).sum()), *slots_k.shape[2:]))
    slots_k[~used] = garbage.astype(k.dtype)
    slots_v[~used] = garbage[::-1].astype(v.dtype)
    return case.replace(key_cache=k, value_cache=v, block_tables=tables)


@pytest.mark.parametrize("causal", [True, False])
def test_window_wider_than_any_position_is_no_window(causal: bool) -> None:
    # the kernel takes "no window" as 2**31 - 1; windows at and past that must change no bit
    case = random_paged_inputs([37, 70, 1], [10, 3, 1], dtype="bfloat16", seed=13)
    out, lse = run(BACKEND, case, causal=causal)
    for window in (2**31 - 1, 2**31, 2**40):
        out_w, lse_w = run(BACKEND, case, causal=causal, sliding_window=window)
        assert np.array_equal(out_w.view(np.uint16), out.view(np.uint16)) and np.array_equal(lse_w, lse), window


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize("num_splits", [None, 3])
def test_garbage_in_unused_slots_is_never_read(kv_layout: str, num_splits: int | None) -> None:
    backend = TritonBackend(num_splits=num_splits)
    clean = random_paged_inputs([37, 70, 0, 5], [10, 1, 0, 5], block_size=16, dtype="bfloat16", kv_layout=kv_layout,
                                seed=11)
    out_clean, lse_clean = run(backend, clean, sliding_window=30)
    out_dirty, lse_dirty = run(backend, _poisoned(clean, 12), sliding_window=30)
    assert np.array_equal(out_clean.view(np.uint16), out_dirty.view(np.uint16)), "out changed with garbage"
    assert np.array_equal(lse_clean.view(np.uint32), lse_dirty.view(np.uint32)), "lse changed with garbage"


def test_same_bits_for_other_placement_and_repeated_runs() -> None:
    case = random_paged_inputs([45, 20], [3, 20], block_size=16, dtype="float16", seed=13)
    out_a, lse_a = run(BACKEND, case)
    out_b, lse_b = run(BACKEND, case)
    assert np.array_equal(out_a.view(np.uint16), out_b.view(np.uint16)) and np.array_equal(lse_a, lse_b)
    # move every used block to another physical block (reversed order)
    num_blocks = case.key_cache.shape[0]
    moved = (num_blocks - 1 - case.block_tables).astype(np.int32)
    moved[case.block_tables < 0] = -1
    new_k = case.key_cache[::-1].copy()
    new_v = case.value_cache[::-1].copy()
    out_c, lse_c = run(BACKEND, case.replace(key_cache=new_k, value_cache=new_v, block_tables=moved))
    assert np.array_equal(out_a.view(np.uint16), out_c.view(np.uint16)) and np.array_equal(lse_a, lse_c)


# -- arrays: strided caches, 64-bit-safe indexing, conversions ------------------------------------

def test_strided_pool_view() -> None:
    """One layer of a pool [num_blocks, 2, num_layers, Hkv, block_size, D]: an HND view."""
    rng = np.random.default_rng(14)
    num_blocks, layers, hkv, bs, d = 10, 3, 2, 16, 16
    pool = rng.standard_normal((num_blocks, 2, layers, hkv, bs, d)).astype(np.float16)
    tables = rng.permutation(num_blocks)[:8].reshape(2, 4).astype(np.int32)
    seq_lens = np.array([50, 33], dtype=np.int32)
    query = rng.standard_normal((2, 4, d)).astype(np.float16)
    pool_t = BACKEND.to_device(pool)
    k_view, v_view = pool_t[:, 0, 1], pool_t[:, 1, 1]
    assert not k_view.is_contiguous()
    out, _lse = BACKEND.paged_attention(BACKEND.to_device(query), k_view, v_view, BACKEND.to_device(tables),
                                       BACKEND.to_device(seq_lens), kv_layout="HND", return_lse=True)
    expected = exact_attention(query, pool[:, 0, 1], pool[:, 1, 1], tables, seq_lens, kv_layout="HND")
    assert_out_within_model(out, expected, "float16")


@pytest.mark.parametrize("cache_dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_values_as_pairs_and_byte_by_byte(cache_dtype: str) -> None:
    """fp8 decode reads values as 16-bit words of two dimensions; a cache whose strides are odd
    (each slot's head padded by a byte) is read byte by byte, and both match the spec."""
    case = random_paged_inputs([70, 33], dtype="bfloat16", cache_dtype=cache_dtype, head_dim=32, num_kv_heads=1,
                               seed=9)
    query, key_cache, value_cache, tables, seq_lens = (BACKEND.to_device(a) for a in case.args()[:5])
    plan = BACKEND.plan(query, key_cache, value_cache, tables, seq_lens, kv_layout="NHD")
    assert plan.state.constexprs["V_PAIRS"], "fp8 decode at head_dim 32 reads values as pairs"
    assert_within_model(case, cache_dtype=cache_dtype, k_scale=0.5, v_scale=2.0)
    padded = np.zeros((*case.value_cache.shape[:-1], 33), dtype=case.value_cache.dtype)
    padded[..., :32] = case.value_cache
    value_view = BACKEND.to_device(padded)[..., :32]
    assert value_view.stride()[1:] == (33, 33, 1)
    out, _lse = BACKEND.paged_attention(query, key_cache, value_view, tables, seq_lens, k_scale=0.5, v_scale=2.0,
                                       return_lse=True)
    expected = exact_attention(*case.args(), k_scale=0.5, v_scale=2.0)
    assert_out_within_model(out, expected, "bfloat16", cache_dtype=cache_dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_to_device_round_trip_is_bit_exact(dtype: str) -> None:
    bits = np.arange(256, dtype=np.uint8) if dtype.startswith("float8") else None
    array = bits.view(numpy_dtype(dtype)) if bits is not None else \
        np.random.default_rng(0).standard_normal((3, 5)).astype(numpy_dtype(dtype))
    back = BACKEND.to_numpy(BACKEND.to_device(array))
    assert back.dtype == array.dtype and back.tobytes() == array.tobytes()


def test_capabilities_and_availability() -> None:
    caps = BACKEND.capabilities()
    assert caps.tf32 is False and caps.block_sizes is None and set(caps.kv_layouts) == {"NHD", "HND"}
    assert {"strided_caches", "fp8", "lse", "write_kv", "copy_blocks", "merge_states"} <= caps.features
    if interpreter_mode():
        assert TritonBackend.availability() is None


def test_bad_input_raises_before_any_kernel() -> None:
    case = random_paged_inputs([20], None, dtype="float16")
    tables = case.block_tables.copy()
    tables[0, 0] = 10_000
    with pytest.raises(PagedAttentionError, match="block_tables"):
        BACKEND.paged_attention(*[BACKEND.to_device(a) for a in (case.query, case.key_cache, case.value_cache,
                                                                  tables, case.seq_lens)])
    with pytest.raises(UnsupportedError, match="head_dim"):
        big = random_paged_inputs([3], None, head_dim=MAX_HEAD_DIM + 64, dtype="float16")
        BACKEND.paged_attention(*[BACKEND.to_device(a) for a in big.args()[:5]])
    with pytest.raises(PagedAttentionError, match="num_splits"):
        TritonBackend(num_splits=0)


# -- other operations: write_kv, copy_blocks, merge_states --------------------------------------

def _fp8_edge_values(dtype: str, scale: float) -> np.ndarray:
    """Values whose quotient by ``scale`` hits fp8 ties, subnormals, zero signs, overflow, NaN and inf."""
    ties = np.array([1.0625, 1.1875, -2.375, 0.0009765625 * 1.5, 0.0, -0.0, 3e-5, 460.0, 470.0, 61000.0, 6e4,
                     np.nan, np.inf, -np.inf])
    return (ties * scale).astype(numpy_dtype(dtype))


@pytest.mark.parametrize("kv_layout", ["NHD", "HND"])
@pytest.mark.parametrize(("dtype", "cache_dtype", "scale"), [
    ("bfloat16", None, 1.0),
    ("float32", None, 1.0),
    ("float16", "float8_e4m3fn", 1.0),
    ("bfloat16", "float8_e4m3fn", 0.37),
    ("float32", "float8_e5m2", 2.0),
    ("float16", "float8_e5m2", 0.11),
])
def test_write_kv_matches_spec_bit_for_bit(dtype: str, cache_dtype: str | None, scale: float,
                                           kv_layout: str) -> None:
    rng = np.random.default_rng(15)
    num_blocks, bs, hkv, d = 4, 8, 2, 16
    shape = (num_blocks, bs, hkv, d) if kv_layout == "NHD" else (num_blocks, hkv, bs, d)
    cdt = numpy_dtype(cache_dtype or dtype)
    k_cache = rng.standard_normal(shape).astype(cdt)
    v_cache = rng.standard_normal(shape).astype(cdt)
    key = (rng.standard_normal((6, hkv, d)) * 3).astype(numpy_dtype(dtype))
    value = (rng.standard_normal((6, hkv, d)) * 3).astype(numpy_dtype(dtype))
    if cache_dtype is not None:
        edge = _fp8_edge_values(dtype, scale)
        key[0, 0, : edge.size] = edge
        value[1, 1, : edge.size] = edge[::-1]
    slots = np.array([3, -1, 17, 31, 0, 12], dtype=np.int64)
    expected_k, expected_v = k_cache.copy(), v_cache.copy()
    kv_ops.write_kv(key, value, expected_k, expected_v, slots, kv_layout=kv_layout, k_scale=scale, v_scale=scale)
    dev_k, dev_v = BACKEND.to_device(k_cache), BACKEND.to_device(v_cache)
    BACKEND.write_kv(BACKEND.to_device(key), BACKEND.to_device(value), dev_k, dev_v, BACKEND.to_device(slots),
                     kv_layout=kv_layout, k_scale=scale, v_scale=scale)
    got_k, got_v = BACKEND.to_numpy(dev_k), BACKEND.to_numpy(dev_v)
    for name, got, expected in (("key_cache", got_k, expected_k), ("value_cache", got_v, expected_v)):
        diff = got.view(np.uint8) != expected.view(np.uint8)
        assert not diff.any(), f"{name}: {int(diff.sum())} bytes differ from the spec's write_kv"


def test_cache_operations_on_numpy_caches_write_in_place() -> None:
    rng = np.random.default_rng(19)
    pool = rng.standard_normal((4, 2, 2, 8, 16)).astype(numpy_dtype("bfloat16"))  # [blocks, 2, Hkv, bs, D]
    key = rng.standard_normal((3, 2, 16)).astype(numpy_dtype("bfloat16"))
    slots = np.array([5, -1, 30])
    expected = pool.copy()
    kv_ops.write_kv(key, key, expected[:, 0], expected[:, 1], slots, kv_layout="HND")
    kv_ops.copy_blocks(expected[:, 0], expected[:, 1], np.array([[0, 3]]), kv_layout="HND")
    BACKEND.write_kv(key, key, pool[:, 0], pool[:, 1], slots, kv_layout="HND")  # strided NumPy views
    BACKEND.copy_blocks(pool[:, 0], pool[:, 1], np.array([[0, 3]]), kv_layout="HND")
    assert pool.tobytes() == expected.tobytes()


def test_copy_blocks_chain_reads_sources_first() -> None:
    rng = np.random.default_rng(16)
    cache = rng.standard_normal((6, 4, 2, 16)).astype(numpy_dtype("bfloat16"))
    pairs = np.array([[0, 1], [1, 2], [2, 0], [4, 5]], dtype=np.int64)  # a cycle plus an independent copy
    expected_k, expected_v = cache.copy(), cache[::-1].copy()
    kv_ops.copy_blocks(expected_k, expected_v, pairs)
    dev_k, dev_v = BACKEND.to_device(cache), BACKEND.to_device(cache[::-1].copy())
    BACKEND.copy_blocks(dev_k, dev_v, pairs)
    assert BACKEND.to_numpy(dev_k).tobytes() == expected_k.tobytes()
    assert BACKEND.to_numpy(dev_v).tobytes() == expected_v.tobytes()
    # a strided pool view, no overlap between sources and destinations
    pool = BACKEND.to_device(rng.standard_normal((6, 2, 3, 2, 4, 16)).astype(np.float32))
    before = BACKEND.to_numpy(pool)
    BACKEND.copy_blocks(pool[:, 0, 1], pool[:, 1, 1], np.array([[3, 5]]), kv_layout="HND")
    after = BACKEND.to_numpy(pool)
    expected = before.copy()
    expected[5, :, 1] = before[3, :, 1]
    assert np.array_equal(after, expected), "only block 5 of layer 1 may change"


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_merge_states_matches_spec(dtype: str) -> None:
    rng = np.random.default_rng(17)
    out_a = rng.standard_normal((5, 3, 16)).astype(numpy_dtype(dtype))
    out_b = rng.standard_normal((5, 3, 16)).astype(numpy_dtype(dtype))
    lse_a = rng.normal(0, 3, (5, 3)).astype(np.float32)
    lse_b = rng.normal(0, 3, (5, 3)).astype(np.float32)
    lse_a[0] = -np.inf  # empty side whose out is NaN: ignored
    out_a[0] = np.nan
    lse_a[1] = lse_b[1] = -np.inf  # both empty
    expected_out, expected_lse = spec_merge(out_a, lse_a, out_b, lse_b)
    out, lse = BACKEND.merge_states(*[BACKEND.to_device(x) for x in (out_a, lse_a, out_b, lse_b)])
    out, lse = BACKEND.to_numpy(out), BACKEND.to_numpy(lse)
    assert out.dtype == out_a.dtype and lse.dtype == np.float32
    tol = merge_tolerance(dtype)
    scale = np.maximum(np.abs(out_a.astype(np.float64)), np.abs(out_b.astype(np.float64)))
    scale = np.nan_to_num(scale, nan=0.0).max(axis=-1)
    bound = tol.out_bound(expected_out, scale, np.zeros_like(scale), np.full(scale.shape, 2))
    assert (np.abs(out.astype(np.float64) - expected_out) <= bound).all()
    assert (out[1] == 0).all() and np.isneginf(lse[1]).all()
    finite = np.isfinite(expected_lse)
    assert np.allclose(lse[finite], expected_lse[finite], rtol=0, atol=1e-5)


# -- a small property test over the contract's options -------------------------------------------

@st.composite
def configs(draw: st.DrawFn) -> dict:
    """The shared small-case strategy, plus a forced split-KV count."""
    config = draw(paged_configs(block_sizes=(4, 16, 32), groups=(1, 3, 4), max_seqs=3, head_dim=16,
                                explicit_scale=False))
    config["splits"] = draw(st.sampled_from([None, 2]), label="num_splits")
    return config


@settings(max_examples=25, deadline=None)
@given(configs())
def test_property_matches_spec(config: dict) -> None:
    assert_within_model(config["case"], backend=TritonBackend(num_splits=config["splits"]),
                        cache_dtype=config["cache_dtype"], **config["options"])
