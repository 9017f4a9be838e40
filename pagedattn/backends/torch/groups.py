"""Host-side planning of the torch backend: sequences grouped by ``q_len``, gather indices.

Sequences with the same ``q_len`` are attended together, at most :data:`GROUP_ELEMENTS`
elements of gathered queries, keys, values and scores at a time: their blocks are gathered
whole into a padded ``[num_seqs_g, Hkv, L_max, D]`` tensor. Only block-table columns below
``ceil(L / block_size)`` are read (see :mod:`pagedattn.spec.arrays`); padding columns
point at block 0, and every position ``p >= L`` is zeroed and masked after the gather,
so whatever those slots hold never reaches the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedattn.spec.arrays import AttentionProblem

#: How SDPA sees a group's gathered keys: all visible to every query, its own top-left
#: causal pattern, or an explicit boolean mask.
SDPA_PATTERNS: tuple[str, ...] = ("all", "causal", "mask")
#: Elements one group's gathered tensors hold, at most (its queries, keys, values and scores;
#: a group of one sequence may hold more keys and values, and attends its query rows in chunks
#: whose scores hold at most this many: ``GroupTensors.row_chunks``): a batch of a million
#: tokens, or one prefill of 65,536 queries over as many keys, then costs the device a few GiB
#: at a time, not several times its own size.
GROUP_ELEMENTS = 2**28


@dataclass(frozen=True)
class Group:
    """Sequences of one ``q_len`` and the host index arrays to gather and scatter them.

    The gathered keys are positions ``offset … L_max - 1`` (``offset`` a multiple of
    block_size: blocks wholly before every query's sliding window are not gathered).
    seqs: int64 ``[S_g]``; blocks: int64 ``[S_g, n]`` physical blocks of columns
    ``offset / block_size …`` (padding 0); valid: bool ``[S_g, L_max - offset]`` (``p < L``);
    tokens: int64 ``[S_g, q_len]`` rows of query/out; p_q: int64 ``[S_g, q_len]`` query
    positions; lengths: int64 ``[S_g]``; pattern: one of :data:`SDPA_PATTERNS`.
    """

    q_len: int
    seqs: np.ndarray
    blocks: np.ndarray
    valid: np.ndarray
    tokens: np.ndarray
    p_q: np.ndarray
    lengths: np.ndarray
    offset: int
    pattern: str

    @property
    def uniform(self) -> bool:
        """All sequences of the group have the same length L > 0 (no padding to zero or mask)."""
        return bool((self.lengths == self.lengths[0]).all() and self.lengths[0] > 0)


def sdpa_pattern(problem: AttentionProblem, q_len: int, lengths: np.ndarray, offset: int) -> str:
    """Which of :data:`SDPA_PATTERNS` the visible keys of a group follow."""
    if not ((lengths == lengths[0]).all() and lengths[0] > 0):
        return "mask"
    length, window = int(lengths[0]), problem.sliding_window
    # the last query (p_q = L - 1) has the narrowest window; q_len = 1 sees every p <= L - 1
    if (not problem.causal or q_len == 1) and (window is None or length - window <= offset):
        return "all"
    if problem.causal and window is None and offset == 0 and q_len == length:
        return "causal"  # p_q = j: SDPA's top-left causal pattern
    return "mask"


def plan_groups(problem: AttentionProblem) -> list[Group]:
    """Split the batch into groups of equal ``q_len``, each of at most :data:`GROUP_ELEMENTS`
    gathered elements (or one sequence).

    Sequences with ``q_len = 0``, or ``L = 0`` (decode padding: its query sees no key), are
    left out: their rows keep the initial ``out = 0``, ``lse = -inf``.
    """
    q_lens = problem.q_lens
    groups = []
    for q_len in np.unique(q_lens):
        seqs = np.flatnonzero((q_lens == q_len) & (problem.seq_lens > 0))
        if q_len == 0 or len(seqs) == 0:
            continue
        l_max = int(problem.seq_lens[seqs].max())
        per_seq = problem.num_q_heads * (problem.head_dim * (int(q_len) + 2 * l_max) + int(q_len) * l_max)
        size = max(1, GROUP_ELEMENTS // per_seq)
        groups += [_group(problem, int(q_len), seqs[i:i + size]) for i in range(0, len(seqs), size)]
    return groups


def _group(problem: AttentionProblem, q_len: int, seqs: np.ndarray) -> Group:
    """The group of sequences ``seqs``, all of ``q_len`` queries and at least one key."""
    bs = problem.block_size
    lengths = problem.seq_lens[seqs]
    l_max = int(lengths.max())
    offset = 0
    if problem.sliding_window is not None:  # lowest visible key: p > p_q - W for the first query
        lowest = np.maximum(lengths - int(q_len) + 1 - problem.sliding_window, 0)
        offset = int(lowest.min()) // bs * bs
    p = offset + np.arange(l_max - offset)
    valid = p[None, :] < lengths[:, None]
    column = np.arange(offset // bs, -(-l_max // bs))
    used = column[None, :] < -(-lengths[:, None] // bs)  # column < ceil(L / block_size)
    table = problem.block_tables[seqs][:, np.minimum(column, problem.max_blocks_per_seq - 1)]
    blocks = np.where(used, table, 0)
    j = np.arange(int(q_len))
    tokens = problem.query_start_loc[seqs][:, None] + j[None, :]
    p_q = lengths[:, None] - int(q_len) + j[None, :]
    pattern = sdpa_pattern(problem, int(q_len), lengths, offset)
    return Group(int(q_len), seqs, blocks, valid, tokens, p_q, lengths, offset, pattern)
