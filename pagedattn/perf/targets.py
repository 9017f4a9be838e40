"""The GPU backends' speed targets and their verdicts on measured results.

A :class:`Target` names cases and the bars they must clear: a share of the roofline ceiling
measured in the same run, a speed relative to unpaged peers (cuDNN SDPA on contiguous K/V by
default, or the faster of several, such as cuDNN and flash SDPA: ``peer time / backend
time``, each timed the same way), and a largest spread of times across the target's block
sizes. Bars are judged on what an engine sees:
one call with the L2 flushed, and CUDA-graph replay (a backend that cannot be captured
misses). :func:`evaluate` turns one run's results into one :class:`Verdict` per backend and
target; a target some of whose cases were not measured (or whose peers were not) is
``not measured``, never ``met``. A peer that reports a case unsupported leaves the speed bar
to the other peers the target names; with none left the target is ``not measured``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from pagedattn.perf import shapes
from pagedattn.perf.inputs import kv_bytes_per_rotation
from pagedattn.perf.measure import Result
from pagedattn.perf.peers import PEERS
from pagedattn.perf.report import REFERENCE_PEER, slowed
from pagedattn.perf.shapes import SMALL_BATCH_DECODE


@dataclass(frozen=True)
class Target:
    """Bars a backend must clear on every one of ``cases`` (None: no bar of that kind)."""

    name: str
    cases: tuple[str, ...]
    min_pct_of_ceiling: float | None = None
    min_speed_vs_reference: float | None = None  # judged on every timing (one call, graph)
    max_spread: float | None = None  # (slowest - fastest) / fastest over the cases
    #: the speed bar of graph replay, where it differs from ``min_speed_vs_reference``
    min_graph_speed_vs_reference: float | None = None
    #: peers the speed bars compare with: the fastest of them that ran each case
    peers: tuple[str, ...] = (REFERENCE_PEER,)

    @property
    def peer_label(self) -> str:
        """``sdpa``, or ``the faster of sdpa and flash``."""
        if len(self.peers) == 1:
            return self.peers[0]
        return f"the faster of {', '.join(self.peers[:-1])} and {self.peers[-1]}"

    def speed_bar(self, timing: str) -> float | None:
        """The speed bar of ``timing`` (a key of :data:`TIMINGS`)."""
        if timing == "graph" and self.min_graph_speed_vs_reference is not None:
            return self.min_graph_speed_vs_reference
        return self.min_speed_vs_reference

    def bars(self) -> str:
        parts = []
        if self.min_pct_of_ceiling is not None:
            parts.append(f">= {self.min_pct_of_ceiling:g}% of ceiling")
        if self.min_speed_vs_reference is not None:
            parts.append(f">= {self.min_speed_vs_reference:g}x {self.peer_label}")
        if self.min_graph_speed_vs_reference is not None:
            parts.append(f"graph >= {self.min_graph_speed_vs_reference:g}x {self.peer_label}'s graph")
        if self.max_spread is not None:
            parts.append(f"block sizes within {100 * self.max_spread:g}%")
        return ", ".join(parts)


def _names(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}/bs{bs}" for bs in (16, 32, 64))


#: The backends the targets hold by default: the project's GPU kernels. torch on CUDA is a reference
#: (gathers, then SDPA): it is timed and kept in the baseline, not held to a kernel's bars.
TARGET_BACKENDS: tuple[str, ...] = ("triton", "cupy")

TARGETS: tuple[Target, ...] = (
    Target("decode 64 x 4096", _names("llama3-8b/decode/b64/ctx4096"), min_pct_of_ceiling=90.0,
           min_speed_vs_reference=0.95, max_spread=0.05),
    Target("decode 2 x 65536", _names("llama3-8b/decode/b2/ctx65536"), min_pct_of_ceiling=80.0),
    Target("causal prefill 8 x 4096", _names("llama3-8b/prefill/b8/ctx4096"), min_speed_vs_reference=0.7),
)
#: small-batch decode at the unpaged speed (the ``small-batch`` shape set): one call at least
#: 0.9x cuDNN's one call, graph replay at least 1.0x cuDNN's graph replay, at every block size
SMALL_BATCH_TARGETS: tuple[Target, ...] = tuple(
    Target(f"small-batch decode {batch} x {context}", _names(f"llama3-8b/decode/b{batch}/ctx{context}"),
           min_speed_vs_reference=0.9, min_graph_speed_vs_reference=1.0)
    for batch, context in SMALL_BATCH_DECODE
)
#: decode holding at least this much K/V must reach 90 % of the read ceiling
LARGE_KV_BYTES = 256 << 20
FASTER_OF_CUDNN_AND_FLASH: tuple[str, ...] = ("sdpa", "flash")


def _set_names(found: list[shapes.Case]) -> tuple[str, ...]:
    return tuple(c.name for c in found)


def _fp8_targets() -> tuple[Target, ...]:
    """fp8 decode at 85 % of the read ceiling (fp8 bytes), at every block size, e4m3 and e5m2,
    with and without scales."""
    return tuple(
        Target(f"fp8 {shapes.KV_LABELS[kv]} decode {batch} x {context}{' scaled' if scales != (1.0, 1.0) else ''}",
               _set_names(shapes.cases(["llama3-8b"], ["decode"], [batch], [context], kv_dtype=kv, scales=scales)),
               min_pct_of_ceiling=85.0)
        for batch, context in shapes.FP8_DECODE for kv in shapes.KV_LABELS
        for scales in ((1.0, 1.0), shapes.FP8_SCALES)
    )


def _layout_targets() -> tuple[Target, ...]:
    """head_dim 64/128/256 and 1/4/8 KV heads: 0.95x the faster of cuDNN and flash, 90 % of ceiling."""
    found = []
    for model, batch, context in shapes.LAYOUT_DECODE:
        m = shapes.MODELS[model]
        found.append(Target(
            f"decode {model} {batch} x {context} (d {m.head_dim}, {m.num_q_heads}/{m.num_kv_heads} heads)",
            _set_names(shapes.cases([model], ["decode"], [batch], [context])), min_pct_of_ceiling=90.0,
            min_speed_vs_reference=0.95, peers=FASTER_OF_CUDNN_AND_FLASH))
    return tuple(found)


def _prefill_targets() -> tuple[Target, ...]:
    """Causal prefill at 0.9x cuDNN's FLOP rate (0.85x for MHA), chunked prefill at 1.3x."""
    bars = {"llama2-7b": 0.85}
    found = [
        Target(f"causal prefill {model} {batch} x {context} {dtype}",
               _set_names(shapes.cases([model], ["prefill"], [batch], [context], dtype=dtype)),
               min_speed_vs_reference=bars.get(model, 0.9))
        for model, batch, context, dtype in shapes.PREFILL_SHAPES
    ]
    batch, context = shapes.CHUNKED_SHAPE
    found.append(Target(f"chunked prefill {batch} x {shapes.PREFILL_CHUNK} over {context}",
                        _set_names(shapes.cases(["llama3-8b"], ["chunked"], [batch], [context])),
                        min_speed_vs_reference=1.3))
    return tuple(found)


#: the ``kernel-gaps`` set's bars: fp8 caches at the byte limit, head_dim and head layouts at the
#: unpaged speed, short contexts at large batch, causal and chunked prefill against cuDNN
KERNEL_GAP_TARGETS: tuple[Target, ...] = (
    *_fp8_targets(),
    *_layout_targets(),
    Target("decode llama3-8b 64 x 1024", _set_names(shapes.cases(["llama3-8b"], ["decode"], [64], [1024])),
           min_pct_of_ceiling=90.0, min_speed_vs_reference=0.95),
    *_prefill_targets(),
)


def _quick_decode_targets() -> tuple[Target, ...]:
    """Every decode shape of the ``quick`` set: block sizes within 5 % where it runs all three, and
    90 % of the read ceiling where it holds at least :data:`LARGE_KV_BYTES` of K/V."""
    shapes_of: dict[tuple[str, int, int], list[shapes.Case]] = {}
    for case in shapes.SETS["quick"]:
        if case.kind == "decode":
            shapes_of.setdefault((case.model.name, case.batch, case.context), []).append(case)
    found = []
    for (model, batch, context), group in shapes_of.items():
        spread = 0.05 if {c.block_size for c in group} == set(shapes.BLOCK_SIZES) else None
        pct = 90.0 if kv_bytes_per_rotation(group[0]) >= LARGE_KV_BYTES else None
        if spread is not None or pct is not None:
            found.append(Target(f"quick decode {model} {batch} x {context}", _set_names(group),
                                min_pct_of_ceiling=pct, max_spread=spread))
    return tuple(found)


QUICK_DECODE_TARGETS: tuple[Target, ...] = _quick_decode_targets()
ALL_TARGETS: tuple[Target, ...] = TARGETS + SMALL_BATCH_TARGETS + KERNEL_GAP_TARGETS + QUICK_DECODE_TARGETS
#: timings a verdict may judge -> the Result field holding it
TIMINGS: dict[str, str] = {"one call": "one_call_s", "graph": "graph_s", "back to back": "seconds"}
#: what the bars are judged on: what an engine sees
JUDGED_ON: tuple[str, ...] = ("one call", "graph")


@dataclass(frozen=True)
class Verdict:
    """One backend against one target: ``met``, ``missed`` or ``not measured``, with the figures."""

    backend: str
    target: Target
    status: str
    worst_pct_of_ceiling: float | None = None
    worst_speed_vs_reference: float | None = None
    spread: float | None = None
    reason: str = ""

    def row(self) -> tuple[str, ...]:
        def fmt(x: float | None, spec: str) -> str:
            return "" if x is None else format(x, spec)

        return (self.backend, self.target.name, self.target.bars(), fmt(self.worst_pct_of_ceiling, ".1f"),
                fmt(self.worst_speed_vs_reference, ".2f"), fmt(None if self.spread is None else 100 * self.spread,
                                                                ".1f"), self.status if not self.reason else
                f"{self.status}: {self.reason}")


VERDICT_HEADERS = ("backend", "target", "bars", "worst % ceiling", "worst x peer speed", "spread %", "verdict")


def fastest_peer_seconds(target: Target, results: Sequence[Result], field: str) -> tuple[list[float] | None, str]:
    """Per case of ``target``, the least ``field`` time among its peers that ran it; or None and why
    not (a peer not run or failed on a case, or none of them able to run it)."""
    rows = {(r.runner, r.case): r for r in results if r.runner in target.peers}
    times: list[float] = []
    for case in target.cases:
        ran: list[float] = []
        for peer in target.peers:
            row = rows.get((peer, case))
            if row is None or row.status not in ("ok", "unsupported"):
                return None, f"no {peer} rows ({'not run' if row is None else row.status})"
            if row.status == "unsupported":
                continue
            seconds = getattr(row, field)
            if seconds is None:
                return None, f"no {peer} rows with this time"
            ran.append(seconds)
        if not ran:
            return None, f"{target.peer_label}: unsupported on {case}"
        times.append(min(ran))
    return times, ""


def _short_of(value: float, bar: float, digits: int) -> str:
    """``value`` below ``bar`` to ``digits`` decimals, never rounded up to the bar it missed."""
    shown = f"{value:.{digits}f}"
    return shown if float(shown) < bar else f"{math.floor(value * 10**digits) / 10**digits:.{digits}f}"


def _past(value: float, bar: float, digits: int) -> str:
    """``value`` above ``bar`` to ``digits`` decimals, never rounded down to the bar it passed."""
    shown = f"{value:.{digits}f}"
    return shown if float(shown) > bar else f"{math.ceil(value * 10**digits) / 10**digits:.{digits}f}"


def judge(backend: str, target: Target, results: Sequence[Result], on: Sequence[str] = JUDGED_ON) -> Verdict:
    """The verdict of ``backend`` on ``target`` from one run's ``results`` (every runner's rows),
    every bar judged on each timing of ``on`` (keys of :data:`TIMINGS`); the worst figures."""
    mine = {r.case: r for r in results if r.runner == backend}
    missing = [c for c in target.cases if c not in mine or mine[c].status != "ok" or mine[c].seconds is None]
    if missing:
        why = mine[missing[0]].status if missing[0] in mine else "not run"
        return Verdict(backend, target, "not measured", reason=f"{missing[0].rsplit('/', 1)[1]} {why}")
    rows = [mine[c] for c in target.cases]
    worst_pct: float | None = None
    worst_speed: float | None = None
    worst_spread: float | None = None
    misses: list[str] = []
    for timing in on:
        field = TIMINGS[timing]
        seconds = [getattr(r, field) for r in rows]
        if any(t is None for t in seconds):
            row = rows[seconds.index(None)]
            if timing == "graph":  # measured, but not captured: the backend misses graph bars
                misses.append(f"no graph replay ({row.graph_note or 'not captured'})")
                continue
            return Verdict(backend, target, "not measured", reason=f"no {timing} time for bs{row.block_size}")
        pct = min((r.pct_of_ceiling or 0.0) * (r.seconds or 0.0) / t for r, t in zip(rows, seconds, strict=True))
        spread = (max(seconds) - min(seconds)) / min(seconds)
        worst_pct = pct if worst_pct is None else min(worst_pct, pct)
        worst_spread = spread if worst_spread is None else max(worst_spread, spread)
        if target.min_pct_of_ceiling is not None and pct < target.min_pct_of_ceiling:
            misses.append(f"{timing}: {_short_of(pct, target.min_pct_of_ceiling, 1)}% of ceiling")
        if target.max_spread is not None and spread > target.max_spread:
            misses.append(f"{timing}: block sizes {_past(100 * spread, 100 * target.max_spread, 1)}% apart")
        bar = target.speed_bar(timing)
        if bar is None:
            continue
        references, why = fastest_peer_seconds(target, results, field)
        if references is None:
            return Verdict(backend, target, "not measured", worst_pct, spread=worst_spread,
                           reason=f"{timing}: {why}")
        speed = min(ref / t for ref, t in zip(references, seconds, strict=True))
        worst_speed = speed if worst_speed is None else min(worst_speed, speed)
        if speed < bar:
            misses.append(f"{timing}: {_short_of(speed, bar, 2)}x {target.peer_label}")
    slowed_rows = [r for r in results if r.case in target.cases and (r.runner == backend or r.runner in target.peers)
                   and slowed(r)]
    if misses and slowed_rows:  # a miss the GPU's own slowdown may explain: said, never excused
        labels = dict.fromkeys(  # a peer timed once per shape stands for each block size: named once
            (f"{r.runner} ({', '.join(r.gpu_state.slowdowns)})" if r.runner in target.peers else
             f"{r.runner} bs{r.block_size} ({', '.join(r.gpu_state.slowdowns)})") for r in slowed_rows if r.gpu_state)
        misses.append("timed while the GPU slowed: " + ", ".join(labels))
    return Verdict(backend, target, "missed" if misses else "met", worst_pct, worst_speed, worst_spread,
                   "; ".join(misses))


def evaluate(results: Sequence[Result]) -> list[Verdict]:
    """Verdicts for every backend (not peer) that ran a case of some target, target by target."""
    measured = {r.case for r in results}
    backends = list(dict.fromkeys(r.runner for r in results if r.runner not in PEERS))
    return [judge(b, t, results) for b in backends for t in ALL_TARGETS if measured.intersection(t.cases)]
