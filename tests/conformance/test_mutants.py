"""The suite's strength: the quick profile kills every mutant of the catalog, and not the correct kernel."""

from __future__ import annotations

import pytest

from pagedattn.conformance import checks, test_launch_scale, test_plans, test_scale
from pagedattn.conformance.assertions import ConformanceFailure
from pagedattn.conformance.cases import AttentionCase
from pagedattn.conformance.mutants import MUTANTS, plans, scale
from pagedattn.conformance.mutants.kernel import SteppedKernelBackend
from pagedattn.conformance.mutants.run import SUITE_MODULES, run_mutant, run_pytest_in_process
from pagedattn.conformance.mutants.run import main as run_main
from pagedattn.conformance.plugin import COSTLY_TESTS
from pagedattn.spec.pools import random_paged_inputs


def test_catalog_has_at_least_20_mutants_with_a_bug_each():
    assert len(MUTANTS) >= 20
    for name, cls in MUTANTS.items():
        assert issubclass(cls, SteppedKernelBackend) and cls.bug and cls.models, name


def test_correct_stepped_kernel_passes_quick_profile(tmp_path):
    code = run_pytest_in_process(["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q", "-x",
                                  "--hypothesis-profile=quick", "--conformance-cases", str(tmp_path),
                                  "--backend", "pagedattn.conformance.mutants.kernel:SteppedKernelBackend",
                                  "--pyargs", *SUITE_MODULES])
    assert code == 0


#: The bases of the scale mutants, and the scale cells their mutants die in (None: any).
SCALE_BASES = {"AddressedKernelBackend": None, "UniformSplitKernelBackend": "mixed_length or long_sequences",
               "CascadeKernelBackend": "shared_prefix"}


@pytest.mark.parametrize("base", sorted(SCALE_BASES))
def test_correct_scale_kernels_pass_the_scale_cells_of_the_quick_profile(tmp_path, base):
    """The bases of the scale mutants are right where their mutants die: a mutant dies of its bug."""
    cells = SCALE_BASES[base]
    code = run_pytest_in_process(["-p", "pagedattn.conformance.plugin", "-p", "no:cacheprovider", "-q", "-x",
                                  "--hypothesis-profile=quick", "--conformance-cases", str(tmp_path),
                                  "--backend", f"pagedattn.conformance.mutants.scale:{base}",
                                  *(["-k", cells] if cells else []), "--pyargs", *MUTANT_MODULES[scale.__name__]])
    assert code == 0


#: Where the mutants of ``mutants/scale.py`` must die: their bugs show only in the scale cells (by
#: name: an installed package's node ids do not always carry the module's path).
SCALE_CELLS = tuple(name for module in (test_scale, test_launch_scale) for name in vars(module)
                    if name.startswith("test_"))
#: Where the mutants of ``mutants/plans.py`` must die: only a backend used as an engine uses it shows their bugs.
PLAN_CELLS = tuple(name for name in vars(test_plans) if name.startswith("test_"))
#: The suite's modules each family of mutants runs: a scale or plan mutant only the modules of the
#: cells it must die in (the rest of the quick profile, run on the correct kernel above, adds only
#: time); every other mutant the whole suite.
MUTANT_MODULES = {scale.__name__: (test_scale.__name__, test_launch_scale.__name__),
                  plans.__name__: (test_plans.__name__,)}


#: Seconds of processor time a mutant may take to die: 60, or 300 for one that only a costly cell
#: kills (the plugin runs those last, after the rest of the quick suite: ``plugin.COSTLY_TESTS``).
#: Processor time, the run's own: the other workers of a parallel test run stretch its wall time.
KILL_SECONDS, COSTLY_KILL_SECONDS = 60, 300


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_quick_profile_kills_mutant(name):
    """Killed within KILL_SECONDS of processor time (COSTLY_KILL_SECONDS by a costly cell); a scale
    mutant by a scale cell, a plan mutant by a cell of test_plans."""
    family = MUTANTS[name].__module__
    result = run_mutant(name, profile="quick", modules=MUTANT_MODULES.get(family, SUITE_MODULES))
    assert result.killed, f"mutant {name} survived the quick profile ({MUTANTS[name].bug}); exit {result.exit_code}"
    costly = any(f"::{cell}[" in result.killed_by for cell in COSTLY_TESTS)
    bound = COSTLY_KILL_SECONDS if costly else KILL_SECONDS
    assert result.cpu_seconds < bound, (f"mutant {name} took {result.cpu_seconds:.0f} s of processor time to kill "
                                        f"({result.seconds:.0f} s of wall time, by {result.killed_by})")
    cells = {scale.__name__: SCALE_CELLS, plans.__name__: PLAN_CELLS}.get(family)
    if cells is not None:
        assert any(f"::{cell}[" in result.killed_by for cell in cells), f"{name} killed by {result.killed_by}"


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
