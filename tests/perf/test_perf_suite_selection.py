"""``tox -e perf`` stays short: the conformance suite's own timings run only with --perf-conformance."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def collected(*extra: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "-o", "python_files=bench_*.py", "benchmarks", *extra],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return [line for line in run.stdout.splitlines() if "::" in line]


def test_conformance_timings_are_opt_in() -> None:
    default = collected()
    assert default and not [node for node in default if node.startswith("benchmarks/bench_conformance.py")]
    asked = collected("--perf-conformance")
    conformance = [node for node in asked if node.startswith("benchmarks/bench_conformance.py")]
    assert "benchmarks/bench_conformance.py::test_quick_profile_numpy_suite" in conformance
    assert set(asked) == set(default) | set(conformance)
