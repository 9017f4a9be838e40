"""The GPU speed targets as benchmarks (:mod:`pagedattn.perf.targets`), asserted.

Each backend runs every case of the ``targets`` set; a timed call queues enough runs to
last about 2 ms and synchronizes once (as ``pagedattn bench`` times), so the per-run median
is pytest-benchmark's median divided by ``runs_per_call`` (in ``extra_info``). The unpaged
reference (cuDNN SDPA on contiguous K/V) is timed in the same session, once per shape (it
has no blocks), and that time stands for each block size of the shape.
A case fails when it misses its target's share of the ceiling or speed against the
reference; the block-size spread is asserted once all of a target's cases ran. Without a
GPU the targets do not apply and these benchmarks are skipped with that reason.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from pagedattn.perf import device, inputs, shapes, suite, timing
from pagedattn.perf.ceilings import Ceilings
from pagedattn.perf.measure import Result, case_work, measure_peer, restate
from pagedattn.perf.peers import PEERS
from pagedattn.perf.report import REFERENCE_PEER
from pagedattn.perf.roofline import Work
from pagedattn.perf.targets import TARGETS, Target, judge

ON_GPU = device.gpu_name() is not None
CASES = shapes.SETS["targets"]
TARGET_OF = {case: target for target in TARGETS for case in target.cases}
BATCH_SECONDS = 2e-3
RESULTS: list[Result] = []  # this session's rows, for the spread check
REFERENCE: dict[tuple[object, ...], Result] = {}  # the reference peer's row of each shape, measured once
WORK: dict[str, tuple[int, Work]] = {}  # rotations and the spec's work of each case (its pool is built once)

pytestmark = pytest.mark.skipif(not ON_GPU, reason="the speed targets are set for a GPU (H200); no GPU here")


def reference_result(case: shapes.Case, ceilings: Ceilings) -> Result:
    """The reference peer's row for ``case``: timed once per shape (it has no blocks), restated per case."""
    if case.name not in WORK:
        rotations = inputs.rotations_for(case, suite.GPU_FLUSH_BYTES)
        WORK[case.name] = (rotations, case_work(case, inputs.make_pool(case, rotations)))
    rotations, work = WORK[case.name]
    key = inputs.pool_key(case)
    if key not in REFERENCE:
        REFERENCE[key] = measure_peer(PEERS[REFERENCE_PEER](), case, rotations, work, ceilings, timing.GPU_POLICY)
    return restate(REFERENCE[key], case, work, ceilings)


def as_result(backend_name: str, case: shapes.Case, seconds: float, info: dict[str, Any]) -> Result:
    return Result(backend_name, case.name, case.model.name, case.kind, case.batch, case.context, case.block_size,
                  case.dtype, "ok", seconds=seconds, bytes=info["bytes"], flops=info["flops"], gbps=info["gbps"],
                  tflops=info["tflops"], pct_of_ceiling=info["pct_of_ceiling"])


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_target_case(benchmark: Any, backend_name: str, case: shapes.Case, ceilings: Ceilings) -> None:
    from pagedattn.backends.registry import load_backend

    backend = load_backend(backend_name)
    benchmark.group = f"targets/{backend_name}"
    prepared = suite.prepare(backend, case, suite.GPU_FLUSH_BYTES)
    for _ in range(max(2, prepared.rotations)):  # warm-up: compile and touch every rotation
        prepared.call()
    start = time.perf_counter()
    prepared.call()
    runs = max(1, round(BATCH_SECONDS / max(time.perf_counter() - start, 1e-6)))
    benchmark.pedantic(prepared.batch(runs), rounds=max(20, 2 * prepared.rotations), iterations=1)
    seconds = benchmark.stats.stats.median / runs
    info = suite.extra_info(prepared.work, seconds, ceilings)
    reference = reference_result(case, ceilings)
    speed = None if reference.seconds is None else reference.seconds / seconds
    benchmark.extra_info.update(info, case=case.name, runs_per_call=runs, reference_seconds=reference.seconds,
                                speed_vs_reference=speed)
    RESULTS.extend([as_result(backend_name, case, seconds, info), reference])
    target = TARGET_OF[case.name]
    single = judge(backend_name, Target(target.name, (case.name,), target.min_pct_of_ceiling,
                                        target.min_speed_vs_reference), RESULTS)
    assert single.status == "met", (
        f"{backend_name} {case.name}: {single.status} ({target.bars()}): {info['pct_of_ceiling']:.1f}% of"
        f" {info['read_ceiling_gbps']:.0f} GB/s / {info['matmul_ceiling_tflops']:.0f} TFLOP/s,"
        f" {speed if speed is None else round(speed, 3)}x {REFERENCE_PEER} ({reference.status})"
    )


@pytest.mark.parametrize("target", [t for t in TARGETS if t.max_spread is not None], ids=lambda t: t.name)
def test_target_spread(backend_name: str, target: Target) -> None:
    mine = {r.case: r for r in RESULTS if r.runner == backend_name}
    if any(c not in mine for c in target.cases):
        pytest.fail(f"{backend_name}: not every case of {target.name!r} was measured in this session")
    seconds = [mine[c].seconds or 0.0 for c in target.cases]
    spread = (max(seconds) - min(seconds)) / min(seconds)
    assert target.max_spread is not None and spread <= target.max_spread, (
        f"{backend_name} {target.name}: block sizes {100 * spread:.1f}% apart ({target.bars()})")
