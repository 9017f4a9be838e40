"""Host-side planning of the torch backend: sequences grouped by ``q_len``, gather indices.

Sequences with the same ``q_len`` are attended together: their keys are gathered into a
padded ``[num_seqs_g, L_max, Hkv, D]`` tensor. Only block-table columns below
``ceil(L / block_size)`` are read (see :mod:`pagedattn.spec.arrays`); padding positions
point at slot 0 of block 0 and are zeroed and masked after the gather.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedattn.spec.arrays import AttentionProblem


@dataclass(frozen=True)
class Group:
    """Sequences of one ``q_len`` and the host index arrays to gather and scatter them.

    seqs: int64 ``[S_g]``; blocks, slots: int64 ``[S_g, L_max]`` (padding 0);
    valid: bool ``[S_g, L_max]`` (``p < L``); tokens: int64 ``[S_g, q_len]`` rows of query/out;
    p_q: int64 ``[S_g, q_len]`` query positions; lengths: int64 ``[S_g]``.
    """

    q_len: int
    seqs: np.ndarray
    blocks: np.ndarray
    slots: np.ndarray
    valid: np.ndarray
    tokens: np.ndarray
    p_q: np.ndarray
    lengths: np.ndarray

    @property
    def uniform(self) -> bool:
        """All sequences of the group have the same length (no padding mask needed)."""
        return bool((self.lengths == self.lengths[0]).all())


def plan_groups(problem: AttentionProblem) -> list[Group]:
    """Split the batch into groups of equal ``q_len`` (sequences with ``q_len = 0`` dropped)."""
    q_lens = problem.q_lens
    groups = []
    for q_len in np.unique(q_lens):
        if q_len == 0:
            continue
        seqs = np.flatnonzero(q_lens == q_len)
        lengths = problem.seq_lens[seqs]
        l_max = max(int(lengths.max()), 1)
        p = np.arange(l_max)
        valid = p[None, :] < lengths[:, None]
        columns = np.where(valid, p // problem.block_size, 0)
        if problem.max_blocks_per_seq == 0:  # every sequence empty: nothing to look up
            blocks = np.zeros_like(columns)
        else:
            blocks = np.take_along_axis(problem.block_tables[seqs], columns, axis=1)
            blocks = np.where(valid, blocks, 0)
        slots = np.where(valid, p % problem.block_size, 0)
        j = np.arange(int(q_len))
        tokens = problem.query_start_loc[seqs][:, None] + j[None, :]
        p_q = lengths[:, None] - int(q_len) + j[None, :]
        groups.append(Group(int(q_len), seqs, blocks, slots, valid, tokens, p_q, lengths))
    return groups
