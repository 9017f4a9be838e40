"""The runner saves one labelled case per distinct failure, each with its replay command, and
saves nothing for an interrupted example."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from pagedattn.backends.numpy.backend import NumpyBackend
from pagedattn.conformance import runner
from pagedattn.conformance.assertions import ConformanceFailure
from pagedattn.conformance.cases import MergeCase, load_case
from pagedattn.conformance.strategies import merge_cases

CELL = {"feature": "merge_states", "dtype": "float32", "block_size": "-", "kv_layout": "-"}


@pytest.fixture
def cases_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Failing cases go to tmp_path; the test runs under a profile with room to find two failures."""
    monkeypatch.setenv("PAGEDATTN_CASES_DIR", str(tmp_path))
    previous = settings.get_current_profile_name()
    settings.register_profile("runner-test", max_examples=60, derandomize=True, database=None, deadline=None)
    settings.load_profile("runner-test")
    yield tmp_path
    settings.load_profile(previous)


def two_bugs(backend: Any, case: MergeCase) -> float:
    """Fails one way with several tokens and one head, another way with several heads."""
    tokens, heads, _ = case.out_a.shape
    if heads >= 2:
        raise ValueError(f"crash on {heads} heads")
    if tokens >= 2:
        raise ConformanceFailure(f"wrong answer on {tokens} tokens")
    return 0.0


def which_bug(case: MergeCase) -> str:
    try:
        two_bugs(None, case)
    except ValueError:
        return "crash"
    except ConformanceFailure:
        return "wrong"
    return "pass"


def test_each_distinct_failure_saves_its_own_labelled_case(cases_dir: Path) -> None:
    with pytest.raises(BaseExceptionGroup) as raised:
        runner.run_property(None, NumpyBackend(), lambda: merge_cases(dtype="float32"), two_bugs, cell=CELL)
    failures = runner.distinct_failures(raised.value)
    assert len(failures) == 2
    saved = sorted(cases_dir.glob("*.npz"))
    assert len(saved) == 2 and all("-failure" in p.name for p in saved)
    for failure in failures:
        notes = "\n".join(getattr(failure, "__notes__", []))
        path = next(p for p in saved if str(p) in notes)
        assert f"pagedattn replay {path} --backend numpy" in notes
        case, check_name, context = load_case(path)
        assert check_name == "two_bugs"
        assert context["failure"] in notes and context["failure"].endswith("of 2")
        expected = "crash" if isinstance(failure, ValueError) else "wrong"
        assert which_bug(case) == expected, f"{path.name} holds the other failure's case"
        assert context["message"] == runner.failure_text(failure).splitlines()[0]


def test_a_single_failure_records_its_text_and_replay(cases_dir: Path) -> None:
    request = _FakeRequest()

    def wrong(backend: Any, case: MergeCase) -> float:
        raise ConformanceFailure("out differs at token 0")

    with pytest.raises(ConformanceFailure):
        runner.run_property(request, NumpyBackend(), lambda: merge_cases(dtype="float32"), wrong, cell=CELL)
    record = dict(request.node.user_properties)[runner.RECORD_KEY]
    assert record["status"] == "fail"
    assert record["message"] == "out differs at token 0"
    [failure] = record["failures"]
    assert failure["label"] == "failure" and Path(failure["case"]).is_file()
    assert record["replays"] == [failure["replay"]]


def test_an_interrupted_example_is_not_saved_as_failing(cases_dir: Path) -> None:
    request = _FakeRequest()
    calls = []

    def interrupted(backend: Any, case: MergeCase) -> float:
        calls.append(case)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return 0.0

    with pytest.raises(KeyboardInterrupt):
        runner.run_property(request, NumpyBackend(), lambda: merge_cases(dtype="float32"), interrupted, cell=CELL)
    assert list(cases_dir.glob("*.npz")) == []
    record = dict(request.node.user_properties)[runner.RECORD_KEY]
    assert record["status"] == "interrupted" and "failures" not in record


class _FakeRequest:
    """Just enough of pytest's request fixture for run_property: a node id and user_properties."""

    def __init__(self) -> None:
        self.node = type("Node", (), {"nodeid": "tests/x.py::test_cell[numpy]", "user_properties": []})()


def test_a_cell_for_another_device_is_unsupported() -> None:
    runner.require(NumpyBackend(), device="cpu")
    with pytest.raises(runner.Unsupported, match="runs on cpu, not cuda"):
        runner.require(NumpyBackend(), device="cuda")


def test_a_cell_about_launch_limits_is_unsupported_in_an_interpreter() -> None:
    class Interpreted(NumpyBackend):
        def capabilities(self):  # type: ignore[no-untyped-def]
            return replace(super().capabilities(), device="cpu (Triton interpreter)")

    runner.require(NumpyBackend(), launch_limits=True)
    runner.require(Interpreted(), launch_limits=False)
    with pytest.raises(runner.Unsupported, match="runs in an interpreter"):
        runner.require(Interpreted(), launch_limits=True)
