"""Contract section "Other operations": write_kv, copy_blocks and merge_states against the spec."""

from __future__ import annotations

import pytest

from pagedattn.conformance import checks
from pagedattn.conformance.runner import run_property
from pagedattn.conformance.strategies import copy_blocks_cases, merge_cases, write_kv_cases
from pagedattn.spec.arrays import KV_LAYOUTS
from pagedattn.spec.dtypes import FP8_DTYPES, QUERY_DTYPES

pytestmark = pytest.mark.pagedattn_conformance


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@pytest.mark.parametrize("cache", ["same", *FP8_DTYPES])
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_write_kv_writes_only_its_slots(request, backend, dtype, cache, block_size, kv_layout):
    """write_kv stores x / scale (rounded to the cache dtype) at slot_mapping's slots, skips -1, and
    leaves every other slot's bits as they were."""
    cache_dtype = dtype if cache == "same" else cache
    features = ("write_kv", "fp8") if cache != "same" else ("write_kv",)
    run_property(
        request, backend,
        lambda: write_kv_cases(dtype=dtype, cache_dtype=cache_dtype, block_size=block_size, kv_layout=kv_layout),
        checks.write_kv_matches_spec,
        cell={"feature": "write_kv" if cache == "same" else "write_kv_fp8", "dtype": dtype,
              "block_size": block_size, "kv_layout": kv_layout, "cache_dtype": cache_dtype},
        requires={"dtype": dtype, "cache_dtype": cache_dtype, "block_size": block_size, "kv_layout": kv_layout,
                  "features": features},
    )


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_copy_blocks_reads_all_sources_first(request, backend, dtype, block_size, kv_layout):
    """copy_blocks copies whole blocks src -> dst, every source read before any destination written."""
    run_property(
        request, backend,
        lambda: copy_blocks_cases(dtype=dtype, block_size=block_size, kv_layout=kv_layout),
        checks.copy_blocks_matches_spec,
        cell={"feature": "copy_blocks", "dtype": dtype, "block_size": block_size, "kv_layout": kv_layout},
        requires={"dtype": dtype, "block_size": block_size, "kv_layout": kv_layout, "features": ("copy_blocks",)},
    )


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_merge_states_matches_exact_merge(request, backend, dtype):
    """merge_states is the exact online-softmax merge; an empty side (lse = -inf) is ignored even if its
    out is NaN; both empty give out = 0, lse = -inf."""
    run_property(
        request, backend, lambda: merge_cases(dtype=dtype), checks.merge_states_matches_spec,
        cell={"feature": "merge_states", "dtype": dtype, "block_size": "-", "kv_layout": "-"},
        requires={"dtype": dtype, "features": ("merge_states",)},
    )
