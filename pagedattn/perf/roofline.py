"""The least work a paged-attention call must do, from the spec (:mod:`pagedattn.spec.arrays`).

Bytes: the K and V blocks holding at least one visible key (each read once), the used
block-table entries and ``seq_lens`` (int32), the query and the output (and lse, float32,
when asked). FLOPs: ``4 * head_dim`` per visible (query head, key) pair: ``q . k`` and
``p * v``, a multiply and an add each. A time is then compared with
``max(bytes / read bandwidth, flops / matrix rate)``, the roofline floor.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedattn.spec.arrays import AttentionProblem
from pagedattn.spec.dtypes import numpy_dtype


@dataclass(frozen=True)
class Work:
    """Bytes to move and FLOPs to do; ``kv_bytes`` is the part of ``bytes`` read from the caches."""

    bytes: int
    flops: int
    kv_bytes: int
    visible_pairs: int  # visible (query token, key) pairs, per head

    def floor_seconds(self, read_bytes_per_s: float, flops_per_s: float) -> float:
        """The roofline floor: the larger of the memory time and the arithmetic time."""
        return max(self.bytes / read_bytes_per_s, self.flops / flops_per_s)


def visible_ranges(problem: AttentionProblem) -> tuple[np.ndarray, np.ndarray]:
    """int64 ``[T]`` arrays ``(lo, hi)``: query token ``t`` sees keys ``lo[t] <= p < hi[t]``."""
    seq_of_token, p_q = problem.token_positions()
    length = problem.seq_lens[seq_of_token]
    hi = np.minimum(p_q + 1, length) if problem.causal else length.copy()
    lo = np.zeros_like(hi)
    if problem.sliding_window is not None:
        lo = np.maximum(lo, p_q - problem.sliding_window + 1)
    return lo, np.maximum(hi, lo)


def work(problem: AttentionProblem) -> Work:
    """The bytes and FLOPs of ``problem`` (see the module docstring for what counts)."""
    lo, hi = visible_ranges(problem)
    pairs = int((hi - lo).sum())
    seq_of_token, _ = problem.token_positions()
    kv_blocks = 0
    table_entries = 0
    bs = problem.block_size
    for s in range(problem.num_seqs):
        tokens = seq_of_token == s
        table_entries += -(-int(problem.seq_lens[s]) // bs)
        if not tokens.any():
            continue
        first, last = int(lo[tokens].min()), int(hi[tokens].max())  # ranges grow with p_q: one span
        if last > first:
            kv_blocks += (last - 1) // bs - first // bs + 1
    cache_item = numpy_dtype(problem.cache_dtype).itemsize
    q_item = numpy_dtype(problem.dtype).itemsize
    kv_bytes = 2 * kv_blocks * bs * problem.num_kv_heads * problem.head_dim * cache_item
    q_bytes = problem.num_tokens * problem.num_q_heads * problem.head_dim * q_item
    lse_bytes = problem.num_tokens * problem.num_q_heads * 4 if problem.return_lse else 0
    index_bytes = 4 * (table_entries + problem.num_seqs + (0 if problem.is_decode else problem.num_seqs + 1))
    total = kv_bytes + 2 * q_bytes + lse_bytes + index_bytes
    flops = 4 * problem.head_dim * problem.num_q_heads * pairs
    return Work(bytes=total, flops=flops, kv_bytes=kv_bytes, visible_pairs=pairs)
