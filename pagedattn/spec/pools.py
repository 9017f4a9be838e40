"""Paged inputs built from a seed: the block-table layout in constructive form, for checks.

:func:`random_paged_inputs` lays random K/V out in a pool whose physical blocks are in
random order, one block table row per sequence (-1 past its blocks), and random queries.
With ``garbage`` it fills every slot a conforming backend never reads (positions ``>= L`` of
a used block, and spare blocks), and with ``"wild"`` also the unused block-table entries,
so reading any of them shows in the output. The hypothesis strategies of the conformance
suite draw the same things one by one; this is the fixed-shape form for unit tests and
device checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.errors import PagedAttentionError
from pagedattn.spec.case import AttentionCase
from pagedattn.spec.dtypes import numpy_dtype
from pagedattn.spec.kv_ops import slot_view

#: What fills unread memory: nothing, NaN, or NaN/+-inf with wild block-table entries.
GARBAGE_KINDS = ("none", "nan", "wild")
#: Unused block-table entries under ``"wild"``: unused, past int32, and negative.
WILD_BLOCK_IDS = (-1, 2**31 - 1, -(2**31))


def random_paged_inputs(
    seq_lens: list[int] | tuple[int, ...],
    q_lens: list[int] | tuple[int, ...] | None = None,
    *,
    block_size: int = 16,
    num_q_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 16,
    dtype: str = "float32",
    cache_dtype: str | None = None,
    kv_layout: str = "NHD",
    spare_blocks: int = 3,
    spare_columns: int = 1,
    seed: int = 0,
    garbage: str = "none",
    name: str = "",
    **options: Any,
) -> AttentionCase:
    """Standard-normal K/V and queries in shuffled blocks; ``q_lens=None`` is decode.

    ``options`` (the call's keyword options besides ``kv_layout``) go into the case's
    options; ``name`` into its labels.

    The pool has ``spare_blocks`` blocks no sequence uses, and the block table
    ``spare_columns`` columns past the longest sequence's blocks. ``garbage`` (one of
    :data:`GARBAGE_KINDS`) fills what must never be read, after every other draw, so the
    read data do not depend on it.
    """
    if garbage not in GARBAGE_KINDS:
        raise PagedAttentionError("garbage", f"expected one of {GARBAGE_KINDS}, received {garbage!r}")
    rng = np.random.default_rng(seed)
    needed = [-(-int(length) // block_size) for length in seq_lens]
    num_blocks = sum(needed) + spare_blocks
    max_blocks = max([*needed, 1]) + spare_columns
    perm = rng.permutation(num_blocks)
    tables = np.full((len(seq_lens), max_blocks), -1, dtype=np.int32)
    used = 0
    for s, n in enumerate(needed):
        tables[s, :n] = perm[used:used + n]
        used += n
    shape = ((num_blocks, block_size, num_kv_heads, head_dim) if kv_layout == "NHD"
             else (num_blocks, num_kv_heads, block_size, head_dim))
    cdt = numpy_dtype(cache_dtype or dtype)
    key_cache = rng.standard_normal(shape).astype(cdt)
    value_cache = rng.standard_normal(shape).astype(cdt)
    if q_lens is None:
        starts, num_tokens = None, len(seq_lens)
    else:
        starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
        num_tokens = int(starts[-1])
    query = rng.standard_normal((num_tokens, num_q_heads, head_dim)).astype(numpy_dtype(dtype))
    if garbage != "none":
        read = np.zeros((num_blocks, block_size), dtype=bool)
        for s, length in enumerate(seq_lens):
            positions = np.arange(int(length))
            read[tables[s, positions // block_size], positions % block_size] = True
        slots_k, slots_v = slot_view(key_cache, kv_layout), slot_view(value_cache, kv_layout)
        if garbage == "nan":
            slots_k[~read] = np.nan
            slots_v[~read] = np.nan
        else:
            for s, n in enumerate(needed):
                tables[s, n:] = rng.choice(WILD_BLOCK_IDS, size=max_blocks - n)
            junk = rng.choice(np.array([np.nan, np.inf, -np.inf]), size=(int((~read).sum()), *slots_k.shape[2:]))
            slots_k[~read] = junk.astype(cdt)
            slots_v[~read] = junk.astype(cdt)
    return AttentionCase(query, key_cache, value_cache, tables, np.asarray(seq_lens, dtype=np.int32), starts,
                         {"kv_layout": kv_layout, **options}, seed=seed, labels={"name": name} if name else {})


def in_pool(case: AttentionCase, *, num_layers: int = 2, layer: int = 1) -> AttentionCase:
    """The same call on strided views ``pool[:, 0, layer]`` / ``pool[:, 1, layer]`` of a NaN-filled
    multi-layer pool ``[num_blocks, 2, num_layers, ...]`` (as engines keep one pool for all layers)."""
    pool = np.full((case.key_cache.shape[0], 2, num_layers, *case.key_cache.shape[1:]), np.nan,
                   dtype=np.float32).astype(case.key_cache.dtype)
    pool[:, 0, layer], pool[:, 1, layer] = case.key_cache, case.value_cache
    return case.replace(pool=pool, layer=layer)


# -- pools above 2**31 elements ----------------------------------------------------------

#: Elements of a cache past which an int32 element offset overflows.
INT32_OFFSET_LIMIT = 2**31
#: Elements past which an unsigned 32-bit element offset wraps.
UINT32_OFFSET_LIMIT = 2**32


def blocks_past(min_elements: int, block_elements: int) -> int:
    """The smallest odd ``num_blocks`` whose pool holds more than ``min_elements`` elements.

    Odd, so that the pool's block count is no power of two either.
    """
    num_blocks = min_elements // block_elements + 1
    return num_blocks if num_blocks % 2 else num_blocks + 1


def lazy_cache(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """A zero cache of ``shape`` that costs memory only where it is written.

    ``np.zeros`` takes pages from the operating system on first touch (calloc), and the
    contract's never-read rules mean a conforming backend touches only the blocks in use, so
    a pool of 2**31 elements costs the blocks a case fills, not gigabytes.
    """
    return np.zeros(shape, dtype=numpy_dtype(dtype))


def lazy_copy(cache: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """A copy of ``cache`` (axis 0: blocks) that holds its ``blocks`` and zeros elsewhere, lazily.

    The copy of a huge pool whose other blocks are zero, at the cost of those blocks.
    """
    copy = np.zeros(cache.shape, dtype=cache.dtype)
    ids = np.unique(np.asarray(blocks, dtype=np.int64))
    copy[ids] = cache[ids]
    return copy


def occupied_blocks(cache: np.ndarray, *, chunk: int = 4096) -> np.ndarray:
    """int64 ids of the blocks (axis 0) with any non-zero bit, read a chunk of blocks at a time."""
    bits = cache.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[cache.dtype.itemsize])
    found = []
    for start in range(0, cache.shape[0], chunk):
        part = bits[start:start + chunk].reshape(min(chunk, cache.shape[0] - start), -1)
        found.append(start + np.flatnonzero(part.any(axis=1)))
    return np.concatenate(found) if found else np.zeros(0, np.int64)
