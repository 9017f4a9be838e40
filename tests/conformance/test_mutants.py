"""The suite's strength: the quick profile kills every mutant of the catalog, and not the correct kernels."""

from __future__ import annotations

import pytest

from pagedattn.conformance import checks, test_launch_scale, test_plans, test_scale
from pagedattn.conformance.assertions import ConformanceFailure
from pagedattn.conformance.cases import AttentionCase
from pagedattn.conformance.mutants import MUTANTS, plans, scale
from pagedattn.conformance.mutants.kernel import SteppedKernelBackend
from pagedattn.conformance.mutants.run import (
    cell_location,
    run_mutant_at_its_cell,
    run_pytest_in_process,
    suite_location,
)
from pagedattn.conformance.mutants.run import main as run_main
from pagedattn.conformance.plugin import COSTLY_TESTS
from pagedattn.spec.pools import random_paged_inputs

#: Where the mutants of ``mutants/scale.py`` must die: their bugs show only in the scale cells (by
#: name: an installed package's node ids do not always carry the module's path).
SCALE_CELLS = tuple(name for module in (test_scale, test_launch_scale) for name in vars(module)
                    if name.startswith("test_"))
#: Where the mutants of ``mutants/plans.py`` must die: only a backend used as an engine uses it shows their bugs.
PLAN_CELLS = tuple(name for name in vars(test_plans) if name.startswith("test_"))
#: The test functions each family of mutants may be killed by (any other family: any of the suite's).
FAMILY_CELLS = {scale.__name__: SCALE_CELLS, plans.__name__: PLAN_CELLS}

#: The correct kernels the mutants are made from; each passes the quick profile's cells where its mutants die.
BASES = (SteppedKernelBackend, scale.AddressedKernelBackend, scale.UniformSplitKernelBackend,
         scale.CascadeKernelBackend)


def _base(mutant: type[SteppedKernelBackend]) -> type[SteppedKernelBackend]:
    """The correct kernel of :data:`BASES` a mutant is made from (the nearest in its MRO)."""
    return next(cls for cls in mutant.__mro__ if cls in BASES)


def test_catalog_has_at_least_20_mutants_with_a_bug_and_a_killing_cell_each():
    assert len(MUTANTS) >= 20
    for name, cls in MUTANTS.items():
        assert issubclass(cls, SteppedKernelBackend) and cls.bug and cls.models, name
        assert "killed_by" in vars(cls), f"{name} inherits the cell that kills its parent"
        assert cls.killed_by in FAMILY_CELLS.get(cls.__module__, (cls.killed_by,)), f"{name}: {cls.killed_by}"
        assert cell_location(cls.killed_by).endswith(f"::{cls.killed_by}")


def _killing_cells(base: type[SteppedKernelBackend]) -> list[tuple[str, ...]]:
    """The test functions that kill ``base``'s mutants, in groups run as one test each: every
    costly one (``plugin.COSTLY_TESTS``) alone, the others together, so that parallel workers share them."""
    cells = sorted({cls.killed_by for cls in MUTANTS.values() if _base(cls) is base})
    cheap = tuple(cell for cell in cells if cell not in COSTLY_TESTS)
    return [*([cheap] if cheap else []), *((cell,) for cell in cells if cell in COSTLY_TESTS)]


@pytest.mark.parametrize(("base", "cells"), [(base, cells) for base in BASES for cells in _killing_cells(base)],
                         ids=lambda value: value.__name__ if isinstance(value, type) else
                         (value[0] if len(value) == 1 else f"{len(value)}-cells"))
def test_correct_kernels_pass_the_cells_their_mutants_die_in(tmp_path, base, cells):
    """A mutant dies of its bug: the kernel it is made from passes the cells that kill it (quick profile)."""
    assert cells
    code = run_pytest_in_process(["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q", "-x",
                                  "--hypothesis-profile=quick", "--conformance-cases", str(tmp_path),
                                  "--backend", f"{base.__module__}:{base.__name__}",
                                  *suite_location([cell_location(cell) for cell in cells])])
    assert code == 0


#: Seconds of processor time a mutant may take to die in its cell: 60, or 300 in a costly cell
#: (``plugin.COSTLY_TESTS``: cells of hundreds of thousands of rows, or pools of several GB).
#: Processor time, the run's own: the other workers of a parallel test run stretch its wall time.
KILL_SECONDS, COSTLY_KILL_SECONDS = 60, 300


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_quick_profile_kills_mutant(name):
    """The cell the mutant's ``killed_by`` names kills it under the quick profile, within KILL_SECONDS
    of processor time (COSTLY_KILL_SECONDS in a costly cell). A cell's draws do not depend on the
    cells before it, so this is the kill the whole suite makes (``mutants.run`` without ``--at-its-cell``)."""
    result = run_mutant_at_its_cell(name, profile="quick")
    killed_by = MUTANTS[name].killed_by
    assert result.killed, f"mutant {name} survived {killed_by} ({MUTANTS[name].bug}); exit {result.exit_code}"
    assert f"::{killed_by}[" in result.killed_by, result.killed_by
    bound = COSTLY_KILL_SECONDS if killed_by in COSTLY_TESTS else KILL_SECONDS
    assert result.cpu_seconds < bound, (f"mutant {name} took {result.cpu_seconds:.0f} s of processor time to kill "
                                        f"({result.seconds:.0f} s of wall time, by {result.killed_by})")


def _decode_case(seed: int) -> AttentionCase:
    inputs = random_paged_inputs([9, 21, 4], None, block_size=16, head_dim=16, seed=seed)
    return AttentionCase(query=inputs.query, key_cache=inputs.key_cache, value_cache=inputs.value_cache,
                         block_tables=inputs.block_tables, seq_lens=inputs.seq_lens, query_start_loc=None,
                         options={"kv_layout": "NHD", "return_lse": True}, seed=seed)


@pytest.mark.parametrize("seed", range(4))
def test_nan_masking_backend_fails_the_non_finite_check_and_the_correct_kernel_passes(seed):
    case = _decode_case(seed)
    assert checks.nonfinite_propagates(SteppedKernelBackend(), case) >= 0.0
    with pytest.raises(ConformanceFailure, match="NaN"):
        checks.nonfinite_propagates(MUTANTS["NaNMaskingKernel"](), case)


def test_kill_table_command_prints_each_mutant_with_its_time(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the table wraps the killing cell's id to the terminal's width
    code = run_main(["--mutant", "WrongGQAMapping", "--profile", "quick"])
    out = capsys.readouterr().out
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("WrongGQAMapping"))
    assert " s " in row and "[mutant:WrongGQAMapping-" in row  # the cell that killed it
    cpu = float(row.split(" s cpu)")[0].rsplit("(", 1)[1])  # the isolated run's processor time, its child's
    assert 0 < cpu < 600
    assert "quick: 1 of 1 killed" in out


def test_kill_table_command_draws_with_a_seed_and_runs_mutants_side_by_side(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    code = run_main(["--mutant", "WrongGQAMapping", "--mutant", "LseInLog2", "--at-its-cell", "--seed", "7",
                     "--jobs", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "seed 7" in out and "quick: 2 of 2 killed" in out
    assert [line.split()[0] for line in out.splitlines() if line.startswith(("WrongGQAMapping", "LseInLog2"))] == [
        "WrongGQAMapping", "LseInLog2"]  # the table in the order asked, whichever run ended first


def test_an_in_process_run_imports_the_suite_afresh_and_gives_the_caller_its_modules_back(tmp_path):
    """A suite module the caller imported under another profile holds other cells (the long cells'
    dtypes come from the profile at import): the run collects from fresh copies; the caller keeps its own."""
    import sys

    import pagedattn.conformance as package

    seen = []

    class Collected:
        def pytest_collection_modifyitems(self, items):
            seen.extend({item.module for item in items})

    code = run_pytest_in_process(["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q",
                                  "--collect-only", "--hypothesis-profile=quick", "--conformance-cases",
                                  str(tmp_path), "--backend", "numpy", "--pyargs", test_scale.__name__],
                                 [Collected()])
    assert code == 0 and len(seen) == 1 and seen[0] is not test_scale
    assert seen[0].__name__ == test_scale.__name__
    assert sys.modules[test_scale.__name__] is test_scale and package.test_scale is test_scale
