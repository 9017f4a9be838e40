"""The spec's answer computed once per distinct block equals the spec's own, wherever tables repeat blocks."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pagedattn.conformance.checks import problem_of
from pagedattn.conformance.repeated_blocks import exact_by_distinct_blocks, visible_counts
from pagedattn.spec.exact import exact_attention_problem
from pagedattn.spec.pools import random_paged_inputs

#: (seq_lens, q_lens or None for decode, block_size, options, NaN or not) of the compared calls.
CALLS = [
    ([200, 37, 0, 64], None, 16, {}, "none"),
    ([300, 5, 96], [3, 5, 1], 16, {}, "none"),
    ([250, 129], [4, 2], 32, {"causal": False, "return_lse": True}, "none"),
    ([333, 18], None, 8, {"softcap": 5.0, "scale": -0.7}, "none"),
    ([180, 61], [2, 1], 16, {"k_scale": 0.5, "v_scale": 4.0}, "none"),
    ([190, 70], [2, 3], 16, {}, "nan"),  # a NaN value dimension in one sequence, a NaN key in the other
]


def _repeating(case, seed):  # type: ignore[no-untyped-def]
    """``case`` with each sequence's table naming 2 to 4 of its blocks again and again, in any order."""
    rng = np.random.default_rng(seed)
    tables = np.array(case.block_tables, copy=True)
    bs = case.key_cache.shape[1] if case.options.get("kv_layout", "NHD") == "NHD" else case.key_cache.shape[2]
    for s, length in enumerate(case.seq_lens):
        used = -(-int(length) // bs)
        if used:
            few = rng.choice(tables[s, :used], size=min(used, int(rng.integers(2, 5))), replace=False)
            tables[s, :used] = rng.choice(few, size=used)
    return replace(case, block_tables=tables)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize(("lens", "q_lens", "block_size", "options", "garbage"), CALLS)
def test_distinct_block_answer_is_the_spec_answer(lens, q_lens, block_size, options, garbage, seed):
    case = _repeating(random_paged_inputs(lens, q_lens, block_size=block_size, num_q_heads=6, num_kv_heads=2,
                                          head_dim=16, dtype="float16", seed=seed,
                                          cache_dtype="float8_e4m3fn" if "k_scale" in options else None,
                                          **options), seed)
    if garbage == "nan":  # (NHD) seq 0's rows get a NaN dimension, seq 1's rows of KV head 1 are NaN
        case.value_cache[case.block_tables[0, 0], 0, 0, 3] = np.nan
        case.key_cache[case.block_tables[1, 0], 0, 1, 5] = np.nan
    problem = problem_of(case)
    want = exact_attention_problem(problem, case.query, case.key_cache, case.value_cache)
    got = exact_by_distinct_blocks(problem, case.query, case.key_cache, case.value_cache)
    np.testing.assert_allclose(got.out, want.out, rtol=1e-12, atol=1e-12, equal_nan=True)
    np.testing.assert_allclose(got.lse, want.lse, rtol=1e-12, atol=1e-12, equal_nan=True)
    np.testing.assert_array_equal(got.value_scale, want.value_scale)
    np.testing.assert_array_equal(got.score_scale, want.score_scale)
    np.testing.assert_array_equal(got.num_visible, want.num_visible)
    if garbage == "nan":
        assert np.isnan(want.out[:2, :3, 3]).all() and not np.isnan(want.out[:2, :3, 2]).any()
        assert np.isnan(want.lse[2:, 3:]).all() and np.isfinite(want.lse[:2]).all()


def test_visible_counts_are_each_rows_keys():
    problem = problem_of(random_paged_inputs([10, 7, 0], [3, 7, 0], block_size=4))
    np.testing.assert_array_equal(visible_counts(problem), [8, 9, 10, 1, 2, 3, 4, 5, 6, 7])
    non_causal = problem_of(random_paged_inputs([10, 7], [3, 2], block_size=4, causal=False))
    np.testing.assert_array_equal(visible_counts(non_causal), [10, 10, 10, 7, 7])


@pytest.mark.parametrize("option", [{"sliding_window": 8}, {"alibi_slopes": np.ones(4, np.float32)}])
def test_position_dependent_scores_are_refused(option):
    case = random_paged_inputs([40], None, block_size=16, **option)
    with pytest.raises(ValueError, match="position"):
        exact_by_distinct_blocks(problem_of(case), case.query, case.key_cache, case.value_cache)
