"""Resuming a conformance run: the ledger records settled cells at once, is tied to the code,
and never records a failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pagedattn.conformance import cli, ledger

SELECTION = "test_meaning and bs16 and float16 and decode"


def test_a_fresh_ledger_holds_its_header_and_settles_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    settled, note = ledger.open_ledger(path, ledger.header("quick", ["numpy"]))
    assert settled == [] and "starting" in note
    assert json.loads(path.read_text().splitlines()[0]) == ledger.header("quick", ["numpy"])


def test_recorded_cells_are_settled_on_reopening(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    expected = ledger.header("thorough", ["triton"])
    ledger.open_ledger(path, expected)
    ledger.record(path, "::test_a[x]", "passed")
    ledger.record(path, "::test_b[y]", "unsupported")
    ledger.record(path, "::test_a[x]", "passed")
    settled, note = ledger.open_ledger(path, expected)
    assert settled == ["::test_a[x]", "::test_b[y]"] and "resuming" in note


@pytest.mark.parametrize("change", ["profile", "backends", "sources"])
def test_a_ledger_of_other_code_profile_or_backends_is_set_aside(tmp_path: Path, change: str) -> None:
    path = tmp_path / "ledger.jsonl"
    expected = ledger.header("thorough", ["triton"])
    ledger.open_ledger(path, expected)
    ledger.record(path, "::test_a[x]", "passed")
    other = {**expected, change: "something else"}
    settled, note = ledger.open_ledger(path, other)
    assert settled == [] and "stale" in note
    assert (tmp_path / "ledger.jsonl.stale").is_file()
    assert path.read_text().splitlines() == [json.dumps(other)]


def test_the_fingerprint_follows_the_sources(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "notes.md").write_text("not a source\n")
    before = ledger.source_fingerprint(tmp_path)
    (tmp_path / "notes.md").write_text("changed\n")
    assert ledger.source_fingerprint(tmp_path) == before
    (tmp_path / "k.cu").write_text("// kernel\n")
    assert ledger.source_fingerprint(tmp_path) != before


def run(tmp_path: Path, backend: str, ledger_path: Path, out: str) -> int:
    return cli.main(["--backend", backend, "--profile", "quick", "-k", SELECTION, "--out", str(tmp_path / out),
                     "--resume", str(ledger_path)])


def test_resume_skips_settled_cells_and_reruns_failures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "numpy.jsonl"
    assert run(tmp_path, "numpy", path, "first") == 0
    cells = path.read_text().splitlines()[1:]
    assert len(cells) == 4 and all(json.loads(c)["outcome"] == "passed" for c in cells)  # (b)float16 x NHD, HND
    capsys.readouterr()
    assert run(tmp_path, "numpy", path, "second") == 0
    assert "every selected cell is already settled" in capsys.readouterr().out

    failing = tmp_path / "mutant.jsonl"
    assert run(tmp_path, "mutant:WrongGQAMapping", failing, "mutant") != 0
    assert len(failing.read_text().splitlines()[1:]) < 4, "a failing cell is never recorded as settled"
    assert run(tmp_path, "mutant:WrongGQAMapping", failing, "mutant-again") != 0, "failures run again"
