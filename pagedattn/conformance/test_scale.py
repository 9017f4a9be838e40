"""Bugs that show only at scale: split-KV on long sequences, long 16-bit rows, pools past 2**31
elements (attention, write_kv, copy_blocks), and sizes that are no power of two.

Sizes and example counts follow the profile (:func:`pagedattn.conformance.scale.scale_limits`);
every cell draws few, large examples. A backend that cannot take a pool of that many
elements declares ``max_pool_elements`` and its far-pool cells are UNSUPPORTED.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import Phase

from pagedattn.conformance import checks
from pagedattn.conformance.runner import run_property
from pagedattn.conformance.scale import (
    far_copy_blocks_cases,
    far_pool_cases,
    far_write_kv_cases,
    long_sequence_cases,
    odd_size_cases,
    scale_limits,
)
from pagedattn.spec.dtypes import QUERY_DTYPES

pytestmark = pytest.mark.pagedattn_conformance

#: Large cases cost a second or more each: shrink the first failure found, look for no other,
#: and skip hypothesis' explain phase (it re-runs the failure under a line tracer).
FIRST_FAILURE: dict[str, Any] = {"report_multiple_bugs": False,
                                 "phases": tuple(phase for phase in Phase if phase is not Phase.explain)}
#: 16-bit dtypes of the far-pool cells: a pool past 2**31 elements is 4 GiB of address space each.
FAR_DTYPES = ("float16", "bfloat16")


@pytest.mark.parametrize("dtype", scale_limits().long_dtypes)  # the profile is loaded before collection
def test_long_sequences_match_spec(request, backend, dtype):
    """A small batch of long sequences (thousands of keys: split-KV plans, long 16-bit rows) within
    the error model of exact attention; inputs untouched."""
    limits = scale_limits()
    run_property(
        request, backend, lambda: long_sequence_cases(backend.capabilities(), dtype=dtype, limits=limits),
        checks.matches_spec,
        cell={"feature": "long_sequences", "dtype": dtype, "block_size": "-", "kv_layout": "-",
              "max_keys": limits.max_long},
        requires={"dtype": dtype}, max_examples=limits.long_examples, settings_overrides=FIRST_FAILURE,
    )


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_odd_sizes_match_spec(request, backend, dtype):
    """Head counts, GQA ratios, head_dim, block_size, num_blocks, lengths and batch sizes that are
    no power of two, wherever the backend allows them, within the error model."""
    limits = scale_limits()
    run_property(
        request, backend, lambda: odd_size_cases(backend.capabilities(), dtype=dtype, limits=limits),
        checks.matches_spec,
        cell={"feature": "odd_sizes", "dtype": dtype, "block_size": "-", "kv_layout": "-"},
        requires={"dtype": dtype}, max_examples=limits.odd_examples, settings_overrides=FIRST_FAILURE,
    )


@pytest.mark.parametrize("dtype", FAR_DTYPES)
def test_far_pool_attention_matches_spec(request, backend, dtype):
    """Attention on caches past 2**31 elements, every block in use past element 2**31 (the last
    block too), within the error model; the blocks in use unchanged."""
    limits = scale_limits()
    run_property(
        request, backend, lambda: far_pool_cases(backend.capabilities(), dtype=dtype, limits=limits),
        checks.far_pool_matches_spec,
        cell={"feature": "far_pool", "dtype": dtype, "block_size": "-", "kv_layout": "-",
              "pool_elements": limits.pool_elements},
        requires={"dtype": dtype, "pool_elements": limits.pool_elements},
        max_examples=limits.far_examples, settings_overrides=FIRST_FAILURE,
    )


def test_far_pool_write_kv(request, backend):
    """write_kv at slots past element 2**31 of its caches: the spec's bits there, the other slots of
    those blocks unchanged."""
    limits = scale_limits()
    run_property(
        request, backend, lambda: far_write_kv_cases(backend.capabilities(), dtype="float16", limits=limits),
        checks.far_write_kv_matches_spec,
        cell={"feature": "far_write_kv", "dtype": "float16", "block_size": "-", "kv_layout": "-"},
        requires={"dtype": "float16", "features": ("write_kv",), "pool_elements": limits.pool_elements},
        max_examples=limits.far_examples, settings_overrides=FIRST_FAILURE,
    )


def test_far_pool_copy_blocks(request, backend):
    """copy_blocks between blocks past element 2**31 of the caches equals the spec's, bit for bit."""
    limits = scale_limits()
    run_property(
        request, backend, lambda: far_copy_blocks_cases(backend.capabilities(), dtype="float16", limits=limits),
        checks.far_copy_blocks_matches_spec,
        cell={"feature": "far_copy_blocks", "dtype": "float16", "block_size": "-", "kv_layout": "-"},
        requires={"dtype": "float16", "features": ("copy_blocks",), "pool_elements": limits.pool_elements},
        max_examples=limits.far_examples, settings_overrides=FIRST_FAILURE,
    )
