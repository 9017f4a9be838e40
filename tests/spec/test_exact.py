"""Contract section "Meaning": the spec's exact attention against a literal reading of it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pagedattn.spec import exact_attention
from pagedattn.spec.error_model import float64_tolerance
from pagedattn.spec.pools import random_paged_inputs


def literal_attention(case, *, scale=None, causal=True, sliding_window=None, softcap=None,
                      alibi_slopes=None, k_scale=1.0, v_scale=1.0):
    """The contract's "Meaning" section as loops, one query, head and key position at a time."""
    q, kc, vc, tables, lens, starts = case.args()
    layout = case.kv_layout
    T, Hq, D = q.shape
    Hkv = kc.shape[2] if layout == "NHD" else kc.shape[1]
    bs = kc.shape[1] if layout == "NHD" else kc.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    if starts is None:
        starts = np.arange(len(lens) + 1)
    out = np.zeros((T, Hq, D))
    lse = np.full((T, Hq), -np.inf)
    for s in range(len(lens)):
        L = int(lens[s])
        q_len = int(starts[s + 1] - starts[s])
        for j in range(q_len):
            t, p_q = int(starts[s]) + j, L - q_len + j
            for h in range(Hq):
                kvh = h // (Hq // Hkv)
                scores, values = [], []
                for p in range(L):
                    block, slot = tables[s, p // bs], p % bs
                    k = (kc[block, slot, kvh] if layout == "NHD" else kc[block, kvh, slot]).astype(float) * k_scale
                    v = (vc[block, slot, kvh] if layout == "NHD" else vc[block, kvh, slot]).astype(float) * v_scale
                    x = scale * float(np.dot(q[t, h].astype(float), k))
                    if softcap is not None:
                        x = softcap * math.tanh(x / softcap)
                    if alibi_slopes is not None:
                        x += float(alibi_slopes[h]) * (p - p_q)
                    if (causal and p > p_q) or (sliding_window is not None and p <= p_q - sliding_window):
                        continue
                    scores.append(x)
                    values.append(v)
                if scores:
                    sc = np.array(scores)
                    w = np.exp(sc - sc.max())
                    out[t, h] = (w[:, None] * np.array(values)).sum(0) / w.sum()
                    lse[t, h] = sc.max() + math.log(w.sum())
    return out, lse


OPTIONS = [
    {},
    {"causal": False},
    {"sliding_window": 3},
    {"sliding_window": 1, "causal": False},
    {"softcap": 2.0, "scale": 0.7},
    {"alibi_slopes": np.array([0.5, 0.25, 0.125, 1.0], np.float32)},
]


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(o) or "default")
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_exact_matches_literal_reading(options, layout) -> None:
    case = random_paged_inputs([5, 20, 0, 17], [2, 20, 0, 1], block_size=4, head_dim=8, kv_layout=layout)
    result = exact_attention(*case.args(), kv_layout=layout, **options)
    out, lse = literal_attention(case, **options)
    tol = float64_tolerance(8)
    bound = tol.out_bound(out, result.value_scale, result.score_scale, result.num_visible)
    assert (np.abs(result.out - out) <= bound).all()
    assert np.array_equal(np.isinf(result.lse), np.isinf(lse))
    fin = np.isfinite(lse)
    assert (np.abs(result.lse - lse)[fin] <= tol.lse_bound(result.score_scale, result.num_visible)[fin]).all()


def test_fp8_cache_uses_cache_times_scale() -> None:
    case = random_paged_inputs([9, 3], None, block_size=4, head_dim=8, cache_dtype="float8_e4m3fn", dtype="float16")
    result = exact_attention(*case.args(), k_scale=0.5, v_scale=3.0)
    out, _ = literal_attention(case, k_scale=0.5, v_scale=3.0)
    assert np.allclose(result.out, out, rtol=0, atol=1e-12)


def test_decode_padding_entry_and_empty_rows() -> None:
    """Decode with L = 0 is batch padding: out = 0 and lse = -inf, never NaN."""
    case = random_paged_inputs([0, 7], None, block_size=4)
    result = exact_attention(*case.args())
    assert np.array_equal(result.out[0], np.zeros_like(result.out[0]))
    assert np.isneginf(result.lse[0]).all() and np.isfinite(result.lse[1]).all()


def test_gqa_head_mapping_any_ratio() -> None:
    """Query head h reads KV head h // 7 with 14 query heads and 2 KV heads."""
    case = random_paged_inputs([6], None, num_q_heads=14, num_kv_heads=2, block_size=4)
    q = case.query.copy()
    q[0, 7:] = q[0, :7]  # same queries for both groups: outputs differ only through the KV head
    result = exact_attention(q, *case.args()[1:])
    out, _ = literal_attention(case.replace(query=q))
    assert np.allclose(result.out, out, atol=1e-12)
    assert not np.allclose(result.out[0, :7], result.out[0, 7:])


def test_unused_slots_and_entries_do_not_matter() -> None:
    case = random_paged_inputs([5, 20], [1, 3], block_size=8)
    base = exact_attention(*case.args())
    kc, vc, tables = case.key_cache.copy(), case.value_cache.copy(), case.block_tables.copy()
    for s, length in enumerate(case.seq_lens):
        last = tables[s, (length - 1) // 8]
        kc[last, length % 8 or 8 :] = np.nan
        vc[last, length % 8 or 8 :] = np.inf
        tables[s, -(-length // 8) :] = 2**31 - 1
    poisoned = exact_attention(case.query, kc, vc, tables, case.seq_lens, case.query_start_loc)
    assert np.array_equal(base.out, poisoned.out) and np.array_equal(base.lse, poisoned.lse)


def test_scales_are_ignored_for_non_fp8_caches() -> None:
    case = random_paged_inputs([9, 3], None, block_size=4, head_dim=8)
    plain = exact_attention(*case.args())
    scaled = exact_attention(*case.args(), k_scale=0.5, v_scale=3.0)
    assert np.array_equal(plain.out, scaled.out)
