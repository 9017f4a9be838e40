"""The GPU backends' speed targets and their verdicts on measured results.

A :class:`Target` names cases and the bars they must clear: a share of the roofline ceiling
measured in the same run, a speed relative to the unpaged reference peer (cuDNN SDPA on
contiguous K/V: ``reference time / backend time``, each timed the same way), and a largest
spread of times across the target's block sizes. Bars are judged on what an engine sees:
one call with the L2 flushed, and CUDA-graph replay (a backend that cannot be captured
misses). :func:`evaluate` turns one run's results into one :class:`Verdict` per backend and
target; a target some of whose cases were not measured (or whose reference was not) is
``not measured``, never ``met``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedattn.perf.measure import Result
from pagedattn.perf.peers import PEERS
from pagedattn.perf.report import REFERENCE_PEER
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
            parts.append(f">= {self.min_speed_vs_reference:g}x {REFERENCE_PEER}")
        if self.min_graph_speed_vs_reference is not None:
            parts.append(f"graph >= {self.min_graph_speed_vs_reference:g}x {REFERENCE_PEER}'s graph")
        if self.max_spread is not None:
            parts.append(f"block sizes within {100 * self.max_spread:g}%")
        return ", ".join(parts)


def _names(prefix: str) -> tuple[str, ...]:
    return tuple(f"{prefix}/bs{bs}" for bs in (16, 32, 64))


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
ALL_TARGETS: tuple[Target, ...] = TARGETS + SMALL_BATCH_TARGETS
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


VERDICT_HEADERS = ("backend", "target", "bars", "worst % ceiling", f"worst x {REFERENCE_PEER} speed",
                   "spread %", "verdict")


def judge(backend: str, target: Target, results: Sequence[Result], on: Sequence[str] = JUDGED_ON) -> Verdict:
    """The verdict of ``backend`` on ``target`` from one run's ``results`` (every runner's rows),
    every bar judged on each timing of ``on`` (keys of :data:`TIMINGS`); the worst figures."""
    mine = {r.case: r for r in results if r.runner == backend}
    reference = {r.case: r for r in results if r.runner == REFERENCE_PEER and r.status == "ok"}
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
            misses.append(f"{timing}: {pct:.1f}% of ceiling")
        if target.max_spread is not None and spread > target.max_spread:
            misses.append(f"{timing}: block sizes {100 * spread:.1f}% apart")
        bar = target.speed_bar(timing)
        if bar is None:
            continue
        references = [getattr(reference[c], field) if c in reference else None for c in target.cases]
        if any(t is None for t in references):
            return Verdict(backend, target, "not measured", worst_pct, spread=worst_spread,
                           reason=f"no {REFERENCE_PEER} {timing} rows")
        speed = min(ref / t for ref, t in zip(references, seconds, strict=True))
        worst_speed = speed if worst_speed is None else min(worst_speed, speed)
        if speed < bar:
            misses.append(f"{timing}: {speed:.2f}x {REFERENCE_PEER}")
    return Verdict(backend, target, "missed" if misses else "met", worst_pct, worst_speed, worst_spread,
                   "; ".join(misses))


def evaluate(results: Sequence[Result]) -> list[Verdict]:
    """Verdicts for every backend (not peer) that ran a case of some target, target by target."""
    measured = {r.case for r in results}
    backends = list(dict.fromkeys(r.runner for r in results if r.runner not in PEERS))
    return [judge(b, t, results) for b in backends for t in ALL_TARGETS if measured.intersection(t.cases)]
