"""The cache operations of the contract on NumPy arrays: write_kv and copy_blocks.

``write_kv`` stores token ``t``'s key/value at slot ``slot_mapping[t] = block * block_size
+ offset`` (-1 = skip), as ``x / scale`` rounded to the cache's dtype. ``copy_blocks``
copies whole blocks ``src -> dst`` for copy-on-write, reading every source first.
Both validate first and change nothing when they raise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.spec.arrays import check_copy_blocks, check_write_kv
from pagedattn.spec.dtypes import numpy_dtype


def slot_view(cache: np.ndarray, kv_layout: str) -> np.ndarray:
    """Return the cache as ``[num_blocks, block_size, num_kv_heads, head_dim]`` (a view)."""
    return cache if kv_layout == "NHD" else np.swapaxes(cache, 1, 2)


def write_kv(
    key: np.ndarray,
    value: np.ndarray,
    key_cache: np.ndarray,
    value_cache: np.ndarray,
    slot_mapping: np.ndarray,
    *,
    kv_layout: str = "NHD",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> None:
    """Write ``key``/``value`` ``[T, Hkv, D]`` into the caches in place at ``slot_mapping``."""
    problem = check_write_kv(
        key, value, key_cache, value_cache, slot_mapping,
        kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale,
    )
    tokens, blocks, offsets = written_slots(problem.slot_mapping, problem.block_size)
    cache_dtype = numpy_dtype(problem.cache_dtype)
    for cache, x, scale in ((key_cache, key, problem.k_scale), (value_cache, value, problem.v_scale)):
        stored = (np.asarray(x)[tokens].astype(np.float64) / scale).astype(cache_dtype)
        slot_view(cache, kv_layout)[blocks, offsets] = stored


def written_slots(slot_mapping: np.ndarray, block_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(tokens, blocks, offsets)`` of the tokens ``write_kv`` writes (slot not -1), int64."""
    tokens = np.flatnonzero(np.asarray(slot_mapping) >= 0)
    slots = np.asarray(slot_mapping)[tokens].astype(np.int64)
    return tokens, slots // block_size, slots % block_size


def copy_blocks(key_cache: np.ndarray, value_cache: np.ndarray, pairs: Any, *, kv_layout: str = "NHD") -> None:
    """Copy blocks ``pairs[i] = (src, dst)`` in both caches, in place; sources read first."""
    table = check_copy_blocks(key_cache, value_cache, pairs, kv_layout=kv_layout)
    for cache in (key_cache, value_cache):
        sources = cache[table[:, 0]].copy()
        cache[table[:, 1]] = sources
