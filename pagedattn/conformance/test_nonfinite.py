"""Contract section "Non-finite data": NaN or inf that a row sees reaches its out and lse, never hidden.

The check puts NaN or ±inf into a query, or into a key or value slot every query of its
sequence sees, of cases that draw every declared feature (the ``combined`` row), and
compares the result with the spec, which computes the contract's formula in IEEE float64
arithmetic. That garbage in memory no row sees changes nothing is ``test_never``'s.
"""

from __future__ import annotations

import pytest

from pagedattn.conformance import checks
from pagedattn.conformance.runner import run_property
from pagedattn.conformance.strategies import attention_cases
from pagedattn.spec.arrays import KV_LAYOUTS
from pagedattn.spec.dtypes import QUERY_DTYPES

pytestmark = pytest.mark.pagedattn_conformance


@pytest.mark.parametrize("kv_layout", KV_LAYOUTS)
@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_non_finite_visible_data_propagates(request, backend, dtype, block_size, kv_layout):
    """NaN or ±inf in a query, or in a key or value of a slot the row sees, gives that row NaN
    where the spec (IEEE arithmetic) does; it is never hidden as 0 or "no visible key"."""
    run_property(
        request, backend,
        lambda: attention_cases(backend.capabilities(), dtype=dtype, block_size=block_size,
                                kv_layout=kv_layout, feature="combined"),
        checks.nonfinite_propagates,
        cell={"feature": "nonfinite_propagates", "dtype": dtype, "block_size": block_size, "kv_layout": kv_layout},
        requires={"dtype": dtype, "block_size": block_size, "kv_layout": kv_layout},
    )
