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


# -- non-finite data: IEEE arithmetic on what a row sees, nothing read that it cannot see ----------

def _nhd_slot(case, seq: int, position: int, block_size: int = 4) -> tuple[int, int]:
    """(physical block, slot) of logical ``position`` of sequence ``seq`` (NHD caches)."""
    return int(case.block_tables[seq, position // block_size]), position % block_size


def test_nan_query_makes_its_row_nan_and_nothing_else() -> None:
    case = random_paged_inputs([5, 7], None, block_size=4, head_dim=8)
    base = exact_attention(*case.args())
    q = case.query.copy()
    q[1, 2, 3] = np.nan
    result = exact_attention(q, *case.args()[1:])
    assert np.isnan(result.out[1, 2]).all() and np.isnan(result.lse[1, 2])
    others = np.ones(result.lse.shape, dtype=bool)
    others[1, 2] = False
    assert np.array_equal(result.out[others], base.out[others]) and np.array_equal(result.lse[others], base.lse[others])


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_non_finite_key_in_a_visible_slot_makes_the_rows_that_see_it_nan(poison) -> None:
    """A key of NaN, or of ±inf in every dimension (q . k = inf - inf for a query of mixed signs):
    the rows of its KV head's group that see it are NaN, the others keep their answer."""
    case = random_paged_inputs([6, 9], None, block_size=4, head_dim=8, num_q_heads=4, num_kv_heads=2)
    q = case.query.copy()
    q[..., 0], q[..., 1] = 1.0, -1.0  # mixed signs in every row
    base = exact_attention(q, *case.args()[1:])
    kc = case.key_cache.copy()
    block, slot = case.block_tables[0, 0], 2  # position 2 of sequence 0, KV head 1 (query heads 2, 3)
    kc[block, slot, 1] = poison
    result = exact_attention(q, kc, *case.args()[2:])
    assert np.isnan(result.out[0, 2:]).all() and np.isnan(result.lse[0, 2:]).all()
    assert np.array_equal(result.out[0, :2], base.out[0, :2]) and np.array_equal(result.out[1], base.out[1])


def test_positive_infinite_score_makes_the_row_nan() -> None:
    """A score of +inf: exp(inf - inf) is NaN, so the row is NaN (not that key's value)."""
    case = random_paged_inputs([6], None, block_size=4, head_dim=8, num_q_heads=1, num_kv_heads=1)
    q = np.abs(case.query)
    kc = case.key_cache.copy()
    kc[case.block_tables[0, 1], 1, 0, 0] = np.inf  # q_0 > 0: q . k = +inf
    result = exact_attention(q, kc, *case.args()[2:])
    assert np.isnan(result.out).all() and np.isnan(result.lse).all()


@pytest.mark.parametrize("poison", [np.nan, np.inf, -np.inf])
def test_non_finite_value_poisons_its_dimension_only(poison) -> None:
    case = random_paged_inputs([6], None, block_size=4, head_dim=8, num_q_heads=2, num_kv_heads=1)
    base = exact_attention(*case.args())
    vc = case.value_cache.copy()
    vc[case.block_tables[0, 1], 0, 0, 5] = poison  # position 4, dimension 5
    result = exact_attention(case.query, case.key_cache, vc, *case.args()[3:])
    got = result.out[0, :, 5]
    assert (np.isnan(got) if np.isnan(poison) else got == poison).all()
    assert np.array_equal(np.delete(result.out, 5, axis=-1), np.delete(base.out, 5, axis=-1))
    assert np.array_equal(result.lse, base.lse)


def test_non_finite_data_outside_the_mask_changes_nothing() -> None:
    """Causal prefill: a NaN key at position 4 is seen only by the query at p_q = 4; a NaN query
    of a decode row with L = 0 (nothing visible) keeps out = 0, lse = -inf."""
    case = random_paged_inputs([5], [5], block_size=4, head_dim=8)
    base = exact_attention(*case.args())
    kc = case.key_cache.copy()
    block, slot = _nhd_slot(case, 0, 4)
    kc[block, slot] = np.nan
    result = exact_attention(case.query, kc, *case.args()[2:])
    assert np.array_equal(result.out[:4], base.out[:4]) and np.array_equal(result.lse[:4], base.lse[:4])
    assert np.isnan(result.out[4]).all() and np.isnan(result.lse[4]).all()
    decode = random_paged_inputs([0, 3], None, block_size=4, head_dim=8)
    q = decode.query.copy()
    q[0] = np.nan  # the query of the empty sequence (batch padding)
    result = exact_attention(q, *decode.args()[1:])
    assert np.array_equal(result.out[0], np.zeros_like(result.out[0])) and np.isneginf(result.lse[0]).all()
    assert np.isfinite(result.out[1]).all()


def test_every_visible_score_minus_inf_is_a_row_without_weight() -> None:
    """exp(-inf) = 0 for every visible key: the weights sum to 0, so out = 0 and lse = -inf."""
    case = random_paged_inputs([1], None, block_size=4, head_dim=8, num_q_heads=1, num_kv_heads=1)
    q = np.abs(case.query) + 0.5
    kc = case.key_cache.copy()
    kc[case.block_tables[0, 0], 0] = -np.inf
    result = exact_attention(q, kc, *case.args()[2:])
    assert np.array_equal(result.out, np.zeros_like(result.out)) and np.isneginf(result.lse).all()


@pytest.mark.parametrize("chunk", [None, 4 * 40 * 16 * 2])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_sequences_of_one_shape_computed_together_give_each_its_own_answer(layout, chunk, monkeypatch):
    """Sequences sharing a query count and a length are computed as one batch (and a batch is cut
    to ROW_CHUNK_ELEMENTS); each row's answer is the one it gets alone, bit for bit."""
    from pagedattn.spec import exact

    lens, q_lens = [40, 17, 40, 40, 17, 5], [3, 1, 3, 3, 1, 0]
    case = random_paged_inputs(lens, q_lens, block_size=16, head_dim=16, seed=5, kv_layout=layout)
    options = dict(kv_layout=layout, alibi_slopes=np.array([0.5, 0.25, 0.125, 0.0625], np.float32),
                   sliding_window=20)
    if chunk is not None:  # two rows of a 40-key sequence at a time: batches of two, rows one by one
        monkeypatch.setattr(exact, "ROW_CHUNK_ELEMENTS", chunk)
    together = exact_attention(*case.args(), **options)
    monkeypatch.undo()
    q, kc, vc, tables, seq_lens, starts = case.args()
    for s in range(len(lens)):
        rows = slice(int(starts[s]), int(starts[s + 1]))
        alone = exact_attention(q[rows], kc, vc, tables[s:s + 1], seq_lens[s:s + 1],
                                np.array([0, rows.stop - rows.start]), **options)
        for name in ("out", "lse", "value_scale", "score_scale", "num_visible"):
            assert np.array_equal(getattr(together, name)[rows], getattr(alone, name), equal_nan=True), (s, name)
    groups = exact.sequence_groups(exact.check_paged_attention(*case.args(), kv_layout=layout))
    assert sorted(map(list, groups)) == [[0, 2, 3], [1, 4]]
