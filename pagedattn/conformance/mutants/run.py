"""Run the conformance suite on mutants, stopping at the first failure, and tabulate the kills.

:func:`run_mutant` returns whether the suite killed one mutant, how long that took and which
test did it. The suite's modules run cheapest first (operations, bad input, non-finite data,
meaning, never), so a mutant is usually killed by the first cell that exercises its bug.
:func:`kill_table` runs the catalog under several profiles, each mutant in a fresh process;
``python -m pagedattn.conformance.mutants.run --profile quick --profile ci`` prints the table.
:func:`run_mutant_at_its_cell` (``--at-its-cell``) runs a mutant on the one test function that
kills it first (its ``killed_by``): the same kill, without the cells before it.
"""

from __future__ import annotations

import argparse
import gc
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pytest

#: The suite's modules, cheapest first.
SUITE_MODULES: tuple[str, ...] = (
    "pagedattn.conformance.test_operations",
    "pagedattn.conformance.test_scale",
    "pagedattn.conformance.test_bad_input",
    "pagedattn.conformance.test_nonfinite",
    "pagedattn.conformance.test_meaning",
    "pagedattn.conformance.test_never",
    "pagedattn.conformance.test_plans",
    "pagedattn.conformance.test_launch_scale",
)


def suite_location(modules: Sequence[str] = SUITE_MODULES) -> list[str]:
    """pytest arguments that select the suite's ``modules`` with node ids that keep the module's path.

    ``--pyargs`` of single modules outside pytest's rootdir gives ids like ``::test_x[...]``;
    a rootdir at the folder holding the package gives ``pagedattn/conformance/test_x.py::...``,
    installed or not.
    """
    import pagedattn

    return ["--rootdir", str(Path(pagedattn.__file__).resolve().parent.parent), "--pyargs", *modules]


def cell_location(function: str, modules: Sequence[str] = SUITE_MODULES) -> str:
    """``module::function`` for the suite's test function ``function``, the first of ``modules`` defining it.

    Passed in ``modules``, it runs that function's cells only (every parametrization).
    """
    import importlib

    for module in modules:
        if callable(getattr(importlib.import_module(module), function, None)):
            return f"{module}::{function}"
    raise LookupError(f"no test function {function!r} in {', '.join(modules)}")


class MutantResult(NamedTuple):
    """killed: the suite failed; seconds: wall time; killed_by: the first failing test id;
    cpu_seconds: the processor time the run took (its process's, or its child's when isolated),
    which other work on the machine does not stretch as it stretches the wall time."""

    name: str
    killed: bool
    seconds: float
    killed_by: str
    exit_code: int
    cpu_seconds: float = float("nan")


def _children_cpu_seconds() -> float:
    """User and system time of this process's waited-for children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class _FirstFailure:
    def __init__(self) -> None:
        self.nodeid = ""

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.failed and not self.nodeid:
            self.nodeid = report.nodeid


def run_pytest_in_process(args: Sequence[str], plugins: Sequence[Any] = ()) -> int:
    """``pytest.main(args)`` that leaves the caller's hypothesis profile and PAGEDATTN_* variables as they were.

    The suite's modules (:data:`SUITE_MODULES`) are imported afresh for the run: their cells'
    parameters come from the profile at import (the long cells' dtypes), so a module the caller
    imported under another profile would hold other cells. The caller's copies are put back after.
    The caller's objects are frozen out of the garbage collector for the run (``gc.freeze``), so
    that the run's collections, which the memory cells make, cost what the run holds, not what the
    calling process has built up.
    """
    from hypothesis import settings

    import pagedattn.conformance as package

    args = ["-W", "ignore::pytest.PytestAssertRewriteWarning", *args]  # the plugin may be imported already
    profile = settings.get_current_profile_name()
    saved = {k: v for k, v in os.environ.items() if k.startswith("PAGEDATTN_")}
    callers = {name: sys.modules.pop(name) for name in SUITE_MODULES if name in sys.modules}
    gc.collect()
    gc.freeze()
    try:
        return int(pytest.main(list(args), plugins=list(plugins)))
    finally:
        gc.unfreeze()
        settings.load_profile(profile)
        for key in [k for k in os.environ if k.startswith("PAGEDATTN_")]:
            del os.environ[key]
        os.environ.update(saved)
        for name in SUITE_MODULES:
            sys.modules.pop(name, None)
            if name in callers:
                sys.modules[name] = callers[name]
                setattr(package, name.rsplit(".", 1)[1], callers[name])


def run_mutant(
    name: str, *, profile: str = "quick", extra_args: Sequence[str] = (), isolated: bool = False,
    modules: Sequence[str] = SUITE_MODULES,
) -> MutantResult:
    """Run the suite's ``modules`` with ``--backend mutant:NAME`` and ``-x`` under ``profile``; report the kill.

    ``isolated=True`` runs it in a fresh Python process, so nothing an earlier run left in
    this process (imported modules, hypothesis state) can change what is drawn.
    """
    first = _FirstFailure()
    with tempfile.TemporaryDirectory(prefix="pagedattn-mutant-") as cases:
        args = ["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q", "-x", "--no-header",
                "-p", "no:randomly", f"--hypothesis-profile={profile}", "--conformance-first-failure",
                "--conformance-cases", cases,
                "--backend", f"mutant:{name}", *suite_location(modules), *extra_args]
        start = time.perf_counter()
        if isolated:
            cpu_start = _children_cpu_seconds()
            done = subprocess.run([sys.executable, "-m", "pytest", "-rf", *args], capture_output=True, text=True)
            cpu = _children_cpu_seconds() - cpu_start
            code = done.returncode
            failed = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")]
            first.nodeid = failed[0] if failed else ""
        else:
            cpu_start = time.process_time()
            code = run_pytest_in_process(args, [first])
            cpu = time.process_time() - cpu_start
        seconds = time.perf_counter() - start
    return MutantResult(name, code == pytest.ExitCode.TESTS_FAILED, seconds, first.nodeid, int(code), cpu)


def run_mutant_at_its_cell(name: str, *, profile: str = "quick", extra_args: Sequence[str] = (),
                           isolated: bool = False) -> MutantResult:
    """:func:`run_mutant` on the one test function the mutant's ``killed_by`` names.

    A kill there is a kill by the whole suite (a cell's draws do not depend on the cells run
    before it), in the time of that function's cells rather than of every cell before them.
    """
    from pagedattn.conformance.mutants import MUTANTS

    return run_mutant(name, profile=profile, extra_args=extra_args, isolated=isolated,
                      modules=[cell_location(MUTANTS[name].killed_by)])


def kill_table(names: Sequence[str], profiles: Sequence[str], *, at_its_cell: bool = False, seed: int | None = None,
               jobs: int = 1, progress: Callable[[MutantResult, str], None] | None = None,
               ) -> dict[str, dict[str, MutantResult]]:
    """Run each mutant under each profile (isolated, ``jobs`` at a time); return ``{name: {profile: result}}``.

    ``at_its_cell``: on the test function its ``killed_by`` names only, not the whole suite.
    ``seed``: the suite's ``--hypothesis-seed``, other examples than the profile's own.
    ``progress(result, profile)`` is told of each run as it ends.
    """
    from concurrent.futures import ThreadPoolExecutor

    run = run_mutant_at_its_cell if at_its_cell else run_mutant
    extra_args = () if seed is None else (f"--hypothesis-seed={seed}",)

    def one(name: str, profile: str) -> tuple[str, str, MutantResult]:
        result = run(name, profile=profile, extra_args=extra_args, isolated=True)
        if progress is not None:
            progress(result, profile)
        return name, profile, result

    table: dict[str, dict[str, MutantResult]] = {name: {} for name in names}
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # each run is a process of its own
        for name, profile, result in pool.map(lambda pair: one(*pair), [(n, p) for n in names for p in profiles]):
            table[name][profile] = result
    return table


def _cell(result: MutantResult) -> str:
    if result.killed:
        return f"{result.seconds:.1f} s ({result.cpu_seconds:.1f} s cpu)"
    return f"SURVIVED ({result.seconds:.0f} s, exit {result.exit_code})"


def _test_name(nodeid: str) -> str:
    """The test function and its parameters, without the path (which names a temporary folder)."""
    return nodeid.rsplit("::", 1)[-1]


def main(argv: Sequence[str] | None = None) -> int:
    """Print, per mutant and profile, the time the suite took to kill it and the cell that did.

    Exit status 1 if a mutant survived a profile.
    """
    from pagedattn.conformance.mutants import MUTANTS
    from pagedattn.console import print_table

    parser = argparse.ArgumentParser(prog="python -m pagedattn.conformance.mutants.run", description=main.__doc__)
    parser.add_argument("--profile", action="append", choices=("quick", "ci", "thorough"),
                        help="hypothesis profile (repeatable; default quick)")
    parser.add_argument("--mutant", action="append", choices=sorted(MUTANTS), metavar="NAME",
                        help="one mutant of the catalog (repeatable; default all)")
    parser.add_argument("--at-its-cell", action="store_true",
                        help="run each mutant on the test function its killed_by names, not the whole suite")
    parser.add_argument("--seed", type=int, default=None, metavar="N",
                        help="hypothesis seed: other examples than the profile's own, the same for every N "
                             "(default: the profile's)")
    parser.add_argument("--jobs", type=int, default=1, metavar="J",
                        help="mutants run at once, each in its own process (default 1: times are then each alone)")
    args = parser.parse_args(argv)
    profiles = args.profile or ["quick"]
    names = args.mutant or sorted(MUTANTS)

    def progress(result: MutantResult, profile: str) -> None:
        print(f"{result.name} [{profile}]: {_cell(result)}", file=sys.stderr, flush=True)

    table = kill_table(names, profiles, at_its_cell=args.at_its_cell, seed=args.seed, jobs=max(1, args.jobs),
                       progress=progress)
    headers = ["mutant", *(f"{p}: time to kill" for p in profiles), f"killed by ({profiles[0]})"]
    rows = [[name, *(_cell(table[name][p]) for p in profiles), _test_name(table[name][profiles[0]].killed_by)]
            for name in names]
    where = "the cell its killed_by names" if args.at_its_cell else "the suite"
    drawn = "" if args.seed is None else f", seed {args.seed}"
    print_table(headers, rows, title=f"mutants: time for {where} to kill each (numpy-stepped kernel, -x{drawn})")
    for profile in profiles:
        killed = [r for r in (table[n][profile] for n in names) if r.killed]
        times = sorted(r.seconds for r in killed)
        median = times[len(times) // 2] if times else float("nan")
        print(f"{profile}: {len(killed)} of {len(names)} killed; median {median:.1f} s, max "
              f"{max(times, default=float('nan')):.1f} s")
    return 0 if all(table[n][p].killed for n in names for p in profiles) else 1


if __name__ == "__main__":
    sys.exit(main())
