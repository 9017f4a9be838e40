"""Contract section "What a backend must never do": garbage, relocation, repetition, batching.

Each rule runs on cases that draw every declared feature at random (the ``combined`` row of
the strategies) and compares two calls: bits must be identical, except alone vs in a batch,
which must agree within twice the error model.
"""

from __future__ import annotations

import pytest

from pagedattn.conformance import checks
from pagedattn.conformance.runner import run_property
from pagedattn.conformance.strategies import attention_cases
from pagedattn.spec.arrays import KV_LAYOUTS
from pagedattn.spec.dtypes import QUERY_DTYPES

pytestmark = pytest.mark.pagedattn_conformance

RULES = {
    "garbage_ignored": checks.garbage_ignored,
    "relocation_invariant": checks.relocation_invariant,
    "deterministic": checks.deterministic,
    "alone_equals_batch": checks.alone_equals_batch,
}


def _run(request, backend, rule, dtype, block_size, kv_layout):
    __tracebackhide__ = True
    run_property(
        request, backend,
        lambda: attention_cases(backend.capabilities(), dtype=dtype, block_size=block_size,
                                kv_layout=kv_layout, feature="combined"),
        RULES[rule],
        cell={"feature": rule, "dtype": dtype, "block_size": block_size, "kv_layout": kv_layout},
        requires={"dtype": dtype, "block_size": block_size, "kv_layout": kv_layout},
    )


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_garbage_in_unused_memory_is_ignored(request, backend, dtype, block_size, kv_layout):
    """NaN, inf or random values in unused slots, unused blocks and unused block-table entries
    (-1, 2**31-1, another sequence's id) leave out and lse bit-identical."""
    _run(request, backend, "garbage_ignored", dtype, block_size, kv_layout)


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_relocated_blocks_give_identical_bits(request, backend, dtype, block_size, kv_layout):
    """The same logical K/V in other physical blocks gives bit-identical out and lse."""
    _run(request, backend, "relocation_invariant", dtype, block_size, kv_layout)


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_same_call_twice_gives_identical_bits(request, backend, dtype, block_size, kv_layout):
    """Two identical calls return the same bits, the second given the block table as a list of
    lists of ints (the contract's other form of it)."""
    _run(request, backend, "deterministic", dtype, block_size, kv_layout)


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_sequence_alone_equals_sequence_in_batch(request, backend, dtype, block_size, kv_layout):
    """A sequence computed alone agrees with its rows in the batch within twice the error model."""
    _run(request, backend, "alone_equals_batch", dtype, block_size, kv_layout)
