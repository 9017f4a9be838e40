"""Work items of the cupy attention kernel, built on the host from a validated problem.

A work item is one sequence ``s``, one KV head, up to ``ROWS`` query rows (``num_tokens``
consecutive query tokens times ``num_groups`` query heads of that KV head) and a range of
logical positions ``[kv_begin, kv_end)`` cut on ``TILE_N`` boundaries. Only positions a row
can see are covered (causal: up to the last row's ``p_q``; sliding window: from the first
row's ``p_q - W + 1``), so the kernel never visits blocks it would mask entirely. Long ranges
are split (split-KV) into parts of about equal length; their partial results are merged by
the part of a range that finishes last (or by ``merge_partials`` after the kernel). Every
output row belongs to exactly one base item, so every row is written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pagedattn.backends.cupy.options import CupyOptions
from pagedattn.backends.cupy.specializations import (
    DECODE_FP8_ROWS,
    DECODE_HEAD_DIMS,
    DECODE_ROWS,
    FP8_TYPES,
    ITEM_FIELDS,
    MERGE_FIELDS,
    MMA_DTYPES,
    MMA_HEAD_DIMS,
    MMA_ROWS,
    ROWS,
    WGMMA_MODULE,
    WGMMA_ROWS,
    Specialization,
    attention,
    tile_n,
    wgmma_attention,
    wgmma_overlap_possible,
    wgmma_supports,
)
from pagedattn.spec.arrays import AttentionProblem


@dataclass(frozen=True)
class WorkPlan:
    """What the attention launch needs: ``items`` int32 ``[n, 11]`` (the kernel's work items:
    ``kernels/common.cuh``), ``merges`` int32 ``[m, 7]`` (``merge_partials``' split ranges)."""

    rows: int
    tile_n: int
    items: np.ndarray
    merges: np.ndarray
    num_partials: int
    kernel: str = "mma"  # "wgmma": paged_attention_wgmma takes the WGMMA_ROWS-row items


@dataclass(frozen=True)
class KernelChoice:
    """The attention kernel a plan takes, chosen once: its rows per CTA and its specialization."""

    rows: int
    spec: Specialization

    @property
    def kernel(self) -> str:
        """"wgmma" (paged_attention_wgmma) or "mma" (every other attention kernel)."""
        return "wgmma" if self.spec.module == WGMMA_MODULE else "mma"


#: rows (query tokens x query heads of a KV head) per sequence, on average, from which
#: ``prefill="auto"`` takes the Hopper kernel (WGMMA_ROWS rows per CTA): 4 of its tiles, so
#: at most a quarter of a sequence's rows sit in its last, partly empty tile
WGMMA_MIN_ROWS_PER_SEQ = 4 * WGMMA_ROWS
#: the options of a backend built with no arguments and no PAGEDATTN_CUPY_* variable set
DEFAULT_OPTIONS = CupyOptions()


def device_has_wgmma() -> bool:
    """Whether the current device runs sm_90a code (compute capability 9.0: H100, H200); False
    where no CUDA device can be asked (a CPU machine planning work for tests)."""
    from cupy_backends.cuda.api.runtime import CUDARuntimeError

    from pagedattn.backends.cupy.runtime import device_arch

    try:
        return device_arch() == "90"
    except CUDARuntimeError:
        return False


def enough_rows_for_wgmma(problem: AttentionProblem) -> bool:
    """Whether the sequences hold at least ``WGMMA_MIN_ROWS_PER_SEQ`` rows on average."""
    rows_per_seq = problem.num_tokens * min(problem.group_size, WGMMA_ROWS)
    return rows_per_seq >= WGMMA_MIN_ROWS_PER_SEQ * max(1, problem.num_seqs)


def uses_wgmma(problem: AttentionProblem, options: CupyOptions, *, sm90: bool) -> bool:
    """Whether the Hopper kernel (paged_attention_wgmma) takes this problem: a prefill batch the
    tensor-core prefill kernels take (at least 8 queries per sequence on average), 16-bit
    queries and caches at head_dim 64 or 128, a compute capability 9.0 device (``sm90``), and
    ``options.prefill`` "wgmma", or "auto" with :func:`enough_rows_for_wgmma`. Anything else
    (fp8 caches, other head dims, other devices) stays on the mma.sync kernels."""
    switch = options.prefill
    if switch == "mma" or not wgmma_supports(problem.dtype, problem.head_dim, problem.cache_dtype):
        return False
    if problem.is_decode or problem.num_tokens < 8 * problem.num_seqs:
        return False
    if switch == "auto" and not enough_rows_for_wgmma(problem):
        return False
    return sm90


def choose_kernel(
    problem: AttentionProblem, options: CupyOptions = DEFAULT_OPTIONS, *, sm90: bool = False
) -> KernelChoice:
    """The attention kernel of ``problem``, which also fixes the rows per CTA.

    ``DECODE_ROWS`` (tensor-core decode, keys split among warps) for float16/bfloat16 decode
    at head_dim 64, 128 or 256 with up to 16 query heads per KV head, unless ``options.decode``
    is "simt"; the tensor-core prefill kernels for float16/bfloat16 batches of at least 8 queries
    per sequence on average at head_dim 64 or 128: the Hopper kernel (``WGMMA_ROWS``) where
    :func:`uses_wgmma`, else the mma.sync kernel (``MMA_ROWS``); else the CUDA-core kernel
    with 4 rows (decode with up to 4 query heads per KV head) or 8. fp8 caches go to the
    tensor-core kernels only (decode, else the prefill kernel whatever the batch); the backend
    refuses fp8 where neither applies (float32 queries, head_dim 256).
    """
    tensor_cores = problem.dtype in MMA_DTYPES and problem.head_dim in MMA_HEAD_DIMS
    decode_mma = problem.is_decode and problem.group_size <= DECODE_ROWS
    decode_tensor_cores = problem.dtype in MMA_DTYPES and problem.head_dim in DECODE_HEAD_DIMS
    if problem.cache_dtype in FP8_TYPES:
        prefill = not decode_mma
    elif decode_mma and decode_tensor_cores and options.decode == "mma":
        prefill = False
    else:
        prefill = (
            not problem.is_decode and tensor_cores and problem.num_tokens >= 8 * problem.num_seqs
        )
        if not prefill:
            rows = ROWS[0] if problem.is_decode and problem.group_size <= ROWS[0] else ROWS[-1]
            return KernelChoice(rows, attention(problem.dtype, problem.head_dim, problem.block_size, rows))
    if not prefill:
        rows = DECODE_ROWS
    elif uses_wgmma(problem, options, sm90=sm90):
        overlap = options.wgmma_schedule == "overlap" and wgmma_overlap_possible(
            problem.head_dim, options.wgmma_ctas
        )
        spec = wgmma_attention(
            problem.dtype, problem.head_dim, problem.block_size, overlap, options.wgmma_ctas
        )
        return KernelChoice(WGMMA_ROWS, spec)
    else:
        rows = MMA_ROWS
    spec = attention(problem.dtype, problem.head_dim, problem.block_size, rows, problem.cache_dtype)
    return KernelChoice(rows, spec)


def item_rows(problem: AttentionProblem, choice: KernelChoice) -> int:
    """Query rows a work item of ``choice`` holds at most: the kernel's rows, but
    ``DECODE_FP8_ROWS`` where the decode kernel reads fp8 caches (its keys on the MMA's M side,
    8 query rows on the n side)."""
    if choice.rows == DECODE_ROWS and problem.cache_dtype in FP8_TYPES:
        return DECODE_FP8_ROWS
    return choice.rows


#: Tiles a split must save, by :func:`choose_split`'s estimate, before 16-bit decode splits at
#: all (:func:`one_cta_a_multiprocessor`). A split adds a tail the tile model does not hold (the
#: parts' partial stores, their arrival count and the last part's merge pass), and a CTA alone on
#: its multiprocessor streams faster than the share the model gives it. Measured on an H100
#: (llama3-8b heads, bf16, graph replay at block sizes 16 / 32 / 64): decode 8 x 2,048, whose
#: 32-tile ranges split in 2 save 16 tiles by the estimate, ran unsplit in 29.3 / 29.1 / 28.8 us
#: against 31.3 / 31.4 / 30.9 us split; the small-batch splits that stay save 27 tiles (1 x
#: 2,048 in 8 parts) and more.
DECODE_MIN_SPLIT_GAIN = 16.0


def one_cta_a_multiprocessor(problem: AttentionProblem, choice: KernelChoice) -> bool:
    """Whether ``choice`` is the tensor-core decode kernel on 16-bit caches at head_dim 64 or 128,
    one CTA of which reaches a multiprocessor's share of the read bandwidth alone."""
    return (
        choice.rows == DECODE_ROWS
        and problem.cache_dtype not in FP8_TYPES
        and problem.head_dim in MMA_HEAD_DIMS
    )


def split_slots(problem: AttentionProblem, choice: KernelChoice, resident: int, multiprocessors: int) -> int:
    """CTAs the split-KV estimate (:func:`choose_split`) fills: one a multiprocessor where
    :func:`one_cta_a_multiprocessor` (a part for the second resident CTA costs its partial and
    merge and gains nothing); every ``resident`` CTA otherwise."""
    return multiprocessors if one_cta_a_multiprocessor(problem, choice) else resident


def choose_split(
    base_tiles: np.ndarray,
    slots: int,
    *,
    min_tiles: int = 4,
    overhead: float = 2.0,
    partial_overhead: float = 0.0,
    min_gain: float = 0.0,
) -> int:
    """Tiles per split-KV part minimising the estimated time of ``base_tiles`` on ``slots`` CTAs.

    An item of ``t`` tiles costs ``t + overhead`` (set-up, epilogue), plus ``partial_overhead``
    when its range is split (its partial written, then read by the merge). Items run longest
    first; the estimate is the largest of three lower bounds on that schedule: the total cost
    over ``slots``, the costliest item, and the waves (``ceil(items / slots)``) times the
    cheapest item (exact for equal items). So splitting pays where a few long ranges would
    leave CTAs idle (long decode), not where the items already fill the device many times
    (prefill). Candidates: no split, and about 48 geometrically spaced part lengths from
    ``min_tiles``; the fastest split is taken only if it saves more than ``min_gain`` tiles
    against no split.
    """
    longest = int(base_tiles.max(initial=0))
    if longest <= min_tiles:
        return max(1, longest)
    candidates = np.unique(np.geomspace(min_tiles, longest, 48).astype(np.int64))
    best, best_time, unsplit_time = longest, np.inf, np.inf
    for per_split in [longest, *candidates[::-1].tolist()]:
        splits = np.maximum(1, -(-base_tiles // per_split))
        cost = -(-base_tiles // splits) + overhead + np.where(splits > 1, partial_overhead, 0.0)
        waves = -(-int(splits.sum()) // slots)
        estimate = max(
            float((splits * cost).sum()) / slots, float(cost.max()), waves * float(cost.min())
        )
        if per_split == longest:
            unsplit_time = estimate
        if estimate < best_time:
            best, best_time = int(per_split), estimate
    return best if best_time < unsplit_time - min_gain else longest


def build_work(
    problem: AttentionProblem,
    choice: KernelChoice | None = None,
    *,
    slots: int = 396,
    min_tiles_per_split: int = 4,
    split_kv: bool = True,
    num_splits: int | None = None,
) -> WorkPlan:
    """Return the :class:`WorkPlan` of ``problem`` for the kernel ``choice`` (None:
    :func:`choose_kernel` with the default options, no sm_90 device) and ``slots`` CTAs
    resident on the device.

    With ``split_kv``, ranges are split into parts of :func:`choose_split` tiles (at least
    ``min_tiles_per_split``); ``num_splits`` replaces that choice by parts of ``ceil(longest / num_splits)``
    tiles; without ``split_kv``, every item covers its whole range.
    """
    G = problem.group_size
    choice = choose_kernel(problem) if choice is None else choice
    rows = choice.rows
    TILE_N = tile_n(problem.dtype, rows)
    per_item = item_rows(problem, choice)
    num_groups = min(G, per_item)
    tokens_per_item = max(1, per_item // G)
    group_starts = np.arange(0, G, num_groups)

    # -- token chunks of each sequence: [token_start, token_start + num_tokens)
    q_lens = problem.q_lens
    chunks_per_seq = -(-q_lens // tokens_per_item)
    seq = np.repeat(np.arange(problem.num_seqs), chunks_per_seq)
    first_chunk = (
        np.concatenate([[0], np.cumsum(chunks_per_seq)[:-1]])
        if problem.num_seqs
        else np.zeros(0, np.int64)
    )
    k = np.arange(seq.size) - first_chunk[seq]
    token_start = problem.query_start_loc[seq] + k * tokens_per_item
    num_tokens = np.minimum(tokens_per_item, problem.query_start_loc[seq + 1] - token_start)
    L = problem.seq_lens[seq]
    p_first = L - q_lens[seq] + (token_start - problem.query_start_loc[seq])
    p_last = p_first + num_tokens - 1
    hi = np.minimum(L, p_last + 1) if problem.causal else L
    lo = (
        np.zeros_like(L)
        if problem.sliding_window is None
        else np.maximum(0, p_first - problem.sliding_window + 1)
    )
    tile_lo = lo // TILE_N
    tiles = np.where(hi > lo, -(-hi // TILE_N) - tile_lo, 0)

    # -- base items: chunk x KV head x group chunk
    n_chunks, n_heads, n_gchunks = seq.size, problem.num_kv_heads, group_starts.size
    shape = (n_chunks, n_heads, n_gchunks)
    c_idx, h_idx, g_idx = (
        a.ravel()
        for a in np.meshgrid(
            np.arange(n_chunks), np.arange(n_heads), np.arange(n_gchunks), indexing="ij"
        )
    )
    del shape
    base_tiles = tiles[c_idx]
    base_groups = np.minimum(num_groups, G - group_starts[g_idx])

    # -- split-KV: parts of about equal length
    # a split part's partial (float32 rows x head_dim, written, then read by the merge) in
    # tiles of K/V traffic (2 x TILE_N x head_dim elements of 16 bits: an estimate)
    partial_tiles = (2 * rows * 4) / (2 * TILE_N * 2)
    longest = max(1, int(base_tiles.max(initial=0)))
    if not split_kv:
        per_split = longest
    elif num_splits is not None:
        per_split = max(1, -(-longest // num_splits))
    else:
        per_split = choose_split(
            base_tiles,
            max(1, slots),
            min_tiles=min_tiles_per_split,
            partial_overhead=partial_tiles,
            min_gain=DECODE_MIN_SPLIT_GAIN if one_cta_a_multiprocessor(problem, choice) else 0.0,
        )
    splits = np.maximum(1, -(-base_tiles // per_split))
    item_base = np.repeat(np.arange(base_tiles.size), splits)
    first_item = (
        np.concatenate([[0], np.cumsum(splits)[:-1]]) if splits.size else np.zeros(0, np.int64)
    )
    part = np.arange(item_base.size) - first_item[item_base]
    n_split = splits[item_base]
    t_begin = tile_lo[c_idx][item_base] + (part * base_tiles[item_base]) // n_split
    t_end = tile_lo[c_idx][item_base] + ((part + 1) * base_tiles[item_base]) // n_split
    split = n_split > 1
    partial = np.full(item_base.size, -1, dtype=np.int64)
    partial[split] = np.arange(int(split.sum()))
    # a part's range: its first partial (the parts of a range are consecutive) and its parts
    range_first = np.where(split, partial[first_item[item_base]], -1)

    items = (
        np.stack(
            [
                seq[c_idx][item_base],
                h_idx[item_base],
                token_start[c_idx][item_base],
                num_tokens[c_idx][item_base],
                group_starts[g_idx][item_base],
                base_groups[item_base],
                t_begin * TILE_N,
                t_end * TILE_N,
                partial,
                range_first,
                np.where(split, n_split, 0),
            ],
            axis=1,
        )
        .astype(np.int32)
        .reshape(-1, ITEM_FIELDS)
    )
    # sequence by sequence, longest ranges first within each: the CTAs resident together read
    # the K/V of one or two sequences, which the L2 cache then holds (longest first over the
    # whole batch spread them over every sequence: 45 % L2 hits against 95 %, ncu on prefill
    # 8 x 4,096), and each sequence's last items, like the batch's, are short
    items = items[np.lexsort((-(items[:, 7] - items[:, 6]), items[:, 0]))]

    merged = splits > 1
    merges = (
        np.stack(
            [
                token_start[c_idx][merged],
                num_tokens[c_idx][merged],
                h_idx[merged],
                group_starts[g_idx][merged],
                base_groups[merged],
                partial[first_item[merged]],
                splits[merged],
            ],
            axis=1,
        )
        .astype(np.int32)
        .reshape(-1, MERGE_FIELDS)
    )
    return WorkPlan(
        rows=rows,
        tile_n=TILE_N,
        items=items,
        merges=merges,
        num_partials=int(split.sum()),
        kernel=choice.kernel,
    )
