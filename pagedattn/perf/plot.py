"""The bench plot: achieved bandwidth per (model, kind, batch, cache) panel, every block size drawn.

A panel measured at several context lengths draws GB/s against context, one line per
runner and block size (colour: runner, line style and marker: block size). A panel
measured at one context length draws bars (one group per block size, one bar per runner).
The read ceiling is the dashed line, or a note where every point lies far below it (a
CPU), so that the points stay readable. Decode panels only when there are any (bandwidth is
what decode is bound by). matplotlib is imported here only, with the file-only Agg backend.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pagedattn.perf.ceilings import Ceilings
from pagedattn.perf.measure import Result
from pagedattn.perf.report import BLOCK_PART, format_rate

if TYPE_CHECKING:
    from matplotlib.axes import Axes

#: one (line style, marker) per block size, in increasing block size
BLOCK_STYLES: tuple[tuple[Any, str], ...] = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"))

CEILING_IN_VIEW = 0.25  # a panel whose best point is below this fraction of the ceiling scales to its data
LEGEND_INCHES = 0.45  # below the panels: the legend shared by all of them

Series = dict[tuple[str, int], list[tuple[int, float]]]


def _variant(case: str) -> str:
    """What a case name says after its block size (`` kv-e4m3 scaled``, `` in-order``): its own panel."""
    parts = case.split("/")
    after = next((i + 1 for i, part in enumerate(parts) if BLOCK_PART.fullmatch(part)), len(parts))
    return "".join(f" {part}" for part in parts[after:])


def panels(results: Sequence[Result]) -> dict[str, Series]:
    """``{panel: {(runner, block size): [(context, GB/s), ...]}}`` of the ok rows, sorted by context."""
    if any(r.kind == "decode" for r in results):
        results = [r for r in results if r.kind == "decode"]
    out: dict[str, Series] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.status == "ok" and r.gbps is not None:
            out[f"{r.model} {r.kind} b{r.batch}{_variant(r.case)}"][(r.runner, r.block_size)].append(
                (r.context, r.gbps))
    return {k: {key: sorted(points) for key, points in v.items()} for k, v in out.items()}


def contexts(series: Series) -> list[int]:
    return sorted({context for points in series.values() for context, _ in points})


def save_plot(results: Sequence[Result], ceilings: Ceilings, path: Path, *, title: str) -> str | None:
    """Write the PNG; return None, or why nothing was written (no ok rows, no matplotlib)."""
    data = panels(results)
    if not data:
        return "no timed rows to plot; no plot saved"
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.lines import Line2D
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib, or pip install 'pagedattn[report]'); no plot saved"

    ncols = min(3, len(data))
    nrows = math.ceil(len(data) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows + LEGEND_INCHES), squeeze=False)
    ceiling = ceilings.read_bytes_per_s / 1e9
    runners = sorted({runner for series in data.values() for runner, _ in series})
    block_sizes = sorted({bs for series in data.values() for _, bs in series})
    colors = {runner: f"C{i}" for i, runner in enumerate(runners)}
    styles = {bs: BLOCK_STYLES[i % len(BLOCK_STYLES)] for i, bs in enumerate(block_sizes)}
    drawn_styles: set[int] = set()  # block sizes drawn as lines (bars name theirs on the axis)
    ceiling_drawn = False
    for ax, (panel, series) in zip(axes.flat, sorted(data.items()), strict=False):
        panel_contexts = contexts(series)
        if len(panel_contexts) > 1:
            drawn_styles |= {bs for _, bs in series}
            for (runner, bs), points in sorted(series.items()):
                xs, ys = zip(*points, strict=True)
                linestyle, marker = styles[bs]
                ax.plot(xs, ys, linestyle=linestyle, marker=marker, color=colors[runner], markersize=4)
            ax.set_xscale("log", base=2)
            ax.set_xticks(panel_contexts, [str(c) for c in panel_contexts])
            ax.set_xlabel("context length (tokens)")
            ax.set_title(panel, fontsize=9)
        else:
            _bars(ax, series, runners, colors)
            ax.set_title(f"{panel} ctx{panel_contexts[0]}", fontsize=9)
        top = max(y for points in series.values() for _, y in points)
        ax.set_ylabel("GB/s")
        if top >= CEILING_IN_VIEW * ceiling:
            ax.axhline(ceiling, linestyle="--", color="black", linewidth=1)
            ceiling_drawn = True
            ax.set_ylim(0, max(ceiling, top) * 1.1)
        else:  # far below the ceiling (a CPU): scale to the data, state the ceiling in words
            ax.set_ylim(0, top * 1.2)
            ax.text(0.99, 0.97, f"read ceiling {format_rate(ceiling)} GB/s: off this scale", transform=ax.transAxes,
                    ha="right", va="top", fontsize=7)
    for ax in list(axes.flat)[len(data):]:
        ax.axis("off")
    handles = [Line2D([], [], color=colors[r], linewidth=2, label=r) for r in runners]
    handles += [Line2D([], [], color="gray", linestyle=styles[bs][0], marker=styles[bs][1], label=f"block {bs}")
                for bs in block_sizes if bs in drawn_styles]
    if ceiling_drawn:
        handles.append(Line2D([], [], color="black", linestyle="--", linewidth=1,
                              label=f"read ceiling {format_rate(ceiling)} GB/s"))
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 8), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, LEGEND_INCHES / (3.6 * nrows + LEGEND_INCHES), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def _bars(ax: Axes, series: Series, runners: list[str], colors: dict[str, str]) -> None:
    """One group per block size, one bar per runner (runners absent from the panel leave no gap)."""
    present = [r for r in runners if any(runner == r for runner, _ in series)]
    sizes = sorted({bs for _, bs in series})
    width = 0.8 / len(present)
    for i, runner in enumerate(present):
        xs, heights = [], []
        for g, bs in enumerate(sizes):
            points = series.get((runner, bs))
            if points:
                xs.append(g - 0.4 + width * (i + 0.5))
                heights.append(points[0][1])
        bars = ax.bar(xs, heights, width=width * 0.9, color=colors[runner])
        ax.bar_label(bars, labels=[format_rate(h) for h in heights], fontsize=7)
    ax.set_xticks(range(len(sizes)), [f"block {bs}" for bs in sizes])
