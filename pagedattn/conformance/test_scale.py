"""Bugs that show only at scale: split-KV on long sequences, long 16-bit rows, pools past 2**31
elements (attention, write_kv, copy_blocks), sizes that are no power of two, groups wider than a
tile of rows, batches larger than one wave of CTAs, more than 65,535 tokens in one call
(attention, write_kv), and prefills of several query tiles per sequence.

Sizes and example counts follow the profile (:func:`pagedattn.conformance.scale.scale_limits`;
the large-batch and many-token cells have one size, set by the GPU's limits); every cell draws
few, large examples. A backend that cannot take a pool of that many
elements declares ``max_pool_elements`` and its far-pool cells are UNSUPPORTED.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import Phase

from pagedattn.backends.interface import Backend
from pagedattn.conformance import checks
from pagedattn.conformance.device_memory import release_cached_device_memory
from pagedattn.conformance.runner import run_property
from pagedattn.conformance.scale import (
    ScaleLimits,
    far_copy_blocks_cases,
    far_pool_cases,
    far_write_kv_cases,
    large_batch_cases,
    long_prefill_cases,
    long_sequence_cases,
    many_token_cases,
    many_token_write_kv_cases,
    odd_size_cases,
    scale_limits,
    wide_group_cases,
)
from pagedattn.spec.dtypes import QUERY_DTYPES

pytestmark = pytest.mark.pagedattn_conformance

#: Large cases cost a second or more each: shrink the first failure found, look for no other,
#: and skip hypothesis' explain phase (it re-runs the failure under a line tracer).
FIRST_FAILURE: dict[str, Any] = {"report_multiple_bugs": False,
                                 "phases": tuple(phase for phase in Phase if phase is not Phase.explain)}
#: 16-bit dtypes of the far-pool cells (a pool past 2**31 elements is 4 GiB of address space each)
#: and of the long cells with fp8 caches (fp8 caches hold keys of 16-bit queries).
FAR_DTYPES = ("float16", "bfloat16")


def _run_scale_cell(request: Any, backend: Backend, cases: Callable[..., Any],
                    check: Callable[[Backend, Any], float], limits: ScaleLimits, *, dtype: str, feature: str,
                    max_examples: int, cell: dict[str, Any] | None = None,
                    requires: dict[str, Any] | None = None) -> None:
    """Run ``check`` on ``cases`` of ``dtype`` drawn within ``limits``, stopping at the first failure;
    ``cell`` and ``requires`` add to the cell's record and to what it requires beyond ``dtype``.
    The device memory the cell's large arrays leave cached goes back to the driver at the end."""
    try:
        run_property(
            request, backend, lambda: cases(backend.capabilities(), dtype=dtype, limits=limits), check,
            cell={"feature": feature, "dtype": dtype, "block_size": "-", "kv_layout": "-", **(cell or {})},
            requires={"dtype": dtype, **(requires or {})}, max_examples=max_examples,
            settings_overrides=FIRST_FAILURE,
        )
    finally:
        release_cached_device_memory()


def _run_long_cell(request: Any, backend: Backend, dtype: str, feature: str, *,
                   requires: dict[str, Any] | None = None, fp8: bool = False, window: bool = False) -> None:
    """A long-sequence cell: :func:`long_sequence_cases` of ``dtype`` (with fp8 caches, under a
    window), checked against the spec."""
    limits = scale_limits()
    cases = partial(long_sequence_cases, fp8=fp8, window=window)
    _run_scale_cell(request, backend, cases, checks.matches_spec, limits, dtype=dtype, feature=feature,
                    max_examples=limits.long_examples, cell={"max_keys": limits.max_long}, requires=requires)


@pytest.mark.parametrize("dtype", scale_limits().long_dtypes)  # the profile is loaded before collection
def test_long_sequences_match_spec(request, backend, dtype):
    """A small batch of long sequences (thousands of keys: split-KV plans, long 16-bit rows) within
    the error model of exact attention; inputs untouched."""
    _run_long_cell(request, backend, dtype, "long_sequences")


@pytest.mark.parametrize("dtype", scale_limits().long_dtypes)
def test_long_sequences_with_a_window_match_spec(request, backend, dtype):
    """The long-sequence batches under a sliding window of at most a quarter of a sequence (with
    ALiBi where declared, sometimes softcap): split plans whose parts may see no key, within the
    error model; inputs untouched."""
    _run_long_cell(request, backend, dtype, "long_sequences_window", requires={"features": ("sliding_window",)},
                   window=True)


@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_long_sequences_with_fp8_caches_match_spec(request, backend, dtype):
    """The long-sequence batches with fp8 caches and scales (v_scale never 1): split-KV plans
    of the fp8 paths, their partials and merge, within the error model; inputs untouched."""
    _run_long_cell(request, backend, dtype, "long_sequences_fp8", requires={"features": ("fp8",)}, fp8=True)


@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_long_prefills_match_spec(request, backend, dtype):
    """1 or 2 sequences of hundreds of queries (512 rows and more each, after up to 1,000 keys of
    context): several query tiles per sequence and their causal diagonals, within the error
    model; inputs untouched."""
    limits = scale_limits()
    _run_scale_cell(request, backend, long_prefill_cases, checks.matches_spec, limits, dtype=dtype,
                    feature="long_prefill", max_examples=limits.long_examples,
                    requires={"features": ("varlen",)})


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_odd_sizes_match_spec(request, backend, dtype):
    """Head counts, GQA ratios, head_dim, block_size, num_blocks, lengths and batch sizes that are
    no power of two, wherever the backend allows them, within the error model."""
    limits = scale_limits()
    _run_scale_cell(request, backend, odd_size_cases, checks.matches_spec, limits, dtype=dtype,
                    feature="odd_sizes", max_examples=limits.odd_examples)


@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_far_pool_attention_matches_spec(request, backend, dtype):
    """Attention on caches past 2**31 elements, every block in use past element 2**31 (the last
    block too), within the error model; the blocks in use unchanged."""
    limits = scale_limits()
    _run_scale_cell(request, backend, far_pool_cases, checks.far_pool_matches_spec, limits, dtype=dtype,
                    feature="far_pool", max_examples=limits.far_examples,
                    cell={"pool_elements": limits.pool_elements}, requires={"pool_elements": limits.pool_elements})


@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_far_pool_attention_with_fp8_caches_matches_spec(request, backend, dtype):
    """The far-pool attention cases with fp8 caches and scales: the fp8 paths' offsets past element
    2**31, within the error model; the blocks in use unchanged."""
    limits = scale_limits()
    _run_scale_cell(request, backend, partial(far_pool_cases, fp8=True), checks.far_pool_matches_spec, limits,
                    dtype=dtype, feature="far_pool_fp8", max_examples=limits.far_examples,
                    cell={"pool_elements": limits.pool_elements},
                    requires={"features": ("fp8",), "pool_elements": limits.pool_elements})


#: The far-pool cells of the cache operations: each operation's cases and check.
FAR_OPERATIONS: dict[str, tuple[Callable[..., Any], Callable[[Backend, Any], float]]] = {
    "write_kv": (far_write_kv_cases, checks.far_write_kv_matches_spec),
    "write_kv_fp8": (partial(far_write_kv_cases, fp8=True), checks.far_write_kv_matches_spec),
    "copy_blocks": (far_copy_blocks_cases, checks.far_copy_blocks_matches_spec),
}
#: What each far-pool operation cell needs beyond the pool: its operation, and fp8 caches.
FAR_OPERATION_FEATURES: dict[str, tuple[str, ...]] = {
    "write_kv": ("write_kv",), "write_kv_fp8": ("write_kv", "fp8"), "copy_blocks": ("copy_blocks",),
}


@pytest.mark.parametrize("operation", FAR_OPERATIONS)
def test_far_pool_operation(request, backend, operation):
    """The operation on blocks past element 2**31 of its caches: write_kv leaves the spec's bits at
    its slots and the other slots of those blocks unchanged; copy_blocks equals the spec's, bit for bit."""
    limits = scale_limits()
    cases, check = FAR_OPERATIONS[operation]
    _run_scale_cell(request, backend, cases, check, limits, dtype="float16", feature=f"far_{operation}",
                    max_examples=limits.far_examples,
                    requires={"features": FAR_OPERATION_FEATURES[operation], "pool_elements": limits.pool_elements})


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_wide_groups_match_spec(request, backend, dtype):
    """12 to 128 query heads per KV head (wider than one tile of rows; 71 and others no power of
    two), decode and a few queries, within the error model; inputs untouched."""
    limits = scale_limits()
    _run_scale_cell(request, backend, wide_group_cases, checks.matches_spec, limits, dtype=dtype,
                    feature="wide_groups", max_examples=limits.wide_examples)


#: The dtype of the large-batch and many-token cells: how work is spread over CTAs does not depend
#: on it, and a batch this large costs the Triton interpreter a minute.
LARGE_BATCH_DTYPES = ("bfloat16",)


@pytest.mark.parametrize("dtype", LARGE_BATCH_DTYPES)
def test_large_batches_match_spec(request, backend, dtype):
    """More than 1,100 (sequence, KV head) pairs of short sequences (more than one wave of CTAs on
    the GPU), decode or mixed, within the error model; inputs untouched."""
    limits = scale_limits()
    _run_scale_cell(request, backend, large_batch_cases, checks.matches_spec, limits, dtype=dtype,
                    feature="large_batch", max_examples=limits.batch_examples)


@pytest.mark.parametrize("dtype", LARGE_BATCH_DTYPES)
def test_many_tokens_match_spec(request, backend, dtype):
    """More than 65,535 query tokens in one call (about 4,100 short prefills; past a CUDA grid's y
    and z limit), within the error model; inputs untouched."""
    limits = scale_limits()
    _run_scale_cell(request, backend, many_token_cases, checks.matches_spec, limits, dtype=dtype,
                    feature="many_tokens", max_examples=limits.batch_examples)


def test_write_kv_of_many_tokens(request, backend):
    """write_kv of more than 65,535 tokens in one call (a long prefill's keys and values): the spec's
    bits at every slot written, every other slot unchanged."""
    limits = scale_limits()
    _run_scale_cell(request, backend, many_token_write_kv_cases, checks.write_kv_matches_spec, limits,
                    dtype="bfloat16", feature="many_tokens_write_kv", max_examples=limits.batch_examples,
                    requires={"features": ("write_kv",)})
