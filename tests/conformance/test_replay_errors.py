"""``pagedattn replay`` with a bad file, backend or check: one line on stderr, exit status 2."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pagedattn.conformance import replay
from pagedattn.conformance.cases import MergeCase, save_case


@pytest.fixture
def case_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    case = MergeCase(rng.standard_normal((2, 3, 8)).astype(np.float32), np.zeros((2, 3), np.float32),
                     rng.standard_normal((2, 3, 8)).astype(np.float32), np.ones((2, 3), np.float32))
    return save_case(tmp_path / "case.npz", case, check="merge_states_matches_spec")


def one_error_line(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err
    assert err.startswith("pagedattn replay: error:") and err.count("\n") == 1, err
    assert all(word in err for word in words), err


def test_the_saved_case_replays(case_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main([str(case_file), "--backend", "numpy"]) == 0
    assert "pass: worst error" in capsys.readouterr().out


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main([str(tmp_path / "nope.npz"), "--backend", "numpy"]) == 2
    one_error_line(capsys, "no such case file", "nope.npz")


@pytest.mark.parametrize("content", [b"not a case\n", b"PK\x03\x04 truncated zip"])
def test_a_file_that_is_not_a_case(tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "x.npz"
    path.write_bytes(content)
    assert replay.main([str(path), "--backend", "numpy"]) == 2
    one_error_line(capsys, "is not a case saved by the conformance suite")


def test_an_npz_without_a_case(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "arrays.npz"
    np.savez(path, a=np.zeros(3))
    assert replay.main([str(path), "--backend", "numpy"]) == 2
    one_error_line(capsys, "is not a case saved by the conformance suite")


@pytest.mark.parametrize("spec", ["nosuch", "mutant:Nosuch", "no.such.module:Backend"])
def test_unknown_backend(case_file: Path, spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main([str(case_file), "--backend", spec]) == 2
    one_error_line(capsys)


def test_unavailable_backend(case_file: Path, numpy_unavailable: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main([str(case_file), "--backend", "numpy"]) == 2
    one_error_line(capsys, "not available", "no such device in this test")


def test_unknown_check(case_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main([str(case_file), "--backend", "numpy", "--check", "nosuch"]) == 2
    one_error_line(capsys, "unknown check 'nosuch'", "merge_states_matches_spec")


def test_a_check_for_another_kind_of_case(case_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert replay.main([str(case_file), "--backend", "numpy", "--check", "matches_spec"]) == 2
    one_error_line(capsys, "'matches_spec' replays AttentionCase files", "holds a MergeCase")
