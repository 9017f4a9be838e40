"""Host time of ``run`` on a planned batch: what one call costs the host before the device sees it.

A tiny batch (decode, and varlen prefill) is planned once with torch inputs where the backend
takes them (``--perf-inputs native``: its own arrays); a timed round queues ``CALLS`` runs
without waiting (the device stays ahead of the host on so small a shape), and
pytest-benchmark's median per round / ``CALLS`` is the host time per call
(``extra_info["host_us"]``). On a GPU the project's GPU kernels
(:data:`~pagedattn.perf.targets.TARGET_BACKENDS`, or those ``--perf-backends`` names) must stay
within :data:`HOST_BOUNDS_S`; torch on CUDA, a reference, is measured without a bound. On the
CPU the CPU backends are measured without a bound (their ``run`` computes on the host) and the
GPU backends are not collected (see conftest).

:func:`test_host_time_of_run_checks` times what every backend's ``run`` does before its
``_run``, the checks of the arrays against the plan, on any machine (a backend whose ``_run``
returns at once), with NumPy arrays and torch tensors; it must stay within
:data:`CHECK_BOUND_S`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pagedattn.backends.interface import Plan
from pagedattn.backends.numpy.backend import NumpyBackend
from pagedattn.perf import device, engine
from pagedattn.perf.targets import TARGET_BACKENDS
from pagedattn.spec.pools import random_paged_inputs

ON_GPU = device.gpu_name() is not None
CALLS = 200 if ON_GPU else 3  # a CPU backend computes on the host: a few calls say enough
ROUNDS = 20 if ON_GPU else 3
#: the most host time a planned ``run`` may take on a GPU backend, per kind of batch
HOST_BOUNDS_S: dict[str, float] = {"decode": 15e-6, "varlen prefill": 25e-6}
#: the most host time ``Backend.run``'s checks may take per run: a third of the decode bound
CHECK_BOUND_S = HOST_BOUNDS_S["decode"] / 3
CHECK_CALLS = 2000
#: kind -> (seq_lens, q_lens): tiny, so that the device never holds the host back
SHAPES: dict[str, tuple[list[int], list[int] | None]] = {
    "decode": ([40, 17, 64, 5], None),
    "varlen prefill": ([40, 17, 64], [40, 9, 30]),
}


@pytest.mark.parametrize("kind", list(SHAPES))
def test_host_time_of_run(benchmark: Any, backend_name: str, kind: str, input_kind: str,
                          request: pytest.FixtureRequest) -> None:
    from pagedattn.backends.registry import load_backend

    backend = load_backend(backend_name)
    judged = backend_name in TARGET_BACKENDS or bool(request.config.getoption("--perf-backends"))
    gpu_backend = backend.capabilities().device == "cuda" and judged
    seq_lens, q_lens = SHAPES[kind]
    host = random_paged_inputs(seq_lens, q_lens, block_size=16, num_q_heads=8, num_kv_heads=2,
                               head_dim=128 if ON_GPU else 16, dtype="bfloat16" if ON_GPU else "float32", seed=3)
    q, k, v = (engine.to_device(backend, x, input_kind) for x in host.args()[:3])
    index = [None if x is None else np.asarray(x) for x in host.args()[3:]]
    plan = backend.plan(q, k, v, *index)
    for _ in range(3):  # compile, first allocations
        backend.run(plan, q, k, v)
    backend.synchronize()

    def calls() -> None:
        for _ in range(CALLS):
            backend.run(plan, q, k, v)

    benchmark.group = f"host time/{kind}"
    benchmark.pedantic(calls, setup=backend.synchronize, rounds=ROUNDS, iterations=1)
    host_s = benchmark.stats.stats.median / CALLS
    bound = HOST_BOUNDS_S[kind] if ON_GPU and gpu_backend else None
    benchmark.extra_info.update(host_us=host_s * 1e6, bound_us=None if bound is None else bound * 1e6,
                                calls_per_round=CALLS)
    backend.synchronize()
    if bound is not None:
        assert host_s <= bound, (
            f"{backend_name} {kind}: {host_s * 1e6:.1f} us of host time per run > {bound * 1e6:g} us"
        )


class _ChecksOnly(NumpyBackend):
    """The NumPy backend with a ``_run`` that returns outputs made once: ``run`` costs its checks."""

    name = "checks-only"

    def _run(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> tuple[Any, Any]:
        return plan.state.outputs  # type: ignore[no-any-return]

    def _plan(self, problem: Any, block_tables: Any, seq_lens: Any, query_start_loc: Any, alibi_slopes: Any) -> Any:
        import types

        shape = (problem.num_tokens, problem.num_q_heads, problem.head_dim)
        return types.SimpleNamespace(outputs=(np.zeros(shape, np.float32), None))


@pytest.mark.parametrize("arrays", ["numpy", "torch"])
@pytest.mark.parametrize("kind", list(SHAPES))
def test_host_time_of_run_checks(benchmark: Any, kind: str, arrays: str) -> None:
    seq_lens, q_lens = SHAPES[kind]
    host = random_paged_inputs(seq_lens, q_lens, block_size=16, num_q_heads=8, num_kv_heads=2, head_dim=16,
                               dtype="float32", seed=3)
    q, k, v = host.args()[:3]
    if arrays == "torch":
        torch = pytest.importorskip("torch")
        q, k, v = (torch.from_numpy(np.ascontiguousarray(x)) for x in (q, k, v))
    backend = _ChecksOnly()
    plan = backend.plan(q, k, v, *[None if x is None else np.asarray(x) for x in host.args()[3:]])
    backend.run(plan, q, k, v)

    def calls() -> None:
        for _ in range(CHECK_CALLS):
            backend.run(plan, q, k, v)

    benchmark.group = f"host time of run's checks/{kind}"
    benchmark.pedantic(calls, rounds=ROUNDS * 3, iterations=1)
    host_s = benchmark.stats.stats.median / CHECK_CALLS
    benchmark.extra_info.update(host_us=host_s * 1e6, bound_us=CHECK_BOUND_S * 1e6, calls_per_round=CHECK_CALLS)
    assert host_s <= CHECK_BOUND_S, (
        f"run's checks ({arrays}, {kind}): {host_s * 1e6:.2f} us per run > {CHECK_BOUND_S * 1e6:g} us"
    )
