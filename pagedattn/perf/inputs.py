"""Host arrays of benchmark cases: one K/V pool per batch, cut into rotated regions.

A :class:`Pool` serves every block size of one (model, kind, batch, context, dtype, cache
dtype): its caches are flat ``[num_slots, Hkv, D]`` NHD slot arrays, in the case's cache
dtype (fp8 included), that a backend receives once and views as
``[num_slots / block_size, block_size, Hkv, D]``. The pool holds ``rotations``
disjoint regions, each with its own shuffled block tables and query, so consecutive timed
runs read different memory and the L2 cache does not flatter small cases. Values are a
random (never zero, always finite) pattern tiled over the pool. :func:`attention_case` gives one rotation's
call as the spec's :class:`~pagedattn.spec.case.AttentionCase`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pagedattn.perf.shapes import BLOCK_SIZES, Case
from pagedattn.spec.case import AttentionCase
from pagedattn.spec.dtypes import FP8_DTYPES, numpy_dtype

PATTERN_LENGTH = (1 << 22) + 17  # random values tiled over the pool (prime-ish: no slot alignment)
FP8_SMALLEST = 2.0**-4  # magnitude an fp8 pattern value is raised to at least, so none rounds to zero
SLOT_ALIGN = max(BLOCK_SIZES)  # each sequence's region is a multiple of every block size


@dataclass(frozen=True)
class Pool:
    """Caches ``[num_slots, Hkv, D]`` and per-rotation queries ``[T, Hq, D]`` of one batch."""

    key: tuple[object, ...]
    key_cache: np.ndarray
    value_cache: np.ndarray
    queries: list[np.ndarray]
    slots_per_seq: int
    batch: int

    @property
    def rotations(self) -> int:
        return len(self.queries)

    @property
    def num_slots(self) -> int:
        return int(self.key_cache.shape[0])


def pool_key(case: Case) -> tuple[object, ...]:
    """Cases with equal keys share a pool (they differ in block size, block order or fp8 scales only)."""
    return (case.model.name, case.kind, case.chunk, case.batch, case.context, case.dtype, case.cache_dtype)


def kv_bytes_per_rotation(case: Case) -> int:
    """Bytes of K and V that one rotation's batch holds (in the cache's dtype)."""
    item = numpy_dtype(case.cache_dtype).itemsize
    return 2 * case.batch * case.context * case.model.num_kv_heads * case.model.head_dim * item


def rotations_for(case: Case, flush_bytes: int, max_rotations: int = 32) -> int:
    """Rotations so that the regions together hold at least ``flush_bytes`` (at least 1)."""
    return max(1, min(max_rotations, math.ceil(flush_bytes / max(1, kv_bytes_per_rotation(case)))))


def _tiled(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    pattern = rng.standard_normal(PATTERN_LENGTH)
    if dtype in FP8_DTYPES:  # standard normals lie far inside both fp8 ranges; only tiny ones need care
        pattern = np.copysign(np.maximum(np.abs(pattern), FP8_SMALLEST), pattern)
    return np.resize(pattern.astype(numpy_dtype(dtype)), shape)


def make_pool(case: Case, rotations: int, seed: int = 0) -> Pool:
    """Random caches and queries for ``case``'s batch with ``rotations`` regions."""
    rng = np.random.default_rng(seed)
    m = case.model
    slots_per_seq = -(-case.context // SLOT_ALIGN) * SLOT_ALIGN
    num_slots = rotations * case.batch * slots_per_seq
    shape = (num_slots, m.num_kv_heads, m.head_dim)
    num_tokens = sum(case.q_lens)
    queries = [
        rng.standard_normal((num_tokens, m.num_q_heads, m.head_dim)).astype(numpy_dtype(case.dtype))
        for _ in range(rotations)
    ]
    return Pool(pool_key(case), _tiled(rng, shape, case.cache_dtype), _tiled(rng, shape, case.cache_dtype), queries,
                slots_per_seq, case.batch)


def attention_case(case: Case, pool: Pool, rotation: int, seed: int = 0) -> AttentionCase:
    """The call of ``rotation``'s region at ``case.block_size``: the pool's caches viewed at that block
    size, the rotation's query, and block tables of the region's blocks, shuffled or in order."""
    bs = case.block_size
    per_region = case.batch * pool.slots_per_seq // bs
    first = rotation * per_region
    if case.blocks == "in-order":
        order = first + np.arange(per_region)
    else:
        order = first + np.random.default_rng((seed, rotation, bs)).permutation(per_region)
    width = -(-case.context // bs)
    stride = pool.slots_per_seq // bs
    tables = np.stack([order[s * stride : s * stride + width] for s in range(case.batch)]).astype(np.int32)
    seq_lens = np.full(case.batch, case.context, dtype=np.int32)
    qsl = None
    if case.kind != "decode":
        qsl = np.concatenate([[0], np.cumsum(case.q_lens)]).astype(np.int32)
    shape = cache_shape(case, pool)
    return AttentionCase(pool.queries[rotation], pool.key_cache.reshape(shape), pool.value_cache.reshape(shape),
                         tables, seq_lens, qsl, {"kv_layout": "NHD", **case.options}, seed=seed,
                         labels={"name": case.name})


def cache_shape(case: Case, pool: Pool) -> tuple[int, int, int, int]:
    """The NHD shape a pool's flat caches take at ``case.block_size``."""
    m = case.model
    return (pool.num_slots // case.block_size, case.block_size, m.num_kv_heads, m.head_dim)
