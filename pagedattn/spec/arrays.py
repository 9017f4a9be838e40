"""The contract's arrays, and the one validation every backend runs before any kernel.

Block-table format (explained here once; everything else links here). Sequence ``s``
holds ``L = seq_lens[s]`` keys at logical positions ``p = 0 … L-1``. Position ``p``
lives in physical block ``block_tables[s, p // block_size]``, slot ``p % block_size``.
Only the first ``ceil(L / block_size)`` columns of a row are meaningful; the rest may
hold anything (-1, 2**31-1, another sequence's block) and must never be read.

Arrays (``T`` = num_tokens, ``Hq``/``Hkv`` = num_q_heads/num_kv_heads, ``D`` = head_dim):

- query: float32 | float16 | bfloat16 ``[T, Hq, D]``
- key_cache, value_cache: the query's dtype or an fp8 dtype, NHD ``[num_blocks,
  block_size, Hkv, D]`` or HND ``[num_blocks, Hkv, block_size, D]`` (strided views allowed)
- block_tables: ``[num_seqs, max_blocks_per_seq]``
- seq_lens: ``[num_seqs]``, keys already in the cache
- query_start_loc: ``[num_seqs + 1]``, from 0 to T, non-decreasing; ``None`` for
  decode (one query per sequence, ``L = 0`` allowed as batch padding)
- the index arrays above: any integer dtype (or a list of ints) whose every value fits
  in int32; ``plan`` converts them once (to int32 on the device)
- alibi_slopes: float32 ``[Hq]``; output: the query's dtype ``[T, Hq, D]``;
  lse: float32 ``[T, Hq]``, natural log.

Query ``j`` of sequence ``s`` (``q_len`` queries) sits at ``p_q = L - q_len + j``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from pagedattn.errors import PagedAttentionError
from pagedattn.spec.dtypes import CACHE_DTYPES, FP8_DTYPES, QUERY_DTYPES, dtype_name

KVLayout = Literal["NHD", "HND"]
KV_LAYOUTS: tuple[str, ...] = ("NHD", "HND")


@dataclass(frozen=True)
class AttentionProblem:
    """A validated paged-attention call: sizes, options and host copies of the index arrays."""

    num_tokens: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    max_blocks_per_seq: int
    kv_layout: str
    dtype: str
    cache_dtype: str
    block_tables: np.ndarray  # int64 [num_seqs, max_blocks_per_seq], host copy
    seq_lens: np.ndarray  # int64 [num_seqs]
    query_start_loc: np.ndarray  # int64 [num_seqs + 1] (decode: 0, 1, …, num_seqs)
    is_decode: bool
    scale: float
    causal: bool
    sliding_window: int | None
    softcap: float | None
    alibi_slopes: np.ndarray | None  # float32 [num_q_heads]
    k_scale: float
    v_scale: float
    return_lse: bool

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def q_lens(self) -> np.ndarray:
        """int64 ``[num_seqs]``: queries of each sequence."""
        return np.diff(self.query_start_loc)

    @property
    def group_size(self) -> int:
        """Query heads per KV head (1 = MHA, num_q_heads = MQA)."""
        return self.num_q_heads // self.num_kv_heads

    @property
    def features(self) -> frozenset[str]:
        """The contract features this call uses, in the capability vocabulary."""
        used = set()
        if not self.is_decode:
            used.add("varlen")
        if not self.causal:
            used.add("non_causal")
        if self.sliding_window is not None:
            used.add("sliding_window")
        if self.softcap is not None:
            used.add("softcap")
        if self.alibi_slopes is not None:
            used.add("alibi")
        if self.return_lse:
            used.add("lse")
        if self.cache_dtype in FP8_DTYPES:
            used.add("fp8")
        return frozenset(used)

    def token_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """Return int64 ``[T]`` arrays: each query token's sequence ``s`` and position ``p_q``."""
        q_lens = self.q_lens
        seq_of_token = np.repeat(np.arange(self.num_seqs), q_lens)
        j = np.arange(self.num_tokens) - self.query_start_loc[seq_of_token]
        p_q = self.seq_lens[seq_of_token] - q_lens[seq_of_token] + j
        return seq_of_token, p_q


def _fail(argument: str, problem: str) -> PagedAttentionError:
    return PagedAttentionError(argument, problem)


def _shape(x: Any, argument: str) -> tuple[int, ...]:
    shape = getattr(x, "shape", None)
    if shape is None:
        raise _fail(argument, f"expected an array, received {type(x).__name__}")
    return tuple(int(n) for n in shape)


def _check_ndim(x: Any, argument: str, ndim: int, dims: str) -> tuple[int, ...]:
    shape = _shape(x, argument)
    if len(shape) != ndim:
        raise _fail(argument, f"expected {ndim} dimensions {dims}, received shape {shape}")
    return shape


def _check_dtype(x: Any, argument: str, allowed: Sequence[str]) -> str:
    name = dtype_name(x.dtype)
    if name not in allowed:
        raise _fail(argument, f"dtype {name} is not one of {', '.join(allowed)}")
    return name


INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _host_int(
    x: Any, argument: str, ndim: int, dims: str, *, low: int = INT32_MIN, high: int = INT32_MAX
) -> np.ndarray:
    """Check an index array (any integer dtype, or a list of ints) for rank, integer dtype and
    values in ``[low, high]`` (default: int32's range); return its values as int64 on the host."""
    if isinstance(x, list | tuple):
        x = np.asarray(x)
        if x.size == 0:
            x = x.astype(np.int64)
    _check_ndim(x, argument, ndim, dims)
    values = np.asarray(x)
    if values.dtype.kind not in "iu":
        fit = " that fit in int32" if high == INT32_MAX else ""
        raise _fail(argument, f"expected integers{fit}, received dtype {dtype_name(values.dtype)}"
                              " (convert with np.asarray(..., dtype=np.int32))")
    if values.size and (int(values.min()) < low or int(values.max()) > high):
        bad = int(values.min()) if int(values.min()) < low else int(values.max())
        raise _fail(argument, f"value {bad} does not fit in [{low}, {high}]")
    return values.astype(np.int64)


def _check_writable(cache: Any, argument: str) -> None:
    """Raise if ``cache`` is a NumPy array that cannot be written (a read-only view or buffer)."""
    flags = getattr(cache, "flags", None)
    if isinstance(cache, np.ndarray) and flags is not None and not flags.writeable:
        raise _fail(argument, "is read-only (flags.writeable is False); pass a writable array")


def check_layout(kv_layout: str) -> str:
    """Return ``kv_layout`` if it is ``"NHD"`` or ``"HND"``; raise naming both otherwise."""
    if kv_layout not in KV_LAYOUTS:
        raise _fail("kv_layout", f"expected 'NHD' or 'HND', received {kv_layout!r}")
    return kv_layout


def cache_dims(key_cache: Any, value_cache: Any, kv_layout: str) -> tuple[int, int, int, int]:
    """Check both caches; return ``(num_blocks, block_size, num_kv_heads, head_dim)``."""
    check_layout(kv_layout)
    dims = (
        "[num_blocks, block_size, num_kv_heads, head_dim]"
        if kv_layout == "NHD"
        else "[num_blocks, num_kv_heads, block_size, head_dim]"
    )
    k_shape = _check_ndim(key_cache, "key_cache", 4, f"{kv_layout} {dims}")
    v_shape = _check_ndim(value_cache, "value_cache", 4, f"{kv_layout} {dims}")
    if k_shape != v_shape:
        raise _fail("value_cache", f"shape {v_shape} differs from key_cache's {k_shape}")
    k_dtype = _check_dtype(key_cache, "key_cache", CACHE_DTYPES)
    v_dtype = _check_dtype(value_cache, "value_cache", CACHE_DTYPES)
    if k_dtype != v_dtype:
        raise _fail("value_cache", f"dtype {v_dtype} differs from key_cache's {k_dtype}")
    if kv_layout == "NHD":
        num_blocks, block_size, num_kv_heads, head_dim = k_shape
    else:
        num_blocks, num_kv_heads, block_size, head_dim = k_shape
    if block_size < 1 or num_kv_heads < 1 or head_dim < 1:
        raise _fail("key_cache", f"block_size, num_kv_heads and head_dim must be >= 1, shape {k_shape}")
    return num_blocks, block_size, num_kv_heads, head_dim


def _first_true(mask: np.ndarray) -> int | None:
    """Index of the first True of a 1-d bool array, or None."""
    return int(np.argmax(mask)) if mask.any() else None


def _check_scalar(value: Any, argument: str, *, positive: bool) -> float:
    """A real number (Python or NumPy int or float, not a bool or a string) as a float."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.integer | np.floating):
        raise _fail(argument, f"expected a float, received {value!r}")
    number = float(value)
    if not math.isfinite(number) or (positive and number <= 0.0):
        kind = "a finite positive" if positive else "a finite"
        raise _fail(argument, f"expected {kind} float, received {value!r}")
    return number


def _cache_scale(value: Any, argument: str, cache_dtype: str) -> float:
    """Validate an fp8 scale; the contract ignores it (uses 1.0) for non-fp8 caches."""
    number = _check_scalar(value, argument, positive=True)
    return number if cache_dtype in FP8_DTYPES else 1.0


def check_paged_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_tables: Any,
    seq_lens: Any,
    query_start_loc: Any = None,
    *,
    kv_layout: str = "NHD",
    scale: float | None = None,
    causal: bool = True,
    sliding_window: int | None = None,
    softcap: float | None = None,
    alibi_slopes: Any = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    return_lse: bool = False,
) -> AttentionProblem:
    """Validate a paged-attention call and return its :class:`AttentionProblem`.

    ``query`` and the caches are only inspected for shape and dtype (any array type);
    ``block_tables``, ``seq_lens``, ``query_start_loc`` and ``alibi_slopes`` must be host
    (NumPy-convertible) arrays. Raises :class:`PagedAttentionError` naming the argument.
    """
    q_shape = _check_ndim(query, "query", 3, "[num_tokens, num_q_heads, head_dim]")
    dtype = _check_dtype(query, "query", QUERY_DTYPES)
    num_tokens, num_q_heads, head_dim_q = q_shape
    num_blocks, block_size, num_kv_heads, head_dim = cache_dims(key_cache, value_cache, kv_layout)
    cache_dtype = dtype_name(key_cache.dtype)
    if cache_dtype != dtype and cache_dtype not in FP8_DTYPES:
        raise _fail("key_cache", f"dtype {cache_dtype} must equal query's {dtype} or be an fp8 dtype")
    if head_dim_q != head_dim:
        raise _fail("query", f"head_dim {head_dim_q} differs from the caches' head_dim {head_dim}")
    if num_q_heads < 1 or num_q_heads % num_kv_heads != 0:
        problem = f"num_q_heads={num_q_heads} is not a positive multiple of num_kv_heads={num_kv_heads}"
        other = "HND" if kv_layout == "NHD" else "NHD"
        other_heads = block_size  # the other layout swaps block_size and num_kv_heads
        if num_q_heads >= 1 and num_q_heads % other_heads == 0:
            raise _fail(
                "kv_layout",
                f"kv_layout={kv_layout!r} reads key_cache {tuple(key_cache.shape)} as num_kv_heads={num_kv_heads},"
                f" block_size={block_size}, and {problem}; the caches look {other}: pass kv_layout={other!r}",
            )
        raise _fail("query", f"{problem} (key_cache {tuple(key_cache.shape)} read as kv_layout={kv_layout!r})")

    tables = _host_int(block_tables, "block_tables", 2, "[num_seqs, max_blocks_per_seq]")
    lens = _host_int(seq_lens, "seq_lens", 1, "[num_seqs]")
    num_seqs, max_blocks_per_seq = tables.shape
    if lens.shape[0] != num_seqs:
        raise _fail("seq_lens", f"has {lens.shape[0]} entries but block_tables has {num_seqs} rows")
    capacity = max_blocks_per_seq * block_size
    s = _first_true((lens < 0) | (lens > capacity))
    if s is not None:
        if lens[s] < 0:
            raise _fail("seq_lens", f"seq_lens[{s}]={lens[s]} is negative")
        raise _fail(
            "seq_lens",
            f"seq_lens[{s}]={lens[s]} exceeds max_blocks_per_seq * block_size"
            f" = {max_blocks_per_seq} * {block_size} = {capacity}",
        )

    is_decode = query_start_loc is None
    if is_decode:
        if num_tokens != num_seqs:
            raise _fail(
                "query",
                f"decode (query_start_loc=None) needs one query per sequence: num_tokens="
                f"{num_tokens} but num_seqs={num_seqs}",
            )
        starts = np.arange(num_seqs + 1, dtype=np.int64)
    else:
        starts = _host_int(query_start_loc, "query_start_loc", 1, "[num_seqs + 1]")
        if starts.shape[0] != num_seqs + 1:
            raise _fail(
                "query_start_loc",
                f"expected num_seqs + 1 = {num_seqs + 1} entries, received {starts.shape[0]}",
            )
        if starts[0] != 0:
            raise _fail("query_start_loc", f"must start at 0, starts at {starts[0]}")
        if starts[-1] != num_tokens:
            raise _fail("query_start_loc", f"must end at num_tokens={num_tokens}, ends at {starts[-1]}")
        steps = np.diff(starts)
        if (steps < 0).any():
            s = int(np.argmax(steps < 0))
            raise _fail(
                "query_start_loc",
                f"must be non-decreasing: query_start_loc[{s + 1}]={starts[s + 1]}"
                f" < query_start_loc[{s}]={starts[s]}",
            )
        too_long = steps > lens
        if too_long.any():
            s = int(np.argmax(too_long))
            raise _fail("query_start_loc", f"q_len={steps[s]} of sequence {s} exceeds seq_lens[{s}]={lens[s]}")

    used_cols = -(-lens // block_size)  # ceil(L / block_size)
    needed = np.arange(max_blocks_per_seq)[None, :] < used_cols[:, None]
    outside = needed & ((tables < 0) | (tables >= num_blocks))
    s = _first_true(np.any(outside, axis=1))
    if s is not None:  # the first sequence with an entry outside, and its first such column
        c = int(np.argmax(outside[s]))
        raise _fail(
            "block_tables",
            f"block_tables[{s}, {c}]={tables[s, c]} is outside [0, num_blocks={num_blocks})"
            f" and is needed for seq_lens[{s}]={lens[s]}",
        )

    resolved_scale = 1.0 / math.sqrt(head_dim) if scale is None else _check_scalar(scale, "scale", positive=False)
    for name, flag in (("causal", causal), ("return_lse", return_lse)):
        if not isinstance(flag, bool | np.bool_):
            raise _fail(name, f"expected a bool, received {flag!r}")
    if sliding_window is not None and (
        isinstance(sliding_window, bool) or not isinstance(sliding_window, int | np.integer) or sliding_window < 1
    ):
        raise _fail("sliding_window", f"expected None or an integer >= 1, received {sliding_window!r}")
    cap = None if softcap is None else _check_scalar(softcap, "softcap", positive=True)
    slopes = None
    if alibi_slopes is not None:
        _check_ndim(alibi_slopes, "alibi_slopes", 1, "[num_q_heads]")
        _check_dtype(alibi_slopes, "alibi_slopes", ("float32",))
        slopes = np.asarray(alibi_slopes, dtype=np.float32)
        if slopes.shape[0] != num_q_heads:
            raise _fail("alibi_slopes", f"has {slopes.shape[0]} entries, expected num_q_heads={num_q_heads}")
        if not np.isfinite(slopes).all():
            raise _fail("alibi_slopes", "must be finite")
    return AttentionProblem(
        num_tokens=num_tokens,
        num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        num_blocks=num_blocks,
        max_blocks_per_seq=max_blocks_per_seq,
        kv_layout=kv_layout,
        dtype=dtype,
        cache_dtype=cache_dtype,
        block_tables=tables,
        seq_lens=lens,
        query_start_loc=starts,
        is_decode=is_decode,
        scale=resolved_scale,
        causal=bool(causal),
        sliding_window=None if sliding_window is None else int(sliding_window),
        softcap=cap,
        alibi_slopes=slopes,
        k_scale=_cache_scale(k_scale, "k_scale", cache_dtype),
        v_scale=_cache_scale(v_scale, "v_scale", cache_dtype),
        return_lse=bool(return_lse),
    )


@dataclass(frozen=True)
class WriteKVProblem:
    """A validated ``write_kv`` call."""

    num_tokens: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    num_blocks: int
    kv_layout: str
    dtype: str
    cache_dtype: str
    slot_mapping: np.ndarray  # int64 [num_tokens], -1 = skip
    k_scale: float
    v_scale: float


def check_write_kv(
    key: Any,
    value: Any,
    key_cache: Any,
    value_cache: Any,
    slot_mapping: Any,
    *,
    kv_layout: str = "NHD",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> WriteKVProblem:
    """Validate ``write_kv``: key/value ``[T, Hkv, D]``, slot_mapping int ``[T]`` (-1 = skip, no duplicates)."""
    num_blocks, block_size, num_kv_heads, head_dim = cache_dims(key_cache, value_cache, kv_layout)
    k_shape = _check_ndim(key, "key", 3, "[num_tokens, num_kv_heads, head_dim]")
    v_shape = _check_ndim(value, "value", 3, "[num_tokens, num_kv_heads, head_dim]")
    if v_shape != k_shape:
        raise _fail("value", f"shape {v_shape} differs from key's {k_shape}")
    if k_shape[1:] != (num_kv_heads, head_dim):
        raise _fail(
            "key",
            f"shape {k_shape} does not match the caches' (num_kv_heads, head_dim)"
            f" = ({num_kv_heads}, {head_dim})",
        )
    dtype = _check_dtype(key, "key", QUERY_DTYPES)
    if dtype_name(value.dtype) != dtype:
        raise _fail("value", f"dtype {dtype_name(value.dtype)} differs from key's {dtype}")
    cache_dtype = dtype_name(key_cache.dtype)
    if cache_dtype != dtype and cache_dtype not in FP8_DTYPES:
        raise _fail("key_cache", f"dtype {cache_dtype} must equal key's {dtype} or be an fp8 dtype")
    _check_writable(key_cache, "key_cache")
    _check_writable(value_cache, "value_cache")
    slots = _host_int(slot_mapping, "slot_mapping", 1, "[num_tokens]", high=2**63 - 1)
    if slots.shape[0] != k_shape[0]:
        raise _fail("slot_mapping", f"has {slots.shape[0]} entries, key has num_tokens={k_shape[0]}")
    num_slots = num_blocks * block_size
    t = _first_true((slots < -1) | (slots >= num_slots))
    if t is not None:
        raise _fail(
            "slot_mapping",
            f"slot_mapping[{t}]={slots[t]} is outside [-1, num_blocks * block_size"
            f" = {num_blocks} * {block_size} = {num_slots})",
        )
    used = slots[slots >= 0]
    unique, counts = np.unique(used, return_counts=True)
    if (counts > 1).any():
        raise _fail("slot_mapping", f"slot {unique[np.argmax(counts > 1)]} appears more than once")
    return WriteKVProblem(
        num_tokens=k_shape[0],
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        num_blocks=num_blocks,
        kv_layout=kv_layout,
        dtype=dtype,
        cache_dtype=cache_dtype,
        slot_mapping=slots,
        k_scale=_cache_scale(k_scale, "k_scale", cache_dtype),
        v_scale=_cache_scale(v_scale, "v_scale", cache_dtype),
    )


def check_copy_blocks(key_cache: Any, value_cache: Any, pairs: Any, *, kv_layout: str = "NHD") -> np.ndarray:
    """Validate ``copy_blocks``; return the pairs as int64 ``[n, 2]`` (src, dst) on the host."""
    num_blocks, _, _, _ = cache_dims(key_cache, value_cache, kv_layout)
    _check_writable(key_cache, "key_cache")
    _check_writable(value_cache, "value_cache")
    table = np.asarray(pairs)
    if table.size == 0:
        return np.zeros((0, 2), dtype=np.int64)
    if table.ndim != 2 or table.shape[1] != 2:
        raise _fail("pairs", f"expected shape [n, 2] of (src, dst), received {table.shape}")
    if not np.issubdtype(table.dtype, np.integer):
        raise _fail("pairs", f"expected integer block ids, received dtype {table.dtype}")
    table = table.astype(np.int64)
    bad = (table < 0) | (table >= num_blocks)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        raise _fail("pairs", f"pairs[{i}, {j}]={table[i, j]} is outside [0, num_blocks={num_blocks})")
    dst, counts = np.unique(table[:, 1], return_counts=True)
    if (counts > 1).any():
        raise _fail("pairs", f"destination block {dst[np.argmax(counts > 1)]} appears more than once")
    return table


def check_merge_states(out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[int, int, int, str]:
    """Validate ``merge_states``: outs ``[T, H, D]`` of one dtype, lses float32 ``[T, H]``."""
    shape = _check_ndim(out_a, "out_a", 3, "[num_tokens, num_heads, head_dim]")
    if _check_ndim(out_b, "out_b", 3, "[num_tokens, num_heads, head_dim]") != shape:
        raise _fail("out_b", f"shape {tuple(out_b.shape)} differs from out_a's {shape}")
    dtype = _check_dtype(out_a, "out_a", QUERY_DTYPES)
    if dtype_name(out_b.dtype) != dtype:
        raise _fail("out_b", f"dtype {dtype_name(out_b.dtype)} differs from out_a's {dtype}")
    for name, lse in (("lse_a", lse_a), ("lse_b", lse_b)):
        if _check_ndim(lse, name, 2, "[num_tokens, num_heads]") != shape[:2]:
            raise _fail(name, f"shape {tuple(lse.shape)} is not out_a's [num_tokens, num_heads] = {shape[:2]}")
        _check_dtype(lse, name, ("float32",))
    return shape[0], shape[1], shape[2], dtype
