"""Contract sections "Arrays" and "Meaning": out (and lse) of every feature against the exact spec.

One test per rule; discrete axes (feature, dtype, block size, layout) are parameters, the
rest is drawn by :func:`pagedattn.conformance.strategies.attention_cases`. Each cell also
checks the output arrays' shape and dtype and that no input was written.
"""

from __future__ import annotations

import pytest

from pagedattn.conformance import checks
from pagedattn.conformance.runner import run_property
from pagedattn.conformance.strategies import ATTENTION_FEATURES, attention_cases
from pagedattn.spec.arrays import KV_LAYOUTS
from pagedattn.spec.dtypes import QUERY_DTYPES

pytestmark = pytest.mark.pagedattn_conformance

#: Examples per huge_pool cell: each moves a pool of 32,768+ blocks to the device and back.
HUGE_POOL_EXAMPLES = 3

#: Capabilities each matrix row needs.
FEATURE_NEEDS: dict[str, tuple[str, ...]] = {
    "decode": (), "varlen": ("varlen",), "non_causal": ("varlen", "non_causal"),
    "sliding_window": ("sliding_window",), "softcap": ("softcap",), "alibi": ("alibi",), "lse": ("lse",),
    "scale": (), "fp8": ("fp8",), "strided_caches": ("strided_caches",), "huge_pool": (),
    "combined": (),
}


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
@pytest.mark.parametrize("feature", ATTENTION_FEATURES)
def test_attention_matches_spec(request, backend, feature, dtype, block_size, kv_layout):
    """out within the error model of exact float64 attention; lse too when asked; out = 0 and
    lse = -inf for a query that sees no key; inputs untouched."""
    run_property(
        request, backend,
        lambda: attention_cases(backend.capabilities(), dtype=dtype, block_size=block_size,
                                kv_layout=kv_layout, feature=feature),
        checks.matches_spec,
        cell={"feature": feature, "dtype": dtype, "block_size": block_size, "kv_layout": kv_layout},
        requires={"dtype": dtype, "block_size": block_size, "kv_layout": kv_layout,
                  "features": FEATURE_NEEDS[feature]},
        max_examples=HUGE_POOL_EXAMPLES if feature == "huge_pool" else None,
    )
