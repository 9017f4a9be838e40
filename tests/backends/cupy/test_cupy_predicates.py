"""The tensor-core kernels' tile predicates, checked on the host against the contract's
visibility rule: a tile left unmasked holds only keys every row of the item sees."""

from __future__ import annotations

import numpy as np
import pytest
from cases import poisoned_case
from cupy_plans import work_of

from pagedattn.conformance.checks import problem_of

#: the masks and GQA ratios (rows of a tile left empty at G=7 and G=12) every predicate is checked at
MASKS = pytest.mark.parametrize(
    "options",
    [{}, {"causal": False}, {"sliding_window": 37}, {"sliding_window": 200, "causal": False}],
    ids=["causal", "non-causal", "window", "window non-causal"],
)
GROUPS = pytest.mark.parametrize("num_q_heads", [8, 14, 24], ids=["G=4", "G=7", "G=12"])


@MASKS
@GROUPS
def test_wgmma_warpgroup_unmasks_only_tiles_all_its_rows_see_whole(
    options: dict, num_q_heads: int
) -> None:
    """The wgmma kernel's per-warpgroup "whole" predicate (64 rows, 64-key tiles), checked
    against the contract's visibility rule on every tile of every work item."""
    case = poisoned_case("predicates", seq_lens=[700, 300, 64], q_lens=[650, 130, 64],
        num_q_heads=num_q_heads, head_dim=64, **options,
    )
    problem = problem_of(case)
    work = work_of(problem, sm90=True, slots=64, prefill="wgmma")
    assert work.kernel == "wgmma"
    W = problem.sliding_window or 0
    unmasked = 0
    for item in work.items:
        seq, token_start, num_tokens, num_groups = (int(item[i]) for i in (0, 2, 3, 5))
        L, q_len = int(problem.seq_lens[seq]), int(problem.q_lens[seq])
        num_rows = num_tokens * num_groups
        pq_min = L - q_len + (token_start - int(problem.query_start_loc[seq]))
        for wg in (0, 1):
            first, last = 64 * wg, min(64 * wg + 63, num_rows - 1)
            if first >= num_rows:
                continue
            pq_lo, pq_hi = pq_min + first // num_groups, pq_min + max(last, 0) // num_groups
            p_q = pq_min + np.arange(first, last + 1) // num_groups
            for p0 in range(int(item[6]), int(item[7]), 64):
                whole = (
                    p0 + 64 <= L
                    and (not problem.causal or p0 + 63 <= pq_lo)
                    and (W <= 0 or p0 > pq_hi - W)
                )
                if whole:
                    unmasked += 1
                    p = np.arange(p0, p0 + 64)[None, :]
                    visible = (p < L) & np.ones((p_q.size, 1), bool)
                    if problem.causal:
                        visible &= p <= p_q[:, None]
                    if W:
                        visible &= p > p_q[:, None] - W
                    assert visible.all(), (tuple(item), wg, p0)
    assert unmasked > 0 or W < 128


@pytest.mark.parametrize("window", [1, 5, 50, 129], ids=lambda w: f"W={w}")
@pytest.mark.parametrize("block_size", [16, 64], ids=lambda b: f"bs{b}")
def test_wgmma_items_cover_exactly_the_tiles_a_window_leaves_visible(
    window: int, block_size: int
) -> None:
    """With a sliding window not aligned to the 64-key tiles (and smaller than one), each wgmma
    work item's [kv_begin, kv_end) holds every key its rows see (contract: p <= p_q and
    p > p_q - W) and no tile none of its rows sees."""
    case = poisoned_case("window items", seq_lens=[900, 260, 77], q_lens=[700, 260, 70],
        head_dim=64, block_size=block_size, sliding_window=window,
    )
    problem = problem_of(case)
    work = work_of(problem, sm90=True, prefill="wgmma")
    assert work.kernel == "wgmma" and work.tile_n == 64
    seen = np.zeros((problem.num_tokens, problem.num_q_heads), dtype=np.int64)
    for item in work.items:
        seq, kv_head, token_start, num_tokens, g0, ng, kv_begin, kv_end = (int(x) for x in item[:8])
        L, q_len = int(problem.seq_lens[seq]), int(problem.q_lens[seq])
        first = L - q_len + token_start - int(problem.query_start_loc[seq])
        p_q = first + np.arange(num_tokens)
        lo, hi = np.maximum(0, p_q - window + 1), np.minimum(p_q, L - 1)  # visible: lo..hi
        assert kv_begin % 64 == 0 and kv_end % 64 == 0, tuple(item)
        assert kv_begin <= lo.min() and hi.max() < kv_end, (tuple(item), lo.min(), hi.max())
        for p0 in range(kv_begin, kv_end, 64):
            assert ((lo <= p0 + 63) & (hi >= p0)).any(), f"tile {p0} of {tuple(item)} is seen by no row"
        heads = kv_head * problem.group_size + g0 + np.arange(ng)
        seen[np.ix_(token_start + np.arange(num_tokens), heads)] += 1
    assert (seen == 1).all(), "every (token, head) row belongs to exactly one item"


# -- the 64-row tensor-core prefill kernel's tile predicate (kernels/paged_attention_mma.cu)
def _cta_tile_whole(problem, item, p0, tile_n):  # type: ignore[no-untyped-def]
    """``whole`` as attend_tile computes it for one CTA and one tile: from the p_q of the item's
    first and last token (plain scores then skip the mask)."""
    seq, _, token_start, num_tokens = (int(x) for x in item[:4])
    L, q_len = int(problem.seq_lens[seq]), int(problem.q_lens[seq])
    pq_min = L - q_len + (token_start - int(problem.query_start_loc[seq]))
    pq_max = pq_min + num_tokens - 1
    W = problem.sliding_window or 0
    return (
        p0 + tile_n <= L
        and (not problem.causal or p0 + tile_n - 1 <= pq_min)
        and (W <= 0 or p0 > pq_max - W)
    )


@MASKS
@GROUPS
def test_mma_kernel_unmasks_only_tiles_all_its_rows_see_whole(
    options: dict, num_q_heads: int
) -> None:
    """Each tile of a 64-row work item is seen by some row of the item, and one the kernel
    leaves unmasked holds only keys all its rows see (checked against the contract's rule)."""
    from pagedattn.backends.cupy import specializations as sp

    case = poisoned_case("predicates", seq_lens=[700, 300, 64], q_lens=[650, 130, 64],
        num_q_heads=num_q_heads, head_dim=64, **options,
    )
    problem = problem_of(case)
    work = work_of(problem, slots=64, prefill="mma")
    assert (work.kernel, work.rows, work.tile_n) == ("mma", sp.MMA_ROWS, sp.MMA_TILE_N)
    tile_n = work.tile_n
    unmasked = 0
    for item in work.items:
        seq, token_start, num_groups = int(item[0]), int(item[2]), int(item[5])
        L, q_len = int(problem.seq_lens[seq]), int(problem.q_lens[seq])
        rows = np.arange(int(item[3]) * num_groups)
        p_q = L - q_len + (token_start - int(problem.query_start_loc[seq])) + rows // num_groups
        for p0 in range(int(item[6]), int(item[7]), tile_n):
            p = np.arange(p0, p0 + tile_n)[None, :]
            visible = (p < L) & np.ones((rows.size, 1), bool)
            if problem.causal:
                visible &= p <= p_q[:, None]
            if problem.sliding_window:
                visible &= p > p_q[:, None] - problem.sliding_window
            assert visible.any(), f"tile {p0} of {tuple(item)} is seen by no row"
            if _cta_tile_whole(problem, item, p0, tile_n):
                unmasked += 1
                assert visible.all(), (tuple(item), p0)
    # (a window narrower than two tiles leaves no tile whole)
    assert unmasked > 0 or (problem.sliding_window or 10**9) < 2 * tile_n
