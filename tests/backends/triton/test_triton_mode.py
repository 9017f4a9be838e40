"""The interpreter test modules select Triton's CPU interpreter on a CPU machine, and on a CUDA
machine only where the caller asked for it, so that the ``gpu`` tests beside them run on the GPU."""

from __future__ import annotations

import importlib.util

import pytest
from triton_mode import interpreter_setting

if importlib.util.find_spec("torch") is None:
    pytest.skip("torch is needed (pip install 'pagedattn[triton]')", allow_module_level=True)

import torch


def test_a_cpu_machine_selects_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert interpreter_setting() == "1"


def test_a_cuda_machine_skips_interpreter_tests_the_caller_did_not_ask_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(pytest.skip.Exception, match="set TRITON_INTERPRET=1"):
        interpreter_setting()


def test_a_cuda_machine_runs_them_where_the_caller_set_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert interpreter_setting() == "1"
