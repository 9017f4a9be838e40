"""``Backend.run`` checks its arrays against the plan once per (shape, dtype) and then only
compares: a changed array is still refused after runs that passed, naming the argument,
with NumPy arrays and torch tensors; a backend without ``strided_caches`` refuses a strided
cache at every run."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pagedattn.backends.capabilities import ALL_FEATURES, Capabilities
from pagedattn.backends.numpy.backend import NumpyBackend
from pagedattn.errors import PagedAttentionError, UnsupportedError
from pagedattn.spec.pools import random_paged_inputs


def _inputs() -> Any:
    return random_paged_inputs([40, 17, 5], None, block_size=16, num_q_heads=4, num_kv_heads=2, head_dim=16,
                               dtype="float32", seed=4)


def _planned_and_run(backend: NumpyBackend) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    """``backend``'s plan for :func:`_inputs`, run once, with the query and caches it was run on."""
    inputs = _inputs()
    q, k, v = inputs.args()[:3]
    plan = backend.plan(q, k, v, *inputs.args()[3:])
    backend.run(plan, q, k, v)
    return plan, q, k, v


def _changed(arrays: dict[str, Any], argument: str, how: str) -> dict[str, Any]:
    """``arrays`` with one array replaced by one of another shape or dtype."""
    x = arrays[argument]
    changed = x[:-1] if how == "shape" else x.astype(np.float16) if isinstance(x, np.ndarray) else x.half()
    return {**arrays, argument: changed}


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("argument", ["query", "key_cache", "value_cache"])
@pytest.mark.parametrize("how", ["shape", "dtype"])
def test_a_changed_array_is_refused_after_runs_that_passed(kind: str, argument: str, how: str) -> None:
    inputs = _inputs()
    if kind == "torch":
        torch = pytest.importorskip("torch")
        from pagedattn.backends.torch.backend import TorchBackend

        backend: Any = TorchBackend()
        q, k, v = (torch.from_numpy(np.ascontiguousarray(x)) for x in inputs.args()[:3])
    else:
        backend = NumpyBackend()
        q, k, v = inputs.args()[:3]
    arrays = {"query": q, "key_cache": k, "value_cache": v}
    plan = backend.plan(q, k, v, *inputs.args()[3:])
    first = backend.to_numpy(backend.run(plan, q, k, v))
    assert plan.accepted[0] is not None  # the check was done and remembered
    bad = _changed(arrays, argument, how)
    for _ in range(2):  # refused every time, also right after a run that passed
        with pytest.raises(PagedAttentionError) as error:
            backend.run(plan, bad["query"], bad["key_cache"], bad["value_cache"])
        assert error.value.argument == argument
        np.testing.assert_array_equal(backend.to_numpy(backend.run(plan, q, k, v)), first)


def test_equal_shapes_and_dtypes_of_new_arrays_pass_without_the_full_check() -> None:
    backend = NumpyBackend()
    plan, q, k, v = _planned_and_run(backend)
    seen = plan.accepted[0]
    other = q.copy()  # another array, the same shape and dtype
    backend.run(plan, other, k, v)
    assert plan.accepted[0] == seen


class _ContiguousOnly(NumpyBackend):
    name = "contiguous-only"

    def capabilities(self) -> Capabilities:
        return Capabilities(features=frozenset(ALL_FEATURES) - {"strided_caches"})


def test_a_backend_without_strided_caches_refuses_a_strided_cache_at_every_run() -> None:
    backend = _ContiguousOnly()
    plan, q, k, v = _planned_and_run(backend)
    wide = np.zeros((*k.shape[:-1], 2 * k.shape[-1]), dtype=k.dtype)
    strided = wide[..., ::2]
    strided[...] = k
    assert strided.shape == k.shape and strided.dtype == k.dtype
    for _ in range(2):
        with pytest.raises(UnsupportedError) as error:
            backend.run(plan, q, strided, v)
        assert error.value.argument == "key_cache"
