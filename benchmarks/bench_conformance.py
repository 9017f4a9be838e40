"""pytest-benchmark figures of the conformance suite itself (not a correctness check).

- the ``quick`` profile on the numpy backend, whole suite (target: under 2 minutes on 2 CPU cores);
- the time the ``quick`` profile takes to kill each mutant (target: under 60 seconds each).

Minutes on a CPU, so left out of ``tox -e perf`` unless ``--perf-conformance`` is given.
Run: ``PYTHONPATH=. python3 -m pytest -o 'python_files=bench_*.py' benchmarks/bench_conformance.py
--perf-conformance --benchmark-group-by=group`` (one round each: a round is a whole suite run).
``extra_info`` records the target and, for mutants, the test that killed it.
"""

from __future__ import annotations

import tempfile

import pytest

from pagedattn.conformance.mutants import MUTANTS
from pagedattn.conformance.mutants.run import SUITE_MODULES, run_mutant, run_pytest_in_process

QUICK_SUITE_TARGET_S = 120.0
MUTANT_KILL_TARGET_S = 60.0

pytestmark = pytest.mark.conformance_timing


@pytest.mark.benchmark(group="conformance: quick profile, numpy, whole suite")
def test_quick_profile_numpy_suite(benchmark):
    def suite() -> int:
        with tempfile.TemporaryDirectory() as cases:
            return run_pytest_in_process(["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q",
                                          "--hypothesis-profile=quick", "--conformance-cases", cases,
                                          "--backend", "numpy", "--pyargs", *SUITE_MODULES])

    code = benchmark.pedantic(suite, rounds=1, iterations=1)
    benchmark.extra_info["target_s"] = QUICK_SUITE_TARGET_S
    assert code == 0


@pytest.mark.benchmark(group="conformance: quick profile, time to kill a mutant")
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_time_to_kill_mutant(benchmark, name):
    result = benchmark.pedantic(run_mutant, args=(name,), rounds=1, iterations=1)
    benchmark.extra_info.update(target_s=MUTANT_KILL_TARGET_S, killed_by=result.killed_by)
    assert result.killed
