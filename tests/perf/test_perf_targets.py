"""The speed targets' verdicts: met, missed on each bar, and never met when rows are missing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pagedattn.perf import shapes
from pagedattn.perf.measure import Result
from pagedattn.perf.targets import TARGETS, Target, evaluate, judge

DECODE = TARGETS[0]


def row(runner: str, case: str, seconds: float, pct: float = 95.0, status: str = "ok") -> Result:
    model, kind, batch, context, bs = case.split("/")
    ok = status == "ok"
    return Result(runner, case, model, kind, int(batch[1:]), int(context[3:]), int(bs[2:]), "bfloat16", status,
                  seconds=seconds if ok else None, pct_of_ceiling=pct if ok else None,
                  one_call_s=seconds if ok else None, graph_s=seconds if ok else None)


def decode_rows(seconds: tuple[float, float, float], reference: float = 1.0, pct: float = 95.0) -> list[Result]:
    rows = [row("kern", c, s, pct) for c, s in zip(DECODE.cases, seconds, strict=True)]
    return rows + [row("sdpa", c, reference) for c in DECODE.cases]


def test_every_target_case_is_in_the_targets_set() -> None:
    names = {c.name for c in shapes.SETS["targets"]}
    assert {c for t in TARGETS for c in t.cases} == names


def test_met_when_every_bar_is_cleared() -> None:
    v = judge("kern", DECODE, decode_rows((1.02, 1.03, 1.04)))
    assert v.status == "met"
    assert v.worst_speed_vs_reference == pytest.approx(1 / 1.04)
    assert v.spread == pytest.approx((1.04 - 1.02) / 1.02)


@pytest.mark.parametrize("seconds, pct, why", [
    ((1.0, 1.0, 1.1), 95.0, "slowest block size 1.1x the reference: below 0.95x"),
    ((1.0, 1.0, 1.0), 89.9, "under 90% of the ceiling"),
])
def test_missed_on_one_bar(seconds: tuple[float, float, float], pct: float, why: str) -> None:
    assert judge("kern", DECODE, decode_rows(seconds, pct=pct)).status == "missed", why


def test_spread_alone_can_miss() -> None:
    target = Target("t", DECODE.cases, max_spread=0.05)
    assert judge("kern", target, decode_rows((1.0, 1.0, 1.06))).status == "missed"
    assert judge("kern", target, decode_rows((1.0, 1.0, 1.04))).status == "met"


def test_missing_or_failed_rows_are_not_measured_never_met() -> None:
    rows = decode_rows((1.0, 1.0, 1.0))
    assert judge("kern", DECODE, rows[1:]).status == "not measured"
    failed = [row("kern", DECODE.cases[0], 1.0, status="unsupported"), *rows[1:]]
    verdict = judge("kern", DECODE, failed)
    assert verdict.status == "not measured" and "unsupported" in verdict.reason
    no_reference = [r for r in rows if r.runner != "sdpa"]
    assert judge("kern", DECODE, no_reference).status == "not measured"


def test_evaluate_judges_backends_not_peers_on_the_targets_they_ran() -> None:
    verdicts = evaluate(decode_rows((1.0, 1.0, 1.0)))
    assert {v.backend for v in verdicts} == {"kern"}
    assert DECODE.name in [v.target.name for v in verdicts]
    assert all(set(v.target.cases) & set(DECODE.cases) for v in verdicts), "only targets of the cases run"
    assert "causal prefill 8 x 4096" not in [v.target.name for v in verdicts]


def test_the_benchmarks_reference_is_restated_per_block_size_even_when_unsupported() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_targets

    from pagedattn.perf.ceilings import Ceilings

    if bench_targets.ON_GPU:
        pytest.skip("on a GPU the reference runs: bench_targets.py itself covers it")
    small = shapes.cases(["llama3-8b"], ["decode"], [2], [64], dtype="float32")
    made_up = Ceilings(device="test", read_bytes_per_s=1e10, matmul_flops_per_s=1e11, how="made up")
    rows = [bench_targets.reference_result(case, made_up) for case in small]
    assert [r.case for r in rows] == [c.name for c in small] and [r.block_size for r in rows] == [16, 32, 64]
    assert all(r.status == "unsupported" and "CUDA" in r.reason for r in rows), rows
    assert len(bench_targets.REFERENCE) == 1, "one measurement per shape"


def test_a_miss_is_never_shown_rounded_onto_its_bar() -> None:
    verdict = judge("kern", DECODE, decode_rows((1.0, 1.0, 1 / 0.9496)))  # 0.9496x against a 0.95x bar
    assert verdict.status == "missed"
    assert "0.94x" in verdict.reason and "0.95x" not in verdict.reason.replace(">= 0.95x", "")
    close = judge("kern", DECODE, decode_rows((1.0, 1.0, 1.0), pct=89.96))  # 89.96 % against 90 %
    assert "89.9% of ceiling" in close.reason
