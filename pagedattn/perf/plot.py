"""The bench plot: achieved bandwidth against context length, one line per runner, ceiling drawn.

One panel per decode (model, batch) at the smallest block size measured; matplotlib is
imported here only, with the file-only Agg backend.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from pagedattn.perf.ceilings import Ceilings
from pagedattn.perf.measure import Result


def panels(results: Sequence[Result]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{panel: {runner: [(context, GB/s), ...]}}`` of the ok rows at each panel's smallest block size.

    Decode panels only when there are any (bandwidth is what decode is bound by).
    """
    if any(r.kind == "decode" for r in results):
        results = [r for r in results if r.kind == "decode"]
    smallest: dict[str, int] = {}
    for r in results:
        key = f"{r.model} {r.kind} b{r.batch}"
        smallest[key] = min(smallest.get(key, r.block_size), r.block_size)
    out: dict[str, dict[str, list[tuple[int, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        key = f"{r.model} {r.kind} b{r.batch}"
        if r.status == "ok" and r.gbps is not None and r.block_size == smallest[key]:
            out[key][r.runner].append((r.context, r.gbps))
    return {k: {runner: sorted(points) for runner, points in v.items()} for k, v in out.items()}


def save_plot(results: Sequence[Result], ceilings: Ceilings, path: Path, *, title: str) -> bool:
    """Write the PNG; return False (and write nothing) if there is nothing to draw."""
    data = panels(results)
    if not data:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = min(3, len(data))
    nrows = math.ceil(len(data) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.6 * nrows), squeeze=False)
    ceiling = ceilings.read_bytes_per_s / 1e9
    runners = sorted({runner for series in data.values() for runner in series})
    colors = {runner: f"C{i}" for i, runner in enumerate(runners)}
    for ax, (panel, series) in zip(axes.flat, sorted(data.items()), strict=False):
        for runner, points in sorted(series.items()):
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", label=runner, color=colors[runner])
        ax.axhline(ceiling, linestyle="--", color="black", linewidth=1, label=f"read ceiling {ceiling:.0f} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("GB/s")
        ax.set_ylim(0, max([ceiling] + [y for points in series.values() for _, y in points]) * 1.1)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(data):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
