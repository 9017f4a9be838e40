"""Hypothesis strategies for the contract's objects, public so that other suites can reuse them.

One strategy per contract object, small ones composed into big ones:

- :func:`block_sizes`, :func:`head_dims`, :func:`head_configs` (MHA, GQA 2/3/4/7/8, MQA);
- :func:`seq_lens` (the edge lengths 0, 1, bs-1, bs, bs+1, multiples, long ones);
- :func:`query_layouts` (decode, full prefill, chunked prefill, mixed in one batch);
- :func:`block_tables` (shuffled, reversed, interleaved, shared-prefix, huge pools with
  block ids >= 32768; unused entries holding -1, 2**31-1 or another sequence's valid id);
- :func:`attention_cases`, which puts them together with caches of a layout and dtype
  (optionally strided views of a multi-layer pool), a query (optionally a strided view of
  fused QKV rows, :func:`fused_qkv_rows`), a block table (optionally a view of a wider one,
  :func:`wider_table`), a value pattern and the options of one feature, into an
  :class:`~pagedattn.conformance.cases.AttentionCase`;
- :func:`write_kv_cases`, :func:`copy_blocks_cases`, :func:`merge_cases` for the other
  operations.

Correlated draws come back as NamedTuples, every draw is labelled, and sizes are capped
once, by :data:`LIMITS` (read from ``PAGEDATTN_SIZE``: ``small``, the default, keeps CPU
runs and the Triton interpreter fast; ``large`` is for GPUs). Examples shrink towards one
short decode sequence, contiguous blocks, normal values and no optional feature.
Large arrays are filled from a NumPy generator seeded by a drawn integer: hypothesis
shrinks the structure (sizes, layouts, options), not each element.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

from pagedattn.backends.capabilities import Capabilities
from pagedattn.conformance.cases import AttentionCase, CopyBlocksCase, MergeCase, WriteKVCase, kv_views
from pagedattn.spec.case import pool_views, query_view, table_view
from pagedattn.spec.dtypes import FP8_DTYPES, numpy_dtype

__all__ = [
    "ARRANGEMENTS",
    "CONTRACT_BLOCK_SIZES",
    "CONTRACT_HEAD_DIMS",
    "COPY_BLOCKS_HEADS",
    "COPY_BLOCKS_HEAD_DIMS",
    "FILLERS",
    "GARBAGE_KINDS",
    "INDEX_DTYPES",
    "LIMITS",
    "MERGE_HEAD_DIMS",
    "VALUE_KINDS",
    "WRITE_KV_HEADS",
    "WRITE_KV_HEAD_DIMS",
    "HeadConfig",
    "Limits",
    "PoolLayout",
    "QueryLayout",
    "alibi_slopes",
    "attention_cases",
    "block_sizes",
    "block_tables",
    "copy_blocks_cases",
    "fused_qkv_rows",
    "garbage_values",
    "head_configs",
    "head_dim_choices",
    "head_dims",
    "merge_cases",
    "query_layouts",
    "seq_lens",
    "wider_table",
    "write_kv_cases",
]


class Limits(NamedTuple):
    """The one place where sizes are capped."""

    max_seqs: int  # sequences per batch
    max_seq_len: int  # the "long" lengths
    max_q_len: int  # queries of one prefill sequence
    max_q_heads: int  # MHA/MQA head counts (GQA goes up to 8 * 2)
    huge_pool_blocks: int  # num_blocks of a "huge" pool: block ids >= 32768 are used
    max_tokens_write: int  # tokens of one write_kv call


_SIZES = {
    "small": Limits(max_seqs=4, max_seq_len=160, max_q_len=12, max_q_heads=4, huge_pool_blocks=32_800,
                    max_tokens_write=24),
    "large": Limits(max_seqs=8, max_seq_len=2048, max_q_len=96, max_q_heads=16, huge_pool_blocks=40_000,
                    max_tokens_write=256),
}


def _limits_from_env() -> Limits:
    name = os.environ.get("PAGEDATTN_SIZE", "small")
    if name not in _SIZES:
        raise ValueError(f"PAGEDATTN_SIZE={name!r}: expected one of {', '.join(_SIZES)}")
    return _SIZES[name]


def sizes_are_large() -> bool:
    """Whether ``PAGEDATTN_SIZE=large``: the widest sizes, and the cells that cost a CPU minutes."""
    return os.environ.get("PAGEDATTN_SIZE") == "large"


#: The size caps of every strategy here (``PAGEDATTN_SIZE=small|large``).
LIMITS: Limits = _limits_from_env()

#: Block sizes drawn for a backend that accepts any; a backend's declared ones are added.
CONTRACT_BLOCK_SIZES: tuple[int, ...] = (16, 32, 64)
#: Head dims drawn (those a backend declares); 16 is added for backends that accept any.
CONTRACT_HEAD_DIMS: tuple[int, ...] = (64, 80, 96, 128, 256)
#: How physical blocks are arranged in the pool.
ARRANGEMENTS: tuple[str, ...] = ("contiguous", "shuffled", "reversed", "interleaved", "shared_prefix", "huge_pool")
#: What unused block-table entries (column >= ceil(L / block_size)) hold.
FILLERS: tuple[str, ...] = ("minus_one", "int32_max", "other_valid", "random")
#: Value patterns of query, keys and values.
VALUE_KINDS: tuple[str, ...] = ("normal", "large", "dominant", "max_in_last_block", "equal", "very_negative",
                                "beyond_float16", "huge_scores", "small_scores")
#: Explicit score scales: the contract allows any finite float, so negative ones and 0 too (a
#: kernel that takes the row max on q.k before scaling keeps its least score under a negative one).
SCALES: tuple[float, ...] = (0.01, 0.125, 0.3, 1.0, 2.0, -0.125, -1.0, 0.0)
#: What unused slots and unused blocks hold.
GARBAGE_KINDS: tuple[str, ...] = ("random", "nan", "inf", "zero")

INT32_MAX = 2**31 - 1
#: Standard deviation of q and k (and v) for "large" values: scale * q . k reaches about 1e4.
LARGE_MAGNITUDE = 60.0
#: "very_negative" values: every key of a KV head is -c times its first query head's last
#: query, so that head's visible scores all equal about -VERY_NEGATIVE_SCORE: below any
#: finite mask value (-1e4, -FLT_MAX / 2 aside) and below a finite initial running max
#: (-5e4) a kernel might use instead of -inf. That query is scaled up to about
#: VERY_NEGATIVE_QUERY_MAGNITUDE so that |k| <= 8192 reaches it for the usual scales;
#: q . k is far outside float16's range then, as a float32 accumulator allows.
VERY_NEGATIVE_SCORE = 2e5
VERY_NEGATIVE_QUERY_MAGNITUDE = 64.0
#: "beyond_float16" values: each sequence's last query is multiplied by this power of two, so
#: its largest elements (about 1e5) lie beyond float16's 65,504, which bfloat16 and float32
#: queries hold exactly. A kernel that rounds such a query to float16 (to multiply fp8 caches
#: converted to float16, say) turns them into inf; the spec's scores stay finite.
BEYOND_FLOAT16_FACTOR = 2.0**15
#: "huge_scores" values: each sequence's last query is multiplied by this power of two, so that
#: its scores reach about 1e10 (bfloat16 and float32 queries hold it; float16 cannot). There a
#: float32 score's rounding is hundreds of units, and a kernel that takes the row max over rounded
#: scores but subtracts it from unrounded ones (scale and shift in one fused multiply-add) gets
#: the max key's weight as e to that error: inf, or 0. The spec's answer is finite.
HUGE_SCORES_FACTOR = 2.0**32
#: "small_scores" values: every query is multiplied by this power of two, so that scores lie near
#: 0 (about 0.02) and the error model's score bound shrinks to a few u_acc: an error of ulps of
#: some constant, such as a soft cap computed as softcap - 2 softcap / (e + 1), shows in lse.
SMALL_SCORES_FACTOR = 2.0**-8
#: Elements a strided cell may pad each row of its pool with: the caches' strides are then odd
#: (in elements, and in bytes for fp8), so a kernel that reads rows as 16- or 32-bit words of
#: several values, or as 16-byte vectors, meets rows off those boundaries; the pad holds garbage.
ROW_PAD = 1
_SEEDS = st.integers(0, 2**32 - 1)


# -- sizes -----------------------------------------------------------------------------

def block_sizes(capabilities: Capabilities | None = None) -> st.SearchStrategy[int]:
    """Return a strategy for block sizes: the backend's declared ones, else 16, 32, 64."""
    declared = None if capabilities is None else capabilities.block_sizes
    return st.sampled_from(tuple(declared) if declared else CONTRACT_BLOCK_SIZES)


def head_dim_choices(capabilities: Capabilities | None = None) -> tuple[int, ...]:
    """The head dims :func:`head_dims` draws, smallest first: 64, 80, 96, 128, 256 as declared
    (plus 16 if any is accepted); a backend declaring none of these, its own."""
    declared = None if capabilities is None else capabilities.head_dims
    if declared is None:
        return (16, *CONTRACT_HEAD_DIMS)
    return tuple(d for d in CONTRACT_HEAD_DIMS if d in declared) or tuple(sorted(declared))


def head_dims(capabilities: Capabilities | None = None) -> st.SearchStrategy[int]:
    """Return a strategy for head_dim, one of :func:`head_dim_choices`; shrinks towards the smallest."""
    return st.sampled_from(head_dim_choices(capabilities))


class HeadConfig(NamedTuple):
    """Head counts that belong together: ``num_q_heads`` is a multiple of ``num_kv_heads``."""

    num_q_heads: int
    num_kv_heads: int
    kind: str  # "MHA", "GQA", "MQA"


@st.composite
def head_configs(draw: st.DrawFn, max_q_heads: int | None = None) -> HeadConfig:
    """Return a strategy for :class:`HeadConfig`: MHA, GQA with ratios 2, 3, 4, 7, 8 (1 or 2 KV heads), MQA.

    Shrinks towards one head (MHA).
    """
    max_q = max_q_heads or LIMITS.max_q_heads
    kind = draw(st.sampled_from(("MHA", "GQA", "MQA")), label="heads")
    if kind == "MHA":
        h = draw(st.integers(1, max_q), label="num_heads")
        return HeadConfig(h, h, kind)
    if kind == "MQA":
        h = draw(st.integers(2, max(2, max_q)), label="num_q_heads")
        return HeadConfig(h, 1, kind)
    ratio = draw(st.sampled_from((2, 3, 4, 7, 8)), label="gqa_ratio")
    kv = draw(st.integers(1, 2), label="num_kv_heads")
    return HeadConfig(ratio * kv, kv, kind)


def seq_lens(block_size: int, *, min_value: int = 0, max_value: int | None = None) -> st.SearchStrategy[int]:
    """Return a strategy for one sequence length ``L``, biased to the edges.

    Edges: 0, 1, block_size - 1, block_size, block_size + 1, 2 and 3 block sizes, and the
    longest allowed (``LIMITS.max_seq_len``); otherwise any length. Shrinks towards ``min_value``.
    """
    top = LIMITS.max_seq_len if max_value is None else max_value
    edges = sorted({n for n in (0, 1, block_size - 1, block_size, block_size + 1, 2 * block_size,
                                3 * block_size, top) if min_value <= n <= top})
    return st.one_of(st.sampled_from(edges), st.integers(min_value, top)) if edges else st.integers(min_value, top)


class QueryLayout(NamedTuple):
    """seq_lens int32 ``[num_seqs]``, query_start_loc int32 ``[num_seqs + 1]`` or None (decode), and
    each sequence's kind ("decode", "prefill", "chunked", "padding", "no_query")."""

    seq_lens: np.ndarray
    query_start_loc: np.ndarray | None
    kinds: tuple[str, ...]

    @property
    def num_tokens(self) -> int:
        return len(self.seq_lens) if self.query_start_loc is None else int(self.query_start_loc[-1])


@st.composite
def query_layouts(draw: st.DrawFn, block_size: int, *, decode: bool) -> QueryLayout:
    """Return a strategy for a batch's :class:`QueryLayout`.

    ``decode=True``: one query per sequence, ``query_start_loc=None``, ``L = 0`` allowed
    (padding). Otherwise each sequence is drawn as decode (q_len 1), full prefill
    (q_len = L), chunked prefill (1 <= q_len < L) or, rarely, one without queries; the batch
    has at least one query. Shrinks towards one sequence of the first kind.
    """
    num_seqs = draw(st.integers(1, LIMITS.max_seqs), label="num_seqs")
    if decode:
        lens = [draw(seq_lens(block_size), label=f"seq_lens[{s}]") for s in range(num_seqs)]
        kinds = tuple("padding" if n == 0 else "decode" for n in lens)
        return QueryLayout(np.array(lens, np.int32), None, kinds)
    lens, q_lens, kinds_list = [], [], []
    for s in range(num_seqs):
        kind = draw(st.sampled_from(("decode", "prefill", "chunked", "no_query")), label=f"kind[{s}]")
        if kind == "prefill":
            length = draw(st.integers(1, LIMITS.max_q_len), label=f"seq_lens[{s}]")
            q_len = length
        elif kind == "chunked":
            length = draw(seq_lens(block_size, min_value=2), label=f"seq_lens[{s}]")
            q_len = draw(st.integers(1, min(length - 1, LIMITS.max_q_len)), label=f"q_len[{s}]")
        elif kind == "decode":
            length = draw(seq_lens(block_size, min_value=1), label=f"seq_lens[{s}]")
            q_len = 1
        else:
            length = draw(seq_lens(block_size), label=f"seq_lens[{s}]")
            q_len = 0
        lens.append(length)
        q_lens.append(q_len)
        kinds_list.append(kind)
    if sum(q_lens) == 0:  # at least one query in the batch
        lens[0], q_lens[0], kinds_list[0] = max(lens[0], 1), 1, "decode"
    starts = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return QueryLayout(np.array(lens, np.int32), starts, tuple(kinds_list))


class PoolLayout(NamedTuple):
    """block_tables int32 ``[num_seqs, max_blocks_per_seq]`` and the pool's ``num_blocks``."""

    block_tables: np.ndarray
    num_blocks: int
    arrangement: str
    filler: str


@st.composite
def block_tables(draw: st.DrawFn, lens: np.ndarray, block_size: int,
                 arrangements: tuple[str, ...] = ARRANGEMENTS) -> PoolLayout:
    """Return a strategy for a :class:`PoolLayout` holding sequences of lengths ``lens``.

    Arrangements: contiguous, shuffled, reversed, interleaved (block j of every sequence
    before block j + 1 of any), shared_prefix (sequences share their first blocks, as in
    prefix caching), huge_pool (32,768 or more blocks, ids >= 32768 used). Unused entries
    hold -1, 2**31-1, a valid id of another sequence, or random int32. Shrinks towards
    contiguous blocks, no spare block and -1 fillers.
    """
    arrangement = draw(st.sampled_from(arrangements), label="arrangement")
    filler = draw(st.sampled_from(FILLERS), label="filler")
    spare = draw(st.integers(0, 3), label="spare_blocks")
    extra_cols = draw(st.integers(0, 2), label="unused_columns")
    rng = np.random.default_rng(draw(_SEEDS, label="table_seed"))
    needed = [-(-int(n) // block_size) for n in lens]
    num_seqs = len(needed)
    cols = max([*needed, 1]) + extra_cols
    tables = np.full((num_seqs, cols), -1, dtype=np.int64)
    shared = 0
    if arrangement == "shared_prefix":
        sharing = [n for n in needed if n > 0]
        if len(sharing) >= 2:
            shared = draw(st.integers(1, min(sharing)), label="shared_blocks")
    own = [n - shared if n > 0 else 0 for n in needed]
    total = shared + sum(own)
    order = [(s, j) for s in range(num_seqs) for j in range(own[s])]  # (sequence, own block j)
    if arrangement == "interleaved":
        order.sort(key=lambda sj: (sj[1], sj[0]))
    num_blocks = total + spare
    ids = np.arange(num_blocks)
    if arrangement == "reversed":
        ids = ids[::-1].copy()
    elif arrangement in ("shuffled", "shared_prefix"):
        ids = rng.permutation(num_blocks)
    elif arrangement == "huge_pool":
        num_blocks = max(LIMITS.huge_pool_blocks, num_blocks + 32_768)
        ids = rng.choice(np.arange(32_768, num_blocks), size=total + spare, replace=False)
    prefix_ids, own_ids = ids[:shared], ids[shared:]
    for s in range(num_seqs):
        if needed[s] > 0:
            tables[s, :shared] = prefix_ids
    for (s, j), block in zip(order, own_ids, strict=False):
        tables[s, shared + j] = block
    valid = np.unique(tables[tables >= 0]) if (tables >= 0).any() else np.array([0])
    for s in range(num_seqs):
        unused = np.arange(needed[s], cols)
        if filler == "int32_max":
            tables[s, unused] = INT32_MAX
        elif filler == "other_valid":
            tables[s, unused] = rng.choice(valid, size=len(unused))
        elif filler == "random":
            tables[s, unused] = rng.integers(-(2**31), INT32_MAX, size=len(unused), endpoint=True)
    return PoolLayout(tables.astype(np.int32), int(num_blocks), arrangement, filler)


# -- values ---------------------------------------------------------------------------

def _logical_values(rng: np.random.Generator, kind: str, query: np.ndarray, lens: np.ndarray,
                    q_starts: np.ndarray, block_size: int, num_kv_heads: int, head_dim: int,
                    scale: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """K, V float64 ``[L, Hkv, D]`` of each sequence for a value pattern (query already drawn;
    "very_negative" and "beyond_float16" scale each sequence's last query up in place)."""
    group = query.shape[1] // num_kv_heads
    magnitude = LARGE_MAGNITUDE if kind == "large" else 1.0
    result = []
    for s, length in enumerate(int(n) for n in lens):
        k = rng.standard_normal((length, num_kv_heads, head_dim)) * magnitude
        v = rng.standard_normal((length, num_kv_heads, head_dim)) * magnitude
        if length and kind == "equal":
            k[:] = k[0]
        if length and kind == "very_negative" and q_starts[s + 1] > q_starts[s]:
            last = int(q_starts[s + 1]) - 1
            query[last] = (query[last].astype(np.float64) * VERY_NEGATIVE_QUERY_MAGNITUDE).astype(query.dtype)
            q0 = query[last].astype(np.float64).reshape(num_kv_heads, group, head_dim)[:, 0]
            norm2 = np.maximum((q0 * q0).sum(axis=1), 1e-6)  # [Hkv]
            c = VERY_NEGATIVE_SCORE / (max(abs(scale), 1e-6) * norm2)
            c = np.minimum(c, 8192.0 / np.maximum(np.abs(q0).max(axis=1), 1e-6))
            k[:] = (-np.sign(scale or 1.0) * c)[:, None] * q0  # every position: [Hkv, D]
        if length and kind in ("beyond_float16", "huge_scores") and q_starts[s + 1] > q_starts[s]:
            last = int(q_starts[s + 1]) - 1
            factor = BEYOND_FLOAT16_FACTOR if kind == "beyond_float16" else HUGE_SCORES_FACTOR
            query[last] = (query[last].astype(np.float64) * factor).astype(query.dtype)
        if length and kind in ("dominant", "max_in_last_block"):
            lo = ((length - 1) // block_size) * block_size if kind == "max_in_last_block" else 0
            p = int(rng.integers(lo, length))
            stop = int(q_starts[s + 1]) if q_starts[s + 1] > q_starts[s] else None
            if stop is not None:  # aligned with the sequence's last query: a much larger score
                q_last = query[stop - 1].astype(np.float64).reshape(num_kv_heads, group, head_dim)[:, 0]
                k[p] = q_last * (6.0 / max(abs(scale) * float(np.sqrt(head_dim)), 1e-3))
            else:
                k[p] *= 8.0
        result.append((k, v))
    return result


def garbage_values(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> np.ndarray:
    """float64 values of a garbage kind, mixed with random values."""
    values = rng.standard_normal(shape) * 1e3
    if kind == "nan":
        values[rng.random(shape) < 0.5] = np.nan
    elif kind == "inf":
        pick = rng.random(shape)
        values[pick < 0.3] = np.inf
        values[pick > 0.7] = -np.inf
    elif kind == "zero":
        values[:] = 0.0
    return values


def fill_caches(rng: np.random.Generator, shape_nhd: tuple[int, int, int, int], tables: np.ndarray,
                lens: np.ndarray, logical: list[tuple[np.ndarray, np.ndarray]], garbage: str,
                cache_dtype: str, k_scale: float, v_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Return K and V caches (NHD, ``cache_dtype``) with each sequence's logical K/V at its slots.

    Every slot no sequence uses holds garbage of kind ``garbage``; fp8 caches store ``x / scale``.
    Huge pools are filled lazily: only blocks in use get values, the rest stay zero.
    """
    num_blocks, block_size, _, _ = shape_nhd
    dtype = numpy_dtype(cache_dtype)
    caches = []
    huge = num_blocks > 4096
    if huge:  # the blocks any sequence uses: the tables' columns in use
        in_use = np.arange(tables.shape[1])[None, :] < -(-np.asarray(lens, dtype=np.int64) // block_size)[:, None]
        used = np.unique(tables[in_use].astype(np.int64))
    for which, scale in ((0, k_scale), (1, v_scale)):
        with np.errstate(over="ignore", invalid="ignore"):
            if huge:  # garbage in the used blocks only (in their slots no sequence writes)
                cache = np.zeros(shape_nhd, dtype=dtype)
                cache[used] = garbage_values(rng, garbage, (len(used), *shape_nhd[1:])).astype(dtype)
            else:
                cache = garbage_values(rng, garbage, shape_nhd).astype(dtype)
        for s, length in enumerate(int(n) for n in lens):
            positions = np.arange(length)
            blocks = tables[s, positions // block_size].astype(np.int64)
            stored = logical[s][which] / scale
            if cache_dtype in FP8_DTYPES:  # stay within the format's finite range
                top = float(ml_dtypes.finfo(dtype).max)
                stored = np.clip(stored, -top, top)
            cache[blocks, positions % block_size] = stored.astype(dtype)
        caches.append(cache)
    # Shared-prefix blocks were written by each sharer in turn; the last one's K/V stands.
    return caches[0], caches[1]


# -- the whole case ---------------------------------------------------------------------

#: Rows of the conformance matrix for paged attention: each forces one feature on.
ATTENTION_FEATURES: tuple[str, ...] = (
    "decode", "varlen", "non_causal", "sliding_window", "softcap", "alibi", "lse", "scale",
    "fp8", "strided_caches", "huge_pool", "combined",
)
#: Arrangements of every row but ``huge_pool`` (which forces a pool of 32,768+ blocks, small heads).
_ORDINARY = tuple(a for a in ARRANGEMENTS if a != "huge_pool")


def alibi_slopes(num_q_heads: int) -> np.ndarray:
    """The usual ALiBi slopes 2**(-8 (h + 1) / H)."""
    return (2.0 ** (-8.0 * (np.arange(num_q_heads) + 1) / num_q_heads)).astype(np.float32)


@st.composite
def attention_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str, block_size: int,
                    kv_layout: str, feature: str = "combined") -> AttentionCase:
    """Return a strategy for an :class:`AttentionCase` of one matrix row ``feature``.

    dtype, block_size and kv_layout are fixed (they are pytest parameters); ``feature`` (one
    of :data:`ATTENTION_FEATURES`) is forced on; ``"combined"`` draws every declared
    feature at random. Everything else (heads, head_dim, lengths, pool, values, garbage) is
    drawn within ``capabilities``. Shrinks towards one short decode sequence, MHA,
    contiguous blocks, normal values.
    """
    caps = capabilities
    if feature == "huge_pool":  # keep the pool's memory small: one KV head, the smallest head_dim
        heads = draw(st.sampled_from((HeadConfig(1, 1, "MHA"), HeadConfig(4, 1, "MQA"))), label="heads")
        head_dim = min(caps.head_dims or (16,))
    else:
        heads = draw(head_configs(), label="heads")
        head_dim = draw(head_dims(caps), label="head_dim")
    varlen_ok = caps.supports("varlen")
    if feature == "decode" or not varlen_ok:
        decode = True
    elif feature in ("varlen", "non_causal"):
        decode = False
    else:
        decode = draw(st.booleans(), label="decode")
    layout = draw(query_layouts(block_size, decode=decode), label="queries")
    arrangements = ("huge_pool",) if feature == "huge_pool" else _ORDINARY
    pool = draw(block_tables(layout.seq_lens, block_size, arrangements), label="pool")

    options: dict[str, Any] = {"kv_layout": kv_layout}
    combined = feature == "combined"

    def wanted(name: str) -> bool:
        if feature == name:
            return True
        return combined and caps.supports(name) and draw(st.booleans(), label=name)

    # decode too: its one query per sequence sees the same keys either way (p_q = L - 1), but a
    # kernel's causal flag may still pick another path (a tile taken whole by the causal bound alone)
    if wanted("non_causal"):
        options["causal"] = False
    if wanted("sliding_window"):
        options["sliding_window"] = draw(st.one_of(st.integers(1, 4), st.integers(1, LIMITS.max_seq_len + 8)),
                                         label="sliding_window")
    if wanted("softcap"):
        options["softcap"] = draw(st.sampled_from((1.0, 5.0, 30.0, 50.0)), label="softcap")
    alibi = wanted("alibi")
    # the softcap row returns lse too: a soft cap's error on scores near 0 shows there first
    if wanted("lse") or (feature == "softcap" and caps.supports("lse")):
        options["return_lse"] = True
    if feature == "scale" or (combined and draw(st.booleans(), label="explicit_scale")):
        # the contract allows any finite scale: negative ones and 0 too
        options["scale"] = draw(st.sampled_from(SCALES), label="scale")
    cache_dtype = dtype
    fp8 = [d for d in FP8_DTYPES if d in caps.cache_dtypes]
    use_fp8 = feature == "fp8" or (combined and caps.supports("fp8") and draw(st.booleans(), label="fp8"))
    if use_fp8 and fp8:
        cache_dtype = draw(st.sampled_from(fp8), label="cache_dtype")
        options["k_scale"] = draw(st.sampled_from((1.0, 0.5, 2.0, 0.0625)), label="k_scale")
        options["v_scale"] = draw(st.sampled_from((1.0, 0.25, 4.0)), label="v_scale")
    strided = wanted("strided_caches")

    # fp8 caches cannot hold very_negative keys (|k| up to 8192), nor float16 queries elements
    # beyond float16's range: they get the other kinds
    kinds = tuple(k for k in VALUE_KINDS if not (k == "very_negative" and cache_dtype in FP8_DTYPES)
                  and not (k in ("beyond_float16", "huge_scores") and dtype == "float16"))
    value_kind = draw(st.sampled_from(kinds), label="values")
    if feature == "softcap" and value_kind == "normal":
        value_kind = draw(st.sampled_from(("normal", "large", "small_scores")), label="softcap_values")
    garbage = draw(st.sampled_from(GARBAGE_KINDS), label="garbage")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))

    T = layout.num_tokens
    scale = options.get("scale", 1.0 / np.sqrt(head_dim))
    magnitude = {"large": LARGE_MAGNITUDE, "small_scores": SMALL_SCORES_FACTOR}.get(value_kind, 1.0)
    query = (rng.standard_normal((T, heads.num_q_heads, head_dim)) * magnitude).astype(numpy_dtype(dtype))
    starts = layout.query_start_loc if layout.query_start_loc is not None else np.arange(len(layout.seq_lens) + 1)
    logical = _logical_values(rng, value_kind, query, layout.seq_lens, starts, block_size,
                              heads.num_kv_heads, head_dim, float(scale))
    shape_nhd = (pool.num_blocks, block_size, heads.num_kv_heads, head_dim)
    k_nhd, v_nhd = fill_caches(rng, shape_nhd, pool.block_tables, layout.seq_lens, logical, garbage,
                               cache_dtype, options.get("k_scale", 1.0), options.get("v_scale", 1.0))
    if alibi:
        options["alibi_slopes"] = alibi_slopes(heads.num_q_heads)

    pool_array, layer = None, 0
    if strided:
        num_layers = draw(st.integers(2, 3), label="num_layers")
        layer = draw(st.integers(0, num_layers - 1), label="layer")
        # rows padded by one element: odd strides, rows off every word boundary past the first
        row_pad = draw(st.sampled_from((0, ROW_PAD)), label="row_pad")
        per_block = (heads.num_kv_heads, block_size) if kv_layout == "HND" else (block_size, heads.num_kv_heads)
        pool_shape = (pool.num_blocks, 2, num_layers, *per_block, head_dim + row_pad)
        with np.errstate(over="ignore", invalid="ignore"):
            pool_array = garbage_values(rng, garbage, pool_shape).astype(numpy_dtype(cache_dtype))
        key_cache, value_cache = pool_views(pool_array, layer, head_dim)
        for view, cache in ((key_cache, k_nhd), (value_cache, v_nhd)):
            view[...] = cache if kv_layout == "NHD" else cache.transpose(0, 2, 1, 3)
    elif kv_layout == "HND":
        key_cache = np.ascontiguousarray(k_nhd.transpose(0, 2, 1, 3))
        value_cache = np.ascontiguousarray(v_nhd.transpose(0, 2, 1, 3))
    else:
        key_cache, value_cache = k_nhd, v_nhd
    labels = {
        "feature": feature, "heads": heads.kind, "queries": ",".join(layout.kinds),
        "arrangement": pool.arrangement, "filler": pool.filler, "values": value_kind, "garbage": garbage,
    }
    qkv = None
    if draw(st.booleans(), label="fused_qkv"):  # the query a view of a fused projection's rows
        qkv = fused_qkv_rows(rng, garbage, heads.num_q_heads, heads.num_kv_heads, query=query)
        query = query_view(qkv, heads.num_q_heads)
    wide = None
    if draw(st.booleans(), label="table_view"):  # the block table a view of an engine's wider one
        wide = wider_table(rng, pool.block_tables, pool.num_blocks,
                           draw(st.integers(1, 5), label="table_extra_columns"))
    seed = draw(_SEEDS, label="variant_seed")
    index = np.dtype(draw(st.sampled_from(INDEX_DTYPES), label="index_dtype"))
    if wide is None:
        tables = pool.block_tables.astype(index)
    else:
        wide = wide.astype(index)
        tables = table_view(wide, pool.block_tables.shape[1])
    q_starts = layout.query_start_loc
    return AttentionCase(
        query=query, key_cache=key_cache, value_cache=value_cache, block_tables=tables,
        seq_lens=layout.seq_lens.astype(index), query_start_loc=None if q_starts is None else q_starts.astype(index),
        options=options, pool=pool_array, layer=layer, qkv=qkv, wide_tables=wide, seed=seed, labels=labels,
    )


def wider_table(rng: np.random.Generator, tables: np.ndarray, num_blocks: int, extra: int) -> np.ndarray:
    """``tables`` with ``extra`` more columns, as an engine keeps a table as wide as its longest
    sequence may grow and passes the columns a batch needs: the extra columns hold block ids in
    use by other sequences (where any is), so a kernel that takes the rows as dense reads real
    blocks, the wrong ones."""
    in_use = tables[(tables >= 0) & (tables < num_blocks)]
    fill = rng.choice(in_use, size=(tables.shape[0], extra)) if in_use.size else np.full((tables.shape[0], extra), -1)
    return np.concatenate([tables, fill.astype(tables.dtype)], axis=1)


def fused_qkv_rows(rng: np.random.Generator, garbage: str, num_q_heads: int, num_kv_heads: int, *,
                   query: np.ndarray | None = None, key: np.ndarray | None = None,
                   value: np.ndarray | None = None) -> np.ndarray:
    """A fused QKV projection's rows ``[T, Hq + 2 * Hkv, D]`` as an engine splits them: the parts
    given in their heads (query, then key, then value), garbage of kind ``garbage`` in the others,
    which the call never reads (a kernel that takes a view's rows as dense reads them from the
    second token on)."""
    given = next(x for x in (query, key, value) if x is not None)
    T, _, D = given.shape
    with np.errstate(over="ignore", invalid="ignore"):
        qkv = garbage_values(rng, garbage, (T, num_q_heads + 2 * num_kv_heads, D)).astype(given.dtype)
    for first, part in zip((0, num_q_heads, num_q_heads + num_kv_heads), (query, key, value), strict=True):
        if part is not None:
            qkv[:, first:first + part.shape[1]] = part
    return qkv


# -- other operations ---------------------------------------------------------------------

def _written_values(rng: np.random.Generator, kind: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Keys or values for write_kv of ``kind`` (see :func:`write_kv_cases`), in ``dtype``."""
    x = rng.standard_normal(shape)
    if kind == "wide":
        top = 14 if dtype == "float16" else 20
        x = x * np.exp2(rng.integers(-20, top + 1, size=shape).astype(np.float64))
    elif kind == "non_finite":
        hit = rng.random(shape) < 0.1
        x[hit] = rng.choice([np.nan, np.inf, -np.inf], int(hit.sum()))
    with np.errstate(over="ignore"):  # a wide value past the dtype's range is stored as inf, bits copied as any
        return x.astype(numpy_dtype(dtype))


#: Dtypes of the index arrays (block tables, seq_lens, query_start_loc, write_kv's slots, copy_blocks'
#: pairs): the contract takes any integer dtype; engines pass int32, and torch makes int64 by default.
INDEX_DTYPES = ("int32", "int64")
#: KV heads (least, most) and head dims of the write_kv cases the operation cells draw (the scale
#: cells draw wider ones).
WRITE_KV_HEADS, WRITE_KV_HEAD_DIMS = (1, 3), (8, 16, 64, 80)
#: KV heads (least, most) and head dims of the copy_blocks cases the operation cells draw.
COPY_BLOCKS_HEADS, COPY_BLOCKS_HEAD_DIMS = (1, 2), (16,)


@st.composite
def write_kv_cases(draw: st.DrawFn, *, dtype: str, cache_dtype: str, block_size: int, kv_layout: str,
                   heads: tuple[int, int] = WRITE_KV_HEADS, dims: tuple[int, ...] = WRITE_KV_HEAD_DIMS) -> WriteKVCase:
    """Return a strategy for a :class:`WriteKVCase` of ``heads`` KV heads (least, most) of one of
    ``dims``: unique slots (some -1) into garbage-filled caches.

    Slots are drawn from the whole pool, so neighbours of written slots hold garbage that must
    survive. Key and value are sometimes views of fused QKV rows, garbage in the query heads.
    ``values``: ``normal``; ``wide``, magnitudes from 2**-20 to 2**20 (2**14 in float16), past
    either fp8 range and into its subnormals; ``non_finite``, about one element in ten NaN,
    +inf or -inf. Shrinks towards one token, one head, arrays of their own, normal values.
    """
    num_heads = draw(st.integers(*heads), label="num_kv_heads")
    head_dim = draw(st.sampled_from(dims), label="head_dim")
    num_blocks = draw(st.integers(1, 6), label="num_blocks")
    T = draw(st.integers(1, min(LIMITS.max_tokens_write, num_blocks * block_size)), label="num_tokens")
    skips = draw(st.integers(0, T), label="skipped_tokens")
    rng = np.random.default_rng(draw(_SEEDS, label="seed"))
    slots = rng.choice(num_blocks * block_size, size=T, replace=False)
    slots[rng.choice(T, size=skips, replace=False)] = -1
    # int64 first; a list of ints, the contract's other form, last
    slot_form = draw(st.sampled_from((*INDEX_DTYPES[::-1], "list")), label="slot_form")
    scales = (1.0, 1.0)
    if cache_dtype in FP8_DTYPES:
        scales = draw(st.sampled_from(((1.0, 1.0), (0.5, 2.0), (0.0625, 0.25))), label="scales")
    garbage = draw(st.sampled_from(GARBAGE_KINDS), label="garbage")
    shape_nhd = (num_blocks, block_size, num_heads, head_dim)
    with np.errstate(over="ignore", invalid="ignore"):
        caches = [garbage_values(rng, garbage, shape_nhd).astype(numpy_dtype(cache_dtype)) for _ in range(2)]
    if kv_layout == "HND":
        caches = [np.ascontiguousarray(c.transpose(0, 2, 1, 3)) for c in caches]
    values = draw(st.sampled_from(("normal", "wide", "non_finite")), label="values")
    key, value = (_written_values(rng, values, (T, num_heads, head_dim), dtype) for _ in range(2))
    qkv = None
    if draw(st.booleans(), label="fused_qkv"):  # key and value views of a fused projection's rows
        query_heads = num_heads * draw(st.sampled_from((1, 4, 7)), label="group")
        qkv = fused_qkv_rows(rng, garbage, query_heads, num_heads, key=key, value=value)
        key, value = kv_views(qkv, num_heads)
    return WriteKVCase(key=key, value=value, key_cache=caches[0], value_cache=caches[1],
                       slot_mapping=slots.astype("int64" if slot_form == "list" else slot_form), kv_layout=kv_layout,
                       k_scale=scales[0], v_scale=scales[1], qkv=qkv, slots_as_list=slot_form == "list")


@st.composite
def copy_blocks_cases(draw: st.DrawFn, *, dtype: str, block_size: int, kv_layout: str,
                      heads: tuple[int, int] = COPY_BLOCKS_HEADS,
                      dims: tuple[int, ...] = COPY_BLOCKS_HEAD_DIMS) -> CopyBlocksCase:
    """Return a strategy for a :class:`CopyBlocksCase` of ``heads`` KV heads (least, most) of one of
    ``dims``: pairs with chains (a->b, b->c) and swaps.

    Destinations are unique (a repeated destination is bad input). ``dtype`` is the caches'; fp8
    caches hold random bytes, every code (NaN among them) a bit pattern to copy. Shrinks towards
    one pair.
    """
    num_blocks = draw(st.integers(2, 8), label="num_blocks")
    num_heads = draw(st.integers(*heads), label="num_kv_heads")
    head_dim = draw(st.sampled_from(dims), label="head_dim")
    rng = np.random.default_rng(draw(_SEEDS, label="seed"))
    n = draw(st.integers(1, num_blocks), label="num_pairs")
    dst = rng.choice(num_blocks, size=n, replace=False)
    pattern = draw(st.sampled_from(("chain", "swap", "random")), label="pattern")
    if pattern == "chain":  # dst[i] is copied from dst[i - 1]: order matters
        src = np.concatenate([[rng.integers(num_blocks)], dst[:-1]])
    elif pattern == "swap":
        src = np.roll(dst, 1)
    else:
        src = rng.integers(0, num_blocks, size=n)
    shape = ((num_blocks, block_size, num_heads, head_dim) if kv_layout == "NHD"
             else (num_blocks, num_heads, block_size, head_dim))
    if dtype in FP8_DTYPES:
        caches = [rng.integers(0, 256, size=shape, dtype=np.uint8).view(numpy_dtype(dtype)) for _ in range(2)]
    else:
        caches = [rng.standard_normal(shape).astype(numpy_dtype(dtype)) for _ in range(2)]
    index = draw(st.sampled_from(INDEX_DTYPES[::-1]), label="pairs_dtype")  # int64 first
    return CopyBlocksCase(key_cache=caches[0], value_cache=caches[1],
                          pairs=np.stack([src, dst], axis=1).astype(index), kv_layout=kv_layout)


#: Head dims of the merges the operation cell draws (the scale cells draw wider ones).
MERGE_HEAD_DIMS = (8, 64)


@st.composite
def merge_cases(draw: st.DrawFn, *, dtype: str, tokens: tuple[int, int] = (1, 6), heads: tuple[int, int] = (1, 4),
                dims: tuple[int, ...] = MERGE_HEAD_DIMS) -> MergeCase:
    """Return a strategy for a :class:`MergeCase` of ``tokens`` x ``heads`` rows (each range's least
    and most) of one of ``dims``:
    lse values from -inf (empty part, its out NaN) through large ones, one side or both empty,
    lses sometimes strided views of ``[H, T]`` arrays.
    ``non_finite`` puts what attention makes of non-finite data into parts that are not empty:
    ``values`` a NaN or inf in one dimension of out (a non-finite value; lse kept), ``scores``
    NaN in the whole out and lse (a NaN or +inf score). Shrinks towards the fewest tokens and
    heads, finite lse and finite data."""
    T = draw(st.integers(*tokens), label="num_tokens")
    H = draw(st.integers(*heads), label="num_heads")
    D = draw(st.sampled_from(dims), label="head_dim")
    rng = np.random.default_rng(draw(_SEEDS, label="seed"))
    spread = draw(st.sampled_from((1.0, 30.0, 1e4)), label="lse_spread")
    empty = draw(st.sampled_from((0.0, 0.3, 0.7)), label="empty_fraction")
    non_finite = draw(st.sampled_from(("none", "values", "scores")), label="non_finite")
    lse = [(rng.standard_normal((T, H)) * spread).astype(np.float32) for _ in range(2)]
    outs = [rng.standard_normal((T, H, D)) for _ in range(2)]
    for side in range(2):
        hole = rng.random((T, H)) < empty
        lse[side][hole] = -np.inf
        outs[side][hole] = np.nan  # the empty side's out is ignored, even NaN
        hit = ~hole & (rng.random((T, H)) < 0.5)
        if non_finite == "values":  # one dimension of the part's out, whatever its weight
            t, h = np.nonzero(hit)
            outs[side][t, h, rng.integers(0, D, t.size)] = rng.choice([np.nan, np.inf, -np.inf], t.size)
        elif non_finite == "scores":
            outs[side][hit] = np.nan
            lse[side][hit] = np.nan
    return MergeCase(out_a=outs[0].astype(numpy_dtype(dtype)), lse_a=lse[0],
                     out_b=outs[1].astype(numpy_dtype(dtype)), lse_b=lse[1],
                     lse_heads_first=draw(st.booleans(), label="lse_heads_first"))
