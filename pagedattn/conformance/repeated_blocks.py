"""The spec's answer for block tables that name the same blocks many times, at the cost of the distinct ones.

Where scores do not depend on a key's position (no ALiBi, no sliding window), a row's softmax
over its visible keys is the same whichever order they come in, so the keys of one block seen
``n`` times weigh as the block seen once with ``ln(n)`` added to its lse. A sequence of millions
of keys whose block table repeats a few hundred blocks then has its exact answer from
:func:`~pagedattn.spec.exact.exact_attention_problem` run once per (row, distinct block), each
piece a decode of one block, combined in float64 by lse: ``lse = log sum_i n_i exp(lse_i)`` and
``out = sum_i n_i exp(lse_i - lse) out_i``. Non-finite data combines as the spec's does: a NaN
lse (a NaN query or key) makes the row NaN, a NaN value the dimension it is in.
"""

from __future__ import annotations

import numpy as np

from pagedattn.spec.arrays import AttentionProblem
from pagedattn.spec.exact import ExactResult, exact_attention, exact_attention_problem


def visible_counts(problem: AttentionProblem) -> np.ndarray:
    """int64 ``[T]``: the keys each query token sees, the first ones of its sequence (causal or not,
    no window)."""
    seq_of_token, p_q = problem.token_positions()
    lens = np.asarray(problem.seq_lens, dtype=np.int64)[seq_of_token]
    return np.minimum(p_q + 1, lens) if problem.causal else lens


def _pieces(problem: AttentionProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(token, block, keys, count)`` of every piece: each distinct block a token sees whole, with
    how many times its table names it, and the block it sees the first ``keys`` slots of (once)."""
    bs = problem.block_size
    tokens: list[np.ndarray] = []
    blocks: list[np.ndarray] = []
    keys: list[np.ndarray] = []
    counts: list[np.ndarray] = []
    seq_of_token, _ = problem.token_positions()
    for t, (s, seen) in enumerate(zip(seq_of_token, visible_counts(problem), strict=True)):
        whole, rest = divmod(int(seen), bs)
        ids, n = np.unique(np.asarray(problem.block_tables[s, :whole], dtype=np.int64), return_counts=True)
        if rest:
            ids, n = np.append(ids, int(problem.block_tables[s, whole])), np.append(n, 1)
        tokens.append(np.full(ids.size, t))
        blocks.append(ids)
        keys.append(np.where(np.arange(ids.size) < ids.size - (rest > 0), bs, rest))
        counts.append(n)
    def joined(parts: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    return joined(tokens), joined(blocks), joined(keys), joined(counts)


def exact_by_distinct_blocks(problem: AttentionProblem, query: np.ndarray, key_cache: np.ndarray,
                             value_cache: np.ndarray) -> ExactResult:
    """What :func:`~pagedattn.spec.exact.exact_attention_problem` returns for a validated problem
    without ALiBi or a sliding window, computed once per distinct block each row sees."""
    if problem.alibi_slopes is not None or problem.sliding_window is not None:
        raise ValueError("scores that depend on a key's position (ALiBi, a sliding window) differ between "
                         "the places a block is named")
    T, Hq, D = problem.num_tokens, problem.num_q_heads, problem.head_dim
    token, block, keys, count = _pieces(problem)
    if token.size == 0:
        return exact_attention_problem(problem, query, key_cache, value_cache)
    piece = exact_attention(
        np.asarray(query)[token], key_cache, value_cache, block[:, None], keys,
        kv_layout=problem.kv_layout, scale=problem.scale, softcap=problem.softcap,
        k_scale=problem.k_scale, v_scale=problem.v_scale)
    starts = np.flatnonzero(np.r_[True, token[1:] != token[:-1]])
    rows = token[starts]
    weighted = piece.lse + np.log(count.astype(np.float64))[:, None]  # [pieces, Hq]
    lse = np.full((T, Hq), -np.inf)
    out = np.zeros((T, Hq, D))
    with np.errstate(invalid="ignore", over="ignore"):
        lse[rows] = np.logaddexp.reduceat(weighted, starts, axis=0)
        row_lse = lse[token]
        has_weight = ~np.isneginf(row_lse)
        w = np.where(has_weight, np.exp(weighted - np.where(has_weight, row_lse, 0.0)), 0.0)
        out[rows] = np.add.reduceat(w[..., None] * piece.out, starts, axis=0)
    value_scale = np.zeros((T, Hq))
    score_scale = np.zeros((T, Hq))
    num_visible = np.zeros((T, Hq), dtype=np.int64)
    value_scale[rows] = np.maximum.reduceat(piece.value_scale, starts, axis=0)
    score_scale[rows] = np.maximum.reduceat(piece.score_scale, starts, axis=0)
    num_visible[rows] = np.add.reduceat(piece.num_visible * count[:, None], starts, axis=0)
    return ExactResult(out, lse, value_scale, score_scale, num_visible)
