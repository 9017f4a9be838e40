"""The suite's strength: the quick profile kills every mutant of the catalog, and not the correct kernel."""

from __future__ import annotations

import pytest

from pagedattn.conformance.mutants import MUTANTS
from pagedattn.conformance.mutants.kernel import SteppedKernelBackend
from pagedattn.conformance.mutants.run import SUITE_MODULES, run_mutant, run_pytest_in_process


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


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_quick_profile_kills_mutant(name):
    result = run_mutant(name, profile="quick", isolated=True)
    assert result.killed, f"mutant {name} survived the quick profile ({MUTANTS[name].bug}); exit {result.exit_code}"
    assert result.seconds < 60, f"mutant {name} took {result.seconds:.0f} s to kill (by {result.killed_by})"
