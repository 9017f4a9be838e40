"""The ``numpy`` reference backend is checked against the spec, not trusted."""

from __future__ import annotations

import numpy as np
import pytest
from cases import paged_configs
from hypothesis import given, settings

from pagedattn.backends import load_backend
from pagedattn.spec import exact_attention, kv_ops, tolerance
from pagedattn.spec.dtypes import numpy_dtype
from pagedattn.spec.error_model import merge_tolerance
from pagedattn.spec.online_softmax import merge_states as spec_merge
from pagedattn.spec.pools import random_paged_inputs

BACKEND = load_backend("numpy")


def assert_within_model(case, dtype: str, cache_dtype: str | None = None, **options) -> None:
    """Compare the backend with the spec under the error model, lse included."""
    expected = exact_attention(*case.args(), kv_layout=case.kv_layout, **options)
    out, lse = BACKEND.paged_attention(*case.args(), kv_layout=case.kv_layout, return_lse=True, **options)
    assert out.dtype == case.query.dtype and lse.dtype == np.float32
    tol = tolerance(dtype, case.query.shape[-1], cache_dtype=cache_dtype)
    bound = tol.out_bound(expected.out, expected.value_scale, expected.score_scale, expected.num_visible)
    err = np.abs(out.astype(np.float64) - expected.out)
    if not (err <= bound).all():
        worst = np.unravel_index(np.argmax(err - bound), err.shape)
        raise AssertionError(f"worst at (token, head, dim)={worst}: {out[worst]} vs {expected.out[worst]}")
    assert np.array_equal(np.isneginf(lse), np.isneginf(expected.lse)), "lse -inf placement"
    fin = np.isfinite(expected.lse)
    lse_bound = tol.lse_bound(expected.score_scale, expected.num_visible)
    assert (np.abs(lse[fin] - expected.lse[fin]) <= lse_bound[fin]).all()


@settings(max_examples=60, deadline=None)
@given(paged_configs())
def test_reference_matches_spec(config) -> None:
    assert_within_model(config["case"], config["dtype"], config["cache_dtype"], **config["options"])


def test_reference_with_alibi_and_large_scores() -> None:
    case = random_paged_inputs([40, 7], [40, 2], dtype="bfloat16")
    case = case.replace(query=(case.query.astype(np.float32) * 30).astype(case.query.dtype))
    assert_within_model(case, "bfloat16", alibi_slopes=np.array([0.5, 0.1, 1.0, 2.0], np.float32))


def test_garbage_and_relocation_give_identical_bits() -> None:
    case = random_paged_inputs([5, 20, 33], [1, 4, 33], block_size=8)
    base = BACKEND.paged_attention(*case.args(), return_lse=True)
    kc, vc, tables = case.key_cache.copy(), case.value_cache.copy(), case.block_tables.copy()
    used = set()
    for s, length in enumerate(case.seq_lens):
        n = -(-int(length) // 8)
        used.update(tables[s, :n].tolist())
        kc[tables[s, n - 1], length - (n - 1) * 8 :] = np.nan
        vc[tables[s, n - 1], length - (n - 1) * 8 :] = -np.inf
        tables[s, n:] = [-1, 2**31 - 1, 0][s]
    for b in set(range(kc.shape[0])) - used:
        kc[b], vc[b] = np.inf, np.nan
    poisoned = BACKEND.paged_attention(case.query, kc, vc, tables, case.seq_lens, case.query_start_loc,
                                       return_lse=True)
    assert all(np.array_equal(a, b) for a, b in zip(base, poisoned, strict=True))
    perm = np.random.default_rng(1).permutation(kc.shape[0])  # move block b to perm[b]
    moved_k, moved_v = np.empty_like(case.key_cache), np.empty_like(case.value_cache)
    moved_k[perm], moved_v[perm] = case.key_cache, case.value_cache
    moved_tables = np.where(case.block_tables >= 0, perm[case.block_tables], -1).astype(np.int32)
    moved = BACKEND.paged_attention(case.query, moved_k, moved_v, moved_tables, case.seq_lens,
                                    case.query_start_loc, return_lse=True)
    assert all(np.array_equal(a, b) for a, b in zip(base, moved, strict=True))


def test_strided_view_of_a_multilayer_pool() -> None:
    """Caches that are one layer of ``[num_blocks, 2, num_layers, Hkv, block_size, D]`` (HND)."""
    case = random_paged_inputs([9, 30], [2, 30], block_size=8, kv_layout="HND")
    pool = np.random.default_rng(3).standard_normal((case.key_cache.shape[0], 2, 3, 2, 8, 16)).astype(np.float32)
    pool[:, 0, 1], pool[:, 1, 1] = case.key_cache, case.value_cache
    out = BACKEND.paged_attention(case.query, pool[:, 0, 1], pool[:, 1, 1], *case.args()[3:], kv_layout="HND")
    assert np.array_equal(out, BACKEND.paged_attention(*case.args(), kv_layout="HND"))


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("cache_dtype", ["float16", "float8_e4m3fn"])
def test_write_kv_writes_only_its_slots(layout: str, cache_dtype: str) -> None:
    case = random_paged_inputs([30], [1], block_size=8, dtype="float16", cache_dtype=cache_dtype, kv_layout=layout)
    rng = np.random.default_rng(5)
    key = rng.standard_normal((5, 2, 16)).astype(np.float16)
    value = rng.standard_normal((5, 2, 16)).astype(np.float16)
    slots = np.array([3, -1, 17, 8, 40], np.int64)
    kc, vc = case.key_cache.copy(), case.value_cache.copy()
    BACKEND.write_kv(key, value, kc, vc, slots, kv_layout=layout, k_scale=0.5, v_scale=2.0)
    kv, kc_view = kv_ops.slot_view(case.key_cache, layout), kv_ops.slot_view(kc, layout)
    changed = np.zeros(kc_view.shape[:2], bool)
    for t, slot in enumerate(slots):
        if slot < 0:
            continue
        changed[slot // 8, slot % 8] = True
        k_scale = 0.5 if cache_dtype.startswith("float8") else 1.0  # scales apply to fp8 caches only
        want = (key[t].astype(np.float64) / k_scale).astype(numpy_dtype(cache_dtype))
        assert np.array_equal(kc_view[slot // 8, slot % 8].view(np.uint8), want.view(np.uint8))
    assert np.array_equal(kc_view[~changed].view(np.uint8), kv[~changed].view(np.uint8))


def test_copy_blocks_reads_every_source_before_writing() -> None:
    case = random_paged_inputs([30], [1], block_size=8)
    kc, vc = case.key_cache.copy(), case.value_cache.copy()
    pairs = np.array([[0, 1], [1, 2], [2, 0]])  # a cycle: a sequential copy would smear block 0
    BACKEND.copy_blocks(kc, vc, pairs)
    for src, dst in pairs:
        assert np.array_equal(kc[dst], case.key_cache[src]) and np.array_equal(vc[dst], case.value_cache[src])
    assert np.array_equal(kc[3:], case.key_cache[3:])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_merge_states_matches_spec(dtype: str) -> None:
    rng = np.random.default_rng(2)
    out_a, out_b = (rng.standard_normal((4, 3, 8)).astype(numpy_dtype(dtype)) for _ in range(2))
    lse_a = rng.standard_normal((4, 3)).astype(np.float32) * 5
    lse_b = rng.standard_normal((4, 3)).astype(np.float32) * 5
    lse_a[0, 0] = -np.inf
    out_a[0, 0] = np.nan
    lse_a[1, 1] = lse_b[1, 1] = -np.inf
    out, lse = BACKEND.merge_states(out_a, lse_a, out_b, lse_b)
    want_out, want_lse = spec_merge(out_a, lse_a, out_b, lse_b)
    tol = merge_tolerance(dtype)
    scale = np.maximum(np.abs(out_a.astype(float)).max(-1), np.abs(out_b.astype(float)).max(-1))
    scale = np.nan_to_num(scale, nan=np.abs(out_b.astype(float)).max())
    bound = tol.out_bound(want_out, scale, np.zeros_like(scale), np.full(scale.shape, 2))
    assert (np.abs(out.astype(float) - want_out) <= bound).all()
    assert np.array_equal(out[1, 1].astype(float), np.zeros(8)) and lse[1, 1] == -np.inf
    assert out.dtype == out_a.dtype and lse.dtype == np.float32
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    fin = np.isfinite(want_lse)
    lse_bound = tol.lse_bound(np.abs(want_lse), np.full(want_lse.shape, 2))
    assert (np.abs(lse[fin] - want_lse[fin]) <= lse_bound[fin]).all()


@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_reference_propagates_non_finite_visible_data_as_the_spec_does(where) -> None:
    """NaN in a query, a visible key or a visible value: the reference has NaN exactly where the spec has."""
    case = random_paged_inputs([7, 3], [3, 1], block_size=4, head_dim=8, garbage="nan")
    q, kc, vc = case.query.copy(), case.key_cache.copy(), case.value_cache.copy()
    block, slot = int(case.block_tables[0, 1]), 1  # position 5 of sequence 0: seen by its queries at p_q 5, 6
    if where == "query":
        q[1, 0, 2] = np.nan
    elif where == "key":
        kc[block, slot, 0, 2] = np.nan
    else:
        vc[block, slot, 1, 2] = np.nan
    args = (q, kc, vc, case.block_tables, case.seq_lens, case.query_start_loc)
    expected = exact_attention(*args)
    out, lse = BACKEND.paged_attention(*args, return_lse=True)
    assert np.isnan(expected.out).any()
    assert np.array_equal(np.isnan(out), np.isnan(expected.out))
    assert np.array_equal(np.isnan(lse), np.isnan(expected.lse))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_merge_states_in_chunks_gives_the_bits_of_one_merge(dtype: str, monkeypatch) -> None:
    """States merged a few rows at a time (as states past 2**31 elements are) give the bits of the
    spec's merge of the whole, empty sides and NaN and inf in them included."""
    import pagedattn.backends.numpy.backend as numpy_backend

    rng = np.random.default_rng(5)
    out_a, out_b = (rng.standard_normal((13, 3, 8)).astype(numpy_dtype(dtype)) for _ in range(2))
    lse_a, lse_b = (rng.standard_normal((13, 3)).astype(np.float32) * 5 for _ in range(2))
    lse_a[0, 0], out_a[0, 0] = -np.inf, np.nan  # an empty side's NaN is ignored
    lse_a[5, 1] = lse_b[5, 1] = -np.inf  # both sides empty
    lse_b[7, 2], out_b[9, 0, 3], lse_a[12, 2] = np.nan, np.inf, np.inf
    want_out, want_lse = spec_merge(out_a, lse_a, out_b, lse_b)
    monkeypatch.setattr(numpy_backend, "MERGE_CHUNK_ELEMENTS", 2 * 3 * 8)  # two rows a chunk: 7 chunks
    out, lse = BACKEND.merge_states(out_a, lse_a, out_b, lse_b)
    assert out.dtype == out_a.dtype and lse.dtype == np.float32
    assert np.array_equal(out, want_out.astype(out_a.dtype), equal_nan=True)
    assert np.array_equal(lse, want_lse.astype(np.float32), equal_nan=True)
