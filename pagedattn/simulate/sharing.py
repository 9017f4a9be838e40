"""What sharing KV blocks saves in beam search and parallel sampling, against copying.

For each width K, one workload runs four ways on paging at one block size: beam search of K
beams and parallel sampling of K samples, each with sharing (forks share every block, the
partial last block is copied on write) and with copying (every beam or sample holds a copy
of its parent's whole cache). Measured over the steps with a request running:

- ``saving``: ``1 - sum(blocks held) / sum(blocks the same sequences would hold copied)``,
  in the sharing run (the vLLM paper's measure, Kwon et al., SOSP 2023, section 6.3);
- block copies per step: copy-on-write in the sharing run (the pairs ``copy_blocks`` gets),
  whole caches in the copying run;
- concurrent requests, preemptions and steps to drain the workload in each run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pagedattn.errors import PagedAttentionError
from pagedattn.simulate.beam import BeamModel
from pagedattn.simulate.meter import Meter, Summary
from pagedattn.simulate.paged import simulate_paged
from pagedattn.simulate.workload import Request, WorkloadSpec, generate

#: Memory saved by sharing, % of the blocks without sharing (Kwon et al., SOSP 2023, fig. 15:
#: OPT-13B on the Alpaca trace). Widths 2 and 6 are the ends of the ranges the text states
#: (6.1-9.8%, 37.6-55.2%); width 4 is read from the figure's bars.
PAPER_SAVING: dict[str, dict[int, float]] = {
    "parallel": {2: 6.1, 4: 8.5, 6: 9.8},
    "beam": {2: 37.6, 4: 53.1, 6: 55.2},
}
MODES: tuple[str, ...] = ("beam", "parallel")


@dataclass(frozen=True)
class RunStats:
    """One run reduced over its steps with a request running."""

    summary: Summary
    meter: Meter
    blocks_held: float  # mean blocks held
    blocks_copied: float  # mean blocks the same sequences would hold with copying
    saving: float  # 1 - sum(held) / sum(copied)
    copies_per_step: float
    copies_per_request: float  # block copies per running request per step
    mean_running: float
    peak_running: int
    steps: int
    preempted: int


@dataclass(frozen=True)
class SharingResult:
    """One width, one mode (``"beam"`` or ``"parallel"``): the sharing and the copying run."""

    mode: str
    width: int
    shared: RunStats
    copied: RunStats

    @property
    def paper_saving(self) -> float | None:
        """The vLLM paper's saving at this mode and width, in %, if it measured it."""
        return PAPER_SAVING[self.mode].get(self.width)


def run_stats(summary: Summary, meter: Meter) -> RunStats:
    """Reduce a paging run to :class:`RunStats` (means over the steps with a request running)."""
    running = np.asarray(meter.running, dtype=np.float64)
    busy = running > 0
    if not busy.any():
        busy = np.ones_like(running, dtype=bool)
    blocks = np.asarray(meter.blocks, dtype=np.float64)[busy]
    references = np.asarray(meter.references, dtype=np.float64)[busy]
    copies = np.asarray(meter.copies, dtype=np.float64)[busy]
    return RunStats(
        summary=summary,
        meter=meter,
        blocks_held=float(blocks.mean()),
        blocks_copied=float(references.mean()),
        saving=float(1.0 - blocks.sum() / references.sum()) if references.sum() else 0.0,
        copies_per_step=float(copies.mean()),
        copies_per_request=float(copies.sum() / running[busy].sum()) if running.any() else 0.0,
        mean_running=float(running[busy].mean()),
        peak_running=int(running.max(initial=0)),
        steps=len(meter.running),
        preempted=summary.preempted,
    )


def _check(mode: str, width: int) -> None:
    if mode not in MODES:
        raise PagedAttentionError("mode", f"expected one of {MODES}, received {mode!r}")
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise PagedAttentionError("width", f"expected an integer >= 1, received {width!r}")


def widen(requests: Sequence[Request], mode: str, width: int) -> list[Request]:
    """The requests of a trace, each made a beam search of ``width`` beams (``mode="beam"``) or
    ``width`` parallel samples of its first output length (``mode="parallel"``)."""
    _check(mode, width)
    if mode == "beam":
        return [replace(r, output_lens=r.output_lens[:1], beam_width=width) for r in requests]
    return [replace(r, output_lens=r.output_lens[:1] * width, beam_width=1) for r in requests]


def workload(spec: WorkloadSpec, mode: str, width: int, fraction: float) -> list[Request]:
    """The generated workload with ``fraction`` of its requests in ``mode`` at ``width``
    (parallel samples draw their output lengths independently)."""
    _check(mode, width)
    if mode == "beam":
        return generate(replace(spec, beam_width=width, beam_fraction=fraction,
                                parallel_n=1, parallel_fraction=0.0))
    return generate(replace(spec, parallel_n=width, parallel_fraction=fraction,
                            beam_width=1, beam_fraction=0.0))


def compare_sharing(
    requests: Sequence[Request],
    mode: str,
    width: int,
    capacity: int,
    *,
    block_size: int,
    beam_model: BeamModel | None = None,
) -> SharingResult:
    """Run ``requests`` (already in ``mode`` at ``width``) with sharing and with copying."""
    _check(mode, width)
    runs = [
        run_stats(*simulate_paged(list(requests), capacity, block_size=block_size,
                                  sharing=sharing, beam_model=beam_model))
        for sharing in (True, False)
    ]
    return SharingResult(mode, width, runs[0], runs[1])


HEADERS = (
    "workload",
    "blocks held",
    "if copied",
    "saving",
    "paper",
    "CoW copies/step",
    "copying copies/step",
    "requests",
    "copying: requests",
    "steps",
    "copying: steps",
    "preempted",
    "copying: preempted",
)


def table_rows(results: Sequence[SharingResult]) -> list[list[str]]:
    """The report's rows, one per mode and width (see :data:`HEADERS`)."""
    rows = []
    for r in results:
        paper = r.paper_saving
        name = f"beam K={r.width}" if r.mode == "beam" else f"parallel n={r.width}"
        s, c = r.shared, r.copied
        rows.append([
            name,
            f"{s.blocks_held:,.0f}",
            f"{s.blocks_copied:,.0f}",
            f"{100 * s.saving:.1f}%",
            "-" if paper is None else f"{paper:.1f}%",
            f"{s.copies_per_step:,.1f}",
            f"{c.copies_per_step:,.1f}",
            f"{s.mean_running:,.1f}",
            f"{c.mean_running:,.1f}",
            str(s.steps),
            str(c.steps),
            str(s.preempted),
            str(c.preempted),
        ])
    return rows


def _smooth(values: Sequence[int], window: int) -> np.ndarray:
    data = np.asarray(values, dtype=np.float64)
    if window <= 1 or data.shape[0] < window:
        return data
    return np.convolve(data, np.ones(window) / window, mode="same")


COLORS = {"beam": "tab:blue", "parallel": "tab:orange"}


def plot_figure(results: Sequence[SharingResult], num_blocks: int) -> Any:
    """A column per width: blocks held against copying, block copies per step, requests.

    Colour is the workload (beam search, parallel sampling); a solid line is sharing with
    copy-on-write, a dashed one copying (in the first row: what the sharing run's sequences
    would hold copied, the paper's measure; below: the copying run itself).
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    widths = sorted({r.width for r in results})
    fig, axes = plt.subplots(3, len(widths), figsize=(4.8 * len(widths) + 0.6, 10), squeeze=False)
    window = 1
    for col, width in enumerate(widths):
        memory, copies, running = axes[0][col], axes[1][col], axes[2][col]
        title = [f"width {width}"]
        for r in (r for r in results if r.width == width):
            color = COLORS[r.mode]
            shared, copied = r.shared.meter, r.copied.meter
            memory.plot(shared.blocks, color=color, linewidth=1.2)
            memory.plot(shared.references, color=color, linewidth=1.0, linestyle="--")
            window = max(1, max(len(shared.copies), len(copied.copies)) // 100)
            copies.plot(_smooth(shared.copies, window), color=color, linewidth=1.2)
            copies.plot(_smooth(copied.copies, window), color=color, linewidth=1.0, linestyle="--")
            running.plot(shared.running, color=color, linewidth=1.2)
            running.plot(copied.running, color=color, linewidth=1.0, linestyle="--")
            paper = r.paper_saving
            title.append(f"{r.mode} saves {100 * r.shared.saving:.0f}% of blocks"
                         + ("" if paper is None else f" (paper, Alpaca: {paper:.0f}%)"))
        highest = max((max(r.shared.meter.references, default=0) for r in results
                       if r.width == width), default=0)
        if num_blocks <= 1.3 * highest:
            memory.axhline(num_blocks, color="gray", linestyle=":", linewidth=1)
        else:  # drawing the budget would flatten the data
            memory.text(0.98, 0.95, f"KV budget: {num_blocks:,} blocks, above the scale",
                        transform=memory.transAxes, ha="right", va="top", fontsize=7,
                        color="gray")
        memory.set_title("\n".join(title), fontsize=9)
        copies.set_yscale("symlog", linthresh=1)
        running.set_xlabel("step")
        if col == 0:
            memory.set_ylabel("KV blocks held\n(dashed: the same sequences copied)")
            copies.set_ylabel(f"block copies per step\n(mean over {window} steps)")
            running.set_ylabel("running requests")
    handles = [
        Line2D([], [], color=COLORS["beam"], label="beam search"),
        Line2D([], [], color=COLORS["parallel"], label="parallel sampling"),
        Line2D([], [], color="black", label="sharing + copy-on-write"),
        Line2D([], [], color="black", linestyle="--", label="copying every beam's cache"),
        Line2D([], [], color="gray", linestyle=":", label="KV budget"),
    ]
    ncol = min(len(handles), 2 * len(widths))  # one row when there is room, else several
    rows = -(-len(handles) // ncol)
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.012 + 0.022 * rows, 1, 1))
    return fig


def save_plot(results: Sequence[SharingResult], num_blocks: int, path: str) -> str | None:
    """Save :func:`plot_figure` to ``path``; return why not (no matplotlib), or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no plot saved"
    fig = plot_figure(results, num_blocks)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return None
