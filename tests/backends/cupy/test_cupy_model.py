"""The work items the cupy backend plans, replayed by a NumPy model of the kernel: every row
once, and the exact answer (split-KV partials merged)."""

from __future__ import annotations

import numpy as np
import pytest
from cases import poisoned_case
from cupy_plans import rows_of, work_of

from pagedattn.conformance.checks import problem_of
from pagedattn.spec.exact import exact_attention
from pagedattn.spec.kv_ops import slot_view


# -- work items, replayed by a NumPy model of the kernel --------------------------------------
def _model(problem, work, query, key_cache, value_cache):  # type: ignore[no-untyped-def]
    """What the kernel computes for the work items (float64): rows, masks, and the split-KV merge
    by the part of a range that counts itself last (the items' order stands for the order the
    parts finish in), over the ranges ``merge_partials`` would merge."""
    k_slots, v_slots = (
        slot_view(key_cache, problem.kv_layout),
        slot_view(value_cache, problem.kv_layout),
    )
    out = np.full((problem.num_tokens, problem.num_q_heads, problem.head_dim), np.nan)
    lse = np.full((problem.num_tokens, problem.num_q_heads), np.nan)
    partial_out = np.zeros((max(1, work.num_partials), work.rows, problem.head_dim))
    partial_lse = np.zeros((max(1, work.num_partials), work.rows))
    bs = problem.block_size
    counted: dict[int, int] = {}
    ranges = {(int(first), int(n)) for *_, first, n in work.merges}
    for seq, kv_head, t0, nt, g0, ng, kv_begin, kv_end, partial, range_first, num_parts in work.items:
        L = problem.seq_lens[seq]
        q_len = problem.q_lens[seq]
        assert kv_begin % work.tile_n == 0 and kv_end % work.tile_n == 0
        assert nt * ng <= work.rows
        p = np.arange(kv_begin, min(kv_end, L))  # the kernel reads nothing at p >= L
        table = problem.block_tables[seq, p // bs] if p.size else np.zeros(0, np.int64)
        assert (p // bs < -(-L // bs)).all()
        for r in range(nt * ng):
            t, h = t0 + r // ng, kv_head * problem.group_size + g0 + r % ng
            p_q = L - q_len + (t - problem.query_start_loc[seq])
            k = k_slots[table, p % bs, kv_head].astype(np.float64)
            v = v_slots[table, p % bs, kv_head].astype(np.float64)
            s = problem.scale * k @ query[t, h].astype(np.float64)
            if problem.softcap:
                s = problem.softcap * np.tanh(s / problem.softcap)
            if problem.alibi_slopes is not None:
                s = s + problem.alibi_slopes[h] * (p - p_q)
            visible = np.ones(p.size, bool)
            if problem.causal:
                visible &= p <= p_q
            if problem.sliding_window:
                visible &= p > p_q - problem.sliding_window
            s = np.where(visible, s, -np.inf)
            m = s.max(initial=-np.inf)
            w = np.exp(s - (m if np.isfinite(m) else 0.0))
            o = w @ np.where(visible[:, None], v, 0.0) / w.sum() if w.sum() > 0 else 0.0
            row_lse = m + np.log(w.sum()) if w.sum() > 0 else -np.inf
            if partial >= 0:
                partial_out[partial, r], partial_lse[partial, r] = o, row_lse
            else:
                assert np.isnan(lse[t, h]), f"row (token {t}, head {h}) written twice"
                out[t, h], lse[t, h] = o, row_lse
        if partial < 0:
            assert (range_first, num_parts) == (-1, 0)
            continue
        assert (range_first, num_parts) in ranges and range_first <= partial < range_first + num_parts
        counted[range_first] = counted.get(range_first, 0) + 1
        if counted[range_first] < num_parts:
            continue
        first, n = range_first, num_parts
        for r in range(nt * ng):
            t, h = t0 + r // ng, kv_head * problem.group_size + g0 + r % ng
            parts = partial_lse[first : first + n, r]
            m = parts.max()
            w = np.where(np.isfinite(parts), np.exp(parts - (m if np.isfinite(m) else 0.0)), 0.0)
            assert np.isnan(lse[t, h]), f"row (token {t}, head {h}) written twice"
            out[t, h] = w @ partial_out[first : first + n, r] / w.sum() if w.sum() > 0 else 0.0
            lse[t, h] = m + np.log(w.sum()) if w.sum() > 0 else -np.inf
    assert counted == {first: n for first, n in ranges}, "every range merged once, after all its parts"
    return out, lse


WORK_CASES = {
    "decode with padding and split-KV": dict(
        seq_lens=[0, 1, 17, 900], num_q_heads=8, num_kv_heads=2
    ),
    "varlen mixed": dict(seq_lens=[1, 40, 129, 77], q_lens=[1, 40, 7, 0], block_size=32),
    "G=7 decode": dict(seq_lens=[33, 300], num_q_heads=14, num_kv_heads=2),
    "G=12 prefill": dict(seq_lens=[50], q_lens=[50], num_q_heads=24, num_kv_heads=2),
    "window": dict(seq_lens=[400, 100], q_lens=[30, 1], sliding_window=37, block_size=64),
    "non-causal HND": dict(seq_lens=[120, 64], q_lens=[20, 64], causal=False, kv_layout="HND"),
    "tensor-core decode": dict(
        seq_lens=[0, 1, 17, 900, 3000], num_q_heads=8, num_kv_heads=2, dtype="float16"
    ),
    "tensor-core decode d256": dict(
        seq_lens=[0, 1, 17, 900], num_q_heads=16, num_kv_heads=8, head_dim=256, softcap=50.0,
        dtype="bfloat16", block_size=32,
    ),
    "tensor-core rows": dict(seq_lens=[300, 129, 7], q_lens=[300, 50, 7], dtype="float16"),
    "wgmma rows": dict(
        seq_lens=[600, 300, 9], q_lens=[600, 200, 9], dtype="float16", num_q_heads=8,
        sliding_window=150,
    ),
    "fp8 mixed": dict(
        seq_lens=[1, 40, 129, 77], q_lens=[1, 40, 7, 0], dtype="bfloat16",
        cache_dtype="float8_e4m3fn",
    ),
    "fp8 decode": dict(
        seq_lens=[0, 17, 900], num_q_heads=8, num_kv_heads=2, dtype="float16",
        cache_dtype="float8_e5m2",
    ),
    "softcap alibi": dict(
        seq_lens=[300],
        q_lens=[4],
        softcap=5.0,
        alibi_slopes=np.linspace(0.01, 0.2, 8).astype(np.float32),
    ),
}


@pytest.mark.parametrize("name", list(WORK_CASES))
def test_work_items_cover_every_row_once_and_give_the_exact_answer(name: str) -> None:
    sm90 = name == "wgmma rows"  # the Hopper kernel's 128-row items, planned as on an sm_90 device
    case = poisoned_case(name, **{"dtype": "float32", "head_dim": 64, **WORK_CASES[name]})
    if name == "tensor-core decode d256":
        assert rows_of(problem_of(case)) == 16
    if name == "tensor-core rows":
        assert rows_of(problem_of(case), sm90=sm90) == 64
    if name == "wgmma rows":
        assert rows_of(problem_of(case), sm90=sm90) == 128
    problem = problem_of(case)
    work = work_of(problem, sm90=sm90, slots=64, min_tiles_per_split=1)  # force split-KV
    assert (work.kernel == "wgmma") == (name == "wgmma rows")
    out, lse = _model(problem, work, case.query, case.key_cache, case.value_cache)
    exact = exact_attention(*case.args(), **case.options)
    assert not np.isnan(lse).any(), "some output row is written by no work item"
    np.testing.assert_allclose(out, exact.out, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(lse, exact.lse, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("seq_lens, options", [
    ([2048], {}),  # one sequence: 8 ranges of 32 tiles for 264 slots, parts of four tiles
    ([900, 17, 0], {"num_splits": 3}),  # forced parts, uneven ranges, an empty sequence
])
def test_small_batch_split_plans_give_the_exact_answer(seq_lens: list[int], options: dict) -> None:
    case = poisoned_case(f"small batch {seq_lens}", seq_lens, num_q_heads=32, num_kv_heads=8, dtype="bfloat16")
    problem = problem_of(case)
    work = work_of(problem, slots=264, **options)
    assert work.num_partials > 0, "the plan splits"
    out, lse = _model(problem, work, case.query, case.key_cache, case.value_cache)
    exact = exact_attention(*case.args(), **case.options)
    np.testing.assert_allclose(out, exact.out, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(lse, exact.lse, rtol=1e-9, atol=1e-9)
