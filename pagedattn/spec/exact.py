"""Exact paged attention: gather K/V through the block tables, softmax in float64.

This is the ground truth every backend is compared with. Inputs are taken as rounded to
their dtype (the arrays as given), fp8 caches are multiplied by ``k_scale``/``v_scale``,
and everything after that is float64. See :mod:`pagedattn.spec.arrays` for the
block-table format and the meaning of each array.

Non-finite data follows IEEE arithmetic: NaN or inf in what a row sees (its query, K/V of
its visible slots) flows through the scores, the max, exp, the sums and the division, so a
NaN query or key makes the row's out and lse NaN, a NaN value makes that dimension of out
NaN. Only a row whose weights sum to 0 (no visible key, or every visible score -inf) gives
``out = 0, lse = -inf``. Slots a row cannot see are never read.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from pagedattn.spec.arrays import AttentionProblem, check_paged_attention


class ExactResult(NamedTuple):
    """The spec's answer and the magnitudes the error model needs, per (token, q head).

    out: float64 ``[T, Hq, D]``; lse: float64 ``[T, Hq]`` (-inf where nothing is visible; NaN/inf
    where visible data is not finite, see the module's docstring); value_scale: max |v| over
    the finite values of visible keys; score_scale: max over visible keys of
    ``|scale| * sum_d |q_d k_d| + |alibi bias|`` where finite (where only the softcapped score
    is finite, its magnitude); num_visible: visible keys (int64).
    """

    out: np.ndarray
    lse: np.ndarray
    value_scale: np.ndarray
    score_scale: np.ndarray
    num_visible: np.ndarray


def gather_kv_of(
    problem: AttentionProblem, key_cache: np.ndarray, value_cache: np.ndarray, seqs: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return float64 K, V ``[G, L, Hkv, D]`` of sequences ``seqs`` (all of length L) in logical
    order, scales applied."""
    length = int(problem.seq_lens[seqs[0]])
    positions = np.arange(length)
    blocks = problem.block_tables[np.asarray(seqs)[:, None], positions // problem.block_size]  # [G, L]
    slots = np.broadcast_to(positions % problem.block_size, blocks.shape)
    if problem.kv_layout == "NHD":
        k = key_cache[blocks, slots]
        v = value_cache[blocks, slots]
    else:
        k = key_cache[blocks, :, slots]
        v = value_cache[blocks, :, slots]
    k64 = np.asarray(k).astype(np.float64) * problem.k_scale
    v64 = np.asarray(v).astype(np.float64) * problem.v_scale
    return k64, v64


def gather_kv(
    problem: AttentionProblem, key_cache: np.ndarray, value_cache: np.ndarray, seq: int
) -> tuple[np.ndarray, np.ndarray]:
    """Return float64 K, V ``[L, Hkv, D]`` of sequence ``seq`` in logical order (scales applied)."""
    k, v = gather_kv_of(problem, key_cache, value_cache, np.array([seq]))
    return k[0], v[0]


def scores_and_mask(
    problem: AttentionProblem, q: np.ndarray, k: np.ndarray, p_q: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Scores and visibility of one sequence (or of a batch of them, on leading axes), the
    contract's steps 1-4 in order.

    q: float64 ``[..., n, Hq, D]``; k: float64 ``[..., L, Hkv, D]``; p_q: int ``[..., n]`` query
    positions. Returns ``(s, visible, score_scale)``, each ``[..., n, Hq, L]``; ``s`` is finite
    where q and k are.
    """
    length = k.shape[-3]
    kv_head = np.arange(problem.num_q_heads) // problem.group_size
    k_per_q = k[..., kv_head, :]  # [..., L, Hq, D]
    s = problem.scale * np.einsum("...nhd,...lhd->...nhl", q, k_per_q)
    score_scale = abs(problem.scale) * np.einsum("...nhd,...lhd->...nhl", np.abs(q), np.abs(k_per_q))
    if problem.softcap is not None:
        s = problem.softcap * np.tanh(s / problem.softcap)
    p = np.arange(length)
    distance = (p - np.asarray(p_q)[..., :, None]).astype(np.float64)  # [..., n, L]: p - p_q
    if problem.alibi_slopes is not None:
        bias = problem.alibi_slopes.astype(np.float64)[:, None] * distance[..., :, None, :]
        s = s + bias
        score_scale = score_scale + np.abs(bias)
    visible = np.ones(distance.shape, dtype=bool)
    if problem.causal:
        visible &= distance <= 0
    if problem.sliding_window is not None:
        visible &= distance > -problem.sliding_window
    visible_h = np.broadcast_to(visible[..., :, None, :], s.shape)
    return s, visible_h, score_scale


#: Elements of the float64 ``[rows, Hq, L, D]`` values the rows computed at once see, at most:
#: a long prefill's rows, or a batch of short sequences, are taken in chunks (each row's answer
#: is its own), 64 MiB at a time.
ROW_CHUNK_ELEMENTS = 2**23


def sequence_groups(problem: AttentionProblem) -> list[np.ndarray]:
    """The sequences with queries and keys, grouped by (query count, length): a group's sequences
    are computed together, each row's answer its own."""
    q_lens = np.diff(problem.query_start_loc)
    lens = np.asarray(problem.seq_lens)
    seqs = np.flatnonzero((q_lens > 0) & (lens > 0))
    if seqs.size == 0:
        return []
    _, group_of = np.unique(np.stack([q_lens[seqs], lens[seqs]], axis=1), axis=0, return_inverse=True)
    group_of = group_of.reshape(-1)
    in_groups = seqs[np.argsort(group_of, kind="stable")]
    return np.split(in_groups, np.cumsum(np.bincount(group_of))[:-1])


def exact_attention_problem(
    problem: AttentionProblem, query: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray
) -> ExactResult:
    """Exact attention of a validated problem on host arrays (see :func:`exact_attention`)."""
    T, Hq, D = problem.num_tokens, problem.num_q_heads, problem.head_dim
    out = np.zeros((T, Hq, D))
    lse = np.full((T, Hq), -np.inf)
    value_scale = np.zeros((T, Hq))
    score_scale = np.zeros((T, Hq))
    num_visible = np.zeros((T, Hq), dtype=np.int64)
    q_all = np.asarray(query).astype(np.float64)
    _, p_q_all = problem.token_positions()
    kv_head = np.arange(Hq) // problem.group_size
    for group in sequence_groups(problem):
        n = int(problem.query_start_loc[group[0] + 1] - problem.query_start_loc[group[0]])
        per_row = Hq * int(problem.seq_lens[group[0]]) * D  # values one row sees
        batch = max(1, ROW_CHUNK_ELEMENTS // per_row)
        for first in range(0, len(group), batch):
            seqs = group[first:first + batch]
            k, v = gather_kv_of(problem, key_cache, value_cache, seqs)  # [G, L, Hkv, D]
            v_rows = v[:, None, :, kv_head, :].transpose(0, 1, 3, 2, 4)  # [G, 1, Hq, L, D]
            chunk = max(1, ROW_CHUNK_ELEMENTS // (len(seqs) * per_row))
            starts = np.asarray(problem.query_start_loc[seqs])
            for lo in range(0, n, chunk):
                rows = starts[:, None] + np.arange(lo, min(n, lo + chunk))  # [G, r] tokens
                with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 and inf - inf are NaN, as IEEE says
                    s, visible, s_abs = scores_and_mask(problem, q_all[rows], k, p_q_all[rows])
                masked = np.where(visible, s, -np.inf)  # replaced, never added to: invisible data is never read
                with np.errstate(invalid="ignore", over="ignore"):
                    m = np.max(masked, axis=-1)  # NaN if a visible score is NaN
                    shift = np.where(np.isneginf(m), 0.0, m)  # no visible finite score: every weight is exp(-inf) = 0
                    w = np.exp(masked - shift[..., None])  # NaN for a +inf score (exp(inf - inf))
                    l_sum = w.sum(axis=-1)
                    v_per_q = np.where(visible[..., None], v_rows, 0.0)  # NaN * 0 = NaN: invisible values never enter
                    o = np.einsum("...hl,...hld->...hd", w, v_per_q)
                    no_weight = l_sum == 0  # nothing visible, or every visible score -inf
                    safe = np.where(no_weight, 1.0, l_sum)
                    out[rows] = np.where(no_weight[..., None], 0.0, o / safe[..., None])
                    lse[rows] = np.where(no_weight, -np.inf, shift + np.log(safe))
                finite_v = np.where(np.isfinite(v_per_q), np.abs(v_per_q), 0.0)
                value_scale[rows] = np.max(finite_v, axis=(-1, -2), initial=0.0)
                # a softcapped score of an infinite product is finite (+-softcap): its own magnitude
                finite_s = np.where(visible & np.isfinite(s_abs), s_abs,
                                    np.where(visible & np.isfinite(s), np.abs(s), 0.0))
                score_scale[rows] = np.max(finite_s, axis=-1, initial=0.0)
                num_visible[rows] = visible.sum(axis=-1)
    return ExactResult(out, lse, value_scale, score_scale, num_visible)


def exact_attention(
    query: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    block_tables: np.ndarray,
    seq_lens: np.ndarray,
    query_start_loc: np.ndarray | None = None,
    **options: Any,
) -> ExactResult:
    """Validate, then compute exact paged attention in float64 on NumPy arrays.

    Arguments and options (kv_layout, scale, causal, sliding_window, softcap, alibi_slopes,
    k_scale, v_scale) are the contract's; see :mod:`pagedattn.spec.arrays`.
    """
    problem = check_paged_attention(
        query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, **options
    )
    return exact_attention_problem(problem, query, key_cache, value_cache)
