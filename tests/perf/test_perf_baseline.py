"""The benchmark suite's plumbing: machine info names the device, and a kept baseline that
the current run is much slower than fails it (``--benchmark-compare-fail``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pagedattn.perf import device

ROOT = Path(__file__).resolve().parents[2]
BENCH = "benchmarks/bench_numpy_reference.py"


def run_suite(tmp_path: Path, *args: str, baselines: Path | None = None) -> subprocess.CompletedProcess[str]:
    # not an xdist worker's variables: pytest-benchmark would take the run for a worker's and not time it
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}, "PYTHONPATH": str(ROOT)}
    if baselines is not None:
        env["PAGEDATTN_PERF_BASELINES"] = str(baselines)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "python_files=bench_*.py",
               BENCH, *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.skipif(device.gpu_name() is not None, reason="CPU run of the suite")
def test_machine_info_and_regression_against_a_kept_baseline(tmp_path: Path) -> None:
    first = tmp_path / "run.json"
    done = run_suite(tmp_path, "--perf-baseline=off", f"--benchmark-json={first}")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(first.read_text())
    assert doc["machine_info"]["device"] == "cpu" and doc["machine_info"]["gpu"] is None
    (bench,) = doc["benchmarks"]
    assert bench["extra_info"]["gbps"] > 0 and 0 < bench["extra_info"]["pct_of_ceiling"] < 100
    assert "tflops" in bench["extra_info"]

    # a kept baseline 100 times faster than now: the run must fail as a regression
    for field in ("min", "max", "mean", "median"):
        bench["stats"][field] /= 100
    kept = tmp_path / "baselines" / "cpu" / "baseline.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(json.dumps(doc))
    again = run_suite(tmp_path, baselines=tmp_path / "baselines")
    assert again.returncode != 0, again.stdout
    assert "Performance has regressed" in again.stdout + again.stderr
