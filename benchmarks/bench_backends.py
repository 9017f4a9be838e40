"""Regression benchmarks of every backend on the suite's cases (:mod:`pagedattn.perf.suite`).

Each benchmark times one ``run`` plus ``synchronize`` through the Backend interface; its
``extra_info`` carries GB/s, TFLOP/s, % of the roofline ceiling and what NVML reported while it
ran (``gpu_state``: the GPU settles before each benchmark); groups are ``backend/dtype/bs<block_size>``.
"""

from __future__ import annotations

from typing import Any

import pytest

from pagedattn.perf import device, suite
from pagedattn.perf.ceilings import Ceilings

ON_GPU = device.gpu_name() is not None
CASES = suite.suite_cases(ON_GPU)
FLUSH = suite.GPU_FLUSH_BYTES if ON_GPU else suite.CPU_FLUSH_BYTES


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_backend(benchmark: Any, backend_name: str, case: Any, ceilings: Ceilings, input_kind: str) -> None:
    from pagedattn.backends.registry import load_backend

    backend = load_backend(backend_name)
    benchmark.group = f"{backend_name}/{case.dtype}/bs{case.block_size}"
    prepared = suite.prepare(backend, case, FLUSH, input_kind)
    prepared.warm_up()
    with suite.settled_rounds(benchmark):
        benchmark.pedantic(prepared.call, rounds=max(20, 2 * prepared.rotations) if ON_GPU else 3, iterations=1)
    benchmark.extra_info.update(suite.extra_info(prepared.work, benchmark.stats.stats.median, ceilings))
    benchmark.extra_info.update(case=case.name, rotations=prepared.rotations)
