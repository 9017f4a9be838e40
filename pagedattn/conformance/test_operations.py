"""Contract section "Other operations": write_kv, copy_blocks and merge_states against the spec."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from pagedattn.conformance import another_gpu, checks
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


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@pytest.mark.parametrize("cache", FP8_DTYPES)
def test_copy_blocks_of_fp8_caches(request, backend, cache, block_size, kv_layout):
    """copy_blocks of fp8 caches (random bytes: every code, NaN among them) copies their bits, every
    source read before any destination written, as an engine's copy-on-write of an fp8 cache does."""
    run_property(
        request, backend,
        lambda: copy_blocks_cases(dtype=cache, block_size=block_size, kv_layout=kv_layout),
        checks.copy_blocks_matches_spec,
        cell={"feature": "copy_blocks_fp8", "dtype": cache, "block_size": block_size, "kv_layout": kv_layout},
        requires={"cache_dtype": cache, "block_size": block_size, "kv_layout": kv_layout,
                  "features": ("copy_blocks", "fp8")},
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


#: The strategy and stream check of each operation, for the cell below.
_OPERATION_CELLS: dict[str, tuple[Callable[..., Any], checks.Check]] = {
    "write_kv": (partial(write_kv_cases, cache_dtype="bfloat16", block_size=16, kv_layout="NHD"),
                 checks.write_kv_follows_callers_stream),
    "copy_blocks": (partial(copy_blocks_cases, block_size=16, kv_layout="NHD"),
                    checks.copy_blocks_follows_callers_stream),
    "merge_states": (merge_cases, checks.merge_states_follows_callers_stream),
}


#: The strategy and another-GPU check of each operation, for the cell below.
_ANOTHER_GPU_CELLS: dict[str, tuple[Callable[..., Any], checks.Check]] = {
    "write_kv": (_OPERATION_CELLS["write_kv"][0], another_gpu.write_kv_on_another_gpu),
    "copy_blocks": (_OPERATION_CELLS["copy_blocks"][0], another_gpu.copy_blocks_on_another_gpu),
    "merge_states": (merge_cases, another_gpu.merge_states_on_another_gpu),
}


@pytest.mark.parametrize("operation", sorted(_ANOTHER_GPU_CELLS))
def test_an_operation_on_another_gpu(request, backend, operation):
    """Every array on a GPU other than the current one: the spec's answer, on that GPU, the current
    device unchanged. Unsupported with fewer than two GPUs, and for backends that run only on the
    current device."""
    cases, check = _ANOTHER_GPU_CELLS[operation]
    run_property(
        request, backend, lambda: cases(dtype="bfloat16"), check,
        cell={"feature": f"{operation}_another_gpu", "dtype": "bfloat16", "block_size": "-", "kv_layout": "-"},
        requires={"dtype": "bfloat16", "block_size": 16, "kv_layout": "NHD", "features": (operation,),
                  "device": "cuda"},
    )


@pytest.mark.parametrize("operation", sorted(_OPERATION_CELLS))
def test_an_operation_follows_the_callers_stream(request, backend, operation):
    """The operation's inputs written on a side stream behind a delay, and the operation called
    there: the spec's answer, as ever (it launches on the caller's current stream). Unsupported
    off CUDA and for backends that do not take torch CUDA tensors."""
    cases, check = _OPERATION_CELLS[operation]
    run_property(
        request, backend, lambda: cases(dtype="bfloat16"), check,
        cell={"feature": f"{operation}_stream", "dtype": "bfloat16", "block_size": "-", "kv_layout": "-"},
        requires={"dtype": "bfloat16", "block_size": 16, "kv_layout": "NHD", "features": (operation,)},
    )
