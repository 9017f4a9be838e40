"""The online softmax and merge_states equal the exact softmax for any split and grouping."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from pagedattn.spec.error_model import float64_tolerance
from pagedattn.spec.online_softmax import empty_state, finalize, merge_states, update

HEAD_DIM = 3


def exact_softmax(s: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, float]:
    """Direct softmax of one query: ``(out [D], lse)``; (0, -inf) if every score is -inf."""
    if not np.isfinite(s).any():
        return np.zeros(v.shape[-1]), -np.inf
    m = s.max()
    w = np.exp(s - m)
    return (w[:, None] * np.where(w[:, None] > 0, v, 0.0)).sum(0) / w.sum(), m + np.log(w.sum())


scores = st.one_of(
    st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False),
    st.just(-np.inf),
)


@st.composite
def keys_and_splits(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """Scores (some -inf, magnitudes to 1e4), values, and cut points splitting them into blocks."""
    n = draw(st.integers(0, 40), label="num_keys")
    s = draw(arrays(np.float64, n, elements=scores), label="scores")
    v = draw(arrays(np.float64, (n, HEAD_DIM), elements=st.floats(-100, 100)), label="values")
    cuts = sorted(draw(st.lists(st.integers(0, n), max_size=6), label="cuts"))
    return s, v, [0, *cuts, n]


def check_close(out: np.ndarray, lse: float, s: np.ndarray, v: np.ndarray) -> None:
    expected_out, expected_lse = exact_softmax(s, v)
    if not np.isfinite(expected_lse):
        assert lse == -np.inf and np.array_equal(out, np.zeros(HEAD_DIM)), (out, lse)
        return
    finite = np.isfinite(s)
    score_scale = np.abs(s[finite]).max()
    value_scale = np.abs(v[finite]).max(initial=0.0)
    tol = float64_tolerance(HEAD_DIM)
    n = np.array(len(s))
    out_bound = tol.out_bound(expected_out, np.array(value_scale), np.array(score_scale), n)
    assert (np.abs(out - expected_out) <= out_bound).all(), (out, expected_out, out_bound)
    assert abs(lse - expected_lse) <= tol.lse_bound(np.array(score_scale), n), (
        lse, expected_lse)


@given(keys_and_splits())
def test_blockwise_update_equals_exact_softmax(case: tuple[np.ndarray, np.ndarray, list[int]]) -> None:
    s, v, bounds = case
    state = empty_state((), HEAD_DIM)
    for lo, hi in pairwise(bounds):
        state = update(state, s[lo:hi], v[lo:hi])
    out, lse = finalize(state)
    check_close(out, float(lse), s, v)


@given(keys_and_splits(), st.randoms(use_true_random=False))
def test_merging_blocks_in_any_grouping_equals_exact_softmax(
    case: tuple[np.ndarray, np.ndarray, list[int]], rnd: st.random.Random  # type: ignore[name-defined]
) -> None:
    s, v, bounds = case
    parts = []
    for lo, hi in pairwise(bounds):
        parts.append(finalize(update(empty_state((), HEAD_DIM), s[lo:hi], v[lo:hi])))
    while len(parts) > 1:  # merge a random adjacent-or-not pair: any grouping, any order
        i, j = sorted(rnd.sample(range(len(parts)), 2))
        b = parts.pop(j)
        a = parts.pop(i)
        parts.insert(i, merge_states(a[0], a[1], b[0], b[1]))
    out, lse = parts[0]
    check_close(np.asarray(out), float(lse), s, v)


def test_empty_side_is_ignored_even_if_nan() -> None:
    out_a = np.array([[np.nan, np.inf, 1.0]])
    out_b = np.array([[1.0, 2.0, 3.0]])
    out, lse = merge_states(out_a, np.array([-np.inf]), out_b, np.array([0.5]))
    assert np.array_equal(out, out_b) and lse[0] == 0.5


def test_both_empty_gives_zero_and_minus_inf() -> None:
    out, lse = merge_states(np.full((1, 3), np.nan), np.array([-np.inf]), np.full((1, 3), np.nan),
                            np.array([-np.inf]))
    assert np.array_equal(out, np.zeros((1, 3))) and lse[0] == -np.inf


def test_nan_of_a_non_empty_side_reaches_the_row_even_where_its_weight_rounds_to_0() -> None:
    """exp(-1000) is 0 in float64; the side is not empty, so 0 * NaN = NaN and 0 * inf = NaN, as in attention."""
    out_a = np.array([[np.nan, np.inf, 1.0]])
    out_b = np.array([[1.0, 2.0, 3.0]])
    out, lse = merge_states(out_a, np.array([-1000.0]), out_b, np.array([0.5]))
    assert np.isnan(out[0, 0]) and np.isnan(out[0, 1]) and out[0, 2] == 3.0 and lse[0] == 0.5


@pytest.mark.parametrize("lse_b", [0.5, -np.inf, np.nan])
def test_nan_lse_makes_the_row_nan(lse_b: float) -> None:
    out, lse = merge_states(np.ones((1, 3)), np.array([np.nan]), np.full((1, 3), 2.0), np.array([lse_b]))
    assert np.isnan(out).all() and np.isnan(lse).all()


def test_missing_rescale_would_be_caught() -> None:
    """The recurrence's rescale matters: blocks whose maxima differ by 10 must be rescaled."""
    s = np.array([0.0, 10.0])
    v = np.array([[1.0, 0, 0], [0, 1.0, 0]])
    state = update(update(empty_state((), HEAD_DIM), s[:1], v[:1]), s[1:], v[1:])
    out, _ = finalize(state)
    w = np.exp(s - 10.0)
    assert np.allclose(out, (w[:, None] * v).sum(0) / w.sum(), rtol=0, atol=1e-15)


def _fold(s: np.ndarray, v: np.ndarray, visible: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    state = update(empty_state((), v.shape[-1]), s, v, visible)
    return finalize(state)


def test_nan_or_positive_inf_score_makes_out_and_lse_nan() -> None:
    v = np.ones((3, HEAD_DIM))
    for bad in (np.nan, np.inf):
        out, lse = _fold(np.array([0.5, bad, -1.0]), v)
        assert np.isnan(out).all() and np.isnan(lse), bad


def test_visible_nan_value_is_read_even_with_zero_weight_invisible_one_never() -> None:
    """A visible key of score -inf weighs 0, but 0 * NaN is NaN; an invisible key's NaN value is never read."""
    v = np.ones((3, HEAD_DIM))
    v[1, 0] = np.nan
    s = np.array([0.5, -np.inf, -1.0])
    out, lse = _fold(s, v, visible=np.array([True, True, True]))
    assert np.isnan(out[0]) and np.isfinite(out[1:]).all() and np.isfinite(lse)
    out, lse = _fold(s, v, visible=np.array([True, False, True]))
    assert np.isfinite(out).all() and np.isfinite(lse)
