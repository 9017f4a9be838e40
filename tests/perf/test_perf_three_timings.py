"""What an engine sees, timed three ways: the plumbing on the CPU with fake clocks and a fake
graph (the real CUDA-graph capture is in the backends' ``gpu`` tests)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pagedattn.perf import engine, shapes, timing
from pagedattn.perf.measure import Result
from pagedattn.perf.targets import SMALL_BATCH_TARGETS, TARGETS, judge


class FakeClock:
    """A clock that advances only when a fake run says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_call_flushes_before_every_run_and_times_only_the_run() -> None:
    clock, events = FakeClock(), []

    def run(i: int) -> None:
        events.append(("run", i))
        clock.now += 3e-6 if i % 2 else 5e-6

    def flush() -> None:
        events.append(("flush", -1))
        clock.now += 1.0  # a flush is never timed

    result = timing.one_call(run, timing.HostMarks(lambda: None, clock), flush, repeats=5)
    assert [e[0] for e in events] == ["flush", "run"] * 5
    assert result.median_s == pytest.approx(5e-6) and result.runs_per_batch == 1
    assert sorted(result.samples_s) == pytest.approx([3e-6, 3e-6, 5e-6, 5e-6, 5e-6])


def test_graph_replay_is_per_run_and_uploads_first() -> None:
    clock, replays = FakeClock(), [0]

    def replay() -> None:
        replays[0] += 1
        clock.now += 40e-6  # a graph of 10 runs

    result = timing.graph_replay(replay, timing.HostMarks(lambda: None, clock), calls=10, repeats=4)
    assert replays[0] == 5, "one untimed replay, then the timed ones"
    assert result.median_s == pytest.approx(4e-6) and result.runs_per_batch == 10


FAST = timing.TimingPolicy(target_batch_s=0.0, budget_s=0.0, min_repeats=2, max_repeats=2)


def _three(capture: Any, graph_note: str = "") -> timing.ThreeTimings:
    clock = FakeClock()

    def run(i: int) -> None:
        clock.now += 2e-6

    return timing.three_timings(run, lambda: None, marks=timing.HostMarks(lambda: None, clock), flush=lambda: None,
                                capture=capture, policy=FAST, graph_note=graph_note)


def test_a_runner_without_capture_reports_why_in_the_graph_column_never_a_number() -> None:
    three = _three(None, "torch: its plan is not capturable")
    assert three.graph is None and three.graph_note == "torch: its plan is not capturable"
    assert three.one_call.median_s == pytest.approx(2e-6)


def test_a_failed_capture_is_reported_not_timed() -> None:
    def capture(run: Any, calls: int) -> Any:
        raise timing.GraphUnsupported("capture failed: operation not permitted when stream is capturing")

    three = _three(capture)
    assert three.graph is None and three.graph_note.startswith("capture failed")


def test_a_captured_graph_of_the_runs_is_replayed() -> None:
    captured: list[int] = []

    def capture(run: Any, calls: int) -> Any:
        captured.append(calls)
        return lambda: [run(i) for i in range(calls)]

    three = _three(capture)
    assert captured == [timing.GRAPH_CALLS]
    assert three.graph is not None and three.graph.runs_per_batch == timing.GRAPH_CALLS


def test_host_time_per_call_counts_the_host_only() -> None:
    clock, syncs = FakeClock(), [0]

    def run(i: int) -> None:
        clock.now += 7e-6

    def synchronize() -> None:
        syncs[0] += 1
        clock.now += 1.0  # waiting for the device is outside the timed span

    result = timing.host_time_per_call(run, calls=100, repeats=3, clock=clock, synchronize=synchronize)
    assert result.median_s == pytest.approx(7e-6) and syncs[0] == 4


class NativeOnly:
    name = "native"

    def to_device(self, array: np.ndarray) -> Any:
        return ("native", array)


def test_inputs_are_native_for_a_backend_that_takes_no_torch_cuda_tensors() -> None:
    array = np.zeros(3, np.float32)
    for kind in engine.INPUT_KINDS:
        assert engine.to_device(NativeOnly(), array, kind)[0] == "native"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="inputs='cupy'"):
        engine.to_device(NativeOnly(), array, "cupy")  # type: ignore[arg-type]


def test_quick_shapes_hold_the_small_batches_at_every_block_size() -> None:
    names = {c.name for c in shapes.SETS["quick"]}
    for batch in (1, 4, 8, 16):
        for context in (2048, 8192):
            for bs in (16, 32, 64):
                assert f"llama3-8b/decode/b{batch}/ctx{context}/bs{bs}" in names
    small = {c.name for c in shapes.SETS["small-batch"]}
    assert small == {c for t in SMALL_BATCH_TARGETS for c in t.cases}
    assert small <= {c.name for c in shapes.SETS["full"]}


def _row(runner: str, case: str, one: float, graph: float | None, note: str = "") -> Result:
    model, kind, batch, context, bs = case.split("/")
    return Result(runner, case, model, kind, int(batch[1:]), int(context[3:]), int(bs[2:]), "bfloat16", "ok",
                  seconds=one, pct_of_ceiling=50.0, one_call_s=one, graph_s=graph, graph_note=note)


SMALL = SMALL_BATCH_TARGETS[3]  # 8 x 2048


def _small_rows(one: float, graph: float | None, note: str = "") -> list[Result]:
    mine = [_row("kern", c, one, graph, note) for c in SMALL.cases]
    return mine + [_row("sdpa", c, 41e-6, 24e-6) for c in SMALL.cases]


@pytest.mark.parametrize("one, graph, status", [
    (45e-6, 24e-6, "met"),  # 0.91x one call, 1.0x graph
    (46e-6, 24e-6, "missed"),  # one call under 0.9x
    (40e-6, 25e-6, "missed"),  # graph under 1.0x
])
def test_small_batch_bars_are_judged_on_one_call_and_graph(one: float, graph: float, status: str) -> None:
    assert SMALL.name == "small-batch decode 8 x 2048"
    assert judge("kern", SMALL, _small_rows(one, graph)).status == status


def test_a_backend_that_cannot_be_captured_misses_a_graph_bar() -> None:
    verdict = judge("kern", SMALL, _small_rows(30e-6, None, "capture failed: previous error"))
    assert verdict.status == "missed" and "capture failed" in verdict.reason


def test_old_targets_are_judged_on_both_timings_too() -> None:
    decode = TARGETS[0]
    rows = [_row("kern", c, 1.0, 1.2) for c in decode.cases] + [_row("sdpa", c, 1.0, 1.0) for c in decode.cases]
    for r in rows:
        r.pct_of_ceiling = 95.0
    verdict = judge("kern", decode, rows)
    assert verdict.status == "missed" and "graph" in verdict.reason
