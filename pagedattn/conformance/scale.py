"""Strategies for bugs that show only at scale: long sequences, pools above 2**31 elements, odd sizes.

Kernels change code paths as sizes grow. Each strategy here draws an existing case type
(:class:`~pagedattn.conformance.cases.AttentionCase`, :class:`WriteKVCase`,
:class:`CopyBlocksCase`) at the sizes where those paths run:

- :func:`long_sequence_cases`: 1 to a few sequences of thousands of keys (a small batch of
  long sequences is where kernels split the key range, split-KV, and merge the parts; rows
  of 4,096+ visible keys are where 16-bit accumulation error shows), odd lengths so that
  the last part is partial; with ``short_seqs``, beside short sequences that fit in one part
  (one plan holding split and unsplit sequences);
- :func:`very_long_sequence_cases`: one sequence of more than 65,536 keys, where positions
  held in 16 bits wrap and a long split plan has more parts than a fixed-size merge holds
  (:func:`very_long_window_sequence_cases`: under a sliding window);
- :func:`million_key_sequence_cases`: one sequence of more than 2**20 keys, past what a plan or
  merge sized for a 131,072-key context holds;
- :func:`kv_bytes_past_int32_cases`: one sequence whose keys and values of a KV head pass 2**31
  bytes (4,194,304 keys at head_dim 128 in 16 bits), where a size held in signed 32 bits wraps;
  its table names a few thousand blocks many times each, so the caches stay small;
- :func:`long_prefill_cases`: 1 or 2 sequences of hundreds of queries (512 rows and up each),
  after up to 1,000 keys of context: several query tiles per sequence, causal diagonals (or,
  without the mask, every tile's range to the sequence's end);
- :func:`long_chunk_cases`: 1 or 2 chunks of more than 1,100 queries after thousands of keys of
  context: split plans of many query tiles, parts past a tile's causal bound;
- :func:`far_pool_cases`, :func:`far_write_kv_cases`, :func:`far_copy_blocks_cases`: caches
  of more than 2**31 elements whose blocks in use lie past the 2**31st element and byte 2**32
  (element 2**32 of an fp8 cache), where 32-bit offset arithmetic overflows; the operations'
  caches pass element 2**32, where an unsigned 32-bit offset wraps, and their last block is
  written. The caches are lazy (:func:`~pagedattn.spec.pools.lazy_cache`): only the blocks a
  case fills cost memory, and every other block is zero;
- :func:`far_row_cases`, :func:`far_merge_row_cases`, :func:`far_row_write_kv_cases`: a query,
  and so an output, of more than 2**31 elements (about 131,072 tokens of 128 query heads of
  128), ``merge_states`` of two such states, and ``write_kv`` of a key and value that large,
  where a row's offset ``token * heads * D`` overflows 32 bits;
- :func:`wide_group_cases`: GQA ratios from 12 to 128 (:data:`WIDE_GROUPS`), past one row
  tile of a KV head's query heads, where kernels cut a group into tiles;
- :func:`very_long_batch_cases`: a batch that fills the GPU, so unsplit, of sequences past 65,536
  keys (decode, or a few queries a sequence), where an offset within a range walked whole wraps in
  16 bits; its tables name a few hundred blocks many times each;
- :func:`large_batch_cases`: more than :data:`MAX_RESIDENT_CTAS` short sequences, more work
  than one wave of CTAs on the GPU;
- :func:`shared_prefix_batch_cases`: 16 to 128 sequences sharing the blocks of a prefix of
  hundreds or thousands of keys (in one group, or two), the batches engines run on a cascade path;
- :func:`far_partial_cases`: more than 16,384 short sequences beside one of 2**15 keys, so that
  split-KV partials laid out by sequence, as many parts each as the longest has, pass 2**31
  elements;
- :func:`far_score_cases`: one causal prefill of 47,000 queries and more, so that one head's
  scores, queries x keys, pass 2**31 elements, where a per-(query, key) offset in 32 bits wraps
  and a kernel holding a head's scores whole runs out of memory;
- :func:`far_score_uint32_cases`: one causal chunk of 8,193 queries and more after 524,288 keys,
  so that one head's scores pass 2**32 elements, where an unsigned 32-bit offset wraps (its table
  names a few hundred blocks many times);
- :func:`many_token_cases`, :func:`many_token_write_kv_cases`: more than 65,535 query tokens
  (or tokens written) in one call, past a CUDA grid's y and z limit;
- :func:`many_sequence_cases`: more than 65,536 sequences in one call (decode, or prompts of
  two queries), past the same limit for a kernel that puts sequences on a grid's y or z axis;
- :func:`many_pair_copy_blocks_cases`: ``copy_blocks`` of more than 65,535 pairs in one call,
  past it for a kernel that puts pairs there; :func:`many_token_merge_cases`: ``merge_states`` of
  more than 65,535 tokens;
- :func:`wide_merge_cases`: ``merge_states`` of 65 to 160 heads of 80 to 512 dims, past a block
  of one row per head and past a row tile of 128 or 256 dims; :func:`wide_head_operation_cases`:
  ``write_kv`` and ``copy_blocks`` of 65 to 128 KV heads, past a block of every head of a token;
- :func:`odd_size_cases`: head counts, GQA ratios, head_dim, block_size, num_blocks,
  lengths and batch sizes that are not powers of two, wherever the backend allows them.

How far each goes is :func:`scale_limits`: one row of :data:`SCALE_LIMITS` per hypothesis
profile, widened by ``PAGEDATTN_SIZE=large``. Examples shrink towards one sequence of the
shortest long length, one head, no optional feature.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from itertools import pairwise
from typing import Any, NamedTuple

import numpy as np
from hypothesis import settings
from hypothesis import strategies as st

from pagedattn.backends.capabilities import Capabilities
from pagedattn.conformance.cases import AttentionCase, CopyBlocksCase, MergeCase, WriteKVCase
from pagedattn.conformance.strategies import (
    CONTRACT_BLOCK_SIZES,
    GARBAGE_KINDS,
    HUGE_SCORES_FACTOR,
    LARGE_MAGNITUDE,
    SCALES,
    alibi_slopes,
    block_tables,
    copy_blocks_cases,
    fill_caches,
    garbage_values,
    head_dim_choices,
    head_dims,
    merge_cases,
    seq_lens,
    sizes_are_large,
    write_kv_cases,
)
from pagedattn.spec.case import table_view
from pagedattn.spec.dtypes import FP8_DTYPES, QUERY_DTYPES, numpy_dtype
from pagedattn.spec.pools import INT32_OFFSET_LIMIT, UINT32_OFFSET_LIMIT, blocks_past, lazy_cache

__all__ = [
    "BATCH_KINDS",
    "FAR_BYTE_LIMIT",
    "FAR_MERGE_SEED",
    "FAR_PARTIAL_KEYS",
    "FAR_PARTIAL_PART_KEYS",
    "FAR_PARTIAL_ROW",
    "FAR_ROW_BLOCKS",
    "FAR_ROW_ELEMENTS",
    "FAR_SCORE_HEADS",
    "FAR_SCORE_QUERIES",
    "FAR_SCORE_ROWS",
    "FAR_TABLE_PADDING",
    "FAR_TABLE_WIDTH",
    "FAR_UINT32_SCORE_CONTEXT",
    "FAR_UINT32_SCORE_QUERIES",
    "FAR_VIEW_LAYERS",
    "FAR_WRITE_ROW_ELEMENTS",
    "HEAD_NEEDLE_KEY",
    "HEAD_NEEDLE_QUERY",
    "KV_BYTES_DISTINCT_BLOCKS",
    "KV_BYTES_GAP",
    "KV_BYTES_LIMIT",
    "LARGE_BATCH_SEQS",
    "LONG_BATCH_KEYS",
    "LONG_BATCH_PAIRS",
    "LONG_BATCH_QUERY_FACTOR",
    "LONG_FP8_K_SCALES",
    "LONG_FP8_V_SCALES",
    "LONG_GROUPS",
    "LONG_HEAD_NEEDLE_KINDS",
    "LONG_MAX_QUERIES",
    "LONG_NEEDLE_KINDS",
    "LONG_PREFILL_ROWS",
    "LONG_PREFILL_VALUE_KINDS",
    "LONG_TAIL_KINDS",
    "LONG_VALUE_KINDS",
    "LONG_VERIFY_QUERIES",
    "LONG_WIDE_GROUPS",
    "LONG_WINDOW_EDGE_KINDS",
    "LONG_WINDOW_MIN",
    "MANY_PAIRS",
    "MANY_SEQUENCES",
    "MANY_TOKENS",
    "MAX_RESIDENT_CTAS",
    "MIXED_LONG_SEQS",
    "MIXED_SHORT_MAX",
    "NEEDLE_GAP",
    "ODD_BLOCK_SIZES",
    "SCALE_GARBAGE_KINDS",
    "SCALE_LIMITS",
    "SHARED_PREFIX_KEYS",
    "SHARED_PREFIX_SEQS",
    "SHARED_PREFIX_SUFFIX",
    "SMALL_BLOCK_SIZES",
    "SPLIT_BATCH_PAIRS",
    "VERY_LONG_BATCH_DISTINCT_BLOCKS",
    "VERY_LONG_BATCH_PAST",
    "VERY_LONG_BATCH_WRAP",
    "VERY_LONG_KEYS",
    "VERY_LONG_MAX",
    "VERY_LONG_MAX_WINDOW",
    "WIDE_GROUPS",
    "WIDE_KV_HEADS",
    "WIDE_KV_HEAD_DIMS",
    "WIDE_MERGE_HEADS",
    "WIDE_MERGE_HEAD_DIMS",
    "ScaleLimits",
    "far_copy_blocks_cases",
    "far_layer_view_cases",
    "far_merge_row_cases",
    "far_partial_cases",
    "far_partial_parts",
    "far_partial_sequences",
    "far_pool_cases",
    "far_pool_limit",
    "far_row_cases",
    "far_row_sequences",
    "far_row_write_kv_cases",
    "far_score_cases",
    "far_score_rows",
    "far_score_uint32_cases",
    "far_table_cases",
    "far_write_kv_cases",
    "kv_bytes_head_dims",
    "kv_bytes_past_int32_cases",
    "kv_bytes_wrap_keys",
    "large_batch_cases",
    "long_batch_cases",
    "long_prefill_cases",
    "long_prefill_queries",
    "long_sequence_cases",
    "long_tail_batch_cases",
    "many_pair_copy_blocks_cases",
    "many_sequence_cases",
    "many_token_cases",
    "many_token_merge_cases",
    "many_token_write_kv_cases",
    "odd_size_cases",
    "past_uint32_elements",
    "scale_block_sizes",
    "scale_limits",
    "shared_prefix_batch_cases",
    "small_block_cases",
    "small_block_sizes",
    "very_long_batch_cases",
    "very_long_sequence_cases",
    "very_long_window_sequence_cases",
    "wide_group_cases",
    "wide_head_operation_cases",
    "wide_merge_cases",
]


class ScaleLimits(NamedTuple):
    """How far the scale cells go under one profile."""

    min_long: int  # keys of the shortest "long" sequence (4,096: 16-bit accumulation shows)
    max_long: int  # keys of the longest sequence
    max_long_seqs: int  # sequences of a long batch (small batches are the ones kernels split)
    pool_elements: int  # far pools hold more than this many elements per cache
    long_examples: int  # examples per long-sequence cell (the first is the shrink target)
    far_examples: int  # examples per far-pool cell
    odd_examples: int  # examples per odd-size cell
    odd_max_len: int  # longest sequence of the odd-size cells
    long_dtypes: tuple[str, ...] = QUERY_DTYPES  # dtypes of the long-sequence cells
    max_batch_keys: int = 2**18  # keys x KV heads of a long batch, summed over its sequences
    wide_examples: int = 2  # examples per wide-group cell
    batch_examples: int = 1  # examples per large-batch cell


#: One row per hypothesis profile; ``large`` is applied over it with ``PAGEDATTN_SIZE=large``.
SCALE_LIMITS: dict[str, ScaleLimits] = {
    # quick: long cells in the 16-bit dtypes only (where accumulation error shows; float32 from ci on)
    "quick": ScaleLimits(4096, 8192, 2, INT32_OFFSET_LIMIT, 1, 1, 2, 400, ("float16", "bfloat16"), 16_384, 2, 1),
    "ci": ScaleLimits(4096, 16_384, 4, INT32_OFFSET_LIMIT, 2, 2, 3, 800, QUERY_DTYPES, 24_576, 3, 1),
    "thorough": ScaleLimits(4096, 65_536, 4, INT32_OFFSET_LIMIT, 10, 4, 20, 4000, QUERY_DTYPES, 2**18, 20, 4),
    "large": ScaleLimits(4096, 65_536, 4, 2**32, 3, 2, 4, 4000, QUERY_DTYPES, 2**18, 4, 2),
}
#: Bound on ``queries x q_heads x keys x head_dim`` of a long sequence: the spec's float64
#: gather for one sequence holds that many values (2**23: 64 MiB).
SPEC_ELEMENTS = 2**23
#: The batch kinds of the scale cells that come one cell per kind: decode (one query a sequence), and
#: a few queries a sequence (varlen; 2 and up, as one query a sequence is a batch a backend may take
#: as decode). GPU backends run each kind on kernels of their own (cupy on sm_90: its decode kernel;
#: its CUDA-core kernel, or its mma.sync one for fp8 caches), and a cell of one or two examples
#: that draws the kind reaches one of them only.
BATCH_KINDS: tuple[str, ...] = ("decode", "queries")


def _is_decode(draw: st.DrawFn, caps: Capabilities, decode: bool | None) -> bool:
    """Whether a case is decode: ``decode`` where given, else drawn (a few queries only with varlen)."""
    if decode is not None:
        return decode
    return not (caps.supports("varlen") and draw(st.booleans(), label="varlen"))


def _fewest_queries(decode: bool | None) -> int:
    """The fewest queries a sequence of a case that is not decode: 2 where the cell asks for a
    few queries (a batch of one query each a backend may treat as decode), else 1."""
    return 2 if decode is False else 1


#: Block sizes that are no power of two, drawn for backends that accept any block size.
ODD_BLOCK_SIZES: tuple[int, ...] = (24, 40, 48)
#: Value patterns of the long cells. "trend": scores ramp by about +-2 along the sequence with
#: little noise, and values from about 1 to 2, so the parts of a split sequence differ in
#: their maximum score and their mean value (a merge that weighs them wrongly shows), while
#: most keys keep a weight of the same order, so the unnormalised output O = sum p v grows
#: with the number of keys (a half-precision O loses the small terms); falling for the first half
#: of each group's heads and rising for the second (``_query``); "normal": standard normal K and V.
LONG_VALUE_KINDS: tuple[str, ...] = ("trend", "normal")
#: Powers of two (least, greatest exponent) the rows of a long cell's "normal" query are scaled by.
QUERY_ROW_EXPONENTS: tuple[int, int] = (-3, 3)
#: The value pattern of the long-tail cells, "tail": a query of about 1 in every dim, the first key
#: of each sequence scoring :data:`TAIL_GAP` above every other (an attention sink, as a model's
#: first token is: +4 against about -4), with values near -1 at the sink and near +1 elsewhere.
#: Each other key weighs about e**-8 of the sink's, under 2**-10 (half of float8 e4m3's smallest
#: step) with fp8 keys too, yet 4,096 of them hold about half of a row's mass and 65,536 all
#: but 5%: a kernel that drops weights that small once it has seen the sink (P cast to fp8,
#: blocks skipped under a threshold) is right on short rows and far off on long ones, where the
#: right output moves from the sink's value towards the others'; a split plan confines the loss
#: to the part that holds the sink, so the longer its parts, the more it shows. Scores of +-4
#: rather than 8 and 0 halve the error model's bound (it grows with the largest score magnitude a
#: row sees).
LONG_TAIL_KINDS: tuple[str, ...] = ("tail",)
#: The value pattern of the long-needle cell, "needle": the query of "tail", every key scoring about
#: -NEEDLE_GAP / 2 but two, the needles, which score +NEEDLE_GAP / 2, one in the third quarter of the
#: sequence and one in the last (the keys a retrieval head looks up). A split plan's first parts see
#: no needle: a later part's lse lies NEEDLE_GAP above theirs, past what float32's exp holds
#: (e**88.7), so a merge that exponentiates a difference of lse without its max overflows; the
#: right output is the needles' mean value.
LONG_NEEDLE_KINDS: tuple[str, ...] = ("needle",)
#: The needles' score above every other key's (natural-log units): past log(float32's largest), 88.7.
NEEDLE_GAP = 100.0
#: The value pattern of the cell of one-head needles, "head_needles": each query head of a group
#: owns one dim (the first heads of a group the first dims), where its query is
#: HEAD_NEEDLE_QUERY * sqrt(head_dim) and every other head's query 0; every key is 0 but one a
#: head, its needle, which holds HEAD_NEEDLE_KEY in the head's dim, past the first quarter of the
#: sequence. Every score is exactly 0 but a needle's for its head, 16: after its first keys no row
#: raises its running max (alpha is exactly 1) but at its own needle, where it alone raises it by
#: 16. A kernel that decides a step's O *= alpha over some rows of a tile (a warp vote over one of
#: a lane's two rows) leaves that head's O at the old scale, off by the mass of its earlier keys,
#: whose values lie near 1; split ranges and the streams within them do not hide it, as every
#: part starts from scores that never rise.
LONG_HEAD_NEEDLE_KINDS: tuple[str, ...] = ("head_needles",)
#: The value pattern of the long cell of fp8 caches under a window, "window_edges": the query of
#: "tail", every key scoring about -WINDOW_EDGE_GAP / 2 but those within WINDOW_EDGE_REACH keys of
#: some query row's window edge (the first key it sees, p_q - W + 1, and the last it does not,
#: p_q - W), which score +WINDOW_EDGE_GAP / 2 and hold standard normal values. A row's output is
#: about the mean value of the edge keys inside its window, a handful: a kernel that moves a row's
#: edge by one key (another row's edge, the window of a split part's first key, p >= p_q - W) moves
#: that mean by a fraction of a unit, while the keys far from every edge, hundreds to thousands of
#: them at e**-8 of an edge key's weight, still hold a share of the row's mass.
LONG_WINDOW_EDGE_KINDS: tuple[str, ...] = ("window_edges",)
#: The edge keys' score above every other key's (natural-log units), as the tail's sink.
WINDOW_EDGE_GAP = 8.0
#: Keys on either side of a row's window edge that score high, beyond its first unseen key.
WINDOW_EDGE_REACH = 2
#: The one-head needle's key in its head's dim: exact in every fp8 format, with any k_scale drawn.
HEAD_NEEDLE_KEY = 8.0
#: The one-head needle's query in its head's dim, in units of sqrt(head_dim): a score of
#: HEAD_NEEDLE_QUERY * HEAD_NEEDLE_KEY (16) under the default scale.
HEAD_NEEDLE_QUERY = 2.0
#: Queries a sequence of the long cells holds at most (its last positions: a decode of a few tokens).
LONG_MAX_QUERIES = 4
#: Queries a sequence of the long verify batches, at least and at most (its last positions): a
#: speculative decoding's verify of 7 to 15 draft tokens (EAGLE's and MTP's 8 queries among them),
#: past the few-query kernels' rows; from 8 queries a sequence cupy takes a batch to its tensor-core
#: prefill kernels, as one partial query tile over a split range.
LONG_VERIFY_QUERIES: tuple[int, int] = (8, 16)
#: Long sequences of a mixed-length batch, at most, and keys of its short sequences, at most: a
#: batch of at most four sequences, which kernels split, where the short ones fit in one part
#: (a split plan leaves them whole, or gives them parts past their end that see no key).
MIXED_LONG_SEQS = 2
MIXED_SHORT_MAX = 300
#: GQA ratios the long cells draw.
LONG_GROUPS: tuple[int, ...] = (1, 2, 3, 5, 8)
#: GQA ratios of the long cell of wide groups: past 8, the most the other long cells draw, and the
#: 8 rows of an MMA tile's first row slot (16 first: one full 16-row tile); 17 and 24 past it.
#: Models with long contexts take them (64 query heads on 4 KV heads: 16).
LONG_WIDE_GROUPS: tuple[int, ...] = (16, 12, 17, 24, 32)
#: The sink's score above the other keys' in the "tail" pattern (natural-log units).
TAIL_GAP = 8.0
#: fp8 scales of the long cells with fp8 caches: v_scale is never 1, so that applying it once per
#: split part and again after the merge (or never) shows.
LONG_FP8_K_SCALES: tuple[float, ...] = (0.5, 1.0, 2.0)
LONG_FP8_V_SCALES: tuple[float, ...] = (4.0, 0.25)
#: Keys of a very long sequence, at least and at most: past 65,535 (positions and lengths held in
#: 16 bits wrap there) and past 64 split parts of 1,024 keys (a merge that holds a fixed number of
#: parts drops the rest); one KV head, so that the spec and the Triton interpreter stay at seconds.
VERY_LONG_KEYS = 2**16 + 1
VERY_LONG_MAX = 2**17
#: Keys of a million-key sequence, at least and at most: a context of the million-token models,
#: past what a merge or reduction sized for a 131,072-key context holds (512 parts of 256 keys,
#: 128 of 1,024), past 65,536 block-table columns of 16 keys, and past 2**20 positions.
MILLION_KEYS = 2**20 + 1
MILLION_MAX = 2**20 + 2**18
#: What the scale cells' unused slots and blocks hold: :data:`GARBAGE_KINDS` with NaN first. Under
#: ``quick`` most of them run one example, their first draw; NaN in a slot that a kernel reads and
#: masks (a key tile past ``L``, copied whole) shows as 0 * NaN in ``P V``, where finite garbage
#: is multiplied by 0 unseen.
SCALE_GARBAGE_KINDS: tuple[str, ...] = ("nan", *(kind for kind in GARBAGE_KINDS if kind != "nan"))
#: Shortest sliding window of the long cells with a window (a few blocks and tiles).
LONG_WINDOW_MIN = 100
#: Widest sliding window of the very-long cell with a window: Mistral's and Gemma 2's 4,096 (Gemma 3
#: takes 1,024, gpt-oss 128). A kernel visits only the window, so an interpreter's cost stays low.
VERY_LONG_MAX_WINDOW = 4096
#: The long cells' ALiBi slopes are those of a model with at least this many heads (its first).
LONG_ALIBI_HEADS = 8
#: GQA ratios of the wide-group cells, all past the other cells' 8: across the row tiles that
#: kernels fill with one KV head's query heads (16 rows: one MMA tile; 64 and 128: prefill
#: tiles), powers of two and not. The shrink target, 96, is past a 64-row tile by more than a
#: 16-row tile's reach from it (heads 80 to 95: tiles of 64 placed 16 apart leave them unwritten),
#: and leaves a partial second tile; 71 (an MQA model's 71 heads) and 128 (MLA decode) follow.
WIDE_GROUPS: tuple[int, ...] = (96, 16, 12, 17, 24, 32, 48, 64, 65, 71, 128)
#: The most CTAs an H200 (or H100 SXM) runs at once: 32 a multiprocessor, sm_90's limit, on 132.
MAX_RESIDENT_CTAS = 32 * 132
#: Sequences, and so (sequence, KV head) pairs, of a large batch, at least: more than any kernel
#: of one CTA per sequence or per pair holds resident, however small its footprint, so its work
#: runs in more than one wave (a persistent kernel loops over its list).
LARGE_BATCH_SEQS = MAX_RESIDENT_CTAS + 1
#: Keys of a sequence in a large batch, at most (many short sequences: the engine's decode batch).
LARGE_BATCH_MAX_LEN = 80
#: Sequences of a shared-prefix batch, at least and at most: past the 8 from which engines take
#: a cascade path (the prefix computed once for every sequence, then merged with each suffix),
#: up to 128 requests of one system prompt.
SHARED_PREFIX_SEQS = (16, 128)
#: Keys of a shared prefix, at least and at most: past the 256 a cascade path asks for.
SHARED_PREFIX_KEYS = (256, 2048)
#: Keys of a sequence after its shared prefix, in blocks of its own, at least and at most.
SHARED_PREFIX_SUFFIX = (1, 200)
#: Rows (queries x query heads of a KV head) of each sequence of a long prefill, at least: 4 of
#: the 128-row tiles of cupy's Hopper prefill kernel, which takes batches of that many rows per
#: sequence; and queries, at least: several 16- to 64-query tiles.
LONG_PREFILL_ROWS = 512
LONG_PREFILL_MIN_QUERIES = 64


def long_prefill_queries(group_size: int, at_least: int = LONG_PREFILL_MIN_QUERIES) -> int:
    """Queries a sequence of :data:`LONG_PREFILL_ROWS` rows or more holds, at least, with
    ``group_size`` query heads a KV head, and ``at_least`` queries."""
    return max(at_least, -(-LONG_PREFILL_ROWS // group_size))

#: (sequence, KV head) pairs of a long batch, at least: four CTAs for each of an H200's 132
#: multiprocessors, so that no plan splits its sequences and each CTA walks a whole range.
LONG_BATCH_PAIRS = 4 * 132
#: (sequence, KV head) pairs of a split batch: half a CTA for each of an H200's 132
#: multiprocessors, so that plans split every sequence (triton into 8 parts of llama3-70b's
#: tensor-parallel decode, 64 sequences of 8,192 keys on one KV head), and hundreds of parts
#: share the partials' workspace: the long cells' batches hold at most 4 sequences.
SPLIT_BATCH_PAIRS = 64
#: Keys of each sequence of a long batch, at least and at most: well past 4,096, where a CTA that
#: holds block-table entries in registers, 32 sub-tiles of 16 keys for each of 4 warps (2,048 keys
#: a batch), reads its third batch (a third of the keys and more lie past it).
LONG_BATCH_KEYS = (6_000, 8_192)
#: The long batches' queries are scaled by this power of two: scores within about 0.1 of 0.
LONG_BATCH_QUERY_FACTOR = 2.0**-6
#: Keys of context before a long prefill's queries, at most (0 is drawn first: a whole prompt).
LONG_PREFILL_MAX_CONTEXT = 1024
#: Query patterns of the long prefills: "normal" (standard normal), "large" (every query times
#: LARGE_MAGNITUDE: scores in the hundreds to thousands, which overflow exp once a kernel's row max
#: is off), "huge_scores" (bfloat16: each sequence's last query times HUGE_SCORES_FACTOR, scores
#: near 1e10, where a score's float32 rounding is hundreds of units). The kernels that only large
#: prefills reach (cupy's Hopper kernel) meet them here, with explicit scales of either sign.
LONG_PREFILL_VALUE_KINDS: tuple[str, ...] = ("normal", "large", "huge_scores")
#: Query tokens of a many-token batch, at least: past 65,535, the most blocks a CUDA grid's y or
#: z axis takes.
MANY_TOKENS = 65_536
#: Sequences of a many-token batch: prompts of 256 queries.
MANY_TOKEN_SEQS = 256
#: Sequences of a many-sequence batch, more than: past 65,535, the most blocks a CUDA grid's y or z
#: axis takes, and an index past 16 bits.
MANY_SEQUENCES = 65_536
#: Keys of a sequence in a many-sequence batch, at most, where blocks hold fewer than 24 keys
#: (one or two blocks at block size 16; a block and one key at larger sizes).
MANY_SEQUENCE_MAX_LEN = 24
#: Pairs of a many-pair copy_blocks call, at least: past 65,535, the most blocks a CUDA grid's y or z
#: axis takes.
MANY_PAIRS = 65_536
#: Heads of a wide merge, at least and at most: past 64, where a block of one row per head at 16
#: lanes a row (head_dim 128 in 16-byte vectors of 16-bit values) passes CUDA's 1,024 threads, to
#: 160 (an MLA model's 128 heads and more, on one GPU).
WIDE_MERGE_HEADS = (65, 160)
#: Head dims of a wide merge: MLA's value dim of 512 first (the shrink target: past a 256-dim tile),
#: then 128 and 256, and dims that are no power of two.
WIDE_MERGE_HEAD_DIMS = (512, 80, 128, 192, 256)
#: Blocks of a far pool past the first one beyond ``pool_elements``: room for the blocks in use.
FAR_BLOCKS = 64
#: The dtype whose long-sequence, far-pool and far layer-view cases draw the largest block size and
#: group and the last declared KV layout (HND) first, and whose long cases the widest head_dim their
#: budget holds. A cell draws the simplest example first, the one example of a `quick` cell: the
#: float16 cells read the pool in the first declared block size, head_dim and layout with one query
#: head a KV head, the bfloat16 cells in the largest, in HND, with groups (GPU kernels take a key
#: tile inside one block, grouped heads, each head_dim and each layout on paths of their own,
#: split-KV ones among them).
LARGEST_FIRST_DTYPE = "bfloat16"
#: The values of the far cells with fp8 caches, of :data:`LONG_VALUE_KINDS`: values from about 1 to 2,
#: so a row's output is about 1.5 and a read that wraps onto blocks of zeros moves it well past fp8's
#: bound. Standard normal values average to about 0.2 over a short row, inside that bound (its
#: products are rounded to the query dtype), so a wrapped read of zeros would pass.
FAR_FP8_VALUES = "trend"
#: Elements of one query token (query heads x head_dim) of a far-row batch, at least: about 131,072
#: tokens of them (a long prefill's, or a large decode batch's) take the query and the output past
#: 2**31 elements.
FAR_ROW_ELEMENTS = 2**14
#: Physical blocks of a far-row batch's pool. Its sequences share them (each table names blocks at
#: random), so the caches stay small however many sequences the batch holds.
FAR_ROW_BLOCKS = 257
#: Which middle row of a far-row merge is compared (:func:`far_row_sequences`' seed): a merge case
#: carries no seed of its own.
FAR_MERGE_SEED = 2**16 + 1
_SEEDS = st.integers(0, 2**32 - 1)


def scale_limits(profile: str | None = None) -> ScaleLimits:
    """The limits of ``profile`` (default: hypothesis' current one; unknown ones get ``ci``'s),
    widened to :data:`SCALE_LIMITS` ``["large"]`` under ``PAGEDATTN_SIZE=large``."""
    name = profile or settings.get_current_profile_name()
    limits = SCALE_LIMITS.get(name, SCALE_LIMITS["ci"])
    if sizes_are_large():
        large = SCALE_LIMITS["large"]
        limits = limits._replace(max_long=max(limits.max_long, large.max_long),
                                 max_long_seqs=max(limits.max_long_seqs, large.max_long_seqs),
                                 pool_elements=max(limits.pool_elements, large.pool_elements),
                                 max_batch_keys=max(limits.max_batch_keys, large.max_batch_keys),
                                 odd_max_len=max(limits.odd_max_len, large.odd_max_len))
    return limits


def scale_block_sizes(capabilities: Capabilities) -> tuple[int, ...]:
    """The backend's declared block sizes, else the contract's plus :data:`ODD_BLOCK_SIZES`."""
    if capabilities.block_sizes is not None:
        return tuple(capabilities.block_sizes)
    return (*CONTRACT_BLOCK_SIZES, *ODD_BLOCK_SIZES)


def _kv_layouts(capabilities: Capabilities, last_first: bool = False) -> st.SearchStrategy[str]:
    """The declared KV layouts, NHD first, or with ``last_first`` the last declared (HND) first."""
    layouts = tuple(capabilities.kv_layouts)
    return st.sampled_from(layouts[::-1] if last_first else layouts)


def _values(rng: np.random.Generator, kind: str, lens: list[int], num_kv_heads: int,
            head_dim: int, group: int = 1, *, q_lens: list[int] | None = None,
            window: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
    """K, V float64 ``[L, Hkv, D]`` of each sequence for a kind of :data:`LONG_VALUE_KINDS`,
    :data:`LONG_TAIL_KINDS`, :data:`LONG_NEEDLE_KINDS`, :data:`LONG_HEAD_NEEDLE_KINDS` (``group``
    query heads a KV head) or :data:`LONG_WINDOW_EDGE_KINDS` (the edges of ``window`` for the last
    ``q_lens[s]`` positions of sequence ``s``, one each if not given)."""
    result = []
    for s, length in enumerate(lens):
        k = rng.standard_normal((length, num_kv_heads, head_dim))
        v = rng.standard_normal((length, num_kv_heads, head_dim))
        if kind == "trend":
            ramp = (np.arange(length) / max(length, 1))[:, None, None]
            k = 0.1 * k + 2.0 * ramp  # scores ramp by about +-2 along the sequence, little noise
            v = 1.0 + 0.1 * v + ramp
        elif kind == "tail":  # with the query of _query: scores near -TAIL_GAP / 2, the first +TAIL_GAP / 2
            half_gap = TAIL_GAP / 2 / np.sqrt(head_dim)  # q . k * D**-0.5 = TAIL_GAP / 2 * mean(q)
            k, v = 0.05 * k - half_gap, 1.0 + 0.1 * v
            k[0] = half_gap
            v[0] -= 2.0
        elif kind == "needle":  # with the query of _query: scores near -NEEDLE_GAP / 2, two at +NEEDLE_GAP / 2
            half_gap = NEEDLE_GAP / 2 / np.sqrt(head_dim)
            k = 0.05 * k - half_gap
            for quarter in (2, 3):  # one needle in the third quarter, one in the last, before every query
                end = min((quarter + 1) * length // 4, length - LONG_MAX_QUERIES)
                k[rng.integers(quarter * length // 4, end)] = half_gap
        elif kind == "window_edges":  # with the query of _query: the keys at its rows' window edges score high
            if window is None:
                raise ValueError("window_edges values need the window")
            half_gap = WINDOW_EDGE_GAP / 2 / np.sqrt(head_dim)
            k, v = 0.05 * k - half_gap, 0.1 * v
            rows = q_lens[s] if q_lens is not None else 1
            edges = np.arange(length - max(rows, 1), length) - window  # each row's last unseen key, p_q - W
            near = np.arange(max(0, edges.min() - WINDOW_EDGE_REACH), max(0, edges.max() + WINDOW_EDGE_REACH + 2))
            near = near[near < length]
            k[near] = half_gap + 0.05 * rng.standard_normal((len(near), num_kv_heads, head_dim))
            v[near] = rng.standard_normal((len(near), num_kv_heads, head_dim))
        elif kind == "head_needles":  # with the query of _query: one key a head scoring 16 for it alone, else 0
            owned = min(group, head_dim)
            k = np.zeros_like(k)
            v = 1.0 + 0.1 * v
            for kv_head in range(num_kv_heads):
                for dim in range(owned):
                    k[rng.integers(length // 4, length - LONG_MAX_QUERIES), kv_head, dim] = HEAD_NEEDLE_KEY
        result.append((k, v))
    return result


def _query(rng: np.random.Generator, kind: str, shape: tuple[int, ...], dtype: str, group: int = 1) -> np.ndarray:
    """A query of ``shape`` (heads in groups of ``group`` per KV head) for K and V of ``kind``: about 1
    in every dim for "tail", "needle" and "window_edges" (so that every head and query gives the
    sink, the needles or the edges their score); else standard normal, for "normal" each row
    (token, head) times its own power of two from :data:`QUERY_ROW_EXPONENTS`, as a model's
    heads differ in scale (a kernel that scales rows, bfloat16 queries into float16's range, and
    undoes another row's scale meets rows whose largest elements differ in exponent); for
    "trend" every element of a row of one sign, |q_d| summing to about sqrt(head_dim), so that
    its scores follow the keys' ramp by about 2 and the error model's score scale, ``|scale|
    sum_d |q_d k_d|``, stays near that (a row of mixed signs would put it near 2 sqrt(head_dim),
    and with fp8 caches the bound with it): the first half of each group's heads see their
    scores fall along the sequence (their running max settles in the first keys) and the second
    half see them rise (it grows at every tile): a kernel that rescales O only where some rows
    of the first half raised their max leaves the second half's O unscaled; for "head_needles"
    standard normal but in the dims the group's heads own (:data:`LONG_HEAD_NEEDLE_KINDS`)."""
    query = rng.standard_normal(shape)
    if kind in ("tail", "needle", "window_edges"):
        query = 1.0 + 0.1 * query
    elif kind == "head_needles":
        owned = min(group, shape[-1])
        within = np.arange(shape[-2]) % group
        owners = np.flatnonzero(within < owned)
        query[..., :owned] = 0.0
        query[..., owners, within[owners]] = HEAD_NEEDLE_QUERY * np.sqrt(shape[-1])
    elif kind == "normal":
        low, high = QUERY_ROW_EXPONENTS
        query *= 2.0 ** rng.integers(low, high + 1, size=(*shape[:-1], 1))
    elif kind == "trend":  # the keys' ramp adds to every dim: a row's scores follow the sign of its sum
        heads = np.arange(shape[-2])
        within = heads % group if group > 1 else heads
        rising = within >= max(group, 2) // 2
        mean_abs = np.sqrt(2 / np.pi) * np.sqrt(shape[-1])  # E sum_d |q_d| / sqrt(D) of a standard normal q
        query = np.abs(query) * np.where(rising, 1.0, -1.0)[:, None] / mean_abs
    return query.astype(numpy_dtype(dtype))


def _case(query: np.ndarray, caches: tuple[np.ndarray, np.ndarray], tables: np.ndarray, lens: list[int],
          q_lens: list[int] | None, kv_layout: str, options: dict[str, Any], seed: int,
          labels: dict[str, str]) -> AttentionCase:
    """An AttentionCase from NHD caches (transposed for HND)."""
    key_cache, value_cache = caches
    if kv_layout == "HND":
        key_cache = np.ascontiguousarray(key_cache.transpose(0, 2, 1, 3))
        value_cache = np.ascontiguousarray(value_cache.transpose(0, 2, 1, 3))
    qsl = None if q_lens is None else np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return AttentionCase(query=query, key_cache=key_cache, value_cache=value_cache, block_tables=tables,
                         seq_lens=np.array(lens, np.int32), query_start_loc=qsl,
                         options={"kv_layout": kv_layout, **options}, seed=seed, labels=labels)


# -- long sequences: split-KV and long 16-bit rows ------------------------------------------

@st.composite
def long_sequence_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                        limits: ScaleLimits | None = None, fp8: bool = False,
                        window: bool = False, max_window: int | None = None, window_alibi: bool = True,
                        max_kv_heads: int = 3, groups: tuple[int, ...] = LONG_GROUPS,
                        kinds: tuple[str, ...] = LONG_VALUE_KINDS, short_seqs: int = 0,
                        ragged: bool = False, decode: bool | None = None,
                        verify: bool = False) -> AttentionCase:
    """Return a strategy for a small batch of long sequences (:attr:`ScaleLimits.min_long` keys and up).

    1 to ``max_long_seqs`` sequences; decode (one query each: every key visible to it), or
    with ``varlen`` a few queries at the end of each sequence. Lengths are odd multiples of
    the block size plus a remainder, so split plans get a partial last part; heads and
    head_dim as the backend allows, the product bounded by :data:`SPEC_ELEMENTS`; lse is
    returned wherever the backend declares it (a split plan merges it as well as out). With
    ``fp8``, the caches are one of the backend's fp8 dtypes, with a ``v_scale`` other than 1
    (:data:`LONG_FP8_V_SCALES`: a split plan must apply it once, not per part and again).
    With ``window``, a sliding window of at most a quarter of the shortest sequence
    (:data:`LONG_WINDOW_MIN` keys and up), with ALiBi where the backend has it and sometimes
    softcap: most of each range is outside every row's window, so a plan that splits the whole
    range has parts that see no key, which its merge must weigh as nothing; and ALiBi takes
    positions in the thousands, which bfloat16 (256) and float16 (2,048) do not hold exactly.
    ``max_window`` caps the window; without ``window_alibi``, ALiBi is drawn only sometimes.
    ``max_kv_heads`` bounds the KV heads (1 to it), ``groups`` are the GQA ratios drawn, ``kinds``
    the value patterns (:data:`LONG_VALUE_KINDS`, or another kind's). With ``short_seqs``,
    1 or :data:`MIXED_LONG_SEQS` long sequences share the batch with 1 to ``short_seqs`` short ones
    (:data:`MIXED_SHORT_MAX` keys at most, a block's edges among them), a short one first and the
    rest in any order: split and unsplit sequences in one plan. With ``ragged`` (a backend with
    varlen), 2 sequences and up, each with 1 to :data:`LONG_MAX_QUERIES` queries, at least two
    counts in the batch (the shrink target: 4,779 keys with 1 query, then 4,096 with 2):
    speculative decoding, which verifies a different number of draft tokens for each request;
    rows of a split sequence then do not start at its index times the batch's most queries, and
    its parts are not as many as another's. ``decode`` True or False fixes the batch's kind:
    decode, or 2 queries and up a sequence (one query a sequence being a batch a backend may take
    as decode); None draws it. With ``verify`` (a backend with varlen), :data:`LONG_VERIFY_QUERIES`
    queries a sequence, the heads and head_dim bounded for them. The :data:`LARGEST_FIRST_DTYPE`
    draws the largest block size and HND first, then the largest head_dim the budget holds; of the
    default ``groups``, one KV head and the largest group the budget holds; of other ``groups``
    (which keep their order: their first is the cell's shrink target), the most KV heads.
    """
    limits = limits or scale_limits()
    caps = capabilities
    largest_first = dtype == LARGEST_FIRST_DTYPE
    block_size = _ordered_block_size(draw, scale_block_sizes(caps), largest_first)
    kv_layout = draw(_kv_layouts(caps, largest_first), label="kv_layout")
    own_groups = groups != LONG_GROUPS
    # the most KV heads first where a cell names its own groups (a layout shows with two and more)
    kv_heads = st.integers(1, max_kv_heads)
    if largest_first and own_groups:
        kv_heads = st.sampled_from(range(max_kv_heads, 0, -1))
    num_kv_heads = draw(kv_heads, label="num_kv_heads")
    fewest_queries, cap = LONG_VERIFY_QUERIES if verify else (_fewest_queries(decode), LONG_MAX_QUERIES)
    decode = False if verify else not caps.supports("varlen") if ragged else _is_decode(draw, caps, decode)
    rows = 1 if decode else 2 if ragged else fewest_queries  # the fewest queries the budget must hold
    dims = head_dim_choices(caps)

    def fits(q_heads: int, head_dim: int) -> bool:
        return q_heads * head_dim * limits.min_long * rows <= SPEC_ELEMENTS

    if largest_first and not own_groups:  # the largest group the budget holds, then the rest
        fitting = [g for g in groups[::-1] if fits(num_kv_heads * g, dims[0])]
        groups = (*fitting, *(g for g in groups if g not in fitting))
    group = draw(st.sampled_from(groups), label="gqa_ratio")
    num_q_heads = num_kv_heads * group
    fitting_dims = [d for d in dims if fits(num_q_heads, d)] or [dims[0]]
    head_dim = draw(st.sampled_from(fitting_dims[::-1] if largest_first else fitting_dims), label="head_dim")
    budget = SPEC_ELEMENTS // (num_q_heads * head_dim)  # queries x keys of one sequence
    most_queries = max(2 if ragged else fewest_queries, min(cap, budget // limits.min_long))
    q_len = 1 if decode else most_queries if ragged else draw(st.integers(fewest_queries, most_queries), label="q_len")
    top = max(limits.min_long, min(limits.max_long, budget // q_len))
    most = min(limits.max_long_seqs, MIXED_LONG_SEQS) if short_seqs else limits.max_long_seqs
    fewest = 2 if ragged else 1
    num_seqs = draw(st.integers(fewest, max(fewest, most)), label="num_seqs")
    lens = []
    for s in range(num_seqs):
        # first (the shrink target): an odd length whose last block, tile and split part are partial
        first = limits.min_long + limits.min_long // 6 + 1
        below_top = max(limits.min_long, top - block_size // 2)  # never below the cell's shortest
        if ragged and s:  # a later sequence of another length, cut into another number of parts
            first = limits.min_long
        edge = st.sampled_from(list(dict.fromkeys((first, limits.min_long, below_top, top))))
        lens.append(draw(st.one_of(edge, st.integers(limits.min_long, top)), label=f"seq_lens[{s}]"))
    while len(lens) > fewest and sum(lens) * num_kv_heads > limits.max_batch_keys:  # the interpreter's cost
        lens.pop()
    if short_seqs:
        lens = _with_short_sequences(draw, lens, block_size, short_seqs)
    pool = draw(block_tables(np.array(lens), block_size, ("contiguous", "shuffled", "reversed", "interleaved")),
                label="pool")
    value_kind = draw(st.sampled_from(kinds), label="values")
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    options: dict[str, Any] = {}
    if caps.supports("lse"):  # a split plan merges lse too: every long case asks for it
        options["return_lse"] = True
    if window:
        widest = max(LONG_WINDOW_MIN, min(lens) // 4)
        if max_window is not None:
            widest = min(widest, max_window)
        options["sliding_window"] = draw(st.integers(LONG_WINDOW_MIN, widest), label="sliding_window")
        if caps.supports("softcap") and draw(st.booleans(), label="softcap"):
            options["softcap"] = 30.0
        # positions in the thousands: beyond 16-bit integers
        if caps.supports("alibi") and (window_alibi or draw(st.booleans(), label="alibi")):
            # the steepest slopes (an 8-head model's first heads, from 1/2): a few keys' error in a
            # distance moves a score by whole units
            options["alibi_slopes"] = alibi_slopes(max(num_q_heads, LONG_ALIBI_HEADS))[:num_q_heads]
            if value_kind in LONG_WINDOW_EDGE_KINDS:  # gentle slopes: a row's window edges keep their weight
                options["alibi_slopes"] = (options["alibi_slopes"] / options["sliding_window"]).astype(np.float32)
    cache_dtype, scales = _cache_dtype_and_scales(draw, caps, dtype, fp8)
    options.update(scales)
    k_scale, v_scale = scales.get("k_scale", 1.0), scales.get("v_scale", 1.0)
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    if decode:  # one query a sequence, a padding entry's (L = 0) too
        q_lens = [1] * len(lens)
    else:  # a short sequence may hold fewer keys than q_len (L = 0: no query)
        q_lens = _ragged_queries(draw, len(lens), q_len) if ragged else [min(q_len, n) for n in lens]
    query = _query(rng, value_kind, (sum(q_lens), num_q_heads, head_dim), dtype, group)
    logical = _values(rng, value_kind, lens, num_kv_heads, head_dim, group, q_lens=q_lens,
                      window=options.get("sliding_window"))
    caches = fill_caches(rng, (pool.num_blocks, block_size, num_kv_heads, head_dim), pool.block_tables,
                         np.array(lens), logical, garbage, cache_dtype, k_scale, v_scale)
    labels = {"feature": "long_sequences", "values": value_kind, "garbage": garbage,
              "arrangement": pool.arrangement,
              "queries": "decode" if decode else f"last 1 to {q_len}" if ragged else f"last {q_len}",
              "cache_dtype": cache_dtype}
    return _case(query, caches, pool.block_tables, lens, None if decode else q_lens, kv_layout,
                 options, draw(_SEEDS, label="variant_seed"), labels)


def _ragged_queries(draw: st.DrawFn, num_seqs: int, most: int) -> list[int]:
    """1 to ``most`` queries for each of ``num_seqs`` sequences, at least two counts among them."""
    q_lens = [draw(st.integers(1, most), label=f"q_len[{s}]") for s in range(num_seqs)]
    if len(set(q_lens)) == 1:
        q_lens[-1] = q_lens[-1] % most + 1
    return q_lens


def _with_short_sequences(draw: st.DrawFn, lens: list[int], block_size: int, most: int) -> list[int]:
    """``lens`` (long sequences) with 1 to ``most`` short ones of 0 to :data:`MIXED_SHORT_MAX` keys
    (0: a padding entry, as engines pad a batch to the size of a captured graph), the first of the
    batch short, the others and the long ones in a drawn order (the shrink target: a padding entry,
    then the long ones)."""
    count = draw(st.integers(1, most), label="short_seqs")
    shorts = [draw(seq_lens(block_size, max_value=MIXED_SHORT_MAX), label=f"short_lens[{s}]") for s in range(count)]
    return shorts[:1] + draw(st.permutations(shorts[1:] + lens), label="order")


def very_long_sequence_cases(capabilities: Capabilities, *, dtype: str, limits: ScaleLimits | None = None,
                             fp8: bool = False, decode: bool | None = None) -> st.SearchStrategy[AttentionCase]:
    """Return a strategy for one sequence of :data:`VERY_LONG_KEYS` to :data:`VERY_LONG_MAX` keys
    on one KV head: :func:`long_sequence_cases` past the lengths where 16-bit positions wrap and
    where a merge of a fixed number of split parts runs out (the shrink target: 76,460 keys);
    with ``fp8``, fp8 caches and scales (``v_scale`` never 1); ``decode`` as there."""
    return long_sequence_cases(capabilities, dtype=dtype, limits=_very_long_limits(limits), max_kv_heads=1, fp8=fp8,
                               decode=decode)


def very_long_window_sequence_cases(capabilities: Capabilities, *, dtype: str, limits: ScaleLimits | None = None,
                                    decode: bool | None = None) -> st.SearchStrategy[AttentionCase]:
    """Return a strategy for :func:`very_long_sequence_cases` under a sliding window of
    :data:`LONG_WINDOW_MIN` to :data:`VERY_LONG_MAX_WINDOW` keys, softcap and ALiBi each sometimes
    (the shrink target: 76,460 keys, a window of 100, neither): every query position is past
    32,767 (the shrink target's past 65,535), so a window's test on positions held in 16 bits
    passes keys far outside it. ``decode`` as in :func:`long_sequence_cases`."""
    return long_sequence_cases(capabilities, dtype=dtype, limits=_very_long_limits(limits), max_kv_heads=1,
                               window=True, max_window=VERY_LONG_MAX_WINDOW, window_alibi=False, decode=decode)


def _very_long_limits(limits: ScaleLimits | None) -> ScaleLimits:
    """The profile's limits with one sequence of :data:`VERY_LONG_KEYS` to :data:`VERY_LONG_MAX` keys."""
    return (limits or scale_limits())._replace(min_long=VERY_LONG_KEYS, max_long=VERY_LONG_MAX, max_long_seqs=1,
                                               max_batch_keys=VERY_LONG_MAX)


def million_key_sequence_cases(capabilities: Capabilities, *, dtype: str, limits: ScaleLimits | None = None,
                               decode: bool | None = None) -> st.SearchStrategy[AttentionCase]:
    """Return a strategy for one sequence of :data:`MILLION_KEYS` to :data:`MILLION_MAX` keys on one
    KV head: :func:`long_sequence_cases` past what a plan, merge or table index sized for a
    131,072-key context holds (the shrink target: 1,223,340 keys). One or two query heads: the
    spec's float64 of a million keys per query head (0.6 GB at head_dim 64) stays a few GB.
    ``decode`` as in :func:`long_sequence_cases`."""
    limits = (limits or scale_limits())._replace(min_long=MILLION_KEYS, max_long=MILLION_MAX, max_long_seqs=1,
                                                 max_batch_keys=MILLION_MAX)
    return long_sequence_cases(capabilities, dtype=dtype, limits=limits, max_kv_heads=1, groups=(1, 2),
                               decode=decode)


# -- a sequence past 2**31 bytes of keys and values ------------------------------------------

#: Bytes of one KV head's keys and values of a sequence, ``L * 2 * head_dim * itemsize``, at and
#: past which the cell of :func:`kv_bytes_past_int32_cases` draws: a size held in signed 32 bits
#: wraps there (a tile scheduler that sizes its L2 swizzle from it: 4,194,304 keys at head_dim 128
#: in 16 bits).
KV_BYTES_LIMIT = 2**31
#: Distinct blocks a wrapping sequence's block table names at random before the block holding the
#: key at the wrap, and as many others from there on, at least and at most: each named a few
#: thousand times at most. Enough distinct keys, in random order, that float32 sums over millions of
#: them round as sums of distinct data do (the error model's ``sqrt(n)``): a few blocks in a fixed
#: period repeat the same roundings, and a correct kernel's error then grows with ``n``.
KV_BYTES_DISTINCT_BLOCKS = (257, 1031)
#: The score of the keys at and past the wrap above the others' (natural-log units): a few hundred
#: thousand keys past it weigh about as much as the millions before.
KV_BYTES_GAP = 4.0


def kv_bytes_head_dims(capabilities: Capabilities, dtype: str) -> tuple[int, ...]:
    """Head dims of the cell past :data:`KV_BYTES_LIMIT` bytes of ``dtype`` caches, the shrink target
    first: 128 in 16 bits (the wrap at 4,194,304 keys) and in fp8 (8,388,608), 256 in float32
    (1,048,576 keys: the fewest a CPU walks); those the backend takes, else its widest."""
    caps = capabilities
    order = (256, 128) if numpy_dtype(dtype).itemsize == 4 else (128, 256)
    if caps.head_dims is not None:
        return tuple(d for d in order if d in caps.head_dims) or (max(caps.head_dims),)
    widest = caps.max_head_dim
    return tuple(d for d in order if widest is None or d <= widest) or ((widest,) if widest else order)


def kv_bytes_wrap_keys(head_dim: int, dtype: str) -> int:
    """The first key of a sequence at which ``L * 2 * head_dim * itemsize`` of ``dtype`` caches reaches
    :data:`KV_BYTES_LIMIT`."""
    return KV_BYTES_LIMIT // (2 * head_dim * numpy_dtype(dtype).itemsize)


@st.composite
def kv_bytes_past_int32_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                              limits: ScaleLimits | None = None, fp8: bool = False,
                              decode: bool | None = None) -> AttentionCase:
    """Return a strategy for one sequence whose keys and values of one KV head pass
    :data:`KV_BYTES_LIMIT` bytes (:func:`kv_bytes_wrap_keys`: 4,194,304 keys at head_dim 128 in 16 bits)
    by 1/64 to 1/8 of that, on a pool of a few thousand blocks.

    The block table names 257 to 1,031 distinct blocks at random up to the block holding the key at
    the wrap, and as many others from there on (the contract lets a table name a block any number
    of times), so the caches stay a few hundred MB at most and the exact answer costs the spec one
    block per distinct block (:mod:`pagedattn.conformance.repeated_blocks`). The keys from the
    wrap on score :data:`KV_BYTES_GAP` above the others and hold values near -1 against +1, so
    they weigh as much as the millions before them: a kernel that drops either side, or reads a
    wrong block past the wrap, moves out by whole units. Decode, or with varlen the last 1 to 3
    queries; 1 or 2 query heads on one KV head; lse wherever declared (it counts the keys, which the
    repeats hide from out); garbage in the unused blocks and table entries; no ALiBi or window
    (scores that depend on a key's position differ between a block's places). With ``fp8``, one of
    the backend's fp8 cache dtypes and scales (``v_scale`` never 1), one byte an element: 8,388,608
    keys at head_dim 128. ``decode`` True or False fixes the batch's kind (decode, or 2 or 3 queries);
    None draws it."""
    del limits  # one size for every profile: the limit is a 32-bit integer's
    caps = capabilities
    cache_dtype, scales = _cache_dtype_and_scales(draw, caps, dtype, fp8)
    head_dim = draw(st.sampled_from(kv_bytes_head_dims(caps, cache_dtype)), label="head_dim")
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    group = draw(st.sampled_from((1, 2)), label="gqa_ratio")
    wrap = kv_bytes_wrap_keys(head_dim, cache_dtype)
    length = wrap + draw(st.integers(wrap // 64, wrap // 8), label="keys_past_the_wrap")
    distinct = draw(st.integers(*KV_BYTES_DISTINCT_BLOCKS), label="distinct_blocks")
    spare = draw(st.integers(1, 4), label="spare_blocks")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    ids = rng.permutation(2 * distinct + spare)
    before, after, unused = ids[:distinct], ids[distinct:2 * distinct], ids[2 * distinct:]
    first_after = wrap // block_size  # the column holding key `wrap`
    table = np.concatenate([rng.choice(before, first_after), rng.choice(after, -(-length // block_size) - first_after)])
    tables = np.append(table, unused[0])[None].astype(np.int32)  # one column past the sequence: garbage
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    caches = _two_sided_caches(rng, garbage, (len(ids), block_size, 1, head_dim), ids[:-spare], after, cache_dtype,
                               scales)
    fewest_queries = _fewest_queries(decode)
    decode = _is_decode(draw, caps, decode)
    q_len = 1 if decode else draw(st.integers(fewest_queries, 3), label="q_len")
    query = (1.0 + 0.1 * rng.standard_normal((q_len, group, head_dim))).astype(numpy_dtype(dtype))
    options: dict[str, Any] = {"return_lse": True} if caps.supports("lse") else {}
    options.update(scales)
    return _case(query, caches, tables, [length], None if decode else [q_len], kv_layout, options,
                 draw(_SEEDS, label="variant_seed"),
                 {"feature": "kv_bytes_past_int32", "garbage": garbage, "head_dim": str(head_dim),
                  "cache_dtype": cache_dtype,
                  "distinct_blocks": f"{distinct} before the wrap, {distinct} from it"})


def _two_sided_caches(rng: np.random.Generator, garbage: str, shape: tuple[int, int, int, int], in_use: np.ndarray,
                      after: np.ndarray, cache_dtype: str, scales: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """NHD K and V caches of ``shape`` whose blocks ``in_use`` hold keys of about ``+-KV_BYTES_GAP / 2`` in
    every dim over ``sqrt(head_dim)`` (those in ``after`` the positive ones: with a query of about 1, scores
    of about ``+GAP / 2`` against ``-GAP / 2``) and values near -1 (``after``) against +1, noise 0.25;
    every other block garbage of ``garbage``; scales divided out."""
    half_gap = KV_BYTES_GAP / 2 / np.sqrt(shape[-1])
    sign = np.where(np.isin(in_use, after), 1.0, -1.0)[:, None, None, None]
    caches = []
    for which, scale in ((0, scales.get("k_scale", 1.0)), (1, scales.get("v_scale", 1.0))):
        with np.errstate(over="ignore", invalid="ignore"):
            cache = garbage_values(rng, garbage, shape).astype(numpy_dtype(cache_dtype))
        noise = 0.25 * rng.standard_normal((len(in_use), *shape[1:]))
        cache[in_use] = ((noise + sign * half_gap if which == 0 else noise - sign) / scale).astype(cache.dtype)
        caches.append(cache)
    return caches[0], caches[1]


# -- pools above 2**31 elements ------------------------------------------------------------

#: Bytes of a cache past which a far pool's blocks in use lie: a 32-bit unsigned byte offset (a
#: buffer load's offset register) wraps there.
FAR_BYTE_LIMIT = 2**32


def far_pool_limit(cache_dtype: str) -> int:
    """Element of a ``cache_dtype`` cache at or past which a far pool's blocks in use lie: 2**31
    (a signed 32-bit element offset wraps there) or byte 2**32, whichever comes later (element
    2**32 of a one-byte fp8 cache)."""
    return max(INT32_OFFSET_LIMIT, FAR_BYTE_LIMIT // numpy_dtype(cache_dtype).itemsize)


def _far_block_ids(rng: np.random.Generator, num_blocks: int, block_elements: int, count: int,
                   limit: int) -> np.ndarray:
    """``count`` distinct block ids whose first element lies at or past element ``limit`` (the
    last block of the pool, the first such block, and others in between), in random order."""
    first_far = -(-limit // block_elements)
    if num_blocks - first_far < count:
        raise ValueError(f"a pool of {num_blocks} blocks has fewer than {count} blocks past element {limit}")
    picks = [num_blocks - 1, first_far][:count]
    others = rng.choice(np.arange(first_far + 1, num_blocks - 1), size=count - len(picks), replace=False)
    return rng.permutation(np.array([*picks, *others.tolist()], dtype=np.int64))


def _sequence_tables(ids: np.ndarray, needed: list[int], filler: int) -> np.ndarray:
    """int32 block tables ``[len(needed), max(needed) + 1]``: sequence ``s``'s ``needed[s]`` blocks the
    next of ``ids`` in turn, every other entry ``filler``."""
    tables = np.full((len(needed), max(needed) + 1), filler, dtype=np.int32)
    used = 0
    for s, n in enumerate(needed):
        tables[s, :n] = ids[used:used + n]
        used += n
    return tables


#: Query heads a KV head of the far cells' batches, the first drawn first: one (MHA), or a group (GQA)
#: that no tile of rows holds evenly.
FAR_GROUPS: tuple[int, ...] = (1, 3)


def _ordered_block_size(draw: st.DrawFn, sizes: tuple[int, ...], largest_first: bool) -> int:
    """One of ``sizes``, the first drawn first, or with ``largest_first`` the largest."""
    return draw(st.sampled_from(tuple(sorted(sizes, reverse=True)) if largest_first else sizes), label="block_size")


def _far_group(draw: st.DrawFn, largest_first: bool) -> int:
    """Query heads a KV head, one of :data:`FAR_GROUPS`: the first drawn first, or with ``largest_first``
    the largest."""
    return draw(st.sampled_from(FAR_GROUPS[::-1] if largest_first else FAR_GROUPS), label="gqa_ratio")


def _far_kv_heads(draw: st.DrawFn, largest_first: bool) -> int:
    """KV heads of a far pool, 1 or 2: one first, or with ``largest_first`` two (HND then differs
    from NHD)."""
    return draw(st.sampled_from((2, 1) if largest_first else (1, 2)), label="num_kv_heads")


def _far_geometry(draw: st.DrawFn, caps: Capabilities, limits: ScaleLimits,
                  block_sizes: tuple[int, ...] | None = None, keys: int = 0,
                  largest_first: bool = False) -> tuple[int, int, int, int]:
    """``(block_size, num_kv_heads, head_dim, num_blocks)`` of a pool past ``limits.pool_elements``,
    in blocks of one of ``block_sizes`` (default :func:`scale_block_sizes`; with ``largest_first``
    the largest drawn first), with room past it for :data:`FAR_BLOCKS` blocks or the blocks of
    ``keys`` keys, whichever are more."""
    block_size = _ordered_block_size(draw, block_sizes or scale_block_sizes(caps), largest_first)
    num_kv_heads = _far_kv_heads(draw, largest_first)
    head_dim = min(caps.head_dims or (16,))  # the fewest elements per slot: the most blocks
    block_elements = block_size * num_kv_heads * head_dim
    # FAR_BLOCKS (or a long batch's blocks) more than just past the bound, so that enough blocks
    # lie past element 2**31
    far_blocks = max(FAR_BLOCKS, -(-keys // block_size) + 1)
    return block_size, num_kv_heads, head_dim, blocks_past(limits.pool_elements + far_blocks * block_elements,
                                                           block_elements)


def _far_batch(draw: st.DrawFn, caps: Capabilities, block_size: int, decode: bool | None = None,
               verify: bool = False, largest_first: bool = False) -> tuple[str, int, list[int], list[int] | None]:
    """``(kv_layout, gqa_ratio, seq_lens, q_lens)`` of a far-pool batch: 1 or 2 short sequences of
    two or three blocks and a key, decode (``q_lens`` None) or two or three queries each (``decode``;
    None: drawn, queries only for a backend with varlen batches); with ``verify``,
    :data:`LONG_VERIFY_QUERIES` queries each, after two blocks and a key of context at least. The
    group is one of :data:`FAR_GROUPS` (with ``largest_first`` the largest drawn first)."""
    kv_layout = draw(_kv_layouts(caps, largest_first), label="kv_layout")
    group = _far_group(draw, largest_first)
    num_seqs = draw(st.integers(1, 2), label="num_seqs")
    if verify:
        fewest, most = LONG_VERIFY_QUERIES
        verify_lens = [draw(st.integers(fewest, most), label=f"q_len[{s}]") for s in range(num_seqs)]
        context = [draw(st.integers(block_size + 1, 3 * block_size + 1), label=f"context[{s}]")
                   for s in range(num_seqs)]
        return kv_layout, group, [c + q for c, q in zip(context, verify_lens, strict=True)], verify_lens
    # two blocks at least: a row sees keys of two far blocks, so keys read from the wrong place change it
    lens = [draw(st.integers(block_size + 1, 3 * block_size + 1), label=f"seq_lens[{s}]") for s in range(num_seqs)]
    decode = _is_decode(draw, caps, decode)
    # two queries or three: a varlen batch of one query a sequence is one a backend may take as decode
    q_lens = None if decode else [draw(st.integers(2, 3), label=f"q_len[{s}]") for s in range(num_seqs)]
    return kv_layout, group, lens, q_lens


#: Queries of a far-pool long prefill past its fewest, at most; keys of context before it, at most
#: (two blocks, up to this many keys); and keys of the whole sequence, at most (:func:`_far_long_prefill`).
FAR_LONG_PREFILL_MORE_QUERIES = 64
FAR_LONG_PREFILL_CONTEXT = 1024
FAR_LONG_PREFILL_KEYS = long_prefill_queries(1) + 1 + FAR_LONG_PREFILL_MORE_QUERIES + FAR_LONG_PREFILL_CONTEXT


def _far_long_prefill(draw: st.DrawFn, caps: Capabilities, block_size: int,
                      largest_first: bool = False) -> tuple[str, int, list[int], list[int] | None]:
    """``(kv_layout, gqa_ratio, seq_lens, q_lens)`` of a far-pool long prefill: one sequence of at
    least :data:`LONG_PREFILL_ROWS` rows and :data:`LONG_PREFILL_MIN_QUERIES` queries after up to two
    blocks of context (:data:`FAR_LONG_PREFILL_CONTEXT` keys at most), so that kernels take their
    prefill paths (cupy its Hopper kernel). The group as :func:`_far_batch` draws it."""
    kv_layout = draw(_kv_layouts(caps, largest_first), label="kv_layout")
    group = _far_group(draw, largest_first)
    fewest = long_prefill_queries(group) + 1
    q_len = draw(st.integers(fewest, fewest + FAR_LONG_PREFILL_MORE_QUERIES), label="q_len[0]")
    context = draw(st.integers(0, min(2 * block_size, FAR_LONG_PREFILL_CONTEXT)), label="context[0]")
    return kv_layout, group, [q_len + context], [q_len]


@st.composite
def far_pool_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                   limits: ScaleLimits | None = None, fp8: bool = False,
                   block_sizes: tuple[int, ...] | None = None, long_prefill: bool = False,
                   decode: bool | None = None, verify: bool = False) -> AttentionCase:
    """Return a strategy for attention on caches of more than ``limits.pool_elements`` elements,
    every block in use at or past element 2**31 and byte 2**32 (:func:`far_pool_limit`; also the
    pool's last block).

    The caches are zero outside the blocks in use (lazy: they cost only those blocks), and
    the unused slots of those blocks hold garbage. One or two short sequences, decode or a
    few queries each. With ``fp8``, the caches are one of the backend's fp8 dtypes, with
    scales, and the values :data:`FAR_FP8_VALUES`: the fp8 paths address their caches in code of
    their own. ``block_sizes``, the first
    drawn first, replaces :func:`scale_block_sizes` (blocks of one slot, or of hundreds). With
    ``long_prefill``, one long prefill (:func:`_far_long_prefill`): prefill paths address the pool
    in code of their own. ``decode`` True or False fixes the short batch's kind (decode, or two or
    three queries a sequence: GPU backends run them on kernels of their own); None draws it. With
    ``verify``, :data:`LONG_VERIFY_QUERIES` queries a sequence (a speculative verify's batch).
    The :data:`LARGEST_FIRST_DTYPE` dtype draws the largest block size and group, and HND, first.
    """
    limits = limits or scale_limits()
    caps = capabilities
    largest_first = dtype == LARGEST_FIRST_DTYPE
    cache_dtype, scales = _cache_dtype_and_scales(draw, caps, dtype, fp8)
    far = far_pool_limit(cache_dtype)
    block_size, num_kv_heads, head_dim, num_blocks = _far_geometry(
        draw, caps, limits._replace(pool_elements=max(limits.pool_elements, far)), block_sizes,
        keys=FAR_LONG_PREFILL_KEYS if long_prefill else 0, largest_first=largest_first)
    batch = _far_long_prefill if long_prefill else partial(_far_batch, decode=decode, verify=verify)
    kv_layout, group, lens, q_lens = batch(draw, caps, block_size, largest_first=largest_first)
    num_seqs = len(lens)
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    needed = [-(-n // block_size) for n in lens]
    ids = _far_block_ids(rng, num_blocks, block_size * num_kv_heads * head_dim, sum(needed), far)
    tables = _sequence_tables(ids, needed, -1)
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    kind = FAR_FP8_VALUES if fp8 else "normal"
    logical = _values(rng, kind, lens, num_kv_heads, head_dim)
    caches = fill_caches(rng, (num_blocks, block_size, num_kv_heads, head_dim), tables, np.array(lens), logical,
                         garbage, cache_dtype, scales.get("k_scale", 1.0), scales.get("v_scale", 1.0))
    if kv_layout == "HND":  # a transposed copy of a lazy pool would fill it: fill an HND pool instead
        caches = tuple(_lazy_transposed(c, tables, lens, block_size) for c in caches)  # type: ignore[assignment]
        kv_layout_labels = "HND"
    else:
        kv_layout_labels = "NHD"
    num_tokens = num_seqs if q_lens is None else sum(q_lens)
    shape = (num_tokens, num_kv_heads * group, head_dim)
    query = _query(rng, kind, shape, dtype, group) if fp8 else rng.standard_normal(shape).astype(numpy_dtype(dtype))
    labels = {"feature": "far_pool_long_prefill" if long_prefill else "far_pool", "garbage": garbage,
              "pool": f"{num_blocks} blocks",
              "elements": str(num_blocks * block_size * num_kv_heads * head_dim), "layout": kv_layout_labels}
    qsl = None if q_lens is None else np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return AttentionCase(query=query, key_cache=caches[0], value_cache=caches[1], block_tables=tables,
                         seq_lens=np.array(lens, np.int32), query_start_loc=qsl,
                         options={"kv_layout": kv_layout, **scales},
                         seed=draw(_SEEDS, label="variant_seed"), labels={**labels, "cache_dtype": cache_dtype})


#: Layers of a far layer-view pool ``[num_blocks, 2, FAR_VIEW_LAYERS, ...]``: a block's K/V of every
#: layer lie together, so a layer view's block stride is ``2 * FAR_VIEW_LAYERS`` blocks of it.
FAR_VIEW_LAYERS = 2


def past_uint32_elements(limits: ScaleLimits) -> int:
    """Elements a pool past 2**32 holds more than: ``limits.pool_elements``, and at least 2**32,
    where an unsigned 32-bit element offset wraps (8 GiB of a 16-bit cache, 4 GiB of an fp8 one:
    its byte 2**32). The far layer-view pool (K and V of both layers; each view a quarter of it)
    and the far operations' caches."""
    return max(limits.pool_elements, UINT32_OFFSET_LIMIT)


@st.composite
def far_layer_view_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                         limits: ScaleLimits | None = None, decode: bool | None = None) -> AttentionCase:
    """Return a strategy for attention on layer views of a pool of more than 2**32 elements (and
    ``limits.pool_elements``) whose views each hold fewer than 2**31: every block in use starts at
    or past element 2**31 of the pool, the pool's last block past element 2**32.

    ``key_cache = pool[:, 0, 1]`` and ``value_cache = pool[:, 1, 1]`` of a lazy pool
    ``[num_blocks, 2, FAR_VIEW_LAYERS, ...]`` (an engine's one pool for all layers, K and V of a
    block together). A kernel that takes 32-bit offsets because the view holds fewer than 2**31
    elements computes ``block * block_stride`` past 2**31 and reads other memory; one that takes
    them unsigned reads the blocks up to element 2**32 right and wraps past it (the last block is
    always in use). The blocks in use hold the case's values and garbage in their unused slots;
    the other layer of those blocks holds garbage too. One or two short sequences, decode or a few
    queries each (``decode`` and the order of :data:`LARGEST_FIRST_DTYPE` as :func:`far_pool_cases`).
    """
    limits = limits or scale_limits()
    caps = capabilities
    largest_first = dtype == LARGEST_FIRST_DTYPE
    block_size = _ordered_block_size(draw, scale_block_sizes(caps), largest_first)
    num_kv_heads = _far_kv_heads(draw, largest_first)
    head_dim = min(caps.head_dims or (16,))
    block_elements = block_size * num_kv_heads * head_dim
    stride_blocks = 2 * FAR_VIEW_LAYERS  # a view's block stride, in blocks of the view
    pool_elements = past_uint32_elements(limits)
    num_blocks = blocks_past((pool_elements + FAR_BLOCKS * stride_blocks * block_elements) // stride_blocks,
                             block_elements)
    kv_layout, group, lens, q_lens = _far_batch(draw, caps, block_size, decode, largest_first=largest_first)
    num_seqs = len(lens)
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    needed = [-(-n // block_size) for n in lens]
    ids = _far_block_ids(rng, num_blocks, stride_blocks * block_elements, sum(needed), INT32_OFFSET_LIMIT)
    compact = _sequence_tables(np.arange(sum(needed)), needed, -1)  # tables over the used blocks only
    tables = np.where(compact >= 0, ids[np.maximum(compact, 0)], -1).astype(np.int32)
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    logical = _values(rng, "normal", lens, num_kv_heads, head_dim)
    filled = fill_caches(rng, (len(ids), block_size, num_kv_heads, head_dim), compact, np.array(lens), logical,
                         garbage, dtype, 1.0, 1.0)
    slot_shape = (block_size, num_kv_heads, head_dim) if kv_layout == "NHD" else (num_kv_heads, block_size, head_dim)
    pool = lazy_cache((num_blocks, 2, FAR_VIEW_LAYERS, *slot_shape), dtype)
    layer = FAR_VIEW_LAYERS - 1
    for which, cache in enumerate(filled):
        blocks = cache if kv_layout == "NHD" else cache.transpose(0, 2, 1, 3)
        pool[ids, which, :layer] = rng.standard_normal((len(ids), layer, *slot_shape)).astype(pool.dtype) * 1e3
        pool[ids, which, layer] = blocks
    num_tokens = num_seqs if q_lens is None else sum(q_lens)
    query = rng.standard_normal((num_tokens, num_kv_heads * group, head_dim)).astype(numpy_dtype(dtype))
    labels = {"feature": "far_layer_view", "garbage": garbage, "pool": f"{num_blocks} blocks x 2 x {FAR_VIEW_LAYERS}",
              "elements": str(pool.size), "layout": kv_layout}
    qsl = None if q_lens is None else np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    return AttentionCase(query=query, key_cache=pool[:, 0, layer], value_cache=pool[:, 1, layer], block_tables=tables,
                         seq_lens=np.array(lens, np.int32), query_start_loc=qsl, options={"kv_layout": kv_layout},
                         seed=draw(_SEEDS, label="variant_seed"), labels=labels, pool=pool, layer=layer)


#: Columns of a far table: an engine's block table as wide as a context of 2,097,152 keys in
#: blocks of 16.
FAR_TABLE_WIDTH = 2**17
#: Padding entries of a far-table batch, before its sequences: their rows take the table to entry
#: 2**32, past which a row offset wraps in 32 bits, signed or unsigned.
FAR_TABLE_PADDING = -(-UINT32_OFFSET_LIMIT // FAR_TABLE_WIDTH)


@st.composite
def far_table_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                    limits: ScaleLimits | None = None, decode: bool | None = None) -> AttentionCase:
    """Return a strategy for attention whose block table is the view ``wide_tables[:, :width]`` of an
    engine's table of more than 2**32 entries (16 GiB of int32, lazy), every sequence's row at or
    past entry 2**32 of it.

    The engine's table has :data:`FAR_TABLE_WIDTH` columns and a row per entry of the batch, which
    is padded (as a CUDA-graph batch is to its captured size) with :data:`FAR_TABLE_PADDING`
    entries of no keys, and no queries in a prefill, before its 1 or 2 short sequences. A kernel
    that reads the caller's table in place at ``s * row_stride`` computed in 32 bits, signed or
    unsigned, reads other memory for every sequence with keys (as does one whose byte offset into
    the table is 32 bits). The table's other entries are 0: block 0, which no sequence uses and
    which holds garbage. ``decode`` fixes the batch's kind as in :func:`far_pool_cases`.
    """
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    num_kv_heads = draw(st.integers(1, 2), label="num_kv_heads")
    head_dim = min(caps.head_dims or (16,))
    kv_layout, group, lens, q_lens = _far_batch(draw, caps, block_size, decode)
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    needed = [-(-n // block_size) for n in lens]
    ids = 1 + rng.permutation(sum(needed) + 1)  # one block more than in use; block 0 unused
    compact = _sequence_tables(ids, needed, 0)
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    logical = _values(rng, "normal", lens, num_kv_heads, head_dim)
    caches = fill_caches(rng, (len(ids) + 1, block_size, num_kv_heads, head_dim), compact, np.array(lens), logical,
                         garbage, dtype, 1.0, 1.0)
    if kv_layout == "HND":
        caches = tuple(np.ascontiguousarray(c.transpose(0, 2, 1, 3)) for c in caches)  # type: ignore[assignment]
    wide = np.zeros((FAR_TABLE_PADDING + len(lens), FAR_TABLE_WIDTH), dtype=np.int32)  # lazy: 16 GiB untouched
    wide[FAR_TABLE_PADDING:, :compact.shape[1]] = compact
    all_lens = np.array([0] * FAR_TABLE_PADDING + lens, np.int32)
    if q_lens is None:
        num_tokens, qsl = len(all_lens), None
    else:
        num_tokens = sum(q_lens)
        qsl = np.concatenate([np.zeros(FAR_TABLE_PADDING + 1, np.int64), np.cumsum(q_lens)]).astype(np.int32)
    query = rng.standard_normal((num_tokens, num_kv_heads * group, head_dim)).astype(numpy_dtype(dtype))
    labels = {"feature": "far_table", "garbage": garbage, "table": f"{wide.shape[0]} x {wide.shape[1]}",
              "entries": str(wide.size), "layout": kv_layout}
    return AttentionCase(query=query, key_cache=caches[0], value_cache=caches[1],
                         block_tables=table_view(wide, compact.shape[1]), seq_lens=all_lens, query_start_loc=qsl,
                         options={"kv_layout": kv_layout}, seed=draw(_SEEDS, label="variant_seed"), labels=labels,
                         wide_tables=wide)


def _fp8_cache_dtype(draw: st.DrawFn, caps: Capabilities) -> str:
    """One of the backend's fp8 cache dtypes."""
    return draw(st.sampled_from([d for d in FP8_DTYPES if d in caps.cache_dtypes]), label="cache_dtype")


def _cache_dtype_and_scales(draw: st.DrawFn, caps: Capabilities, dtype: str,
                            fp8: bool) -> tuple[str, dict[str, float]]:
    """``(dtype, {})``, or with ``fp8`` one of the backend's fp8 dtypes and drawn ``k_scale`` / ``v_scale``."""
    if not fp8:
        return dtype, {}
    cache_dtype = _fp8_cache_dtype(draw, caps)
    return cache_dtype, {"k_scale": draw(st.sampled_from(LONG_FP8_K_SCALES), label="k_scale"),
                         "v_scale": draw(st.sampled_from(LONG_FP8_V_SCALES), label="v_scale")}


def _batch_options(draw: st.DrawFn, caps: Capabilities, dtype: str,
                   fp8: bool) -> tuple[dict[str, Any], str, dict[str, float]]:
    """A batch cell's options (lse sometimes, where declared; fp8 scales), its cache dtype and scales."""
    options: dict[str, Any] = {}
    if caps.supports("lse") and draw(st.booleans(), label="lse"):
        options["return_lse"] = True
    cache_dtype, scales = _cache_dtype_and_scales(draw, caps, dtype, fp8)
    options.update(scales)
    return options, cache_dtype, scales


def _lazy_transposed(nhd: np.ndarray, tables: np.ndarray, lens: list[int], block_size: int) -> np.ndarray:
    """The HND form of a lazy NHD cache, written block by block (only the blocks in use)."""
    hnd = lazy_cache((nhd.shape[0], nhd.shape[2], nhd.shape[1], nhd.shape[3]), _dtype_name(nhd))
    used = np.unique(np.concatenate([tables[s, :-(-n // block_size)] for s, n in enumerate(lens)]))
    hnd[used] = nhd[used].transpose(0, 2, 1, 3)
    return hnd


def _dtype_name(x: np.ndarray) -> str:
    from pagedattn.spec.dtypes import dtype_name

    return dtype_name(x.dtype)


def _far_kv_caches(rng: np.random.Generator, shape_nhd: tuple[int, int, int, int], blocks: np.ndarray,
                   dtype: str, kv_layout: str) -> list[np.ndarray]:
    """Two lazy caches of ``kv_layout`` whose ``blocks`` hold random values (the rest zero)."""
    num_blocks, block_size, heads, head_dim = shape_nhd
    shape = shape_nhd if kv_layout == "NHD" else (num_blocks, heads, block_size, head_dim)
    caches = []
    for _ in range(2):
        cache = lazy_cache(shape, dtype)
        cache[blocks] = rng.standard_normal((len(blocks), *shape[1:])).astype(numpy_dtype(dtype))
        caches.append(cache)
    return caches


@st.composite
def far_write_kv_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                       limits: ScaleLimits | None = None, fp8: bool = False) -> WriteKVCase:
    """Return a strategy for ``write_kv`` into caches past element 2**32 (:func:`past_uint32_elements`),
    at slots whose first element lies past element 2**31 (slot ids above 2**31 / (num_kv_heads x
    head_dim)), one of them in the pool's last block, past element 2**32; some other tokens
    skipped (-1). The other slots of those blocks hold random values that must survive. With
    ``fp8``, the caches are one of the backend's fp8 dtypes (past byte 2**32) and the call has
    scales."""
    limits = limits or scale_limits()
    block_size, heads, head_dim, num_blocks = _far_geometry(
        draw, capabilities, limits._replace(pool_elements=past_uint32_elements(limits)))
    kv_layout = draw(_kv_layouts(capabilities), label="kv_layout")
    rng = np.random.default_rng(draw(_SEEDS, label="seed"))
    count = draw(st.integers(1, 3), label="num_blocks_written")
    blocks = _far_block_ids(rng, num_blocks, block_size * heads * head_dim, count, INT32_OFFSET_LIMIT)
    T = draw(st.integers(1, 8), label="num_tokens")
    last = (num_blocks - 1) * block_size + rng.integers(block_size)  # a slot past element 2**32
    candidates = np.setdiff1d((blocks[:, None] * block_size + np.arange(block_size)[None, :]).ravel(), [last])
    slots = np.concatenate([[last], rng.choice(candidates, size=min(T, candidates.size + 1) - 1, replace=False)])
    skips = draw(st.integers(0, len(slots) - 1), label="skipped_tokens")
    slots[1 + rng.choice(len(slots) - 1, size=skips, replace=False)] = -1
    slots = rng.permutation(slots)
    cache_dtype, scales = _cache_dtype_and_scales(draw, capabilities, dtype, fp8)
    caches = _far_kv_caches(rng, (num_blocks, block_size, heads, head_dim), blocks, cache_dtype, kv_layout)
    key = rng.standard_normal((len(slots), heads, head_dim)).astype(numpy_dtype(dtype))
    value = rng.standard_normal((len(slots), heads, head_dim)).astype(numpy_dtype(dtype))
    return WriteKVCase(key=key, value=value, key_cache=caches[0], value_cache=caches[1],
                       slot_mapping=slots.astype(np.int64), kv_layout=kv_layout,
                       k_scale=scales.get("k_scale", 1.0), v_scale=scales.get("v_scale", 1.0))


@st.composite
def far_copy_blocks_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                          limits: ScaleLimits | None = None, fp8: bool = False) -> CopyBlocksCase:
    """Return a strategy for ``copy_blocks`` on caches past element 2**32 (:func:`past_uint32_elements`),
    between blocks past element 2**31 (a chain or a swap among them), or from a block near the
    start; the pool's last block, past element 2**32, is always a destination. With ``fp8``, the
    caches are one of the backend's fp8 dtypes (past byte 2**32)."""
    limits = limits or scale_limits()
    block_size, heads, head_dim, num_blocks = _far_geometry(
        draw, capabilities, limits._replace(pool_elements=past_uint32_elements(limits)))
    kv_layout = draw(_kv_layouts(capabilities), label="kv_layout")
    rng = np.random.default_rng(draw(_SEEDS, label="seed"))
    n = draw(st.integers(1, 3), label="num_pairs")
    far = _far_block_ids(rng, num_blocks, block_size * heads * head_dim, n + 1, INT32_OFFSET_LIMIT)
    far = np.concatenate([[num_blocks - 1], rng.permutation(far[far != num_blocks - 1])])
    far[:n] = rng.permutation(far[:n])  # the last block among the destinations, at any place
    pattern = draw(st.sampled_from(("chain", "swap", "from_near")), label="pattern")
    dst = far[:n]
    if pattern == "chain":  # dst[i] is copied from dst[i - 1]: order matters
        src = np.concatenate([[far[n]], dst[:-1]])
    elif pattern == "swap":
        src = np.roll(dst, 1) if n > 1 else far[n:]
    else:
        src = rng.integers(0, 8, size=n)
    cache_dtype = _fp8_cache_dtype(draw, capabilities) if fp8 else dtype
    blocks = np.unique(np.concatenate([src, dst]))
    caches = _far_kv_caches(rng, (num_blocks, block_size, heads, head_dim), blocks, cache_dtype, kv_layout)
    return CopyBlocksCase(key_cache=caches[0], value_cache=caches[1],
                          pairs=np.stack([src, dst], axis=1).astype(np.int64), kv_layout=kv_layout)


# -- sizes that are no power of two --------------------------------------------------------

def _odd_head_dims(caps: Capabilities) -> tuple[int, ...]:
    if caps.head_dims is None:
        return (48, 80, 96, 72)
    odd = tuple(d for d in sorted(caps.head_dims) if d & (d - 1))
    return odd or tuple(sorted(caps.head_dims))


@st.composite
def odd_size_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                   limits: ScaleLimits | None = None, decode: bool | None = None) -> AttentionCase:
    """Return a strategy for attention where every size the backend lets vary is no power of two.

    3, 5 or 6 KV heads with GQA ratios 1, 3, 5, 6, 7; a head_dim and a block size that are no
    power of two where declared (any: 48, 72, 80, 96 and 24, 40, 48); 1, 3 or 5 sequences of
    odd lengths up to ``limits.odd_max_len``; an odd ``num_blocks``; odd query counts. ``decode``
    True or False fixes the batch's kind (decode, or 3, 5 or 7 queries a sequence where it holds as
    many keys); None draws it.
    """
    limits = limits or scale_limits()
    caps = capabilities
    sizes = scale_block_sizes(caps)
    odd_sizes = tuple(b for b in sizes if b & (b - 1)) or sizes
    block_size = draw(st.sampled_from(odd_sizes), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.sampled_from((3, 5, 6)), label="num_kv_heads")
    group = draw(st.sampled_from((1, 3, 5, 6, 7)), label="gqa_ratio")
    head_dim = draw(st.sampled_from(_odd_head_dims(caps)), label="head_dim")
    num_seqs = draw(st.sampled_from((1, 3, 5)), label="num_seqs")
    odd_lengths = st.integers(0, (limits.odd_max_len - 1) // 2).map(lambda k: 2 * k + 1)
    lens = [draw(st.one_of(st.sampled_from((1, block_size + 1, 3 * block_size - 1)), odd_lengths),
                 label=f"seq_lens[{s}]") for s in range(num_seqs)]
    q_counts = (3, 5, 7) if decode is False else (1, 3, 5, 7)
    decode = _is_decode(draw, caps, decode)
    q_lens = None if decode else [min(n, draw(st.sampled_from(q_counts), label=f"q_len[{s}]"))
                                  for s, n in enumerate(lens)]
    pool = draw(block_tables(np.array(lens), block_size, ("shuffled", "interleaved", "reversed")), label="pool")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    num_blocks = pool.num_blocks + (1 - pool.num_blocks % 2)  # odd: one spare block more if even
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    logical = _values(rng, "normal", lens, num_kv_heads, head_dim)
    caches = fill_caches(rng, (num_blocks, block_size, num_kv_heads, head_dim), pool.block_tables, np.array(lens),
                         logical, garbage, dtype, 1.0, 1.0)
    num_tokens = num_seqs if q_lens is None else sum(q_lens)
    query = rng.standard_normal((num_tokens, num_kv_heads * group, head_dim)).astype(numpy_dtype(dtype))
    labels = {"feature": "odd_sizes", "garbage": garbage, "arrangement": pool.arrangement,
              "heads": f"{num_kv_heads * group}/{num_kv_heads}"}
    return _case(query, caches, pool.block_tables, lens, q_lens, kv_layout, {},
                 draw(_SEEDS, label="variant_seed"), labels)


#: Block sizes of the large-block cell: pages of more slots than a fixed tile of 128 keys holds
#: (FlashAttention-2's paged path takes multiples of 256).
LARGE_BLOCK_SIZES: tuple[int, ...] = (128, 256, 512)
#: Blocks of fewer slots than the contract's 16, drawn for backends that accept any block size:
#: SGLang's page of one token, and sizes that are no multiple of 8 (a run of 8 consecutive slots
#: then spans blocks).
SMALL_BLOCK_SIZES: tuple[int, ...] = (1, 4, 12)
#: The large-block cell's first sequence passes this many keys by a block and more: a public kernel
#: with pages over 128 slots saw only the first 4,096 keys and the last page.
LARGE_BLOCK_FAR_KEYS = 4096


def large_block_sizes(capabilities: Capabilities) -> tuple[int, ...]:
    """The block sizes the large-block cells draw, largest first (the first example takes it): the
    backend's declared ones from 128, else :data:`LARGE_BLOCK_SIZES` (which a backend that declares
    its sizes does not take)."""
    declared = tuple(b for b in capabilities.block_sizes or () if b >= min(LARGE_BLOCK_SIZES))
    return tuple(sorted(declared or LARGE_BLOCK_SIZES, reverse=True))


def small_block_sizes(capabilities: Capabilities) -> tuple[int, ...]:
    """The block sizes the small-block cell draws, smallest first (the first example takes it): the
    backend's declared ones below 16, else :data:`SMALL_BLOCK_SIZES` (which a backend that declares
    its sizes does not take)."""
    declared = tuple(b for b in capabilities.block_sizes or () if b < min(CONTRACT_BLOCK_SIZES))
    return tuple(sorted(declared or SMALL_BLOCK_SIZES))


@st.composite
def small_block_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                      limits: ScaleLimits | None = None) -> AttentionCase:
    """Return a strategy for attention on blocks of fewer than 16 slots (:data:`SMALL_BLOCK_SIZES`,
    or the backend's declared sizes below 16; a backend that declares none is unsupported).

    As :func:`large_block_cases`: the first of 1 to 4 sequences past :data:`LARGE_BLOCK_FAR_KEYS`
    keys (at one slot a block, a block-table row of more than 4,096 columns), the others at block
    edges or anywhere up to 48 keys; "trend" or normal values; decode or a few queries each; GQA 1,
    4 or 8; garbage in every unused slot; lse and a sliding window each where declared and drawn.
    """
    del limits  # one size for every profile: the threshold is a tile's
    block_size = draw(st.sampled_from(small_block_sizes(capabilities)), label="block_size")
    return _blocks_case(draw, capabilities, dtype=dtype, block_size=block_size, first_past=LARGE_BLOCK_FAR_KEYS,
                        others_max=48, widest_window=64, feature="small_blocks")


@st.composite
def large_block_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                      limits: ScaleLimits | None = None) -> AttentionCase:
    """Return a strategy for attention on blocks of 128 slots and more (:data:`LARGE_BLOCK_SIZES`,
    or the backend's declared sizes from 128; a backend that declares none is unsupported).

    1 to 4 sequences: the first past :data:`LARGE_BLOCK_FAR_KEYS` keys by more than a block (to
    2,048 keys more), the others at block edges (1, a block less one, a block, a block and one,
    two blocks and one) or anywhere up to three blocks; "trend" or normal values (in a trend, which
    keys a row sees shows even in 16-bit outputs); decode or, with varlen, a few
    queries each; GQA 1, 4 or 8 on one or two KV heads; a shuffled or interleaved pool with
    garbage in every unused slot; lse, and a sliding window that ends inside a block, each
    where declared and drawn.
    """
    del limits  # one size for every profile: the threshold is a tile's
    block_size = draw(st.sampled_from(large_block_sizes(capabilities)), label="block_size")
    return _blocks_case(draw, capabilities, dtype=dtype, block_size=block_size,
                        first_past=LARGE_BLOCK_FAR_KEYS + block_size, others_max=3 * block_size,
                        widest_window=block_size + block_size // 2, feature="large_blocks")


def _blocks_case(draw: st.DrawFn, caps: Capabilities, *, dtype: str, block_size: int, first_past: int,
                 others_max: int, widest_window: int, feature: str) -> AttentionCase:
    """A case of the block-size cells at ``block_size``: 1 to 4 sequences, the first of ``first_past``
    + 1 to ``first_past`` + 2,048 keys, the others at a block's edges or of up to ``others_max`` keys;
    "trend" or normal values; decode or a few queries each; GQA 1, 4 or 8 on one or two KV heads;
    lse, and a sliding window of 2 to ``widest_window`` keys, each where declared and drawn."""
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.sampled_from((1, 2)), label="num_kv_heads")
    group = draw(st.sampled_from((1, 4, 8)), label="gqa_ratio")
    head_dim = draw(st.sampled_from(tuple(sorted(caps.head_dims or (64, 128)))), label="head_dim")
    num_seqs = draw(st.integers(1, 4), label="num_seqs")
    edges = (1, max(1, block_size - 1), block_size, block_size + 1, 2 * block_size + 1)
    lens = [draw(st.integers(first_past + 1, first_past + 2048), label="seq_lens[0]")]
    lens += [draw(st.one_of(st.sampled_from(edges), st.integers(1, others_max)), label=f"seq_lens[{s}]")
             for s in range(1, num_seqs)]
    options: dict[str, Any] = {}
    if caps.supports("lse") and draw(st.booleans(), label="lse"):
        options["return_lse"] = True
    if caps.supports("sliding_window") and draw(st.booleans(), label="window"):
        options["sliding_window"] = draw(st.integers(2, widest_window), label="sliding_window")
    kind = draw(st.sampled_from(LONG_VALUE_KINDS), label="values")  # "trend": which keys are seen shows
    return _few_sequences_case(draw, caps, dtype=dtype, lens=lens, q_counts=(1, 2, 5), block_size=block_size,
                               kv_layout=kv_layout, heads=(num_kv_heads, group), head_dim=head_dim, options=options,
                               labels={"feature": feature, "block_size": str(block_size), "values": kind},
                               kind=kind)


@st.composite
def large_block_operation_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                                limits: ScaleLimits | None = None, operation: str = "write_kv") -> Any:
    """Return a strategy for ``operation`` (``write_kv`` or ``copy_blocks``) on blocks of 128 slots and
    more (:func:`large_block_sizes`): the operation's own cases (slots or pairs anywhere in a small
    pool, garbage around them) at that block size."""
    del limits  # one size for every profile: the threshold is a tile's
    block_size = draw(st.sampled_from(large_block_sizes(capabilities)), label="block_size")
    case = _operation_case(draw, capabilities, dtype, operation, block_size)
    return _with_a_last_slot(case, block_size) if operation == "write_kv" else case


#: KV heads of a wide-head write_kv or copy_blocks, at least and at most: past 64, where a block
#: holding every KV head of a token or slot, 16 lanes a head of 128 16-bit values, passes CUDA's
#: 1,024 threads; up to 128 (MiniMax-M3's KV heads, a multi-head model on one GPU).
WIDE_KV_HEADS = (65, 128)
#: Head dims of a wide-head write_kv or copy_blocks.
WIDE_KV_HEAD_DIMS = (128, 256)


@st.composite
def wide_head_operation_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                              limits: ScaleLimits | None = None, operation: str = "write_kv") -> Any:
    """Return a strategy for ``operation`` (``write_kv`` or ``copy_blocks``) on caches of
    :data:`WIDE_KV_HEADS` KV heads of :data:`WIDE_KV_HEAD_DIMS`: the operation's own cases (slots or
    pairs anywhere in a small pool, garbage around them) with tokens and slots that many heads wide."""
    del limits  # one size for every profile: the threshold is a block's threads
    block_size = draw(st.sampled_from(scale_block_sizes(capabilities)), label="block_size")
    return _operation_case(draw, capabilities, dtype, operation, block_size,
                           heads=WIDE_KV_HEADS, dims=WIDE_KV_HEAD_DIMS)


def _operation_case(draw: st.DrawFn, caps: Capabilities, dtype: str, operation: str, block_size: int,
                    **shape: tuple[int, int]) -> Any:
    """``operation``'s own case (``write_kv`` into caches of ``dtype``, or ``copy_blocks`` with a block
    moved) at ``block_size``, in a layout the backend takes, of ``shape`` (``heads``, ``dims``) where
    given."""
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    if operation == "write_kv":
        return draw(write_kv_cases(dtype=dtype, cache_dtype=dtype, block_size=block_size, kv_layout=kv_layout,
                                   **shape))
    return _with_a_moved_block(draw(copy_blocks_cases(dtype=dtype, block_size=block_size, kv_layout=kv_layout,
                                                      **shape)))


def _with_a_moved_block(case: CopyBlocksCase) -> CopyBlocksCase:
    """``case`` with its first pair copying another block where every pair copies a block onto
    itself (a scale cell draws a few examples: each must move data)."""
    pairs = np.array(case.pairs)
    if np.any(pairs[:, 0] != pairs[:, 1]):
        return case
    pairs[0, 0] = (pairs[0, 1] + 1) % case.key_cache.shape[0]
    return replace(case, pairs=pairs)


def _with_a_last_slot(case: WriteKVCase, block_size: int) -> WriteKVCase:
    """``case`` with its first token written to the last slot of a block no other token writes,
    unless a token already writes a block's last slot."""
    slots = np.array(case.slot_mapping)
    if any(int(s) % block_size == block_size - 1 for s in slots if s >= 0):
        return case
    taken = {int(s) for s in slots}
    free = [b * block_size + block_size - 1 for b in range(case.key_cache.shape[0])
            if b * block_size + block_size - 1 not in taken]
    if free:
        slots[0] = free[0]
    return replace(case, slot_mapping=slots)


#: Head dims of the large-head cell: wider than a 256-wide head tile (models with head_dim 512
#: exist), one of them no power of two.
LARGE_HEAD_DIMS: tuple[int, ...] = (384, 512)


def large_head_dims(capabilities: Capabilities) -> tuple[int, ...]:
    """The head dims the large-head cell draws: the backend's declared ones past 256, else
    :data:`LARGE_HEAD_DIMS` (which a backend that declares its head dims does not take)."""
    declared = tuple(d for d in capabilities.head_dims or () if d > 256)
    return declared or LARGE_HEAD_DIMS


@st.composite
def large_head_dim_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                         limits: ScaleLimits | None = None) -> AttentionCase:
    """Return a strategy for attention at head_dim 384 or 512 (:data:`LARGE_HEAD_DIMS`, or the
    backend's declared head dims past 256; a backend that declares none is unsupported).

    1 to 3 sequences of up to 300 keys, decode or a few queries each, GQA 1, 2 or 8 on one or
    two KV heads, the backend's block sizes, garbage in unused slots; lse, ALiBi and softcap
    each where declared and drawn.
    """
    del limits  # one size for every profile: the threshold is a tile's
    caps = capabilities
    head_dim = draw(st.sampled_from(large_head_dims(caps)), label="head_dim")
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.sampled_from((1, 2)), label="num_kv_heads")
    group = draw(st.sampled_from((1, 2, 8)), label="gqa_ratio")
    num_seqs = draw(st.integers(1, 3), label="num_seqs")
    lens = [draw(st.integers(1, 300), label=f"seq_lens[{s}]") for s in range(num_seqs)]
    options = _sometimes_lse_alibi_softcap(draw, caps, num_kv_heads * group)
    return _few_sequences_case(draw, caps, dtype=dtype, lens=lens, q_counts=(1, 3), block_size=block_size,
                               kv_layout=kv_layout, heads=(num_kv_heads, group), head_dim=head_dim, options=options,
                               labels={"feature": "large_head_dims", "head_dim": str(head_dim)})


def _few_sequences_case(draw: st.DrawFn, caps: Capabilities, *, dtype: str, lens: list[int],
                        q_counts: tuple[int, ...], block_size: int, kv_layout: str, heads: tuple[int, int],
                        head_dim: int, options: dict[str, Any], labels: dict[str, str],
                        kind: str = "normal") -> AttentionCase:
    """Sequences of ``lens`` keys on ``heads`` (KV heads, GQA ratio): decode, or with varlen one of
    ``q_counts`` queries each (at most its length); a shuffled or interleaved pool with garbage in
    every unused slot; K and V of ``kind`` (:data:`LONG_VALUE_KINDS`), a standard normal query."""
    num_kv_heads, group = heads
    decode = not (caps.supports("varlen") and draw(st.booleans(), label="varlen"))
    q_lens = None if decode else [min(n, draw(st.sampled_from(q_counts), label=f"q_len[{s}]"))
                                  for s, n in enumerate(lens)]
    pool = draw(block_tables(np.array(lens), block_size, ("shuffled", "interleaved")), label="pool")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    caches = _normal_caches(rng, pool, block_size, lens, num_kv_heads, head_dim, garbage, dtype, kind)
    num_tokens = len(lens) if q_lens is None else sum(q_lens)
    query = rng.standard_normal((num_tokens, num_kv_heads * group, head_dim)).astype(numpy_dtype(dtype))
    return _case(query, caches, pool.block_tables, lens, q_lens, kv_layout, options,
                 draw(_SEEDS, label="variant_seed"),
                 {"garbage": garbage, "arrangement": pool.arrangement, **labels})


def _sometimes_lse_alibi_softcap(draw: st.DrawFn, caps: Capabilities, num_q_heads: int) -> dict[str, Any]:
    """Options: lse, ALiBi (a slope per query head, not per group) and softcap, each where declared
    and drawn."""
    options: dict[str, Any] = {}
    if caps.supports("lse") and draw(st.booleans(), label="lse"):
        options["return_lse"] = True
    if caps.supports("alibi") and draw(st.booleans(), label="alibi"):
        options["alibi_slopes"] = alibi_slopes(num_q_heads)
    if caps.supports("softcap") and draw(st.booleans(), label="softcap"):
        options["softcap"] = 30.0
    return options


def _normal_caches(rng: np.random.Generator, pool: Any, block_size: int, lens: list[int], num_kv_heads: int,
                   head_dim: int, garbage: str, dtype: str, kind: str = "normal",
                   scales: dict[str, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """NHD caches of ``pool`` (a :class:`~pagedattn.conformance.strategies.PoolLayout`) holding K and
    V of sequences of ``lens`` keys (standard normal, or another of :data:`LONG_VALUE_KINDS`),
    ``garbage`` in every other slot; an fp8 ``dtype`` stores them divided by ``scales``' ``k_scale``
    and ``v_scale``."""
    logical = _values(rng, kind, lens, num_kv_heads, head_dim)
    scales = scales or {}
    return fill_caches(rng, (pool.num_blocks, block_size, num_kv_heads, head_dim), pool.block_tables,
                       np.array(lens), logical, garbage, dtype, scales.get("k_scale", 1.0), scales.get("v_scale", 1.0))


# -- wide groups: more query heads per KV head than one row tile ------------------------------

@st.composite
def wide_group_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                     limits: ScaleLimits | None = None, decode: bool | None = None) -> AttentionCase:
    """Return a strategy for attention with 12 to 128 query heads per KV head (:data:`WIDE_GROUPS`).

    1 or 2 KV heads; decode, or a few queries per sequence; 1 to 3 sequences of up to
    ``limits.odd_max_len`` keys (their product with the heads bounded by :data:`SPEC_ELEMENTS`);
    the smallest declared head_dim or another; lse, ALiBi (one slope per query head) and
    softcap where declared, each sometimes. A kernel that holds a group in one tile of rows
    must cut wider groups into tiles and give each query head its own row. ``decode`` True or
    False fixes the batch's kind (decode, or 2 to 5 queries a sequence); None draws it.
    """
    limits = limits or scale_limits()
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.integers(1, 2), label="num_kv_heads")
    group = draw(st.sampled_from(WIDE_GROUPS), label="gqa_ratio")
    num_q_heads = num_kv_heads * group
    smallest = min(caps.head_dims or (16,))
    dims = head_dims(caps).filter(lambda d: num_q_heads * d * 64 <= SPEC_ELEMENTS)
    head_dim = draw(st.one_of(st.just(smallest), dims), label="head_dim")
    fewest_queries = _fewest_queries(decode)
    decode = _is_decode(draw, caps, decode)
    q_len = 1 if decode else draw(st.integers(fewest_queries, 5), label="q_len")
    top = max(block_size + 1, min(limits.odd_max_len, SPEC_ELEMENTS // (num_q_heads * head_dim * q_len)))
    num_seqs = draw(st.integers(1, 3), label="num_seqs")
    edges = st.sampled_from((block_size + 1, 1, block_size, top))
    lens = [max(q_len, draw(st.one_of(edges, st.integers(1, top)), label=f"seq_lens[{s}]"))
            for s in range(num_seqs)]
    pool = draw(block_tables(np.array(lens), block_size, ("shuffled", "interleaved", "reversed")), label="pool")
    options = _sometimes_lse_alibi_softcap(draw, caps, num_q_heads)
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    caches = _normal_caches(rng, pool, block_size, lens, num_kv_heads, head_dim, garbage, dtype)
    q_lens = None if decode else [q_len] * num_seqs
    query = rng.standard_normal((num_seqs * q_len, num_q_heads, head_dim)).astype(numpy_dtype(dtype))
    labels = {"feature": "wide_groups", "garbage": garbage, "arrangement": pool.arrangement,
              "heads": f"{num_q_heads}/{num_kv_heads}", "queries": "decode" if decode else f"last {q_len}"}
    return _case(query, caches, pool.block_tables, lens, q_lens, kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


# -- large batches: more work than one wave ------------------------------------------------------

@st.composite
def long_batch_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                     limits: ScaleLimits | None = None, fp8: bool = False,
                     pairs: int = LONG_BATCH_PAIRS) -> AttentionCase:
    """Return a strategy for a decode batch of ``pairs`` (sequence, KV head) pairs, by default
    :data:`LONG_BATCH_PAIRS`, each sequence :data:`LONG_BATCH_KEYS` keys long.

    A batch that fills the GPU is not split: each CTA walks the whole range of one sequence's KV
    head, thousands of keys, as in an engine's decode of 64 sequences of 8,192 keys; the long
    cells' batches of 1 to 4 sequences are split into parts of a thousand keys or so, and the
    large batches hold at most 80 keys a sequence. With :data:`SPLIT_BATCH_PAIRS` the batch is
    split instead, every sequence of it: one KV head first, GQA 8 first (llama3-70b's
    tensor-parallel decode). 1, 2 or 4 KV heads, GQA 4, 1 or 8, the smallest declared head_dim;
    K, V and queries of a kind of :data:`LONG_VALUE_KINDS`; lse sometimes; a shuffled or
    interleaved pool. With ``fp8``, fp8 caches and scales (the fp8 decode paths stage and step
    through a range their own way).
    """
    del limits  # one size for every profile: the threshold is the GPU's, not the profile's
    caps = capabilities
    split = pairs < LONG_BATCH_PAIRS
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.sampled_from((1, 2, 4)), label="num_kv_heads")
    group = draw(st.sampled_from((8, 4, 1) if split else (4, 1, 8)), label="gqa_ratio")
    head_dim = min(caps.head_dims or (16,))
    num_seqs = -(-pairs // num_kv_heads)
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    lens = rng.integers(LONG_BATCH_KEYS[0], LONG_BATCH_KEYS[1] + 1, num_seqs)
    lens[-1] = draw(st.sampled_from(LONG_BATCH_KEYS), label="last_seq_len")
    pool = draw(block_tables(lens, block_size, ("shuffled", "interleaved")), label="pool")
    options, cache_dtype, scales = _batch_options(draw, caps, dtype, fp8)
    # "trend" first: values ramp along the sequence; with the queries scaled down every key weighs
    # about the same, so a row that reads other positions' keys past 4,096 (a third of its keys and
    # more) is off by more than the tolerance, which grows with the scores (fp8's most)
    kind = draw(st.sampled_from(LONG_VALUE_KINDS), label="values")
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    caches = _normal_caches(rng, pool, block_size, lens.tolist(), num_kv_heads, head_dim, garbage, cache_dtype,
                            kind, scales)
    query = _query(rng, kind, (num_seqs, num_kv_heads * group, head_dim), "float64", group)
    query = (query * LONG_BATCH_QUERY_FACTOR).astype(numpy_dtype(dtype))
    labels = {"feature": "split_batch" if split else "long_batch", "values": kind, "garbage": garbage,
              "arrangement": pool.arrangement,
              "heads": f"{num_kv_heads * group}/{num_kv_heads}", "sequences": str(num_seqs), "queries": "decode",
              "cache_dtype": cache_dtype}
    return _case(query, caches, pool.block_tables, lens.tolist(), None, kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


#: A key's offset within a range walked whole wraps here when held in 16 bits: every sequence of a
#: very long batch has keys past it.
VERY_LONG_BATCH_WRAP = 2**16
#: Keys of each sequence of a very long batch past :data:`VERY_LONG_BATCH_WRAP`, at least and at most:
#: scoring :data:`KV_BYTES_GAP` above the keys before, they weigh 46 % to 87 % of each row.
VERY_LONG_BATCH_PAST = (1_024, 8_192)
#: Distinct blocks the very long batches' tables name before the wrap, and as many others from it
#: on, at least and at most: each named dozens of times a row, in random order, so the spec's
#: answer costs a block per distinct block and row
#: (:mod:`pagedattn.conformance.repeated_blocks`).
VERY_LONG_BATCH_DISTINCT_BLOCKS = (65, 257)


@st.composite
def very_long_batch_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                          limits: ScaleLimits | None = None, fp8: bool = False,
                          decode: bool | None = None) -> AttentionCase:
    """Return a strategy for a batch of :data:`LONG_BATCH_PAIRS` (sequence, KV head) pairs, each
    sequence :data:`VERY_LONG_BATCH_WRAP` keys and :data:`VERY_LONG_BATCH_PAST` more.

    A batch that fills the GPU is not split, so each CTA walks a whole range of more than 65,536
    keys, where an offset within the range held in 16 bits wraps; the very long cells' single
    sequences are split into parts of a thousand keys or so, and the long batches' ranges end by
    8,192. Each table names 65 to 257 distinct blocks at random before the wrap and as many
    others from it on (the contract lets a table name a block any number of times), so the pool
    holds a few hundred blocks; the keys from the wrap on score :data:`KV_BYTES_GAP` above the
    others and hold values near -1 against +1, so a row that reads keys before the wrap in their
    place moves by whole units. 4, 2 or 1 KV heads, GQA 1, 2 or 4, the smallest declared
    head_dim, the largest of the contract's block sizes first; queries of about 1; lse wherever
    declared; garbage in the unused blocks and table entries; no ALiBi or window. With ``fp8``,
    one of the backend's fp8 cache dtypes and scales (``v_scale`` never 1). ``decode`` True or
    False fixes the batch's kind (decode, or the last 2 or 3 positions of each sequence as
    queries); None draws it.
    """
    del limits  # one size for every profile: the threshold is the GPU's and a 16-bit integer's
    caps = capabilities
    cache_dtype, scales = _cache_dtype_and_scales(draw, caps, dtype, fp8)
    # the largest blocks and most KV heads first: the fewest (sequence, block) steps for a kernel on a CPU
    sizes = scale_block_sizes(caps)
    block_size = draw(st.sampled_from(sorted(set(sizes) & set(CONTRACT_BLOCK_SIZES), reverse=True) or sizes),
                      label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.sampled_from((4, 2, 1)), label="num_kv_heads")
    group = draw(st.sampled_from((1, 2, 4)), label="gqa_ratio")
    head_dim = min(caps.head_dims or (16,))
    num_seqs = -(-LONG_BATCH_PAIRS // num_kv_heads)
    distinct = draw(st.integers(*VERY_LONG_BATCH_DISTINCT_BLOCKS), label="distinct_blocks")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    lens = VERY_LONG_BATCH_WRAP + rng.integers(VERY_LONG_BATCH_PAST[0], VERY_LONG_BATCH_PAST[1] + 1, num_seqs)
    lens[0] = VERY_LONG_BATCH_WRAP + draw(st.integers(*VERY_LONG_BATCH_PAST), label="first_keys_past_the_wrap")
    spare = 4
    ids = rng.permutation(2 * distinct + spare)
    before, after, unused = ids[:distinct], ids[distinct:2 * distinct], ids[2 * distinct:]
    first_after = VERY_LONG_BATCH_WRAP // block_size  # the column holding the key at the wrap
    columns = -(-lens // block_size)
    width = int(columns.max()) + 1  # a column past the longest: garbage
    tables = np.concatenate([rng.choice(before, (num_seqs, first_after)),
                             rng.choice(after, (num_seqs, width - first_after))], axis=1)
    past = np.arange(width)[None, :] >= columns[:, None]
    tables = np.where(past, rng.choice(unused, tables.shape), tables).astype(np.int32)
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    caches = _two_sided_caches(rng, garbage, (len(ids), block_size, num_kv_heads, head_dim), ids[:-spare], after,
                               cache_dtype, scales)
    decode = _is_decode(draw, caps, decode)
    q_lens = None if decode else rng.integers(2, 4, num_seqs).tolist()
    tokens = num_seqs if q_lens is None else sum(q_lens)
    query = (1.0 + 0.1 * rng.standard_normal((tokens, num_kv_heads * group, head_dim))).astype(numpy_dtype(dtype))
    options: dict[str, Any] = {"return_lse": True} if caps.supports("lse") else {}
    options.update(scales)
    labels = {"feature": "very_long_batch", "garbage": garbage, "heads": f"{num_kv_heads * group}/{num_kv_heads}",
              "sequences": str(num_seqs), "queries": "decode" if decode else "2 or 3 a sequence",
              "cache_dtype": cache_dtype, "distinct_blocks": f"{distinct} before the wrap, {distinct} from it"}
    return _case(query, caches, tables, lens.tolist(), q_lens, kv_layout, options, draw(_SEEDS, label="variant_seed"),
                 labels)


@st.composite
def large_batch_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                      limits: ScaleLimits | None = None, fp8: bool = False,
                      decode: bool | None = None) -> AttentionCase:
    """Return a strategy for a batch of at least :data:`LARGE_BATCH_SEQS` sequences (and more pairs).

    1, 2 or 4 KV heads with GQA 1, 4 or 8; short sequences (1 to :data:`LARGE_BATCH_MAX_LEN`
    keys, block edges among them) in an interleaved or shuffled pool; decode, or a mixed batch
    where some sequences take a few queries. A kernel whose grid, or persistent work list,
    covers one wave of CTAs must still reach the last pair. With ``fp8``, fp8 caches and scales
    (``v_scale`` never 1). ``decode`` True or False fixes the batch's kind (decode, or mixed); None
    draws it.
    """
    del limits  # one size for every profile: the threshold is the GPU's, not the profile's
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.sampled_from((1, 2, 4)), label="num_kv_heads")
    group = draw(st.sampled_from((1, 4, 8)), label="gqa_ratio")
    head_dim = min(caps.head_dims or (16,))
    num_seqs = LARGE_BATCH_SEQS + draw(st.integers(0, 64), label="extra_seqs")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    edges = np.array([1, block_size - 1, block_size, block_size + 1, LARGE_BATCH_MAX_LEN])
    lens = np.where(rng.random(num_seqs) < 0.25, rng.choice(edges, num_seqs),
                    rng.integers(1, LARGE_BATCH_MAX_LEN + 1, num_seqs)).astype(int)
    lens[-1] = draw(st.sampled_from(tuple(edges)), label="last_seq_len")  # the last pair: past every wave
    mixed = not _is_decode(draw, caps, decode)
    q_lens = None
    if mixed:  # a quarter of the sequences take up to 4 queries (chunked prefill beside decode)
        q_lens = np.where(rng.random(num_seqs) < 0.25, np.minimum(lens, rng.integers(1, 5, num_seqs)), 1).tolist()
    pool = draw(block_tables(lens, block_size, ("shuffled", "interleaved")), label="pool")
    options, cache_dtype, scales = _batch_options(draw, caps, dtype, fp8)
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    logical = _values(rng, "normal", lens.tolist(), num_kv_heads, head_dim)
    caches = fill_caches(rng, (pool.num_blocks, block_size, num_kv_heads, head_dim), pool.block_tables, lens,
                         logical, garbage, cache_dtype, scales.get("k_scale", 1.0), scales.get("v_scale", 1.0))
    num_tokens = num_seqs if q_lens is None else sum(q_lens)
    query = rng.standard_normal((num_tokens, num_kv_heads * group, head_dim)).astype(numpy_dtype(dtype))
    labels = {"feature": "large_batch", "garbage": garbage, "arrangement": pool.arrangement,
              "heads": f"{num_kv_heads * group}/{num_kv_heads}", "sequences": str(num_seqs),
              "queries": "mixed" if mixed else "decode", "cache_dtype": cache_dtype}
    return _case(query, caches, pool.block_tables, lens.tolist(), q_lens, kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


# -- a batch of many sequences sharing a long prefix -------------------------------------------

@st.composite
def shared_prefix_batch_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                              limits: ScaleLimits | None = None, prefixes: int = 1,
                              decode: bool | None = None) -> AttentionCase:
    """Return a strategy for :data:`SHARED_PREFIX_SEQS` sequences in ``prefixes`` groups, each
    group's sequences sharing the physical blocks of a prefix of :data:`SHARED_PREFIX_KEYS` keys
    (whole blocks, as prefix caching shares them), then :data:`SHARED_PREFIX_SUFFIX` keys each in
    blocks of their own (200 first), shuffled in the pool; values of :func:`_shared_prefix_values`.
    Every query lies in its sequence's suffix: decode, or a mixed batch where some sequences take
    a few queries (the first sequence two where its suffix holds them). The first two sequences are in the first
    group. GQA 4 or 8 (a prefix pass's rows are tokens x query heads); lse, ALiBi and softcap
    each sometimes. ``decode`` True or False fixes the batch's kind (decode, or mixed); None draws it.
    """
    del limits  # one size for every profile: the thresholds are an engine's, not the profile's
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.integers(1, 2), label="num_kv_heads")
    num_q_heads = num_kv_heads * draw(st.sampled_from((4, 8)), label="gqa_ratio")
    declared = tuple(d for d in (caps.head_dims or (16, 64, 128)) if d <= 128) or (min(caps.head_dims or (16,)),)
    head_dim = min(declared)
    num_seqs = draw(st.integers(*SHARED_PREFIX_SEQS), label="num_seqs")
    first, rest = -(-SHARED_PREFIX_KEYS[0] // block_size), SHARED_PREFIX_KEYS[1] // block_size
    prefix_blocks = [draw(st.integers(first, max(first, rest)), label=f"prefix_blocks[{g}]") for g in range(prefixes)]
    group = np.minimum(np.arange(num_seqs) * prefixes // num_seqs, prefixes - 1)  # contiguous groups
    low, high = SHARED_PREFIX_SUFFIX  # the longest first: a suffix weighs about as much as the prefix
    suffixes = [high - draw(st.integers(0, high - low), label=f"suffix_shortfall[{s}]") for s in range(num_seqs)]
    lens = [prefix_blocks[g] * block_size + n for g, n in zip(group.tolist(), suffixes, strict=True)]
    mixed = not _is_decode(draw, caps, decode)
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    q_lens = None
    if mixed:  # a quarter of the sequences take up to 4 queries, all in their suffix; the first 2 or more
        q_lens = np.where(rng.random(num_seqs) < 0.25, np.minimum(suffixes, rng.integers(1, 5, num_seqs)), 1).tolist()
        q_lens[0] = max(q_lens[0], min(2, suffixes[0]))
    own = [-(-n // block_size) for n in suffixes]
    num_blocks = sum(prefix_blocks) + sum(own) + draw(st.integers(0, 3), label="spare_blocks")
    ids = rng.permutation(num_blocks)
    starts = np.cumsum([0, *prefix_blocks])
    own_ids = iter(ids[starts[-1]:].tolist())
    tables = np.full((num_seqs, max(prefix_blocks) + max(own) + 1), -1, dtype=np.int64)
    for s, g in enumerate(group.tolist()):
        tables[s, :prefix_blocks[g]] = ids[starts[g]:starts[g + 1]]
        for j in range(own[s]):
            tables[s, prefix_blocks[g] + j] = next(own_ids)
    tables[tables < 0] = rng.integers(0, num_blocks, int((tables < 0).sum()))  # unused entries: any block
    options = _sometimes_lse_alibi_softcap(draw, caps, num_q_heads)
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    logical = _shared_prefix_values(rng, lens, [prefix_blocks[g] * block_size for g in group.tolist()],
                                    group.tolist(), num_kv_heads, head_dim)
    caches = fill_caches(rng, (num_blocks, block_size, num_kv_heads, head_dim), tables, np.array(lens), logical,
                         garbage, dtype, 1.0, 1.0)
    num_tokens = num_seqs if q_lens is None else sum(q_lens)
    query = rng.standard_normal((num_tokens, num_q_heads, head_dim)).astype(numpy_dtype(dtype))
    labels = {"feature": "shared_prefix_batch", "garbage": garbage, "prefixes": str(prefixes),
              "prefix_keys": "+".join(str(n * block_size) for n in prefix_blocks), "sequences": str(num_seqs),
              "heads": f"{num_q_heads}/{num_kv_heads}", "queries": "mixed" if mixed else "decode"}
    return _case(query, caches, tables.astype(np.int32), lens, q_lens, kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


def _shared_prefix_values(rng: np.random.Generator, lens: list[int], prefix_lens: list[int], groups: list[int],
                          num_kv_heads: int, head_dim: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """K, V float64 ``[L, Hkv, D]`` of each sequence of a shared-prefix batch: keys of the prefix near
    ``+2`` in every dim and of the suffix near ``-2``, so that a standard normal query's weight moves
    between the two with the sign of its sum (each row its own split of the mass); values near 1 in
    the first group's prefix, 0.5 in the second's, -1 in every suffix, so that each pass's output,
    and which prefix a row read, shows."""
    result = []
    for length, prefix, group in zip(lens, prefix_lens, groups, strict=True):
        sign = np.where(np.arange(length) < prefix, 1.0, -1.0)[:, None, None]
        k = 2.0 * sign + 0.5 * rng.standard_normal((length, num_kv_heads, head_dim))
        level = np.where(sign > 0, 1.0 - 0.5 * group, -1.0)
        v = level + 0.1 * rng.standard_normal((length, num_kv_heads, head_dim))
        result.append((k, v))
    return result


# -- a long-tail batch: a GPU full without split-KV --------------------------------------------

#: Sequences of a long-tail batch: an engine's decode batch, which fills an H200 without split-KV
#: on TAIL_BATCH_KV_HEADS KV heads, so that a kernel walks each row's keys in one pass.
TAIL_BATCH_SEQS = 64
#: KV heads of a long-tail batch (llama3-8b's).
TAIL_BATCH_KV_HEADS = 8
#: Keys of each sequence of a long-tail batch, at least: the tail then holds about 40% of a row's mass.
TAIL_BATCH_KEYS = 2048


@st.composite
def long_tail_batch_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                          limits: ScaleLimits | None = None) -> AttentionCase:
    """Return a strategy for a decode batch of :data:`TAIL_BATCH_SEQS` sequences of
    :data:`TAIL_BATCH_KEYS` keys to a block more on :data:`TAIL_BATCH_KV_HEADS` KV heads (GQA 1 or
    4, the backend's smallest head_dim), values of the "tail" kind (:data:`LONG_TAIL_KINDS`) in
    fp8 caches (one of the backend's, with scales), lse where declared. The long-tail cells'
    batches of 1 to 4 sequences are split into parts on a GPU, which confines a loss of the tail's
    small weights to the part holding the sink; this batch fills the GPU unsplit, so every row's
    whole tail is at stake.
    """
    del limits  # one size for every profile: the threshold is the GPU's, not the profile's
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    group = draw(st.sampled_from((1, 4)), label="gqa_ratio")
    head_dim = min(caps.head_dims or (16,))
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    lens = rng.integers(TAIL_BATCH_KEYS, TAIL_BATCH_KEYS + block_size + 1, TAIL_BATCH_SEQS)
    lens[-1] = TAIL_BATCH_KEYS + 1  # a partial last block
    pool = draw(block_tables(lens, block_size, ("shuffled", "interleaved")), label="pool")
    options: dict[str, Any] = {"return_lse": True} if caps.supports("lse") else {}
    cache_dtype, scales = _cache_dtype_and_scales(draw, caps, dtype, True)
    options.update(scales)
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    caches = _normal_caches(rng, pool, block_size, lens.tolist(), TAIL_BATCH_KV_HEADS, head_dim, garbage,
                            cache_dtype, "tail", scales)
    query = _query(rng, "tail", (TAIL_BATCH_SEQS, TAIL_BATCH_KV_HEADS * group, head_dim), dtype)
    labels = {"feature": "long_tail_batch", "values": "tail", "garbage": garbage, "arrangement": pool.arrangement,
              "heads": f"{TAIL_BATCH_KV_HEADS * group}/{TAIL_BATCH_KV_HEADS}", "cache_dtype": cache_dtype}
    return _case(query, caches, pool.block_tables, lens.tolist(), None, kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


# -- far partials: split-KV partials past 2**31 elements ---------------------------------------------

#: Keys of the one long sequence of a far-partials batch: 32 split parts of 1,024 keys, 64 of 512.
FAR_PARTIAL_KEYS = 2**15
#: Keys of a split part, at most, of the kernels a far-partials batch is sized for.
FAR_PARTIAL_PART_KEYS = 1024
#: Query heads x head_dim of a far-partials batch: the floats of one token's partial of one part.
FAR_PARTIAL_ROW = 4096


@st.composite
def far_partial_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                      limits: ScaleLimits | None = None) -> AttentionCase:
    """Return a strategy for a decode batch whose split-KV partials, laid out by sequence, pass 2**31 elements.

    A kernel that cuts every sequence's keys into parts of at most :data:`FAR_PARTIAL_PART_KEYS`
    and keeps their partials as ``[sequence, head, part, head_dim]``, as many parts for each
    sequence as the longest needs, holds the partials of sequence ``s`` from element
    ``s * FAR_PARTIAL_ROW * parts`` on: here one sequence of :data:`FAR_PARTIAL_KEYS` keys, first
    or last, among 16,384 to 16,447 more of 1 to two blocks and one keys, 32 query heads of
    128 (or as many of the backend's largest head_dim as make :data:`FAR_PARTIAL_ROW`) on 1 or 4
    KV heads, so that the partials of the last sequences start past element 2**31
    (:func:`far_partial_sequences`). A kernel that addresses them in 32 bits merges those rows
    from elsewhere.
    """
    del limits  # one size for every profile: the limit is the offset type's
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    head_dim = _far_row_head_dim(caps)
    num_q_heads = FAR_PARTIAL_ROW // head_dim
    num_kv_heads = draw(st.sampled_from((1, 4)), label="num_kv_heads")
    parts = far_partial_parts(np.array([FAR_PARTIAL_KEYS]))
    num_seqs = INT32_OFFSET_LIMIT // (FAR_PARTIAL_ROW * parts) + draw(st.integers(1, 64), label="extra_seqs")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    lens = rng.integers(1, 2 * block_size + 2, num_seqs)
    # first: the sequences past element 2**31 are then short ones, whose rows a few keys decide
    long_at = draw(st.sampled_from((0, num_seqs - 1)), label="long_sequence")
    lens[long_at] = FAR_PARTIAL_KEYS
    pool = draw(block_tables(lens, block_size, ("shuffled", "interleaved")), label="pool")
    logical = _values(rng, "normal", lens.tolist(), num_kv_heads, head_dim)
    caches = fill_caches(rng, (pool.num_blocks, block_size, num_kv_heads, head_dim), pool.block_tables, lens,
                         logical, "random", dtype, 1.0, 1.0)
    query = rng.standard_normal((num_seqs, num_q_heads, head_dim)).astype(numpy_dtype(dtype))
    options: dict[str, Any] = {}
    if caps.supports("lse") and draw(st.booleans(), label="lse"):
        options["return_lse"] = True
    labels = {"feature": "far_partials", "sequences": str(num_seqs), "long_sequence": str(long_at),
              "heads": f"{num_q_heads}/{num_kv_heads}",
              "partial_elements": str(num_seqs * num_q_heads * parts * head_dim)}
    return _case(query, caches, pool.block_tables, lens.tolist(), None, kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


def far_partial_parts(seq_lens: np.ndarray) -> int:
    """Split parts of every sequence in a far-partials layout: as many parts of
    :data:`FAR_PARTIAL_PART_KEYS` keys as the longest sequence needs."""
    return -(-int(np.max(seq_lens, initial=1)) // FAR_PARTIAL_PART_KEYS)


def far_partial_sequences(seq_lens: np.ndarray, row_elements: int, seed: int) -> np.ndarray:
    """Sequences a far-partials check compares: the first, one picked by ``seed``, the longest, and
    every sequence whose partials, laid out ``[sequence, head, part, head_dim]`` with parts of
    :data:`FAR_PARTIAL_PART_KEYS` keys, start at or past element 2**31."""
    lens = np.asarray(seq_lens)
    parts = far_partial_parts(lens)
    first_far = min(INT32_OFFSET_LIMIT // (row_elements * parts), lens.size - 1)
    picks = [0, seed % max(first_far, 1), int(np.argmax(lens))]
    return np.unique(np.concatenate([picks, np.arange(first_far, lens.size)]))


# -- far rows: a query and an output past 2**31 elements ---------------------------------------------

def far_row_sequences(query_start_loc: np.ndarray | None, num_tokens: int, row_elements: int,
                      seed: int) -> np.ndarray:
    """Sequences whose rows a far-row check compares: the first, one picked by ``seed``, and every
    sequence holding a token row at or past element 2**31 of the query and the output.

    Row ``r`` holds elements ``r * row_elements`` to ``(r + 1) * row_elements - 1``; the first row
    with an element past ``INT32_OFFSET_LIMIT - 1`` is ``INT32_OFFSET_LIMIT // row_elements``.
    """
    first_far = min(INT32_OFFSET_LIMIT // row_elements, num_tokens - 1)
    rows = np.concatenate([[0, seed % max(first_far, 1)], np.arange(first_far, num_tokens)])
    if query_start_loc is None:
        return np.unique(rows)
    return np.unique(np.searchsorted(np.asarray(query_start_loc), rows, side="right") - 1)


def _far_row_head_dim(caps: Capabilities) -> int:
    """128 where declared (or any head_dim is), else the backend's largest."""
    if caps.head_dims is None or 128 in caps.head_dims:
        return 128
    return max(caps.head_dims)


#: Queries of each sequence of a far-row prefill, at least (a prefill batch's, in cupy's planning)
FAR_PREFILL_MIN_QUERIES = 8


@st.composite
def far_row_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str, limits: ScaleLimits | None = None,
                  queries: str = "decode", fp8: bool = False, fused: bool = False) -> AttentionCase:
    """Return a strategy for a batch whose query and output hold more than 2**31 elements.

    Tokens of :data:`FAR_ROW_ELEMENTS` elements (128 query heads on 8 or 1 KV heads at head_dim
    128), as many as take the query past ``INT32_OFFSET_LIMIT`` elements and 1 to 64 tokens more.
    ``queries`` "decode": one query per sequence of 2 keys to a block and one; "prompts": 1 to 4
    queries after 1 or 2 keys of context each, as a varlen call; "prefills": as "prompts", but
    sequences of at least :data:`LONG_PREFILL_ROWS` rows and :data:`FAR_PREFILL_MIN_QUERIES` queries
    (:func:`long_prefill_queries` to 8 more), which kernels take on their prefill paths (cupy its
    Hopper kernel). The sequences share a pool of
    :data:`FAR_ROW_BLOCKS` blocks. The query is zero (lazy: it costs no memory) except in the rows
    of :func:`far_row_sequences`, the ones the check compares, which are standard normal. With
    ``fp8``, the caches are one of the backend's fp8 dtypes, with scales. A kernel that computes a
    row's offset ``token * Hq * D`` in 32 bits reads and writes the rows past element 2**31
    elsewhere. With ``fused``, the query is the view ``qkv[:, :Hq]`` of a fused QKV projection's
    rows, and only as many tokens as take those rows past element 2**31: the view and the output
    hold fewer than 2**31 elements, and a kernel that picks 32-bit offsets for a query of fewer
    reads the far rows elsewhere (the key and value heads of the compared rows are NaN, never read).
    """
    del limits  # one size for every profile: the limit is the offset type's
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.sampled_from((8, 1)), label="num_kv_heads")
    head_dim = _far_row_head_dim(caps)
    per_kv_head = -(-FAR_ROW_ELEMENTS // (head_dim * num_kv_heads))
    num_q_heads = num_kv_heads * per_kv_head
    row_elements = (num_q_heads + 2 * num_kv_heads if fused else num_q_heads) * head_dim  # the query's row stride
    min_tokens = INT32_OFFSET_LIMIT // row_elements + draw(st.integers(1, 64), label="extra_tokens")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    if queries == "decode":
        q_lens = None
        lens = rng.integers(2, block_size + 2, min_tokens)
        num_tokens = min_tokens
    else:
        fewest = 1 if queries == "prompts" else long_prefill_queries(per_kv_head, FAR_PREFILL_MIN_QUERIES)
        per_seq = rng.integers(fewest, fewest + (4 if queries == "prompts" else 9), min_tokens)
        num_seqs = int(np.searchsorted(np.cumsum(per_seq), min_tokens)) + 1
        q_lens = per_seq[:num_seqs]
        lens = q_lens + rng.integers(1, 3, num_seqs)
        num_tokens = int(q_lens.sum())
    columns = int(-(-lens.max() // block_size))
    tables = rng.integers(0, FAR_ROW_BLOCKS, (lens.size, columns)).astype(np.int32)
    cache_dtype, scales = _cache_dtype_and_scales(draw, caps, dtype, fp8)
    pool_keys = FAR_ROW_BLOCKS * block_size
    logical = _values(rng, "normal", [pool_keys], num_kv_heads, head_dim)  # every slot of the pool
    caches = fill_caches(rng, (FAR_ROW_BLOCKS, block_size, num_kv_heads, head_dim),
                         np.arange(FAR_ROW_BLOCKS, dtype=np.int32)[None, :], np.array([pool_keys]), logical,
                         "random", cache_dtype, scales.get("k_scale", 1.0), scales.get("v_scale", 1.0))
    seed = draw(_SEEDS, label="variant_seed")
    qsl = None if q_lens is None else np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    rows_array = lazy_cache((num_tokens, row_elements // head_dim, head_dim), dtype)  # the query, or qkv
    for s in far_row_sequences(qsl, num_tokens, row_elements, seed):
        rows = slice(s, s + 1) if qsl is None else slice(int(qsl[s]), int(qsl[s + 1]))
        rows_array[rows, :num_q_heads] = rng.standard_normal((rows.stop - rows.start, num_q_heads, head_dim))
        rows_array[rows, num_q_heads:] = np.nan  # a fused view's key and value heads (none when contiguous)
    options: dict[str, Any] = dict(scales)
    if caps.supports("lse") and draw(st.booleans(), label="lse"):
        options["return_lse"] = True
    labels = {"feature": "far_rows", "tokens": str(num_tokens), "sequences": str(lens.size),
              "elements": str(num_tokens * row_elements), "queries": queries, "cache_dtype": cache_dtype,
              "query": "a view of fused QKV rows" if fused else "contiguous"}
    query = rows_array[:, :num_q_heads] if fused else rows_array
    case = _case(query, caches, tables, lens.tolist(), None if q_lens is None else q_lens.tolist(), kv_layout,
                 options, seed, labels)
    return case.replace(qkv=rows_array) if fused else case


@st.composite
def far_merge_row_cases(draw: st.DrawFn, *, dtype: str) -> MergeCase:
    """Return a strategy for ``merge_states`` of two states of more than 2**31 elements each.

    ``[T, 128, 128]`` outs, ``T`` as many tokens as take them past ``INT32_OFFSET_LIMIT`` and 1 to 64
    more (a long prefill's two parts, as chunked prefill merges them). The outs are zero (lazy) and
    the lses 0 except in the rows the check compares (:func:`far_row_sequences`, seed
    :data:`FAR_MERGE_SEED`): standard normal outs, lses spread by ``lse_spread``, some of them -inf
    (an empty side of a head). A kernel that computes ``token * H * D`` in 32 bits merges the rows past
    element 2**31 from elsewhere.
    """
    heads, head_dim = FAR_ROW_ELEMENTS // 128, 128
    row_elements = heads * head_dim
    num_tokens = INT32_OFFSET_LIMIT // row_elements + draw(st.integers(1, 64), label="extra_tokens")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    spread = draw(st.sampled_from((1.0, 30.0)), label="lse_spread")
    rows = far_row_sequences(None, num_tokens, row_elements, FAR_MERGE_SEED)
    outs = [lazy_cache((num_tokens, heads, head_dim), dtype) for _ in range(2)]
    lses = [np.zeros((num_tokens, heads), np.float32) for _ in range(2)]
    for out, lse in zip(outs, lses, strict=True):
        out[rows] = rng.standard_normal((rows.size, heads, head_dim)).astype(out.dtype)
        lse_rows = (rng.standard_normal((rows.size, heads)) * spread).astype(np.float32)
        lse_rows[rng.random(lse_rows.shape) < 0.1] = -np.inf  # an empty side of some heads
        lse[rows] = lse_rows
    return MergeCase(out_a=outs[0], lse_a=lses[0], out_b=outs[1], lse_b=lses[1])


#: Elements of one token (KV heads x head_dim) of a far-row ``write_kv``, at least: 32 KV heads of 128
#: (a multi-head model's), about 524,288 tokens of them (a long prefill's) past 2**31 elements.
FAR_WRITE_ROW_ELEMENTS = 2**12


@st.composite
def far_row_write_kv_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                           limits: ScaleLimits | None = None, fp8: bool = False) -> WriteKVCase:
    """Return a strategy for ``write_kv`` whose key and value hold more than 2**31 elements each.

    Tokens of :data:`FAR_WRITE_ROW_ELEMENTS` elements, as many as take the inputs past
    ``INT32_OFFSET_LIMIT`` and 1 to 64 more. Only the tokens of :func:`far_row_sequences` (seed
    drawn) are written, at shuffled slots of a small pool; every other token is skipped (-1) and
    zero (lazy: the inputs cost no memory). The pool's other slots hold random values that must
    survive. With ``fp8``, the caches are one of the backend's fp8 dtypes and the call has scales.
    A kernel that computes a token's offset ``token * Hkv * D`` in 32 bits reads the tokens past
    element 2**31 from elsewhere.
    """
    del limits  # one size for every profile: the limit is the offset type's
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    head_dim = _far_row_head_dim(caps)
    heads = -(-FAR_WRITE_ROW_ELEMENTS // head_dim)
    row_elements = heads * head_dim
    num_tokens = INT32_OFFSET_LIMIT // row_elements + draw(st.integers(1, 64), label="extra_tokens")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    tokens = far_row_sequences(None, num_tokens, row_elements, draw(_SEEDS, label="row_seed"))
    num_blocks = -(-tokens.size // block_size) + 2  # spare blocks: slots no token writes
    slots = np.full(num_tokens, -1, dtype=np.int64)
    slots[tokens] = rng.choice(num_blocks * block_size, size=tokens.size, replace=False)
    cache_dtype, scales = _cache_dtype_and_scales(draw, caps, dtype, fp8)
    caches = _far_kv_caches(rng, (num_blocks, block_size, heads, head_dim), np.arange(num_blocks), cache_dtype,
                            kv_layout)
    key, value = (lazy_cache((num_tokens, heads, head_dim), dtype) for _ in range(2))
    for x in (key, value):
        x[tokens] = rng.standard_normal((tokens.size, heads, head_dim)).astype(x.dtype)
    return WriteKVCase(key=key, value=value, key_cache=caches[0], value_cache=caches[1], slot_mapping=slots,
                       kv_layout=kv_layout, k_scale=scales.get("k_scale", 1.0), v_scale=scales.get("v_scale", 1.0))


# -- many query tokens: past a grid's y and z limit ------------------------------------------------

@st.composite
def many_token_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                     limits: ScaleLimits | None = None) -> AttentionCase:
    """Return a strategy for a batch of more than :data:`MANY_TOKENS` query tokens.

    With ``varlen``: :data:`MANY_TOKEN_SEQS` whole prompts of 256 queries (the last a few
    more), under a sliding window of one to two blocks where the backend has one (each query
    then sees a few blocks, which keeps the batch cheap for an interpreter); a decode-only
    backend gets as many one-query sequences. One KV head, GQA 1 or 2, the smallest head_dim.
    A kernel that puts query tokens on a grid's y or z axis (at most 65,535) fails its launch
    here, often without an exception, and writes nothing.
    """
    del limits  # one size for every profile: the limit is the GPU's
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    group = draw(st.sampled_from((1, 2)), label="gqa_ratio")
    head_dim = min(caps.head_dims or (16,))
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    decode = not caps.supports("varlen")
    if decode:
        q_lens = np.ones(MANY_TOKENS + draw(st.integers(1, 64), label="extra_tokens"), dtype=int)
        lens = rng.integers(1, 9, q_lens.size)
    else:
        q_lens = np.full(MANY_TOKEN_SEQS, MANY_TOKENS // MANY_TOKEN_SEQS)  # whole prompts, no context
        q_lens[-1] += draw(st.integers(1, 2 * block_size), label="extra_tokens")  # past MANY_TOKENS
        lens = q_lens.copy()
    pool = draw(block_tables(lens, block_size, ("shuffled", "interleaved")), label="pool")
    options: dict[str, Any] = {}
    if caps.supports("lse") and draw(st.booleans(), label="lse"):
        options["return_lse"] = True
    if caps.supports("sliding_window"):  # each query sees a few blocks: the batch costs an interpreter little
        options["sliding_window"] = draw(st.integers(block_size + 1, 2 * block_size), label="sliding_window")
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    logical = _values(rng, "normal", lens.tolist(), 1, head_dim)
    caches = fill_caches(rng, (pool.num_blocks, block_size, 1, head_dim), pool.block_tables, lens, logical,
                         garbage, dtype, 1.0, 1.0)
    query = rng.standard_normal((int(q_lens.sum()), group, head_dim)).astype(numpy_dtype(dtype))
    labels = {"feature": "many_tokens", "garbage": garbage, "arrangement": pool.arrangement,
              "tokens": str(int(q_lens.sum())), "sequences": str(lens.size),
              "queries": "decode" if decode else "prefill"}
    return _case(query, caches, pool.block_tables, lens.tolist(), None if decode else q_lens.tolist(), kv_layout,
                 options, draw(_SEEDS, label="variant_seed"), labels)


@st.composite
def many_sequence_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str, limits: ScaleLimits | None = None,
                        queries: str = "decode") -> AttentionCase:
    """Return a strategy for a batch of more than :data:`MANY_SEQUENCES` sequences.

    ``queries`` "decode": one query each, as a decode call (no ``q_lens``); "prompts": two each,
    as a varlen call. Each sequence holds as many keys as its queries up to
    :data:`MANY_SEQUENCE_MAX_LEN` or a block and one key, whichever is more (block edges among
    them), in a shuffled or interleaved pool; one KV head, GQA 1 or 2, the smallest head_dim. A
    kernel that puts sequences on a grid's y or z axis (at most 65,535) fails its launch here,
    often without an exception, and writes nothing.
    """
    del limits  # one size for every profile: the limit is the GPU's
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    group = draw(st.sampled_from((1, 2)), label="gqa_ratio")
    head_dim = min(caps.head_dims or (16,))
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    per_seq = 1 if queries == "decode" else 2
    num_seqs = MANY_SEQUENCES + draw(st.integers(1, 64), label="extra_seqs")  # index 65,536 among them
    max_len = max(MANY_SEQUENCE_MAX_LEN, block_size + 1)
    edges = np.array([per_seq, block_size - 1, block_size, block_size + 1, max_len])
    edges = edges[edges >= per_seq]
    lens = np.where(rng.random(num_seqs) < 0.25, rng.choice(edges, num_seqs),
                    rng.integers(per_seq, max_len + 1, num_seqs)).astype(int)
    lens[-1] = draw(st.sampled_from(tuple(int(e) for e in edges)), label="last_seq_len")  # the last sequence
    pool = draw(block_tables(lens, block_size, ("shuffled", "interleaved")), label="pool")
    options: dict[str, Any] = {}
    if caps.supports("lse") and draw(st.booleans(), label="lse"):
        options["return_lse"] = True
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    logical = _values(rng, "normal", lens.tolist(), 1, head_dim)
    caches = fill_caches(rng, (pool.num_blocks, block_size, 1, head_dim), pool.block_tables, lens, logical,
                         garbage, dtype, 1.0, 1.0)
    query = rng.standard_normal((num_seqs * per_seq, group, head_dim)).astype(numpy_dtype(dtype))
    labels = {"feature": "many_sequences", "garbage": garbage, "arrangement": pool.arrangement,
              "sequences": str(num_seqs), "queries": queries}
    q_lens = None if queries == "decode" else [per_seq] * num_seqs
    return _case(query, caches, pool.block_tables, lens.tolist(), q_lens, kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


@st.composite
def many_token_write_kv_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                              limits: ScaleLimits | None = None, fp8: bool = False) -> WriteKVCase:
    """Return a strategy for ``write_kv`` of more than :data:`MANY_TOKENS` tokens (a long prefill's
    keys and values in one call) into a pool with a few spare blocks: consecutive slots in
    block-table order, the blocks shuffled, some tokens skipped (-1). Every slot not written holds
    random values that must survive. With ``fp8``, the caches are one of the backend's fp8 dtypes
    and the call has scales (many backends write fp8 caches with a kernel of their own)."""
    del limits  # one size for every profile: the limit is the GPU's
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    head_dim = min(caps.head_dims or (16,))
    rng = np.random.default_rng(draw(_SEEDS, label="seed"))
    T = MANY_TOKENS + draw(st.integers(1, 2 * block_size), label="extra_tokens")
    num_blocks = -(-T // block_size) + draw(st.integers(1, 4), label="spare_blocks")
    order = rng.permutation(num_blocks)  # the sequence's block table
    positions = np.arange(T)
    slots = order[positions // block_size] * block_size + positions % block_size
    slots[rng.random(T) < 0.01] = -1
    slots[-1] = order[(T - 1) // block_size] * block_size + (T - 1) % block_size  # the last token is written
    shape = (num_blocks, block_size, 1, head_dim) if kv_layout == "NHD" else (num_blocks, 1, block_size, head_dim)
    cache_dtype, scales = _cache_dtype_and_scales(draw, caps, dtype, fp8)
    caches = [rng.standard_normal(shape).astype(numpy_dtype(cache_dtype)) for _ in range(2)]
    key = rng.standard_normal((T, 1, head_dim)).astype(numpy_dtype(dtype))
    value = rng.standard_normal((T, 1, head_dim)).astype(numpy_dtype(dtype))
    return WriteKVCase(key=key, value=value, key_cache=caches[0], value_cache=caches[1],
                       slot_mapping=slots.astype(np.int64), kv_layout=kv_layout,
                       k_scale=scales.get("k_scale", 1.0), v_scale=scales.get("v_scale", 1.0))


@st.composite
def many_token_merge_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                           limits: ScaleLimits | None = None) -> MergeCase:
    """Return a strategy for ``merge_states`` of more than 65,535 tokens (the two parts of a long
    prefill's chunks): :data:`MANY_TOKENS` to 64 more tokens of 1 or 2 heads of 8, each side empty
    in some rows (lse -inf, its out NaN), non-finite data sometimes (as :func:`merge_cases`)."""
    del capabilities, limits  # one size for every profile: the limit is the GPU's
    return draw(merge_cases(dtype=dtype, tokens=(MANY_TOKENS, MANY_TOKENS + 64), heads=(1, 2),
                            dims=(8,)))


@st.composite
def wide_merge_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                     limits: ScaleLimits | None = None) -> MergeCase:
    """Return a strategy for ``merge_states`` of many wide heads: 1 to 4 tokens of
    :data:`WIDE_MERGE_HEADS` heads of one of :data:`WIDE_MERGE_HEAD_DIMS` (more heads than a block
    holding a row per head takes, and rows past a 128- or 256-dim tile), as :func:`merge_cases`."""
    del capabilities, limits  # merge_states takes any head_dim; one size for every profile
    return draw(merge_cases(dtype=dtype, tokens=(1, 4), heads=WIDE_MERGE_HEADS,
                            dims=WIDE_MERGE_HEAD_DIMS))


@st.composite
def many_pair_copy_blocks_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                                limits: ScaleLimits | None = None) -> CopyBlocksCase:
    """Return a strategy for ``copy_blocks`` of more than :data:`MANY_PAIRS` pairs (a fork of many
    sequences' blocks, copy-on-write, in one call): distinct destinations, sources anywhere in the
    pool, destinations among them (chains whose old contents must be copied), one KV head, the
    smallest head_dim. Every block not a destination must keep its bits."""
    del limits  # one size for every profile: the limit is the GPU's
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    head_dim = min(caps.head_dims or (16,))
    rng = np.random.default_rng(draw(_SEEDS, label="seed"))
    n = MANY_PAIRS + draw(st.integers(1, 64), label="extra_pairs")
    num_blocks = n + draw(st.integers(1, 64), label="spare_blocks")
    dst = rng.permutation(num_blocks)[:n]
    src = rng.integers(0, num_blocks, n)
    shape = (num_blocks, block_size, 1, head_dim) if kv_layout == "NHD" else (num_blocks, 1, block_size, head_dim)
    caches = [rng.standard_normal(shape).astype(numpy_dtype(dtype)) for _ in range(2)]
    return CopyBlocksCase(key_cache=caches[0], value_cache=caches[1],
                          pairs=np.stack([src, dst], axis=1).astype(np.int64), kv_layout=kv_layout)


# -- long prefills: several query tiles per sequence --------------------------------------------

@st.composite
def long_prefill_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                       limits: ScaleLimits | None = None, causal: bool = True,
                       negative_scale: bool = False) -> AttentionCase:
    """Return a strategy for 1 or 2 sequences of many queries each (a prompt's prefill, or a chunk of it).

    Each sequence holds at least :data:`LONG_PREFILL_ROWS` rows (queries x query heads of a KV
    head) and :data:`LONG_PREFILL_MIN_QUERIES` queries, so kernels run several query tiles per
    sequence, and cupy takes its Hopper prefill kernel; the queries follow 0 to about 1,000 keys
    of context (chunked prefill). Causal, or without ``causal`` not (every query sees every key
    of its sequence, later queries' too); lse, a sliding window, ALiBi, softcap and an explicit
    scale (:data:`~pagedattn.conformance.strategies.SCALES`, negative ones and 0 among them) each
    sometimes; queries of a kind of :data:`LONG_PREFILL_VALUE_KINDS`; the smallest declared
    head_dim of at most 128, or another; in bfloat16 "huge_scores" first (a ``quick`` cell runs its
    first case alone: the default scale, positive, over scores past the range of a one-FFMA
    exponent). With ``negative_scale``, every case has a negative scale and queries other than
    "normal": "large" first in float16.
    """
    limits = limits or scale_limits()
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.integers(1, 2), label="num_kv_heads")
    group = draw(st.sampled_from((4, 1, 8)), label="gqa_ratio")
    num_q_heads = num_kv_heads * group
    declared = tuple(d for d in (caps.head_dims or (16, 64, 128)) if d <= 128) or (min(caps.head_dims or (16,)),)
    head_dim = draw(st.sampled_from(tuple(sorted(declared))), label="head_dim")
    # one query past a whole number of blocks and tiles: the shrink target's last block holds a slot
    # past L (NaN first), which a kernel that copies one key too many reaches
    fewest = long_prefill_queries(group) + 1
    num_seqs = draw(st.integers(1, 2), label="num_seqs")
    q_lens = [draw(st.integers(fewest, fewest + 200), label=f"q_len[{s}]") for s in range(num_seqs)]
    contexts = [draw(st.one_of(st.just(0), st.integers(1, LONG_PREFILL_MAX_CONTEXT)), label=f"context[{s}]")
                for s in range(num_seqs)]
    lens = [q + c for q, c in zip(q_lens, contexts, strict=True)]
    pool = draw(block_tables(np.array(lens), block_size, ("shuffled", "interleaved", "reversed")), label="pool")
    options = _sometimes_lse_alibi_softcap(draw, caps, num_q_heads)
    if not causal:
        options["causal"] = False
    if caps.supports("sliding_window") and draw(st.booleans(), label="window"):
        options["sliding_window"] = draw(st.integers(1, max(lens)), label="sliding_window")
    if negative_scale:
        options["scale"] = draw(st.sampled_from(tuple(s for s in SCALES if s < 0)), label="scale")
    elif draw(st.booleans(), label="explicit_scale"):
        options["scale"] = draw(st.sampled_from(SCALES), label="scale")
    # float16 does not hold a query times 2**32; bfloat16 draws its huge scores first
    kinds = tuple(k for k in LONG_PREFILL_VALUE_KINDS if not (k == "huge_scores" and dtype == "float16")
                  and not (negative_scale and k == "normal"))
    kinds = tuple(sorted(kinds, key=lambda k: k != "huge_scores"))
    value_kind = draw(st.sampled_from(kinds), label="values")
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    caches = _normal_caches(rng, pool, block_size, lens, num_kv_heads, head_dim, garbage, dtype)
    query = rng.standard_normal((sum(q_lens), num_q_heads, head_dim))
    if value_kind == "large":
        query *= LARGE_MAGNITUDE
    elif value_kind == "huge_scores":
        query[np.cumsum(q_lens) - 1] *= HUGE_SCORES_FACTOR
    query = query.astype(numpy_dtype(dtype))
    labels = {"feature": "long_prefill" if causal else "long_prefill_non_causal", "garbage": garbage,
              "values": value_kind, "arrangement": pool.arrangement,
              "heads": f"{num_q_heads}/{num_kv_heads}", "queries": "+".join(map(str, q_lens)),
              "context": "+".join(map(str, contexts))}
    return _case(query, caches, pool.block_tables, lens, q_lens, kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


# -- long chunks: a chunked prefill's chunk after thousands of keys -----------------------------

#: Queries of a long chunk, at least and at most: more than a split part of 1,024 keys and a
#: 64-query tile, so that a split plan has parts that begin past the last query of the chunk's
#: first query tiles (they see none of its keys, and the merge must weigh them as nothing).
LONG_CHUNK_QUERIES = (1_100, 2_048)
#: Keys of context before a long chunk, at least and at most: a long prompt's later chunks.
LONG_CHUNK_CONTEXT = (2_048, 8_192)
#: The check compares every this many query rows of a chunk (from a seeded offset: one row of
#: every 16-query tile), besides its first and last.
LONG_CHUNK_ROW_STRIDE = 16


@st.composite
def long_chunk_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                     limits: ScaleLimits | None = None, fp8: bool = False,
                     kinds: tuple[str, ...] = LONG_VALUE_KINDS, window: bool = False) -> AttentionCase:
    """Return a strategy for 1 or 2 sequences, each a chunk of :data:`LONG_CHUNK_QUERIES` queries
    after :data:`LONG_CHUNK_CONTEXT` keys of context (an engine's chunked prefill of a long prompt).

    The long cells draw at most 4 queries a sequence and the long-prefill cell at most about 1,000
    keys of context; here a few sequences of long key ranges (split plans) meet many query tiles
    whose causal bounds lie thousands of keys in. Causal, one KV head, lse wherever declared (a
    split plan merges it), a sliding window, ALiBi and softcap each sometimes, "trend" or normal
    values (or another of ``kinds``: :data:`LONG_TAIL_KINDS`, without ALiBi or a window, so that every
    row sees the sink and no bias outweighs it); with ``fp8``, fp8 caches and scales
    (``v_scale`` never 1: a split plan applies it once). With ``window``, always a sliding window
    no wider than the shortest context, so that every chunk's rows see their window's lower
    edge move through thousands of keys, across the KV tiles a query tile sees whole. The check
    compares a sample of rows (:func:`long_chunk_rows`).
    """
    del limits  # one size for every profile: the sizes are the plans'
    caps = capabilities
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    group = draw(st.sampled_from((1, 4, 8)), label="gqa_ratio")
    declared = tuple(d for d in (caps.head_dims or (16, 64, 128)) if d <= 128) or (min(caps.head_dims or (16,)),)
    head_dim = draw(st.sampled_from(tuple(sorted(declared))), label="head_dim")
    num_seqs = draw(st.integers(1, 2), label="num_seqs")
    q_lens = [draw(st.integers(*LONG_CHUNK_QUERIES), label=f"q_len[{s}]") for s in range(num_seqs)]
    contexts = [draw(st.integers(*LONG_CHUNK_CONTEXT), label=f"context[{s}]") for s in range(num_seqs)]
    lens = [q + c for q, c in zip(q_lens, contexts, strict=True)]
    pool = draw(block_tables(np.array(lens), block_size, ("shuffled", "interleaved", "reversed")), label="pool")
    options = _sometimes_lse_alibi_softcap(draw, caps, group)
    if caps.supports("lse"):
        options["return_lse"] = True
    if window:
        options["sliding_window"] = draw(st.integers(LONG_WINDOW_MIN, min(contexts)), label="sliding_window")
    elif caps.supports("sliding_window") and draw(st.booleans(), label="window"):
        options["sliding_window"] = draw(st.integers(LONG_WINDOW_MIN, max(lens)), label="sliding_window")
    cache_dtype, scales = _cache_dtype_and_scales(draw, caps, dtype, fp8)
    options.update(scales)
    kind = draw(st.sampled_from(kinds), label="values")
    if kind in LONG_TAIL_KINDS:  # every row sees the sink, and no bias outweighs it
        options = {k: v for k, v in options.items() if k not in ("alibi_slopes", "sliding_window")}
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    garbage = draw(st.sampled_from(SCALE_GARBAGE_KINDS), label="garbage")
    caches = _normal_caches(rng, pool, block_size, lens, 1, head_dim, garbage, cache_dtype, kind, scales)
    query = _query(rng, kind, (sum(q_lens), group, head_dim), dtype, group)
    labels = {"feature": "long_chunks", "values": kind, "garbage": garbage, "arrangement": pool.arrangement,
              "heads": f"{group}/1", "queries": "+".join(map(str, q_lens)), "context": "+".join(map(str, contexts)),
              "cache_dtype": cache_dtype}
    return _case(query, caches, pool.block_tables, lens, q_lens, kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


def long_chunk_rows(query_start_loc: np.ndarray, seed: int) -> np.ndarray:
    """Query rows (tokens of the batch) a long-chunk check compares: each sequence's first and last,
    and every :data:`LONG_CHUNK_ROW_STRIDE`-th from an offset picked by ``seed``."""
    offset = int(np.random.default_rng(seed).integers(0, LONG_CHUNK_ROW_STRIDE))
    chunks = list(pairwise(int(x) for x in query_start_loc))
    rows = [np.array([start, stop - 1]) for start, stop in chunks]
    rows += [np.arange(start + offset, stop, LONG_CHUNK_ROW_STRIDE) for start, stop in chunks]
    return np.unique(np.concatenate(rows).astype(np.int64))


# -- far scores: one prefill whose queries x keys pass 2**31 -------------------------------------

#: Queries of a far-scores prefill, at least: with its keys (as many and more) a head's scores
#: ``[queries, keys]`` pass 2**31 elements (46,341**2 already does).
FAR_SCORE_QUERIES = 47_000
#: Query heads of a far-scores prefill: all of one head's scores in float32 would take 8.6 GiB
#: a head, 69 GiB for the eight.
FAR_SCORE_HEADS = 8
#: Query rows whose scores start past element 2**31 that a far-scores check compares, besides the
#: first of them, the first and last rows and one more.
FAR_SCORE_ROWS = 4


def _far_score_geometry(draw: st.DrawFn, caps: Capabilities) -> tuple[int, str, int, int]:
    """``(block_size, kv_layout, num_kv_heads, head_dim)`` of a far-scores prefill: 1 or 2 KV heads,
    the smallest declared head_dim of at most 128 (the fewest elements a score)."""
    block_size = draw(st.sampled_from(scale_block_sizes(caps)), label="block_size")
    kv_layout = draw(_kv_layouts(caps), label="kv_layout")
    num_kv_heads = draw(st.sampled_from((1, 2)), label="num_kv_heads")
    declared = tuple(d for d in (caps.head_dims or (64, 128)) if d <= 128) or (min(caps.head_dims or (64,)),)
    return block_size, kv_layout, num_kv_heads, min(declared)


@st.composite
def far_score_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                    limits: ScaleLimits | None = None) -> AttentionCase:
    """Return a strategy for one causal prefill whose scores, queries x keys of one head, pass 2**31.

    A kernel that addresses an array of one entry per (query, key), a materialized mask or bias
    or a scratch of scores, as ``query * keys + key`` in 32 bits wraps past it; one that holds a
    head's scores whole runs out of memory. One sequence of :data:`FAR_SCORE_QUERIES` to 1,000
    more queries after 0 to 2,048 keys of context, :data:`FAR_SCORE_HEADS` query heads on 1 or 2
    KV heads, the smallest declared head_dim of at most 128; lse, ALiBi and softcap each
    sometimes. The check compares a few rows past element 2**31 (:func:`far_score_rows`).
    """
    del limits  # one size for every profile: the limit is the offset type's
    caps = capabilities
    block_size, kv_layout, num_kv_heads, head_dim = _far_score_geometry(draw, caps)
    q_len = draw(st.integers(FAR_SCORE_QUERIES, FAR_SCORE_QUERIES + 1000), label="q_len")
    length = q_len + draw(st.one_of(st.just(0), st.integers(1, 2048)), label="context")
    pool = draw(block_tables(np.array([length]), block_size, ("shuffled", "interleaved")), label="pool")
    options = _sometimes_lse_alibi_softcap(draw, caps, FAR_SCORE_HEADS)
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    caches = _normal_caches(rng, pool, block_size, [length], num_kv_heads, head_dim, "nan", dtype)
    query = rng.standard_normal((q_len, FAR_SCORE_HEADS, head_dim)).astype(numpy_dtype(dtype))
    labels = {"feature": "far_scores", "arrangement": pool.arrangement,
              "heads": f"{FAR_SCORE_HEADS}/{num_kv_heads}", "queries": str(q_len), "keys": str(length),
              "score_elements": str(q_len * length)}
    return _case(query, caches, pool.block_tables, [length], [q_len], kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


#: Queries of a prefill whose scores pass 2**32 elements, at least and at most (a chunk of 8,192
#: queries and more), after :data:`FAR_UINT32_SCORE_CONTEXT` keys of context and up to 8,192 more:
#: queries x keys then pass 2**32 by 1.5 % and more.
FAR_UINT32_SCORE_QUERIES = (8_193, 8_993)
#: Keys of context before the queries of a prefill whose scores pass 2**32 elements, at least.
FAR_UINT32_SCORE_CONTEXT = 2**19


@st.composite
def far_score_uint32_cases(draw: st.DrawFn, capabilities: Capabilities, *, dtype: str,
                           limits: ScaleLimits | None = None) -> AttentionCase:
    """Return a strategy for one causal chunk whose scores, queries x keys of one head, pass 2**32.

    A kernel that addresses an entry per (query, key) with an unsigned 32-bit offset, or with a
    signed one counted in pairs of 16-bit elements (a mask's stride in ``half2``), passes the
    far-scores cell (2**31 and up to about 2.4e9) and wraps here. 8,193 to 8,993 queries after
    524,288 to 532,480 keys of context, :data:`FAR_SCORE_HEADS` query heads on 1 or 2 KV heads, the
    smallest declared head_dim of at most 128; lse and softcap each sometimes (no ALiBi: the exact
    answer comes from the distinct blocks, :mod:`pagedattn.conformance.repeated_blocks`). The block
    table names 257 to 1,031 distinct blocks at random, so the caches stay small; the unused blocks
    and the column past the sequence hold garbage. The check compares a few rows past element 2**32
    (:func:`far_score_rows`)."""
    del limits  # one size for every profile: the limit is the offset type's
    caps = capabilities
    block_size, kv_layout, num_kv_heads, head_dim = _far_score_geometry(draw, caps)
    q_len = draw(st.integers(*FAR_UINT32_SCORE_QUERIES), label="q_len")
    length = q_len + draw(st.integers(FAR_UINT32_SCORE_CONTEXT, FAR_UINT32_SCORE_CONTEXT + 8192), label="context")
    distinct = draw(st.integers(*KV_BYTES_DISTINCT_BLOCKS), label="distinct_blocks")
    spare = draw(st.integers(1, 4), label="spare_blocks")
    options: dict[str, Any] = {}
    if caps.supports("lse") and draw(st.booleans(), label="lse"):
        options["return_lse"] = True
    if caps.supports("softcap") and draw(st.booleans(), label="softcap"):
        options["softcap"] = 30.0
    rng = np.random.default_rng(draw(_SEEDS, label="value_seed"))
    ids = rng.permutation(distinct + spare)
    table = np.append(rng.choice(ids[:distinct], -(-length // block_size)), ids[distinct])[None].astype(np.int32)
    shape = (distinct + spare, block_size, num_kv_heads, head_dim)
    caches = []
    for _ in range(2):
        with np.errstate(over="ignore", invalid="ignore"):
            cache = garbage_values(rng, "nan", shape).astype(numpy_dtype(dtype))
        cache[ids[:distinct]] = rng.standard_normal((distinct, *shape[1:])).astype(cache.dtype)
        caches.append(cache)
    query = rng.standard_normal((q_len, FAR_SCORE_HEADS, head_dim)).astype(numpy_dtype(dtype))
    labels = {"feature": "far_scores_uint32", "heads": f"{FAR_SCORE_HEADS}/{num_kv_heads}", "queries": str(q_len),
              "keys": str(length), "score_elements": str(q_len * length), "distinct_blocks": str(distinct)}
    return _case(query, (caches[0], caches[1]), table, [length], [q_len], kv_layout, options,
                 draw(_SEEDS, label="variant_seed"), labels)


def far_score_rows(q_len: int, length: int, seed: int, limit: int = INT32_OFFSET_LIMIT) -> np.ndarray:
    """Query rows (of one sequence) a far-scores check compares: the first and the last, one picked
    by ``seed``, and the first of the rows whose scores, laid out ``[queries, keys]``, start at or
    past element ``limit`` (2**31, or 2**32), with :data:`FAR_SCORE_ROWS` more of them picked by ``seed``."""
    first_far = min(-(-limit // max(length, 1)), q_len - 1)
    rng = np.random.default_rng(seed)
    picks = [0, q_len - 1, int(rng.integers(0, q_len)), first_far,
             *rng.integers(first_far, q_len, FAR_SCORE_ROWS).tolist()]
    return np.unique(np.array(picks, dtype=np.int64))
