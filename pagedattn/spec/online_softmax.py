"""The online softmax: the (m, l, O) recurrence over blocks of keys, and merge_states.

For one query, scores ``s_p`` and values ``v_p`` arrive in blocks ``j``. The running state
after block ``j`` is ``m_i`` (the largest score seen), ``l_i = sum exp(s_p - m_i)`` and
``O_i = sum exp(s_p - m_i) v_p`` (unnormalized). A new block with scores ``s_ij`` has
``m_ij = max(s_ij)``; with ``m_new = max(m_i, m_ij)``::

    l_i <- exp(m_i - m_new) * l_i + sum exp(s_ij - m_new)
    O_i <- exp(m_i - m_new) * O_i + sum exp(s_ij - m_new) v_j

and at the end ``out = O_i / l_i`` and ``lse = m_i + log(l_i)``. Keys with score ``-inf``
weigh exactly zero; a state whose weights sum to 0 (it saw no finite score) finalizes to
``out = 0, lse = -inf``. Nothing else is guarded: a NaN score, a ``+inf`` score or a
non-finite visible value propagates as IEEE arithmetic says (NaN * 0 is NaN), so the
caller says which keys are visible and only their values are read.
Everything works elementwise on leading batch axes and in the dtype of its inputs.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from pagedattn.errors import PagedAttentionError


class SoftmaxState(NamedTuple):
    """Running state: m ``[...]``, l ``[...]``, O ``[..., D]`` (O unnormalized)."""

    m: np.ndarray
    l: np.ndarray
    O: np.ndarray


def empty_state(batch_shape: tuple[int, ...], head_dim: int, dtype: type = np.float64) -> SoftmaxState:
    """Return the state before any key: ``m = -inf``, ``l = 0``, ``O = 0``."""
    return SoftmaxState(
        m=np.full(batch_shape, -np.inf, dtype=dtype),
        l=np.zeros(batch_shape, dtype=dtype),
        O=np.zeros((*batch_shape, head_dim), dtype=dtype),
    )


def _finite_or_zero(m: np.ndarray) -> np.ndarray:
    """Replace -inf by 0 so that ``exp(x - m)`` of an all -inf row gives 0, not NaN."""
    return np.where(np.isneginf(m), np.zeros_like(m), m)


def update(state: SoftmaxState, s_ij: np.ndarray, v_j: np.ndarray, visible: np.ndarray | None = None) -> SoftmaxState:
    """Fold one block of keys into the state.

    s_ij: ``[..., n]`` scores, ``-inf`` where invisible; v_j: ``[..., n, D]`` values;
    visible: bool ``[..., n]`` (default: ``s_ij != -inf``). Values of invisible keys are
    never read; those of visible keys are, even when their weight is 0 (NaN * 0 = NaN).
    """
    m_i, l_i, O_i = state
    if visible is None:
        visible = s_ij != -np.inf
    with np.errstate(invalid="ignore", over="ignore"):
        m_ij = np.max(s_ij, axis=-1) if s_ij.shape[-1] else np.full_like(m_i, -np.inf)
        m_new = np.maximum(m_i, m_ij)  # NaN stays NaN
        shift = _finite_or_zero(m_new)
        alpha = np.exp(m_i - shift)  # rescale of the old state; 0 when m_i = -inf
        p_ij = np.exp(s_ij - shift[..., None])  # 0 for invisible keys
        v_visible = np.where(np.asarray(visible)[..., None], v_j, np.zeros_like(v_j))
        l_new = alpha * l_i + np.sum(p_ij, axis=-1)
        O_new = alpha[..., None] * O_i + np.einsum("...n,...nd->...d", p_ij, v_visible)
    return SoftmaxState(m_new.astype(m_i.dtype), l_new.astype(l_i.dtype), O_new.astype(O_i.dtype))


def finalize(state: SoftmaxState) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(out, lse)``: ``O / l`` and ``m + log(l)``; ``(0, -inf)`` where ``l = 0`` (NaN stays NaN)."""
    m_i, l_i, O_i = state
    empty = l_i == 0
    safe_l = np.where(empty, np.ones_like(l_i), l_i)
    out = np.where(empty[..., None], np.zeros_like(O_i), O_i / safe_l[..., None])
    lse = np.where(empty, np.full_like(m_i, -np.inf), m_i + np.log(safe_l))
    return out, lse


def merge_states(
    out_a: np.ndarray, lse_a: np.ndarray, out_b: np.ndarray, lse_b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Merge two normalized partial results over disjoint key sets (exact, in float64).

    out_*: ``[..., D]``, lse_*: ``[...]``. A side with ``lse = -inf`` is empty and its
    ``out`` is ignored, even NaN; both empty gives ``out = 0, lse = -inf``. Nothing else is
    guarded: a NaN ``lse`` makes the row NaN, and a NaN in a non-empty side's ``out`` reaches
    the row even where that side's weight rounds to 0 (``0 * NaN`` is NaN), as in attention.
    Returns float64 ``(out, lse)``. Shapes must agree exactly (nothing is broadcast);
    raises :class:`PagedAttentionError` naming the argument that differs.
    """
    shape = np.shape(out_a)
    if np.ndim(out_a) < 1:
        raise PagedAttentionError("out_a", f"expected at least 1 dimension [..., head_dim], received shape {shape}")
    if np.shape(out_b) != shape:
        raise PagedAttentionError("out_b", f"shape {np.shape(out_b)} differs from out_a's {shape}")
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        if np.shape(lse) != shape[:-1]:
            raise PagedAttentionError(name, f"shape {np.shape(lse)} is not out_a's without head_dim, {shape[:-1]}")
    lse_a = np.asarray(lse_a, dtype=np.float64)
    lse_b = np.asarray(lse_b, dtype=np.float64)
    m = np.maximum(lse_a, lse_b)
    shift = _finite_or_zero(m)
    o_a = np.where(np.isneginf(lse_a)[..., None], 0.0, np.asarray(out_a, dtype=np.float64))
    o_b = np.where(np.isneginf(lse_b)[..., None], 0.0, np.asarray(out_b, dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore"):  # 0 * inf is NaN and inf overflows, as IEEE says
        w_a = np.exp(lse_a - shift)
        w_b = np.exp(lse_b - shift)
        total = w_a + w_b
        empty = total <= 0
        safe = np.where(empty, 1.0, total)
        out = (w_a[..., None] * o_a + w_b[..., None] * o_b) / safe[..., None]
        lse = np.where(empty, -np.inf, shift + np.log(safe))
    return out, lse
