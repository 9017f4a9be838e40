"""Paged-attention cases with poisoned pools, shared by the cupy GPU check and its tests.

A case holds host (NumPy) arrays from :func:`pagedattn.spec.pools.random_paged_inputs`:
physical blocks in random order, NaN and +-inf in unused slots and blocks, wild ids (-1,
2**31-1, -2**31) in block-table columns past ``ceil(L / block_size)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pagedattn.spec.pools import random_paged_inputs


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

    def args(self) -> tuple[Any, ...]:
        """The positional arguments of ``paged_attention`` / ``exact_attention``."""
        return (self.query, self.key_cache, self.value_cache, self.block_tables, self.seq_lens,
                self.query_start_loc)


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

    The arrays are :func:`pagedattn.spec.pools.random_paged_inputs` with ``"wild"`` garbage
    (NaN and +-inf in every slot a backend must not read, wild ids in unused block-table
    columns), seeded from ``rng``. ``cache_dtype`` (default ``dtype``) may be an fp8 dtype; pass
    ``k_scale``/``v_scale`` in ``options`` then."""
    inputs = random_paged_inputs(
        seq_lens,
        q_lens,
        block_size=block_size,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype=dtype,
        cache_dtype=cache_dtype,
        kv_layout=kv_layout,
        seed=int(rng.integers(2**31)),
        garbage="wild",
    )
    return Case(
        name,
        inputs.query,
        inputs.key_cache,
        inputs.value_cache,
        inputs.block_tables,
        inputs.seq_lens,
        inputs.query_start_loc,
        {"kv_layout": kv_layout, **options},
        pool_view,
        split_kv,
    )
