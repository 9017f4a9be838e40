"""Host-side planning of the torch backend: sequences grouped by ``q_len``, gather indices.

Sequences with the same ``q_len`` are attended together: their blocks are gathered whole
into a padded ``[num_seqs_g, Hkv, L_max, D]`` tensor. Only block-table columns below
``ceil(L / block_size)`` are read (see :mod:`pagedattn.spec.arrays`); padding columns
point at block 0, and every position ``p >= L`` is zeroed and masked after the gather,
so whatever those slots hold never reaches the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedattn.spec.arrays import AttentionProblem


@dataclass(frozen=True)
class Group:
    """Sequences of one ``q_len`` and the host index arrays to gather and scatter them.

    seqs: int64 ``[S_g]``; blocks: int64 ``[S_g, ceil(L_max / block_size)]`` physical blocks
    (padding 0);
    valid: bool ``[S_g, L_max]`` (``p < L``); tokens: int64 ``[S_g, q_len]`` rows of query/out;
    p_q: int64 ``[S_g, q_len]`` query positions; lengths: int64 ``[S_g]``.
    """

    q_len: int
    seqs: np.ndarray
    blocks: np.ndarray
    valid: np.ndarray
    tokens: np.ndarray
    p_q: np.ndarray
    lengths: np.ndarray

    @property
    def uniform(self) -> bool:
        """All sequences of the group have the same length L > 0 (no padding to zero or mask)."""
        return bool((self.lengths == self.lengths[0]).all() and self.lengths[0] > 0)


def plan_groups(problem: AttentionProblem) -> list[Group]:
    """Split the batch into groups of equal ``q_len``.

    Sequences with ``q_len = 0``, or ``L = 0`` (decode padding: its query sees no key), are
    left out: their rows keep the initial ``out = 0``, ``lse = -inf``.
    """
    q_lens = problem.q_lens
    groups = []
    for q_len in np.unique(q_lens):
        seqs = np.flatnonzero((q_lens == q_len) & (problem.seq_lens > 0))
        if q_len == 0 or len(seqs) == 0:
            continue
        lengths = problem.seq_lens[seqs]
        l_max = max(int(lengths.max()), 1)
        p = np.arange(l_max)
        valid = p[None, :] < lengths[:, None]
        width = -(-l_max // problem.block_size)
        column = np.arange(width)
        used = column[None, :] < -(-lengths[:, None] // problem.block_size)  # column < ceil(L / block_size)
        if problem.max_blocks_per_seq == 0:  # every sequence empty: nothing to look up
            blocks = np.zeros((len(seqs), width), dtype=np.int64)
        else:
            table = problem.block_tables[seqs][:, np.minimum(column, problem.max_blocks_per_seq - 1)]
            blocks = np.where(used, table, 0)
        j = np.arange(int(q_len))
        tokens = problem.query_start_loc[seqs][:, None] + j[None, :]
        p_q = lengths[:, None] - int(q_len) + j[None, :]
        groups.append(Group(int(q_len), seqs, blocks, valid, tokens, p_q, lengths))
    return groups
