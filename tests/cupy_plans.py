"""The kernel and work plan a cupy backend built with given options makes, for the host-side
planning tests (``sm90``: planned as on an H100/H200, on any machine)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pagedattn.backends.cupy.options import CupyOptions
from pagedattn.backends.cupy.planning import KernelChoice, WorkPlan, build_work, choose_kernel
from pagedattn.spec.arrays import AttentionProblem, check_paged_attention
from pagedattn.spec.dtypes import numpy_dtype


def shape_problem(seq_lens: Sequence[int], q_lens: Sequence[int] | None = None, *, num_q_heads: int = 8,
                  num_kv_heads: int = 2, head_dim: int = 128, block_size: int = 16, dtype: str = "bfloat16",
                  cache_dtype: str | None = None) -> AttentionProblem:
    """The validated problem of a call over ``seq_lens`` (``q_lens`` None: decode) whose query and
    NHD caches are zero-stride views: planning reads their shapes and dtypes only, so a problem of
    a gigabyte of K/V costs no memory. Each sequence's blocks are consecutive in the pool."""
    blocks = [-(-n // block_size) for n in seq_lens]
    width = max(blocks)
    tables = np.zeros((len(seq_lens), width), dtype=np.int32)
    for s, (start, count) in enumerate(zip(np.cumsum([0, *blocks[:-1]]), blocks, strict=True)):
        tables[s, :count] = np.arange(start, start + count)
    starts = np.cumsum([0, *(q_lens if q_lens is not None else [1] * len(seq_lens))]).astype(np.int32)
    cache = np.broadcast_to(np.zeros((), numpy_dtype(cache_dtype or dtype)),
                            (sum(blocks), block_size, num_kv_heads, head_dim))
    query = np.broadcast_to(np.zeros((), numpy_dtype(dtype)), (int(starts[-1]), num_q_heads, head_dim))
    return check_paged_attention(query, cache, cache, tables, np.asarray(seq_lens, dtype=np.int32),
                                 None if q_lens is None else starts)


def kernel_of(problem: AttentionProblem, *, sm90: bool = False, **options: Any) -> KernelChoice:
    """The kernel ``CupyBackend(**options)`` picks for ``problem``."""
    return choose_kernel(problem, CupyOptions(**options), sm90=sm90)


def rows_of(problem: AttentionProblem, *, sm90: bool = False, **options: Any) -> int:
    """Rows per CTA of that kernel."""
    return kernel_of(problem, sm90=sm90, **options).rows


def work_of(problem: AttentionProblem, *, sm90: bool = False, slots: int = 132, min_tiles_per_split: int = 4,
            **options: Any) -> WorkPlan:
    """The work plan of ``CupyBackend(**options)`` for ``slots`` resident CTAs."""
    choice = kernel_of(problem, sm90=sm90, **options)
    split_kv = options.get("split_kv", True)
    return build_work(problem, choice, slots=slots, min_tiles_per_split=min_tiles_per_split, split_kv=split_kv,
                      num_splits=options.get("num_splits") or None)
