"""Run the conformance suite on one mutant, in process, stopping at the first failure.

:func:`run_mutant` returns whether the suite killed it, how long that took and which test
did it. The suite's modules run cheapest first (operations, bad input, meaning, never), so a
mutant is usually killed by the first cell that exercises its bug.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

#: The suite's modules, cheapest first.
SUITE_MODULES: tuple[str, ...] = (
    "pagedattn.conformance.test_operations",
    "pagedattn.conformance.test_scale",
    "pagedattn.conformance.test_bad_input",
    "pagedattn.conformance.test_meaning",
    "pagedattn.conformance.test_never",
)


def suite_location() -> list[str]:
    """pytest arguments that select the suite's modules with node ids that keep the module's path.

    ``--pyargs`` of single modules outside pytest's rootdir gives ids like ``::test_x[...]``;
    a rootdir at the folder holding the package gives ``pagedattn/conformance/test_x.py::...``,
    installed or not.
    """
    import pagedattn

    return ["--rootdir", str(Path(pagedattn.__file__).resolve().parent.parent), "--pyargs", *SUITE_MODULES]


class MutantResult(NamedTuple):
    """killed: the suite failed; seconds: wall time; killed_by: the first failing test id."""

    name: str
    killed: bool
    seconds: float
    killed_by: str
    exit_code: int


class _FirstFailure:
    def __init__(self) -> None:
        self.nodeid = ""

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed and not self.nodeid:
            self.nodeid = report.nodeid


def run_pytest_in_process(args: Sequence[str], plugins: Sequence[Any] = ()) -> int:
    """``pytest.main(args)`` that leaves the caller's hypothesis profile and PAGEDATTN_* variables as they were."""
    from hypothesis import settings

    args = ["-W", "ignore::pytest.PytestAssertRewriteWarning", *args]  # the plugin may be imported already
    profile = settings.get_current_profile_name()
    saved = {k: v for k, v in os.environ.items() if k.startswith("PAGEDATTN_")}
    try:
        return int(pytest.main(list(args), plugins=list(plugins)))
    finally:
        settings.load_profile(profile)
        for key in [k for k in os.environ if k.startswith("PAGEDATTN_")]:
            del os.environ[key]
        os.environ.update(saved)


def run_mutant(
    name: str, *, profile: str = "quick", extra_args: Sequence[str] = (), isolated: bool = False
) -> MutantResult:
    """Run the suite with ``--backend mutant:NAME`` and ``-x`` under ``profile``; report the kill.

    ``isolated=True`` runs it in a fresh Python process, so nothing an earlier run left in
    this process (imported modules, hypothesis state) can change what is drawn.
    """
    first = _FirstFailure()
    with tempfile.TemporaryDirectory(prefix="pagedattn-mutant-") as cases:
        args = ["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q", "-x", "--no-header",
                "-p", "no:randomly", f"--hypothesis-profile={profile}", "--conformance-cases", cases,
                "--backend", f"mutant:{name}", *suite_location(), *extra_args]
        start = time.perf_counter()
        if isolated:
            done = subprocess.run([sys.executable, "-m", "pytest", "-rf", *args], capture_output=True, text=True)
            code = done.returncode
            failed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
            first.nodeid = failed[0] if failed else ""
        else:
            code = run_pytest_in_process(args, [first])
        seconds = time.perf_counter() - start
    return MutantResult(name, code == pytest.ExitCode.TESTS_FAILED, seconds, first.nodeid, int(code))
