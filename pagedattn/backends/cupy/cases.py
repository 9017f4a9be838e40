"""Paged-attention cases with poisoned pools, shared by the cupy GPU check and its tests.

A case holds host (NumPy) arrays: caches whose unused slots and blocks are NaN, block-table
columns past ``ceil(L / block_size)`` set to -1 or 2**31-1, physical blocks in random order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pagedattn.spec.dtypes import numpy_dtype


@dataclass
class Case:
    """One call: host arrays and options; ``query_start_loc`` None means decode."""

    name: str
    query: np.ndarray
    key_cache: np.ndarray
    value_cache: np.ndarray
    block_tables: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray | None
    options: dict[str, Any] = field(default_factory=dict)
    pool_view: bool = False  # run on HND views of a [blocks, 2, layers, Hkv, bs, D] pool
    #: False: plan without split-KV, so one CTA walks each whole (long) range
    split_kv: bool = True


def make_case(
    name: str,
    rng: np.random.Generator,
    *,
    seq_lens: list[int],
    q_lens: list[int] | None = None,
    num_q_heads: int = 8,
    num_kv_heads: int = 2,
    head_dim: int = 128,
    block_size: int = 16,
    dtype: str = "bfloat16",
    kv_layout: str = "NHD",
    pool_view: bool = False,
    split_kv: bool = True,
    cache_dtype: str | None = None,
    **options: Any,
) -> Case:
    """Build a case; ``q_lens`` None is decode (one query per sequence, ``L = 0`` allowed).

    ``cache_dtype`` (default ``dtype``) may be an fp8 dtype; pass ``k_scale``/``v_scale`` in
    ``options`` then."""
    lens = np.asarray(seq_lens, dtype=np.int32)
    blocks_per_seq = -(-lens // block_size)
    max_blocks = max(1, int(blocks_per_seq.max(initial=0)) + 1)
    num_blocks = int(blocks_per_seq.sum()) + 3
    order = rng.permutation(num_blocks)
    tables = np.where(np.arange(max_blocks) % 2 == 0, -1, 2**31 - 1)[None, :].repeat(len(lens), 0)
    tables = tables.astype(np.int32)
    kv_dtype = numpy_dtype(dtype)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)  # NHD while filling
    key = np.full(shape, np.nan, dtype=np.float32)
    value = np.full(shape, np.nan, dtype=np.float32)
    used = 0
    for s, L in enumerate(lens):
        for j in range(int(blocks_per_seq[s])):
            block = order[used]
            used += 1
            tables[s, j] = block
            slots = min(block_size, int(L) - j * block_size)
            key[block, :slots] = rng.standard_normal((slots, num_kv_heads, head_dim))
            value[block, :slots] = rng.standard_normal((slots, num_kv_heads, head_dim))
    if kv_layout == "HND":
        key, value = key.transpose(0, 2, 1, 3).copy(), value.transpose(0, 2, 1, 3).copy()
    if q_lens is None:
        starts = None
        num_tokens = len(lens)
    else:
        starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        num_tokens = int(starts[-1])
    query = rng.standard_normal((num_tokens, num_q_heads, head_dim)).astype(kv_dtype)
    options = {"kv_layout": kv_layout, **options}
    return Case(
        name,
        query,
        key.astype(numpy_dtype(cache_dtype or dtype)),
        value.astype(numpy_dtype(cache_dtype or dtype)),
        tables,
        lens,
        starts,
        options,
        pool_view,
        split_kv,
    )
