"""What the GPU reported while a cell was timed: the summary, the sampler, and how a slowed cell is shown."""

from __future__ import annotations

import itertools
import time
from dataclasses import replace

from pagedattn.perf import gpu_state
from pagedattn.perf.gpu_state import GpuState, Sample, sampling, summarize
from pagedattn.perf.measure import Result
from pagedattn.perf.report import SLOWED_MARK, slowdown_notes, table_rows
from pagedattn.perf.targets import TARGETS, judge

DECODE = TARGETS[0]
IDLE, POWER_CAP, THERMAL, SYNC_BOOST = 0x1, 0x4, 0x20, 0x10


def test_summary_keeps_clock_range_peak_power_and_only_the_reasons_that_slow() -> None:
    state = summarize([Sample(1980, 420.0, IDLE), Sample(1935, 660.0, POWER_CAP | SYNC_BOOST),
                       Sample(1950, 500.0, THERMAL)])
    assert state == GpuState(3, 1935, 1980, 660.0, ("software power cap", "software thermal slowdown"))
    assert summarize([Sample(1980, 300.0, IDLE | SYNC_BOOST)]).slowdowns == ()  # type: ignore[union-attr]
    assert summarize([]) is None


def test_sampler_reads_while_the_block_runs_and_summarizes_at_its_end() -> None:
    readings = itertools.cycle([Sample(1980, 400.0, 0), Sample(1940, 650.0, POWER_CAP)])
    calls = []

    def read() -> Sample:
        calls.append(time.perf_counter())
        return next(readings)

    with sampling(read, interval_s=0.005) as sampled:
        assert sampled.state is None
        time.sleep(0.05)
    assert sampled.state is not None
    assert sampled.state.samples == len(calls) >= 4  # one at each end and some between
    assert sampled.state.slowdowns == ("software power cap",)
    assert (sampled.state.sm_clock_mhz_min, sampled.state.power_w_max) == (1940, 650.0)


def test_no_reader_samples_nothing() -> None:
    with sampling(None) as sampled:
        pass
    assert sampled.state is None


def test_no_nvml_on_a_machine_without_a_cuda_device() -> None:
    import torch

    if not torch.cuda.is_available():
        assert gpu_state.nvml_reader() is None


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
