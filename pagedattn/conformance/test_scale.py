"""Bugs that show only at scale: split-KV on long sequences (beside short ones that are not split,
with ragged query counts, at groups past 8 query heads), long 16-bit rows, pools past 2**31
elements (attention, write_kv, copy_blocks; fp8 caches past byte 2**32), a query and output (and
merge_states' states, write_kv's inputs) past 2**31 elements, split-KV partials laid out by
sequence past 2**31 elements, block-table rows past entry 2**31 of an engine's table, a prefill
whose scores (queries x keys of a head) pass 2**31 and a chunk whose scores pass 2**32, split
plans run as an engine runs a plan (once per layer, captured in a CUDA graph, on the caller's
stream, and step after step without holding memory), split parts whose lse lie past float32's exp
range apart or are not finite, sizes that are no power of two, blocks larger than a tile and
smaller than a run of slots, head dims past 256, and write_kv, copy_blocks and merges of more heads
than a block of one row per head takes. How kernels divide their work at scale (tiles of heads and
queries, waves, grid axes) is :mod:`pagedattn.conformance.test_launch_scale`.

Sizes and example counts follow the profile (:func:`pagedattn.conformance.scale.scale_limits`);
every cell draws few, large examples. A backend that cannot take a pool of that many
elements declares ``max_pool_elements`` and its far-pool cells are UNSUPPORTED.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from pagedattn.backends.capabilities import Capabilities
from pagedattn.backends.interface import Backend
from pagedattn.conformance import checks
from pagedattn.conformance.runner import run_scale_cell
from pagedattn.conformance.scale import (
    BATCH_KINDS,
    FAR_BYTE_LIMIT,
    LONG_GROUPS,
    LONG_HEAD_NEEDLE_KINDS,
    LONG_NEEDLE_KINDS,
    LONG_TAIL_KINDS,
    LONG_VALUE_KINDS,
    LONG_WIDE_GROUPS,
    LONG_WINDOW_EDGE_KINDS,
    far_copy_blocks_cases,
    far_layer_view_cases,
    far_merge_row_cases,
    far_partial_cases,
    far_pool_cases,
    far_row_cases,
    far_row_write_kv_cases,
    far_score_cases,
    far_score_uint32_cases,
    far_table_cases,
    far_write_kv_cases,
    large_block_cases,
    large_block_operation_cases,
    large_block_sizes,
    large_head_dim_cases,
    large_head_dims,
    long_sequence_cases,
    odd_size_cases,
    past_uint32_elements,
    scale_limits,
    small_block_cases,
    small_block_sizes,
    wide_head_operation_cases,
    wide_merge_cases,
)
from pagedattn.spec.dtypes import QUERY_DTYPES

pytestmark = pytest.mark.pagedattn_conformance

#: 16-bit dtypes of the far-pool cells (a pool past 2**31 elements is 4 GiB of address space each)
#: and of the long cells with fp8 caches (fp8 caches hold keys of 16-bit queries).
FAR_DTYPES = ("float16", "bfloat16")


def _run_long_cell(request: Any, backend: Backend, dtype: str, feature: str, *,
                   requires: dict[str, Any] | None = None, fp8: bool = False, window: bool = False,
                   kinds: tuple[str, ...] = LONG_VALUE_KINDS,
                   check: Callable[[Backend, Any], float] = checks.matches_spec,
                   examples: Callable[[int], int] = int, groups: tuple[int, ...] = LONG_GROUPS,
                   short_seqs: int = 0, max_kv_heads: int = 3, ragged: bool = False,
                   batch: str | None = None, verify: bool = False) -> None:
    """A long-sequence cell: :func:`long_sequence_cases` of ``dtype`` (with fp8 caches, under a
    window, of value patterns ``kinds``, of GQA ratios ``groups`` on up to ``max_kv_heads`` KV
    heads, beside up to ``short_seqs`` short sequences, with ``ragged`` query counts, of one
    ``batch`` kind of :data:`~pagedattn.conformance.scale.BATCH_KINDS` or either, or ``verify``
    batches of :data:`~pagedattn.conformance.scale.LONG_VERIFY_QUERIES` queries), held to
    ``check`` (the spec's answer unless given), in ``examples(long_examples)`` examples."""
    limits = scale_limits()
    cases = partial(long_sequence_cases, fp8=fp8, window=window, kinds=kinds, groups=groups,
                    short_seqs=short_seqs, max_kv_heads=max_kv_heads, ragged=ragged, verify=verify)
    run_scale_cell(request, backend, cases, check, limits, dtype=dtype, feature=feature,
                   max_examples=examples(limits.long_examples), cell={"max_keys": limits.max_long},
                   requires=requires, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", scale_limits().long_dtypes)  # the profile is loaded before collection
def test_long_sequences_match_spec(request, backend, dtype, batch):
    """A small batch of long sequences (thousands of keys: split-KV plans, long 16-bit rows) within
    the error model of exact attention; inputs untouched. This and the long cells below come one
    per batch kind (:data:`~pagedattn.conformance.scale.BATCH_KINDS`); a backend without varlen
    batches has no ``queries`` cell."""
    _run_long_cell(request, backend, dtype, "long_sequences", batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", scale_limits().long_dtypes)
def test_long_sequences_with_a_window_match_spec(request, backend, dtype, batch):
    """The long-sequence batches under a sliding window of at most a quarter of a sequence (with
    ALiBi where declared, sometimes softcap): split plans whose parts may see no key, within the
    error model; inputs untouched."""
    _run_long_cell(request, backend, dtype, "long_sequences_window", requires={"features": ("sliding_window",)},
                   window=True, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_long_sequences_with_fp8_caches_match_spec(request, backend, dtype, batch):
    """The long-sequence batches with fp8 caches and scales (v_scale never 1): split-KV plans
    of the fp8 paths, their partials and merge, within the error model; inputs untouched."""
    _run_long_cell(request, backend, dtype, "long_sequences_fp8", requires={"features": ("fp8",)}, fp8=True,
                   batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_long_sequences_with_fp8_caches_under_a_window_match_spec(request, backend, dtype, batch):
    """The windowed long batches with fp8 caches and scales, of keys that score high only near
    their rows' window edges (:data:`~pagedattn.conformance.scale.LONG_WINDOW_EDGE_KINDS`: an edge
    one key off moves a row's output by a fraction of a unit): the fp8 paths' split plans whose
    parts may see no key, with ALiBi where declared and softcap sometimes, within the error model;
    inputs untouched. Kernels of their own take fp8 caches under a window for a few queries a sequence
    (flashinfer-ai/flashinfer issue 3864: a speculative verify of bfloat16 queries on fp8 caches,
    right without the window and on fp8 queries, mis-computed rows once a sequence passed the
    window)."""
    _run_long_cell(request, backend, dtype, "long_sequences_window_fp8",
                   requires={"features": ("fp8", "sliding_window")}, fp8=True, window=True,
                   kinds=LONG_WINDOW_EDGE_KINDS, batch=batch)


#: KV heads of the long cell of wide groups, at most: its query heads (up to 64) bound the spec's cost.
WIDE_LONG_KV_HEADS = 2


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", scale_limits().long_dtypes)
def test_long_sequences_of_wide_groups_match_spec(request, backend, dtype, batch):
    """The long-sequence batches at 12 to 32 query heads a KV head: split plans whose parts hold a
    group wider than 8 rows, within the error model; inputs untouched."""
    _run_long_cell(request, backend, dtype, "long_sequences_wide_groups", groups=LONG_WIDE_GROUPS,
                   max_kv_heads=WIDE_LONG_KV_HEADS, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_long_sequences_of_wide_groups_with_fp8_caches_match_spec(request, backend, dtype, batch):
    """The long batches of wide groups with fp8 caches and scales (v_scale never 1): the fp8
    paths' split plans holding a group wider than 8 rows, within the error model; inputs
    untouched."""
    _run_long_cell(request, backend, dtype, "long_sequences_wide_groups_fp8", requires={"features": ("fp8",)},
                   fp8=True, groups=LONG_WIDE_GROUPS, max_kv_heads=WIDE_LONG_KV_HEADS, batch=batch)


#: Short sequences of a mixed-length batch, at most: with its one or two long ones, four sequences.
MIXED_SHORT_SEQS = 2


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", scale_limits().long_dtypes)
def test_mixed_length_batches_match_spec(request, backend, dtype, batch):
    """Long sequences beside short ones in one small batch, a short one first: a plan that splits
    the long ones and leaves the short ones whole (or gives them parts past their end), within the
    error model; inputs untouched."""
    _run_long_cell(request, backend, dtype, "mixed_lengths", short_seqs=MIXED_SHORT_SEQS, batch=batch)


@pytest.mark.parametrize("dtype", scale_limits().long_dtypes)
def test_long_speculative_batches_match_spec(request, backend, dtype):
    """Two or more long sequences with 1 to 4 queries each, counts differing in the batch (draft
    tokens verified): split plans of a varlen batch whose sequences' rows do not start at a
    multiple of the most queries, within the error model; inputs untouched."""
    _run_long_cell(request, backend, dtype, "long_speculative", requires={"features": ("varlen",)}, ragged=True)


#: GQA ratios of the long verify cells: a group's rows times 16 queries fill a 64-row query tile at most.
VERIFY_GROUPS = (1, 2, 4)


#: The long verify cells' caches: 16-bit, fp8, and fp8 under a sliding window on keys that score
#: high at their rows' window edges (flashinfer-ai/flashinfer issue 3864's verify of 8 queries a
#: sequence, wrong there and right on 1, 2 or 4).
VERIFY_CACHES: dict[str, dict[str, Any]] = {"16-bit": {}, "fp8": {"fp8": True},
                                             "fp8-window": {"fp8": True, "window": True,
                                                            "kinds": LONG_WINDOW_EDGE_KINDS}}


@pytest.mark.parametrize("cache", sorted(VERIFY_CACHES))
@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_long_verify_batches_match_spec(request, backend, dtype, cache):
    """Long sequences of one KV head with 8 to 16 queries each (a speculative decoding's verify of
    7 to 15 draft tokens, :data:`~pagedattn.conformance.scale.LONG_VERIFY_QUERIES`), on 16-bit or
    fp8 caches, the fp8 ones also under a window (:data:`VERIFY_CACHES`): split plans of one
    partial query tile, past the few-query kernels' rows, within the error model; inputs
    untouched."""
    drawing = VERIFY_CACHES[cache]
    features = ("varlen", *(name for name, key in (("fp8", "fp8"), ("sliding_window", "window")) if drawing.get(key)))
    _run_long_cell(request, backend, dtype, "long_verify", groups=VERIFY_GROUPS, max_kv_heads=1,
                   requires={"features": features}, verify=True, **drawing)


#: dtype of the long-plan cells: float32, whose output keeps the bits a merge's order changes (a
#: 16-bit output rounds them off on the few heads of the shrink target).
PLAN_DTYPE = "float32"
#: GQA ratio of the long-plan cells: eight query heads a KV head (llama3's), so that even the shrink
#: target (one KV head) merges eight rows, each a chance for a merge's order to show.
PLAN_GROUPS = (8,)


def few_long_examples(long_examples: int) -> int:
    """Examples of a long cell about split plans only (long plans, needles, non-finite scores): half the
    long cells' (at least the shrink target, which triton's and cupy's plans split on the H200 and
    in the interpreter)."""
    return max(1, long_examples // 2)


@pytest.mark.parametrize("batch", BATCH_KINDS)
def test_long_plans_serve_many_runs(request, backend, batch):
    """A split plan of the long-sequence batches used as an engine uses it: beside a second plan,
    run on the next layer's query and caches, then on the first arrays again. Every run within
    the error model; an earlier run's out and lse kept; the same arrays give the same bits (a
    merge that adds the parts in the order they finish does not)."""
    _run_long_cell(request, backend, PLAN_DTYPE, "long_plans", check=checks.plan_serves_many_runs,
                   examples=few_long_examples, groups=PLAN_GROUPS, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
def test_long_captured_runs_replay_new_contents(request, backend, batch):
    """A split plan of the long-sequence batches captured in a CUDA graph, replayed after the next
    layer's query and caches are written into its arrays: the bits of an eager run. Unsupported
    off CUDA and for plans that are not capturable."""
    _run_long_cell(request, backend, PLAN_DTYPE, "long_replays", requires={"device": "cuda"},
                   check=checks.replay_matches_eager, examples=few_long_examples, groups=PLAN_GROUPS, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
def test_long_runs_follow_the_callers_stream(request, backend, batch):
    """A split plan of the long-sequence batches run on a side stream of torch's, behind a delay and
    after the next layer's query and caches are written into its arrays there: the bits of an eager
    run. Every launch of a split run (the parts, the merge) goes on the caller's stream; the small
    cases of the plan cell never split. Unsupported off CUDA and for backends that do not take
    torch CUDA tensors."""
    _run_long_cell(request, backend, PLAN_DTYPE, "long_streams", requires={"device": "cuda"},
                   check=checks.run_follows_callers_stream, examples=few_long_examples, groups=PLAN_GROUPS,
                   batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
def test_long_runs_hold_no_memory(request, backend, batch):
    """A split plan of the long-sequence batches run step after step on arrays allocated anew and
    dropped after each step: the step's arrays freed, and the memory in use grows by less than one
    run's out and lse (a split run that allocates its partials and never frees them fails)."""
    _run_long_cell(request, backend, PLAN_DTYPE, "long_memory", check=checks.runs_hold_no_memory,
                   examples=few_long_examples, groups=PLAN_GROUPS, batch=batch)


#: dtypes of the long-tail cells: the 16-bit ones (a float32 kernel that drops weights of 2**-10 is
#: off by more than float32's bound on short rows, where the other cells see it).
TAIL_DTYPES = ("float16", "bfloat16")


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", TAIL_DTYPES)
def test_long_tails_match_spec(request, backend, dtype, batch):
    """The long-sequence batches with a sink: each sequence's first key scores 8 above the rest, whose
    weights are each under 2**-10 of its own and together hold half or more of a row's mass (kernels
    that drop weights that small are right only on short rows); within the error model."""
    _run_long_cell(request, backend, dtype, "long_tails", kinds=LONG_TAIL_KINDS, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", TAIL_DTYPES)
def test_long_tails_with_fp8_caches_match_spec(request, backend, dtype, batch):
    """The long-tail batches with fp8 caches and scales: fp8 paths that take P in fp8 for the P V
    product flush the small weights; within the error model."""
    _run_long_cell(request, backend, dtype, "long_tails_fp8", requires={"features": ("fp8",)}, fp8=True,
                   kinds=LONG_TAIL_KINDS, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
def test_long_needles_match_spec(request, backend, batch):
    """The long-sequence batches with two needles past the first half of each sequence, scoring 100
    above every other key: a split plan's later part has an lse 100 above the earlier parts', past
    what float32's exp holds, which a merge must shift by the largest before exponentiating;
    within the error model (float16 queries: the overflow is float32's, whatever the query's dtype)."""
    _run_long_cell(request, backend, "float16", "long_needles", kinds=LONG_NEEDLE_KINDS, examples=few_long_examples,
                   batch=batch)


#: The caches of the cell of one-head needles: the query's dtype (float16), or fp8 under bfloat16 queries.
HEAD_NEEDLE_CACHES = ("same", "fp8")


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("cache", HEAD_NEEDLE_CACHES)
def test_long_needles_of_single_heads_match_spec(request, backend, cache, batch):
    """The long batches of wide groups where every score is 0 but one key a query head, its
    needle, which scores 16 for that head alone: a step where one row of a tile raises its running
    max and no other must still rescale that row's O (a rescale decided over some of the tile's
    rows leaves it at the old scale); within the error model."""
    fp8 = cache == "fp8"
    _run_long_cell(request, backend, "bfloat16" if fp8 else "float16", f"long_head_needles_{cache}",
                   requires={"features": ("fp8",)} if fp8 else None, fp8=fp8, kinds=LONG_HEAD_NEEDLE_KINDS,
                   groups=LONG_WIDE_GROUPS, max_kv_heads=WIDE_LONG_KV_HEADS, examples=few_long_examples, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
def test_long_sequences_with_non_finite_scores_propagate(request, backend, batch):
    """The long-sequence batches with NaN or inf in a query or in a key every query of its sequence
    sees: one split part's max and lse are not finite, and the merge carries that to the row's out
    and lse as IEEE arithmetic does (never weighed as an empty part)."""
    _run_long_cell(request, backend, "float16", "long_nonfinite", check=checks.nonfinite_scores_propagate,
                   examples=few_long_examples, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
def test_long_rows_of_minus_inf_scores_are_empty(request, backend, batch):
    """The long-sequence batches with one row of each sequence whose every score is -inf (its query
    -inf in one dim, every key of the sequence 1 there): each part of a split plan is empty, and
    the row gets out 0 and lse -inf, as a row without keys; a merge of parts that are all empty
    must not make it exp(-inf + inf) = NaN."""
    _run_long_cell(request, backend, "float16", "long_empty_rows", check=checks.minus_inf_rows_are_empty,
                   examples=few_long_examples, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_odd_sizes_match_spec(request, backend, dtype, batch):
    """Head counts, GQA ratios, head_dim, block_size, num_blocks, lengths and batch sizes that are
    no power of two, wherever the backend allows them, within the error model; one cell of decode,
    one of odd query counts."""
    limits = scale_limits()
    run_scale_cell(request, backend, odd_size_cases, checks.matches_spec,
                   limits, dtype=dtype, feature="odd_sizes", max_examples=limits.odd_examples,
                   batch=batch)


#: The dtypes of the large-block and large-head cells: where a page or a head is cut into tiles does
#: not depend on the dtype.
LARGE_BLOCK_DTYPES = ("float32", "bfloat16")


@pytest.mark.parametrize("dtype", LARGE_BLOCK_DTYPES)
def test_large_blocks_match_spec(request, backend, dtype):
    """Blocks of 128, 256 and 512 slots (more than a fixed tile of keys), sequences ending at and
    around their edges, within the error model; inputs untouched. A backend that declares no
    block size from 128 is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, large_block_cases, checks.matches_spec, limits, dtype=dtype,
                   feature="large_blocks", max_examples=limits.odd_examples,
                   requires={"block_size": large_block_sizes(backend.capabilities())[0]})


@pytest.mark.parametrize("dtype", LARGE_BLOCK_DTYPES)
def test_small_blocks_match_spec(request, backend, dtype):
    """Blocks of 1, 4 and 12 slots (fewer than a tile of keys, or a run of 8 consecutive slots,
    holds), a sequence of more than 4,096 blocks and others ending at and around block edges,
    within the error model; inputs untouched. A backend that declares no block size below 16 is
    unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, small_block_cases, checks.matches_spec, limits, dtype=dtype,
                   feature="small_blocks", max_examples=limits.odd_examples,
                   requires={"block_size": small_block_sizes(backend.capabilities())[0]})


#: The check of each operation of the large-block operation cell.
LARGE_BLOCK_OPERATIONS: dict[str, Callable[[Backend, Any], float]] = {
    "write_kv": checks.write_kv_matches_spec, "copy_blocks": checks.copy_blocks_matches_spec}


@pytest.mark.parametrize("operation", sorted(LARGE_BLOCK_OPERATIONS))
def test_large_block_operations_match_spec(request, backend, operation):
    """write_kv and copy_blocks on blocks of 128, 256 and 512 slots: the spec's bits in every slot.
    A backend that declares no block size from 128, or not the operation, is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, partial(large_block_operation_cases, operation=operation),
                   LARGE_BLOCK_OPERATIONS[operation], limits, dtype="bfloat16", feature=f"large_blocks_{operation}",
                   max_examples=limits.odd_examples, cell={"operation": operation},
                   requires={"features": (operation,), "block_size": large_block_sizes(backend.capabilities())[0]})


@pytest.mark.parametrize("operation", sorted(LARGE_BLOCK_OPERATIONS))
def test_wide_head_operations_match_spec(request, backend, operation):
    """write_kv and copy_blocks on caches of 65 to 128 KV heads of 128 or 256 (more than a block
    holding every head of a token or slot takes): the spec's bits in every slot. A backend that
    declares not the operation is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, partial(wide_head_operation_cases, operation=operation),
                   LARGE_BLOCK_OPERATIONS[operation], limits, dtype="bfloat16", feature=f"wide_heads_{operation}",
                   max_examples=limits.odd_examples, cell={"operation": operation},
                   requires={"features": (operation,)})


@pytest.mark.parametrize("dtype", LARGE_BLOCK_DTYPES)
def test_large_head_dims_match_spec(request, backend, dtype):
    """head_dim 384 and 512 (wider than a 256-wide head tile), within the error model; inputs
    untouched. A backend that declares no head_dim past 256, or refuses one, is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, large_head_dim_cases, checks.matches_spec, limits, dtype=dtype,
                   feature="large_head_dims", max_examples=limits.odd_examples,
                   requires={"head_dim": large_head_dims(backend.capabilities())[0]})


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_merges_of_many_wide_heads_match_exact_merge(request, backend, dtype):
    """merge_states of 65 to 160 heads of 80 to 512 dims (an MLA model's 128 heads of 512 among
    them): within rounding of the exact merge, an empty side ignored. More heads than a block of one
    row per head takes, rows wider than a 128- or 256-dim tile."""
    limits = scale_limits()
    run_scale_cell(request, backend, wide_merge_cases, checks.merge_states_matches_spec, limits, dtype=dtype,
                   feature="wide_merges", max_examples=limits.odd_examples, requires={"features": ("merge_states",)})


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_far_pool_attention_matches_spec(request, backend, dtype, batch):
    """Attention on caches past 2**31 elements, every block in use past element 2**31 (the last
    block too), within the error model; the blocks in use unchanged. One cell of decode batches,
    one of a few queries a sequence (unsupported without varlen batches)."""
    limits = scale_limits()
    run_scale_cell(request, backend, far_pool_cases, checks.far_pool_matches_spec,
                   limits, dtype=dtype, feature="far_pool", max_examples=limits.far_examples,
                   cell={"pool_elements": limits.pool_elements},
                   requires={"pool_elements": limits.pool_elements}, batch=batch)


@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_far_pool_verify_batches_match_spec(request, backend, dtype):
    """The far-pool attention cases with 8 to 16 queries a sequence (a speculative verify's batch,
    :data:`~pagedattn.conformance.scale.LONG_VERIFY_QUERIES`), every block in use past element
    2**31: the verify paths' block offsets, within the error model; the blocks in use unchanged."""
    limits = scale_limits()
    run_scale_cell(request, backend, partial(far_pool_cases, verify=True), checks.far_pool_matches_spec,
                   limits, dtype=dtype, feature="far_pool_verify", max_examples=limits.far_examples,
                   cell={"pool_elements": limits.pool_elements},
                   requires={"features": ("varlen",), "pool_elements": limits.pool_elements})


#: The block sizes of the far-pool cell of small and large blocks: the small- and large-block cells'.
FAR_BLOCK_SIZES: dict[str, Callable[[Capabilities], tuple[int, ...]]] = {
    "small": small_block_sizes, "large": large_block_sizes}


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("blocks", FAR_BLOCK_SIZES)
def test_far_pools_of_small_and_large_blocks_match_spec(request, backend, blocks, batch):
    """The far-pool attention cases in blocks of fewer than 16 slots (one slot first) or of 128
    and more (512 first): paths of their own (a token-level page table, a page of several key
    tiles) address the pool past element 2**31 in code of their own; one cell of decode, one of a
    few queries a sequence. A backend that declares no such block size is unsupported here."""
    limits = scale_limits()
    sizes = FAR_BLOCK_SIZES[blocks](backend.capabilities())
    run_scale_cell(request, backend, partial(far_pool_cases, block_sizes=sizes),
                   checks.far_pool_matches_spec, limits, dtype="float16", feature="far_pool",
                   max_examples=limits.far_examples,
                   cell={"pool_elements": limits.pool_elements, "blocks": blocks},
                   requires={"block_size": sizes[0], "pool_elements": limits.pool_elements}, batch=batch)


@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_far_pool_long_prefills_match_spec(request, backend, dtype):
    """A long prefill (one sequence of at least 512 rows) on caches past 2**31 elements, every
    block in use past element 2**31: prefill paths (cupy's Hopper kernel, triton's prefill tiles)
    address the pool in code of their own; within the error model, the blocks in use unchanged.
    A backend without varlen batches is unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, partial(far_pool_cases, long_prefill=True), checks.far_pool_matches_spec,
                   limits, dtype=dtype, feature="far_pool_long_prefill", max_examples=limits.far_examples,
                   cell={"pool_elements": limits.pool_elements},
                   requires={"features": ("varlen",), "pool_elements": limits.pool_elements})


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_far_pool_attention_with_fp8_caches_matches_spec(request, backend, dtype, batch):
    """The far-pool attention cases with fp8 caches and scales, every block in use past byte 2**32
    (element 2**32 of a one-byte cache): the fp8 paths' element offsets past 2**31 and byte
    offsets past 2**32, within the error model; the blocks in use unchanged. One cell of decode
    batches, one of a few queries a sequence (unsupported without varlen batches)."""
    limits = scale_limits()
    pool_elements = max(limits.pool_elements, FAR_BYTE_LIMIT)
    run_scale_cell(request, backend, partial(far_pool_cases, fp8=True),
                   checks.far_pool_matches_spec, limits, dtype=dtype, feature="far_pool_fp8",
                   max_examples=limits.far_examples, cell={"pool_elements": pool_elements},
                   requires={"features": ("fp8",), "pool_elements": pool_elements}, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_far_layer_views_match_spec(request, backend, dtype, batch):
    """Attention on K/V views of one layer of a pool past 2**32 elements, each view under 2**31,
    every block in use past element 2**31 of the pool and the last past 2**32, within the error
    model; nothing written. One cell of decode batches, one of a few queries a sequence
    (unsupported without varlen batches)."""
    limits = scale_limits()
    pool_elements = past_uint32_elements(limits)
    run_scale_cell(request, backend, far_layer_view_cases, checks.matches_spec,
                   limits, dtype=dtype, feature="far_layer_view", max_examples=limits.far_examples,
                   cell={"pool_elements": pool_elements},
                   requires={"features": ("strided_caches",), "pool_elements": pool_elements}, batch=batch)


@pytest.mark.parametrize("batch", BATCH_KINDS)
@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_far_table_rows_match_spec(request, backend, dtype, batch):
    """Attention whose block table is a view of an engine's table of more than 2**32 entries, every
    sequence's row past entry 2**32 (a batch padded with 32,768 entries of no keys): within the
    error model, the padding entries' rows empty. One cell of decode batches, one of a few queries
    a sequence (unsupported without varlen batches): each kind's kernel reads the table in code of
    its own. An interpreter, which runs the padding entries' programs one at a time (minutes), is
    unsupported here."""
    limits = scale_limits()
    run_scale_cell(request, backend, far_table_cases, checks.matches_spec,
                   limits, dtype=dtype, feature="far_table", max_examples=limits.far_examples,
                   requires={"many_programs": True}, batch=batch)


#: The far-pool cells of the cache operations: each operation's cases and check.
FAR_OPERATIONS: dict[str, tuple[Callable[..., Any], Callable[[Backend, Any], float]]] = {
    "write_kv": (far_write_kv_cases, checks.far_write_kv_matches_spec),
    "write_kv_fp8": (partial(far_write_kv_cases, fp8=True), checks.far_write_kv_matches_spec),
    "copy_blocks": (far_copy_blocks_cases, checks.far_copy_blocks_matches_spec),
    "copy_blocks_fp8": (partial(far_copy_blocks_cases, fp8=True), checks.far_copy_blocks_matches_spec),
}
#: What each far-pool operation cell needs beyond the pool: its operation, and fp8 caches.
FAR_OPERATION_FEATURES: dict[str, tuple[str, ...]] = {
    "write_kv": ("write_kv",), "write_kv_fp8": ("write_kv", "fp8"), "copy_blocks": ("copy_blocks",),
    "copy_blocks_fp8": ("copy_blocks", "fp8"),
}


@pytest.mark.parametrize("operation", FAR_OPERATIONS)
def test_far_pool_operation(request, backend, operation):
    """The operation on blocks past element 2**31 of caches past element 2**32 (byte 2**32 of fp8
    ones), the last block among them: write_kv leaves the spec's bits at its slots and the other
    slots of those blocks unchanged; copy_blocks equals the spec's, bit for bit."""
    limits = scale_limits()
    cases, check = FAR_OPERATIONS[operation]
    run_scale_cell(request, backend, cases, check, limits, dtype="float16", feature=f"far_{operation}",
                   max_examples=limits.far_examples,
                   requires={"features": FAR_OPERATION_FEATURES[operation],
                             "pool_elements": past_uint32_elements(limits)})


#: Which queries the far-row cells draw (decode and prefill are separate kernels in most backends)
#: and whether their caches are fp8 (a separate kernel in some).
FAR_ROW_CELLS: dict[str, dict[str, Any]] = {
    "decode": {"queries": "decode"},
    "prompts": {"queries": "prompts"},
    "prefills": {"queries": "prefills"},
    "decode-fp8": {"queries": "decode", "fp8": True},
    "prompts-fp8": {"queries": "prompts", "fp8": True},
    "decode-fused": {"queries": "decode", "fused": True},
}


@pytest.mark.parametrize("cell", FAR_ROW_CELLS)
def test_far_rows_match_spec(request, backend, cell):
    """A query and output past 2**31 elements (about 131,072 tokens of 128 heads of 128), or a
    query viewed in fused QKV rows that pass element 2**31 while the view and the output hold
    fewer: the rows past element 2**31, and the first ones, within the error model; inputs
    untouched. On a CPU (minutes of work) only under PAGEDATTN_SIZE=large."""
    limits = scale_limits()
    options = FAR_ROW_CELLS[cell]
    features = tuple(name for name, needed in (("varlen", options["queries"] != "decode"),
                                               ("fp8", options.get("fp8", False))) if needed)
    run_scale_cell(request, backend, partial(far_row_cases, **options), checks.far_rows_match_spec, limits,
                   dtype="bfloat16", feature="far_rows", max_examples=limits.batch_examples, cell={"cell": cell},
                   requires={"features": features, "large_arrays": True}, shrink=False)


def test_far_rows_of_merge_states(request, backend):
    """merge_states of two states past 2**31 elements (a long prefill's two parts): the rows past
    element 2**31, and the first ones, within rounding of the exact merge. On a CPU only under
    PAGEDATTN_SIZE=large."""
    limits = scale_limits()
    run_scale_cell(request, backend, lambda capabilities, dtype, limits: far_merge_row_cases(dtype=dtype),
                   checks.far_merge_rows_match_spec, limits, dtype="bfloat16", feature="far_rows_merge",
                   max_examples=limits.batch_examples,
                   requires={"features": ("merge_states",), "large_arrays": True}, shrink=False)


@pytest.mark.parametrize("cache", ["same", "fp8"])
def test_far_rows_of_write_kv(request, backend, cache):
    """write_kv of a key and value past 2**31 elements each (a long prefill's, 32 KV heads of 128),
    most tokens skipped: the spec's bits at the slots of the first tokens and of every token past
    element 2**31, every other slot unchanged. A backend run in an interpreter (a program per 64
    tokens and head: hundreds of thousands) only under PAGEDATTN_SIZE=large."""
    limits = scale_limits()
    fp8 = cache == "fp8"
    run_scale_cell(request, backend, partial(far_row_write_kv_cases, fp8=fp8), checks.write_kv_matches_spec, limits,
                   dtype="bfloat16", feature="far_rows_write_kv", max_examples=limits.batch_examples,
                   cell={"cache": cache},
                   requires={"features": ("write_kv", "fp8") if fp8 else ("write_kv",), "many_programs": True},
                   shrink=False)


def test_far_partials_match_spec(request, backend):
    """Decode of 16,384 or more short sequences beside one of 2**15 keys, 32 query heads of 128:
    split-KV partials laid out by sequence and sized by the longest (parts of up to 1,024 keys)
    pass 2**31 elements. The rows of the sequences whose partials start past element 2**31, of
    the longest and of the first ones within the error model, inputs untouched. On a CPU (half a
    minute of arithmetic) only under PAGEDATTN_SIZE=large."""
    limits = scale_limits()
    run_scale_cell(request, backend, far_partial_cases, checks.far_partials_match_spec, limits, dtype="bfloat16",
                   feature="far_partials", max_examples=limits.batch_examples,
                   requires={"large_arrays": True}, shrink=False)


def test_far_scores_match_spec(request, backend):
    """One causal prefill of 47,000 queries or more over as many keys and more, 8 query heads: a
    head's scores, queries x keys, pass 2**31 elements. The rows whose scores start past element
    2**31, the first and the last within the error model, inputs untouched. On a CPU (a
    prefill of hundreds of GFLOP) only under PAGEDATTN_SIZE=large."""
    limits = scale_limits()
    run_scale_cell(request, backend, far_score_cases, checks.far_scores_match_spec, limits, dtype="bfloat16",
                   feature="far_scores", max_examples=limits.batch_examples,
                   requires={"features": ("varlen",), "large_arrays": True}, shrink=False)


def test_far_scores_past_2_32_match_spec(request, backend):
    """One causal chunk of 8,193 queries or more after 524,288 keys of context, 8 query heads: a
    head's scores, queries x keys, pass 2**32 elements, where an unsigned 32-bit offset wraps. The
    rows whose scores start past element 2**32, the first and the last within the error model,
    inputs untouched. On a CPU (a prefill of tens of TFLOP) only under PAGEDATTN_SIZE=large."""
    limits = scale_limits()
    run_scale_cell(request, backend, far_score_uint32_cases, checks.far_scores_past_uint32_match_spec, limits,
                   dtype="bfloat16", feature="far_scores_uint32", max_examples=limits.batch_examples,
                   requires={"features": ("varlen",), "large_arrays": True}, shrink=False)
