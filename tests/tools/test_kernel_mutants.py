"""``tools/kernel-mutants``: every edit still applies to the kernels it names, and applies alone."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("kernel_mutants", str(ROOT / "tools" / "kernel-mutants"))
    spec = importlib.util.spec_from_loader("kernel_mutants", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


TOOL = _tool()
EDITS = [(backend, edit) for backend, edits in TOOL.EDITS.items() for edit in edits]


@pytest.mark.parametrize(("backend", "edit"), EDITS, ids=[f"{b}-{e.name}" for b, e in EDITS])
def test_edit_applies_once_and_changes_its_file(backend, edit):
    """An edit whose text has moved would report "not applied" on the GPU machine, not a kill."""
    text = (ROOT / edit.file).read_text()
    assert text.count(edit.old) == 1, f"{edit.name}: its text occurs {text.count(edit.old)} times in {edit.file}"
    assert edit.new != edit.old
    assert edit.file.startswith(f"pagedattn/backends/{backend}/")


def test_edit_names_are_unique_within_a_backend():
    for backend, edits in TOOL.EDITS.items():
        names = [e.name for e in edits]
        assert len(names) == len(set(names)), backend


def test_apply_edit_changes_only_the_copy(tmp_path):
    """The edit lands in the scratch copy of the package; the repository's file is untouched."""
    _, edit = EDITS[0]
    before = (ROOT / edit.file).read_text()
    assert TOOL.apply_edit(edit, tmp_path / "work") is None
    assert edit.new in (tmp_path / "work" / edit.file).read_text()
    assert (ROOT / edit.file).read_text() == before
