"""The GPU speed targets as benchmarks (:mod:`pagedattn.perf.targets`), asserted.

Each backend runs every case of the ``targets`` set; a timed call queues enough runs to
last ``timing.GPU_POLICY.target_batch_s`` (20 ms) and synchronizes once (as ``pagedattn bench``
times: :func:`pagedattn.perf.timing.runs_per_batch`), so the per-run median
is pytest-benchmark's median divided by ``runs_per_call`` (in ``extra_info``). The unpaged
reference (cuDNN SDPA on contiguous K/V) is timed in the same session, once per shape (it
has no blocks), and that time stands for each block size of the shape.
A case fails when it misses its target's share of the ceiling or speed against the
reference; the block-size spread is asserted once all of a target's cases ran. The targets
hold the project's GPU kernels (:data:`~pagedattn.perf.targets.TARGET_BACKENDS`), or the
backends ``--perf-backends`` names. Without a
GPU the targets do not apply and these benchmarks are skipped with that reason.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from pagedattn.perf import device, inputs, shapes, suite, timing
from pagedattn.perf.ceilings import Ceilings
from pagedattn.perf.measure import Result, case_work, figures, measure_peer, restate
from pagedattn.perf.peers import PEERS
from pagedattn.perf.report import REFERENCE_PEER
from pagedattn.perf.roofline import Work
from pagedattn.perf.targets import TARGET_BACKENDS, TARGETS, Target, judge

ON_GPU = device.gpu_name() is not None
JUDGED_BACKENDS = TARGET_BACKENDS  # see conftest.pytest_generate_tests
CASES = shapes.SETS["targets"]
TARGET_OF = {case: target for target in TARGETS for case in target.cases}
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


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_target_case(benchmark: Any, backend_name: str, case: shapes.Case, ceilings: Ceilings,
                     input_kind: str) -> None:
    from pagedattn.backends.registry import load_backend

    backend = load_backend(backend_name)
    benchmark.group = f"targets/{backend_name}"
    prepared = suite.prepare(backend, case, suite.GPU_FLUSH_BYTES, input_kind)
    prepared.warm_up()
    start = time.perf_counter()
    prepared.call()
    runs = timing.runs_per_batch(time.perf_counter() - start, timing.GPU_POLICY)
    with suite.settled_rounds(benchmark) as sampled:
        benchmark.pedantic(prepared.batch(runs), rounds=max(20, 2 * prepared.rotations), iterations=1)
    seconds = benchmark.stats.stats.median / runs
    info = suite.extra_info(prepared.work, seconds, ceilings)
    reference = reference_result(case, ceilings)
    speed = None if reference.seconds is None else reference.seconds / seconds
    benchmark.extra_info.update(info, case=case.name, runs_per_call=runs, reference_seconds=reference.seconds,
                                speed_vs_reference=speed)
    mine = figures(backend_name, case, timing.Timing(seconds, [], runs), prepared.work, ceilings, prepared.rotations)
    mine.gpu_state = sampled.state
    RESULTS.extend([mine, reference])
    target = TARGET_OF[case.name]
    single = judge(backend_name, Target(target.name, (case.name,), target.min_pct_of_ceiling,
                                        target.min_speed_vs_reference), RESULTS, on=("back to back",))
    assert single.status == "met", (
        f"{backend_name} {case.name}: {single.status} ({target.bars()}): {info['pct_of_ceiling']:.1f}% of"
        f" {info['read_ceiling_gbps']:.0f} GB/s / {info['matmul_ceiling_tflops']:.0f} TFLOP/s,"
        f" {speed if speed is None else round(speed, 3)}x {REFERENCE_PEER} ({reference.status})"
        + ("" if sampled.state is None else f"; the GPU reported {sampled.state.describe()}")
    )


@pytest.mark.parametrize("target", [t for t in TARGETS if t.max_spread is not None], ids=lambda t: t.name)
def test_target_spread(backend_name: str, target: Target) -> None:
    verdict = judge(backend_name, Target(target.name, target.cases, max_spread=target.max_spread), RESULTS,
                    on=("back to back",))
    if verdict.status == "not measured":
        pytest.fail(f"{backend_name}: not every case of {target.name!r} was measured in this session"
                    f" ({verdict.reason})")
    assert verdict.status == "met", (
        f"{backend_name} {target.name}: block sizes {100 * (verdict.spread or 0.0):.1f}% apart ({target.bars()})")
