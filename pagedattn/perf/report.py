"""The bench report: the table rows, the JSON document, and the human units."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pagedattn.perf.ceilings import Ceilings
from pagedattn.perf.measure import Result

REFERENCE_PEER = "sdpa"  # the unpaged reference: ratio = time / this peer's time
BLOCK_PART = re.compile(r"bs\d+")  # the block-size part of a case name
SLOWED_MARK = "!"  # beside the runner of a row timed while the GPU slowed its clocks
HEADERS = ("backend", "shape", "block", "one call", "back to back", "graph", "GB/s", "TFLOP/s", "% ceiling",
           "x unpaged")


def format_seconds(seconds: float) -> str:
    """``12.3 us``, ``4.56 ms``, ``1.23 s``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def format_rate(value: float) -> str:
    """Three significant figures without an exponent: ``4800``, ``12.3``, ``0.0284``; ``0`` for 0."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def add_reference_ratios(results: Sequence[Result]) -> None:
    """Set ``ratio_to_reference`` of every ok row whose case the reference peer measured."""
    reference = {r.case: r.seconds for r in results if r.runner == REFERENCE_PEER and r.status == "ok"}
    for r in results:
        ref = reference.get(r.case)
        if r.status == "ok" and ref and r.seconds:
            r.ratio_to_reference = r.seconds / ref


def _note_key(r: Result) -> tuple[str, str, str] | None:
    """The note a row refers to: why it was not timed, or what a timed peer ran differently."""
    if r.status != "ok" or r.seconds is None:
        return (r.runner, r.status, r.reason)
    return (r.runner, "note", r.note) if r.note else None


def _reasons(results: Sequence[Result]) -> dict[tuple[str, str, str], int]:
    """``{(runner, status, reason): note number}`` of the rows that were not timed, and ``(runner,
    "note", note)`` of timed rows with a note, numbered from 1."""
    numbers: dict[tuple[str, str, str], int] = {}
    for r in results:
        key = _note_key(r)
        if key is not None:
            numbers.setdefault(key, len(numbers) + 1)
    return numbers


def slowed(r: Result) -> bool:
    """Whether the GPU reported a clock slowdown (power cap, thermal) while ``r`` was timed."""
    return r.gpu_state is not None and bool(r.gpu_state.slowdowns)


def table_rows(results: Sequence[Result]) -> list[tuple[str, ...]]:
    """One row per result; a row not timed shows its status and a note number, the reason is in
    :func:`reason_notes` (a reason in the cell would widen the time column for every row); a
    timed row with a note (a peer that ran fp8 K/V in the query's dtype) has its number beside
    the runner, and a row timed under a clock slowdown :data:`SLOWED_MARK` (:func:`slowdown_notes`)."""
    numbers = _reasons(results)
    rows: list[tuple[str, ...]] = []
    for r in results:
        shape = "/".join(part for part in r.case.split("/") if not BLOCK_PART.fullmatch(part))  # block: own column
        if r.status != "ok" or r.seconds is None:
            note = numbers[(r.runner, r.status, r.reason)]
            rows.append((r.runner, shape, str(r.block_size), f"{r.status} [{note}]", "", "", "", "", "", ""))
            continue
        runner = f"{r.runner} [{numbers[(r.runner, 'note', r.note)]}]" if r.note else r.runner
        if slowed(r):
            runner += f" {SLOWED_MARK}"
        ratio = "" if r.ratio_to_reference is None else f"{r.ratio_to_reference:.2f}"
        one = "" if r.one_call_s is None else format_seconds(r.one_call_s)
        graph = format_seconds(r.graph_s) if r.graph_s is not None else (r.graph_note[:40] or "not timed")
        rows.append((runner, shape, str(r.block_size), one, format_seconds(r.seconds), graph,
                     format_rate(r.gbps or 0.0), format_rate(r.tflops or 0.0), f"{r.pct_of_ceiling:.1f}", ratio))
    return rows


def reason_notes(results: Sequence[Result]) -> list[str]:
    """``[N] runner status: reason``, once per distinct reason the table's rows refer to."""
    return [f"[{n}] {runner} {status}: {reason}" for (runner, status, reason), n in _reasons(results).items()]


def slowdown_notes(results: Sequence[Result]) -> list[str]:
    """``! runner case: what the GPU reported`` for each row timed under a clock slowdown."""
    return [f"{SLOWED_MARK} {r.runner} {r.case}: timed while the GPU reported {r.gpu_state.describe()}"
            for r in results if slowed(r) and r.gpu_state is not None]


def settle_summary(results: Sequence[Result]) -> str | None:
    """One line on the waits before the cells for the GPU to settle; None where none was sampled."""
    states = [r.gpu_state for r in results if r.gpu_state is not None]
    if not states:
        return None
    waits = [s.settle_s for s in states]
    unsettled = sum(s.unsettled for s in states)
    return (f"the GPU settled before each of {len(waits)} cells: {sum(waits):.0f} s in all, at most "
            f"{max(waits):.1f} s" + (f"; {unsettled} started unsettled at the wait's bound" if unsettled else ""))


def document(results: Sequence[Result], ceilings: Ceilings, *, command: str, machine: dict[str, Any],
             elapsed_s: float) -> dict[str, Any]:
    """The JSON document ``pagedattn bench`` writes."""
    return {
        "command": command,
        "machine": machine,
        "ceilings": ceilings.as_dict(),
        "elapsed_s": elapsed_s,
        "columns": {
            "seconds": "median time per run, runs back to back (batches between synchronizations)",
            "one_call_s": "median time of one run after an L2 flush (device events on a GPU)",
            "graph_s": "median time per run replaying a CUDA graph of several runs (None: graph_note says why)",
            "inputs": "what run received: torch tensors (as an engine passes) or the backend's own arrays",
            "gbps": "bytes the spec says the case must move / back-to-back time (pagedattn.perf.roofline)",
            "pct_of_ceiling": "max(bytes / read bandwidth, flops / matrix rate) / back-to-back time, in %",
            "ratio_to_reference": f"median time / median time of the '{REFERENCE_PEER}' peer (unpaged K/V)",
            "cache_dtype": "the dtype of K and V in the case (fp8 caches: the backends read fp8)",
            "note": "what a peer ran differently from the case (an fp8 case's K/V in the query's dtype)",
            "gpu_state": "what NVML reported while the row was timed: SM clock range, peak board power, clock"
                         " slowdowns (power cap, thermal); null where not sampled (no pynvml or no GPU)",
        },
        "results": [r.as_dict() for r in results],
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
