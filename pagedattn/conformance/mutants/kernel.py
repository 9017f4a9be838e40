"""A kernel-style paged attention split into small overridable steps: the base of the mutants.

It computes what :mod:`pagedattn.reference.paged` computes (per sequence, block by block,
online softmax in float32), with each step a method so that a mutant changes one step.
The unmodified :class:`SteppedKernelBackend` passes the conformance suite; each mutant in
:mod:`pagedattn.conformance.mutants.attention` overrides one method with one realistic bug.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from pagedattn.backends.interface import Plan
from pagedattn.backends.numpy.backend import NumpyBackend
from pagedattn.spec.arrays import AttentionProblem
from pagedattn.spec.kv_ops import slot_view

F32 = np.float32
#: The online-softmax state (m, l, O) of a part of a sequence's keys.
State = tuple[np.ndarray, np.ndarray, np.ndarray]


def read_with_strides(array: np.ndarray, strides: tuple[int, ...]) -> np.ndarray:
    """``array``'s memory read with other byte ``strides``, as wrong address arithmetic reads it."""
    # as_strided needs a numpy dtype
    bits = array.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[array.itemsize])
    return np.lib.stride_tricks.as_strided(bits, shape=array.shape, strides=strides).view(array.dtype)


def read_as_dense(array: np.ndarray) -> np.ndarray:
    """``array``'s memory read from its first element with the strides of a dense array of its
    shape, as a kernel that ignores the strides it is given reads a view."""
    return read_with_strides(array, tuple(int(np.prod(array.shape[i + 1:])) * array.itemsize
                                          for i in range(array.ndim)))


class SteppedKernelBackend(NumpyBackend):
    """NumPy paged attention in overridable steps (not registered; see the mutants catalog)."""

    name = "stepped-kernel"
    description = "the reference algorithm in overridable steps (base of the mutants)"
    #: One line: the bug this variant has ("" for the correct base).
    bug: ClassVar[str] = ""
    #: The public reports of the same kind of bug.
    models: ClassVar[str] = ""
    #: The test function of the conformance suite that fails first under the ``quick`` profile, its
    #: modules run in :data:`~pagedattn.conformance.mutants.run.SUITE_MODULES`' order (the kill
    #: table's last column); for a mutant of ``mutants/plans.py``, the first in ``test_plans``.
    killed_by: ClassVar[str] = ""

    # -- steps ------------------------------------------------------------------------------
    def queries(self, query: Any, problem: AttentionProblem) -> np.ndarray:
        """The query ``[T, Hq, D]`` as the kernel reads it: by its strides."""
        return np.asarray(query)

    def table_row(self, plan: Plan, s: int) -> np.ndarray:
        """Sequence ``s``'s row of the block table, as the plan holds it."""
        return plan.problem.block_tables[s]

    def scale(self, problem: AttentionProblem) -> float:
        return problem.scale

    def slots(self, cache: Any, problem: AttentionProblem) -> np.ndarray:
        """The cache as [num_blocks, block_size, num_kv_heads, head_dim]."""
        return slot_view(np.asarray(cache), problem.kv_layout)

    def block_size(self, problem: AttentionProblem) -> int:
        return problem.block_size

    def kv_heads(self, problem: AttentionProblem) -> np.ndarray:
        """KV head read by each query head."""
        return np.arange(problem.num_q_heads) // problem.group_size

    def query_positions(self, problem: AttentionProblem) -> np.ndarray:
        """p_q of each query token."""
        return problem.token_positions()[1]

    def logical_blocks(self, length: int, block_size: int, p_q: np.ndarray, problem: AttentionProblem) -> list[int]:
        """Logical blocks j to visit: the ceil(L / block_size) that hold keys."""
        return list(range(-(-length // block_size)))

    def physical_block(self, row: np.ndarray, j: int) -> int:
        return int(row[j])

    def scores(self, q: np.ndarray, k: np.ndarray, problem: AttentionProblem) -> np.ndarray:
        """s_ij [n, Hq, bs] from q [n, Hq, D] (scaled) and k [bs, Hq, D]."""
        return np.einsum("nhd,bhd->nhb", q, k).astype(F32, copy=False)

    def transform(self, s_ij: np.ndarray, p: np.ndarray, p_q: np.ndarray, visible: np.ndarray,
                  problem: AttentionProblem) -> np.ndarray:
        """Softcap then ALiBi (the contract's steps 2 and 3)."""
        if problem.softcap is not None:
            cap = F32(problem.softcap)
            s_ij = cap * np.tanh(s_ij / cap)
        if problem.alibi_slopes is not None:
            distance = (p[None, :] - p_q[:, None]).astype(F32)
            s_ij = s_ij + problem.alibi_slopes[None, :, None] * distance[:, None, :]
        return s_ij.astype(F32, copy=False)

    def visible(self, p: np.ndarray, p_q: np.ndarray, length: int, problem: AttentionProblem) -> np.ndarray:
        """bool [n, bs]: p < L, causal p <= p_q, window p > p_q - W."""
        vis = np.empty((len(p_q), len(p)), dtype=bool)
        vis[...] = p < length
        if problem.causal:
            vis &= p[None, :] <= p_q[:, None]
        if problem.sliding_window is not None:
            vis &= p[None, :] > p_q[:, None] - problem.sliding_window
        return vis

    def initial_max(self) -> float:
        """The running max m before any key."""
        return -np.inf

    def exp(self, x: np.ndarray) -> np.ndarray:
        """The online softmax's exponential, e**x (of score minus running max)."""
        return np.exp(x)

    def mask(self, s_ij: np.ndarray, visible: np.ndarray) -> np.ndarray:
        return np.where(visible[:, None, :], s_ij, F32(-np.inf))

    def update(self, m: np.ndarray, l: np.ndarray, O: np.ndarray, s_ij: np.ndarray, visible: np.ndarray,
               v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Online-softmax step: s_ij [n, Hq, bs] masked, v [bs, Hq, D] -> new (m, l, O)."""
        with np.errstate(invalid="ignore", over="ignore"):  # NaN/inf the row sees propagate
            m_new = np.maximum(m, self.tile_max(s_ij, visible))
            shift = self.row_shift(m_new)
            alpha = self.exp(m - shift)
            p_ij = self.exp(s_ij - shift[..., None])
            l_new = alpha * l + p_ij.sum(axis=-1)
            O_new = self.output_rescale(alpha, m, m_new)[..., None] * O + self.weighted_values(p_ij, visible, v)
        return m_new.astype(F32, copy=False), l_new.astype(F32, copy=False), O_new.astype(F32, copy=False)

    def row_shift(self, m_new: np.ndarray) -> np.ndarray:
        """What a row's scores are shifted by before exp: its running max, 0 where that is -inf (the
        ``m = -inf`` guard: no key seen yet, or every score -inf)."""
        return np.where(np.isneginf(m_new), F32(0), m_new)

    def output_rescale(self, alpha: np.ndarray, m: np.ndarray, m_new: np.ndarray) -> np.ndarray:
        """The factor [n, Hq] O is rescaled by when the running max goes from m to m_new: alpha itself."""
        return alpha

    def tile_max(self, s_ij: np.ndarray, visible: np.ndarray) -> np.ndarray:
        """The row max [n, Hq] of a block's masked scores s_ij [n, Hq, bs] (NaN propagates)."""
        return s_ij.max(axis=-1)

    def weighted_values(self, p_ij: np.ndarray, visible: np.ndarray, v: np.ndarray) -> np.ndarray:
        """sum_b p_ij v_b [n, Hq, D], each row reading only the values it sees (NaN * 0 would be NaN)."""
        values = v.transpose(1, 0, 2)[None]  # [1, Hq, bs, D]
        if visible.all():  # nothing to hide: the values as they are, unbroadcast
            return np.einsum("nhb,nhbd->nhd", p_ij, np.broadcast_to(values, (len(p_ij), *values.shape[1:])))
        seen = np.where(visible[:, None, :, None], values, F32(0))  # [n, Hq, bs, D]
        return np.einsum("nhb,nhbd->nhd", p_ij, seen)

    def finalize(self, m: np.ndarray, l: np.ndarray, O: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        empty = l == 0  # a NaN l stays NaN
        safe = np.where(empty, F32(1), l)
        out = np.where(empty[..., None], F32(0), O / safe[..., None])
        lse = np.where(empty, F32(-np.inf), m + np.log(safe))
        return out, lse.astype(F32)

    # -- the kernel -----------------------------------------------------------------------------
    def read_block(self, slots: np.ndarray, row: np.ndarray, j: int, problem: AttentionProblem) -> np.ndarray:
        """Logical block ``j`` of a sequence whose block-table row is ``row``, from the slot view ``slots``."""
        return slots[self.physical_block(row, j)]

    def parts(self, blocks: list[int], length: int, problem: AttentionProblem) -> list[list[int]]:
        """The logical blocks cut into parts, each with its own (m, l, O): one part, no split."""
        return [blocks]

    def merge(self, states: list[State]) -> State:
        """The parts' (m, l, O) as one: the single part's own."""
        return states[0]

    def _run(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> tuple[Any, Any]:
        pr = plan.problem
        query = self.queries(query, pr)
        T, Hq, D = pr.num_tokens, pr.num_q_heads, pr.head_dim
        bs = self.block_size(pr)
        out = np.zeros((T, Hq, D), dtype=query.dtype)
        lse = np.full((T, Hq), -np.inf, dtype=F32)
        k_slots, v_slots = self.slots(key_cache, pr), self.slots(value_cache, pr)
        heads = self.kv_heads(pr)
        p_q_all = self.query_positions(pr)
        self.query_dtype = query.dtype  # the kernel's 16-bit type, for the variants that use one
        self.cache_dtype = pr.cache_dtype  # the kernel's path (fp8 or not), for the variants of one path
        q_all = query.astype(F32) * F32(self.scale(pr))
        for s in range(pr.num_seqs):
            start, stop = int(pr.query_start_loc[s]), int(pr.query_start_loc[s + 1])
            if stop == start:
                continue
            length = int(pr.seq_lens[s])
            q, p_q = q_all[start:stop], p_q_all[start:stop]
            n = stop - start
            row = self.table_row(plan, s)
            states: list[State] = []
            for part in self.parts(self.logical_blocks(length, bs, p_q, pr), length, pr):
                m = np.full((n, Hq), self.initial_max(), dtype=F32)
                l = np.zeros((n, Hq), dtype=F32)
                O = np.zeros((n, Hq, D), dtype=F32)
                for j in part:
                    k = self.read_block(k_slots, row, j, pr).astype(F32)[:, heads] * F32(pr.k_scale)  # [bs, Hq, D]
                    v = self.read_block(v_slots, row, j, pr).astype(F32)[:, heads] * F32(pr.v_scale)
                    p = j * bs + np.arange(k.shape[0])
                    vis = self.visible(p, p_q, length, pr)
                    s_ij = self.transform(self.scores(q, k, pr), p, p_q, vis, pr)
                    m, l, O = self.update(m, l, O, self.mask(s_ij, vis), vis, v)
                states.append((m, l, O))
            o, lse_s = self.finalize(*(self.merge(states) if states else self.merge([(m, l, O)])))
            out[start:stop] = o.astype(query.dtype)
            lse[start:stop] = lse_s
        return out, (lse if pr.return_lse else None)
