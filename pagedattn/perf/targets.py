"""The GPU backends' speed targets (issues #4 and #5) and their verdicts on measured results.

A :class:`Target` names cases of the ``targets`` shape set and the bars they must clear:
a share of the roofline ceiling measured in the same run, a speed relative to the unpaged
reference peer (cuDNN SDPA on contiguous K/V: ``reference time / backend time``), and a
largest spread of times across the target's block sizes. :func:`evaluate` turns one run's
results into one :class:`Verdict` per backend and target; a target some of whose cases were
not measured (or whose reference was not) is ``not measured``, never ``met``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pagedattn.perf.measure import Result
from pagedattn.perf.peers import PEERS
from pagedattn.perf.report import REFERENCE_PEER


@dataclass(frozen=True)
class Target:
    """Bars a backend must clear on every one of ``cases`` (None: no bar of that kind)."""

    name: str
    cases: tuple[str, ...]
    min_pct_of_ceiling: float | None = None
    min_speed_vs_reference: float | None = None
    max_spread: float | None = None  # (slowest - fastest) / fastest over the cases

    def bars(self) -> str:
        parts = []
        if self.min_pct_of_ceiling is not None:
            parts.append(f">= {self.min_pct_of_ceiling:g}% of ceiling")
        if self.min_speed_vs_reference is not None:
            parts.append(f">= {self.min_speed_vs_reference:g}x {REFERENCE_PEER}")
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


def judge(backend: str, target: Target, results: Sequence[Result]) -> Verdict:
    """The verdict of ``backend`` on ``target`` from one run's ``results`` (every runner's rows)."""
    mine = {r.case: r for r in results if r.runner == backend}
    reference = {r.case: r for r in results if r.runner == REFERENCE_PEER and r.status == "ok"}
    missing = [c for c in target.cases if c not in mine or mine[c].status != "ok" or mine[c].seconds is None]
    if missing:
        why = mine[missing[0]].status if missing[0] in mine else "not run"
        return Verdict(backend, target, "not measured", reason=f"{missing[0].rsplit('/', 1)[1]} {why}")
    rows = [mine[c] for c in target.cases]
    seconds = [r.seconds or 0.0 for r in rows]
    pct = min(r.pct_of_ceiling or 0.0 for r in rows)
    spread = (max(seconds) - min(seconds)) / min(seconds)
    speed = None
    if target.min_speed_vs_reference is not None:
        if any(c not in reference for c in target.cases):
            return Verdict(backend, target, "not measured", pct, spread=spread, reason=f"no {REFERENCE_PEER} rows")
        speed = min((reference[c].seconds or 0.0) / s for c, s in zip(target.cases, seconds, strict=True))
    met = ((target.min_pct_of_ceiling is None or pct >= target.min_pct_of_ceiling)
           and (target.min_speed_vs_reference is None or (speed is not None and speed >= target.min_speed_vs_reference))
           and (target.max_spread is None or spread <= target.max_spread))
    return Verdict(backend, target, "met" if met else "missed", pct, speed, spread)


def evaluate(results: Sequence[Result]) -> list[Verdict]:
    """Verdicts for every backend (not peer) that ran a case of some target, target by target."""
    measured = {r.case for r in results}
    backends = list(dict.fromkeys(r.runner for r in results if r.runner not in PEERS))
    return [judge(b, t, results) for b in backends for t in TARGETS if measured.intersection(t.cases)]
