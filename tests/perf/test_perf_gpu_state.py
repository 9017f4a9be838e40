"""What the GPU reported while a cell was timed: the summary, the sampler, and how a slowed cell is shown."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from pagedattn.perf import gpu_state
from pagedattn.perf.gpu_state import GpuState, Sample, sampling, settle, settled, summarize
from pagedattn.perf.measure import Result
from pagedattn.perf.report import SLOWED_MARK, settle_summary, slowdown_notes, table_rows
from pagedattn.perf.targets import TARGETS, judge

DECODE = TARGETS[0]
IDLE, POWER_CAP, THERMAL, SYNC_BOOST = 0x1, 0x4, 0x20, 0x10


def test_summary_keeps_clock_range_peak_power_and_only_the_reasons_that_slow() -> None:
    state = summarize([Sample(1980, 420.0, IDLE), Sample(1935, 660.0, POWER_CAP | SYNC_BOOST),
                       Sample(1950, 500.0, THERMAL)])
    assert state == GpuState(3, 1935, 1980, 660.0, ("software power cap", "software thermal slowdown"))
    assert summarize([Sample(1980, 300.0, IDLE | SYNC_BOOST)]).slowdowns == ()  # type: ignore[union-attr]
    assert summarize([]) is None


class FakeGpu:
    """Readings from a list, the last one repeated; counts the reads."""

    def __init__(self, samples: list[Sample], power_limit_w: float = 700.0) -> None:
        self.samples, self.power_limit_w, self.reads = samples, power_limit_w, 0

    def read(self) -> Sample:
        self.reads += 1
        return self.samples[min(self.reads, len(self.samples)) - 1]


def test_sampler_reads_while_the_block_runs_and_summarizes_at_its_end() -> None:
    gpu = FakeGpu([Sample(1980, 100.0, 0), Sample(1980, 400.0, 0), Sample(1940, 650.0, POWER_CAP)])
    with sampling(gpu, interval_s=0.005) as sampled:
        assert sampled.state is None
        time.sleep(0.05)
    assert sampled.state is not None
    assert sampled.state.samples == gpu.reads - 1 >= 4  # the settle's read, then one at each end and some between
    assert sampled.state.slowdowns == ("software power cap",)
    assert (sampled.state.sm_clock_mhz_min, sampled.state.power_w_max) == (1940, 650.0)


def test_a_cell_waits_for_the_gpu_to_settle_and_no_longer() -> None:
    hot = [Sample(1500, 690.0, POWER_CAP), Sample(1980, 420.0, 0), Sample(1980, 360.0, 0)]
    cooling = FakeGpu([*hot, Sample(1980, 340.0, 0)])
    waited, unsettled = settle(cooling, max_wait_s=5.0, interval_s=0.001)
    assert cooling.reads == 4 and 0.0 < waited < 5.0 and not unsettled  # 690 W capped, 420 and 360 W above 350 W
    never = FakeGpu([Sample(1500, 690.0, POWER_CAP)])
    waited, unsettled = settle(never, max_wait_s=0.02, interval_s=0.001)
    assert 0.02 <= waited < 1.0 and unsettled
    assert settled(Sample(1980, 80.0, IDLE | SYNC_BOOST), 700.0)
    assert not settled(Sample(1980, 80.0, THERMAL), 700.0)
    with sampling(FakeGpu([Sample(1980, 690.0, 0), Sample(1980, 80.0, 0)]), interval_s=0.001) as sampled:
        pass
    assert sampled.state is not None and sampled.state.settle_s > 0.0 and sampled.state.power_w_max == 80.0
    with sampling(FakeGpu([Sample(1980, 690.0, 0), Sample(1980, 80.0, 0)]), settle_max_s=0.0) as sampled:
        pass
    assert sampled.state is not None and sampled.state.settle_s == 0.0 and sampled.state.power_w_max == 690.0


class FailingGpu(FakeGpu):
    """A GPU whose reads fail from the ``fail_from``-th on (NVML lost mid-run)."""

    def __init__(self, samples: list[Sample], fail_from: int) -> None:
        super().__init__(samples)
        self.fail_from = fail_from

    def read(self) -> Sample:
        if self.reads + 1 >= self.fail_from:
            self.reads += 1
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        return super().read()


def test_a_gpu_that_stops_answering_never_fails_the_measurement() -> None:
    hot = Sample(1500, 690.0, POWER_CAP)
    assert settle(FailingGpu([hot], fail_from=3), max_wait_s=5.0, interval_s=0.001)[0] < 5.0  # gives up waiting
    with sampling(FailingGpu([Sample(1980, 100.0, 0)], fail_from=4), interval_s=0.001) as sampled:
        time.sleep(0.02)
    assert sampled.state is not None and 1 <= sampled.state.samples <= 2
    with sampling(FailingGpu([hot], fail_from=1), interval_s=0.001) as sampled:
        pass
    assert sampled.state is None


def test_no_gpu_waits_for_and_samples_nothing() -> None:
    with sampling(None) as sampled:
        pass
    assert sampled.state is None


def test_no_nvml_on_a_machine_without_a_cuda_device() -> None:
    import torch

    if not torch.cuda.is_available():
        assert gpu_state.nvml_gpu() is None


def _rows(slowed_block: int | None) -> list[Result]:
    """The decode target's rows, block size 64 missing the speed bar; its row slowed at ``slowed_block``."""
    calm = GpuState(5, 1980, 1980, 420.0, ())
    capped = replace(calm, sm_clock_mhz_min=1935, slowdowns=("software power cap",))
    rows = []
    for runner, case, seconds in [*(("kern", c, s) for c, s in zip(DECODE.cases, (1.0, 1.0, 1.2), strict=True)),
                                  *(("sdpa", c, 1.0) for c in DECODE.cases)]:
        model, kind, batch, context, bs = case.split("/")
        block = int(bs[2:])
        rows.append(Result(runner, case, model, kind, int(batch[1:]), int(context[3:]), block, "bfloat16", "ok",
                           seconds=seconds, one_call_s=seconds, graph_s=seconds, pct_of_ceiling=95.0,
                           gpu_state=capped if runner == "kern" and block == slowed_block else calm))
    return rows


def test_a_slowed_row_is_marked_and_described() -> None:
    rows = _rows(slowed_block=64)
    marked = [r for r, cells in zip(rows, table_rows(rows), strict=True) if cells[0].endswith(SLOWED_MARK)]
    assert [(r.runner, r.block_size) for r in marked] == [("kern", 64)]
    (note,) = slowdown_notes(rows)
    assert note.startswith(f"{SLOWED_MARK} kern {DECODE.cases[2]}: timed while the GPU reported software power cap")
    assert "SM clock 1935-1980 MHz" in note


def test_a_miss_under_a_slowdown_says_so_and_stays_a_miss() -> None:
    slowed = judge("kern", DECODE, _rows(slowed_block=64))
    assert slowed.status == "missed"
    assert "timed while the GPU slowed: kern bs64 (software power cap)" in slowed.reason
    calm = judge("kern", DECODE, _rows(slowed_block=None))
    assert calm.status == "missed" and "slowed" not in calm.reason


def test_the_waits_are_summed_and_cells_that_never_settled_counted() -> None:
    rows = _rows(slowed_block=None)
    for r, wait in zip(rows, (0.5, 3.0, 0.0, 1.0, 0.0, 0.0), strict=True):
        r.gpu_state = replace(r.gpu_state, settle_s=wait, unsettled=wait == 3.0)  # type: ignore[type-var]
    assert settle_summary(rows) == ("the GPU settled before each of 6 cells: 4 s in all, at most 3.0 s;"
                                    " 1 started unsettled at the wait's bound")
    assert settle_summary([replace(r, gpu_state=None) for r in rows]) is None


def test_the_bench_takes_the_wait_bound_as_an_option() -> None:
    from pagedattn.perf.cli import parse_args

    assert parse_args(["--settle", "0"]).settle == 0.0
    assert parse_args([]).settle is None  # the policy's default
    with pytest.raises(SystemExit):
        parse_args(["--settle", "-1"])
