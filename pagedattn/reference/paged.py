"""Paged attention the way a kernel does it, in NumPy float32.

For every logical block ``j`` of the longest sequence, all query tokens whose sequence
reaches block ``j`` look up the physical block ``block_tables[s, j]``, score its
``block_size`` slots against every query head (query head ``h`` reads KV head
``h // group_size``), mask slots ``p >= L`` and the causal/window bounds, and fold the
block into the online-softmax state (m, l, O) of :mod:`pagedattn.spec.online_softmax`.
The epilogue divides O by l and stores ``lse = m + log l``. NaN or inf in what a row sees
propagates (nothing visible is guarded); invisible slots are never read. It must match
:func:`pagedattn.spec.exact.exact_attention` within the error model.
"""

from __future__ import annotations

import numpy as np

from pagedattn.spec.arrays import AttentionProblem
from pagedattn.spec.kv_ops import slot_view
from pagedattn.spec.online_softmax import empty_state, finalize, update

TOKEN_CHUNK = 512  # query tokens processed together: bounds the float32 query and gathered K/V memory


def _block_scores(
    problem: AttentionProblem, q: np.ndarray, k_j: np.ndarray, p: np.ndarray, p_q: np.ndarray, length: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Scores ``s_ij`` [n, Hkv, G, block_size] of one block, -inf where invisible, and the visibility.

    q: [n, Hkv, G, D] float32 (already scaled); k_j: [n, block_size, Hkv, D]; p: [n, block_size]
    logical positions of the slots; p_q, length: [n].
    """
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0 is NaN, as IEEE says
        s_ij = np.einsum("nkgd,nbkd->nkgb", q, k_j)
    if problem.softcap is not None:
        cap = np.float32(problem.softcap)
        s_ij = cap * np.tanh(s_ij / cap)
    distance = (p - p_q[:, None]).astype(np.float32)  # p - p_q, [n, block_size]
    if problem.alibi_slopes is not None:
        slopes = problem.alibi_slopes.reshape(problem.num_kv_heads, problem.group_size)
        s_ij = s_ij + slopes[None, :, :, None] * distance[:, None, None, :]
    visible = p < length[:, None]
    if problem.causal:
        visible &= distance <= 0
    if problem.sliding_window is not None:
        visible &= distance > -problem.sliding_window
    visible_b = np.broadcast_to(visible[:, None, None, :], s_ij.shape)
    # NaN garbage in unused slots must not leak: masked scores are replaced, not added to.
    return np.where(visible_b, s_ij, np.float32(-np.inf)).astype(np.float32), visible_b


def paged_attention_reference(
    problem: AttentionProblem, query: np.ndarray, key_cache: np.ndarray, value_cache: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(out [T, Hq, D] in the query dtype, lse float32 [T, Hq])`` of a validated problem."""
    T, Hkv, G, D = problem.num_tokens, problem.num_kv_heads, problem.group_size, problem.head_dim
    bs = problem.block_size
    out = np.zeros((T, problem.num_q_heads, D), dtype=query.dtype)
    lse = np.full((T, problem.num_q_heads), -np.inf, dtype=np.float32)
    seq_of_token, p_q_all = problem.token_positions()
    k_slots, v_slots = slot_view(key_cache, problem.kv_layout), slot_view(value_cache, problem.kv_layout)
    scale = np.float32(problem.scale)
    k_scale, v_scale = np.float32(problem.k_scale), np.float32(problem.v_scale)
    for start in range(0, T, TOKEN_CHUNK):
        tokens = np.arange(start, min(start + TOKEN_CHUNK, T))
        seqs, p_q = seq_of_token[tokens], p_q_all[tokens]
        length = problem.seq_lens[seqs]
        num_blocks_needed = -(-length // bs)  # ceil(L / block_size): columns that may be read
        state = empty_state((len(tokens), Hkv, G), D, dtype=np.float32)
        with np.errstate(invalid="ignore"):  # an infinite query element times scale 0 is NaN, as in the spec
            q_chunk = (query[tokens].astype(np.float32) * scale).reshape(len(tokens), Hkv, G, D)
        for j in range(int(num_blocks_needed.max(initial=0))):
            active = np.flatnonzero(num_blocks_needed > j)
            if problem.sliding_window is not None:  # blocks entirely left of every window are skipped
                active = active[(j + 1) * bs > p_q[active] - problem.sliding_window + 1]
            if problem.causal:  # blocks entirely right of the query are skipped
                active = active[j * bs <= p_q[active]]
            if active.size == 0:
                continue
            physical = problem.block_tables[seqs[active], j]  # only needed columns are read
            k_j = k_slots[physical].astype(np.float32) * k_scale  # [n, bs, Hkv, D]
            v_j = v_slots[physical].astype(np.float32) * v_scale
            p = j * bs + np.arange(bs)[None, :].repeat(active.size, axis=0)
            s_ij, visible = _block_scores(problem, q_chunk[active], k_j, p, p_q[active], length[active])
            v_per_group = np.broadcast_to(v_j.transpose(0, 2, 1, 3)[:, :, None], (*s_ij.shape, D))
            partial = type(state)(state.m[active], state.l[active], state.O[active])
            m, l, O = update(partial, s_ij, v_per_group, visible)
            state.m[active], state.l[active], state.O[active] = m, l, O
        o_chunk, lse_chunk = finalize(state)
        out[tokens] = o_chunk.reshape(len(tokens), -1, D).astype(query.dtype)
        lse[tokens] = lse_chunk.reshape(len(tokens), -1)
    return out, lse
