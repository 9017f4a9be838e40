"""Cached device memory is handed back through the libraries a worker has imported, and only those."""

from __future__ import annotations

import sys
import types

import pytest

from pagedattn.conformance.device_memory import release_cached_device_memory


class _Pool:
    def __init__(self) -> None:
        self.freed = 0

    def free_all_blocks(self) -> None:
        self.freed += 1


def _fake_cupy(available: bool = True) -> tuple[types.ModuleType, _Pool, _Pool]:
    device, pinned = _Pool(), _Pool()
    module = types.ModuleType("cupy")
    module.cuda = types.SimpleNamespace(is_available=lambda: available)  # type: ignore[attr-defined]
    module.get_default_memory_pool = lambda: device  # type: ignore[attr-defined]
    module.get_default_pinned_memory_pool = lambda: pinned  # type: ignore[attr-defined]
    return module, device, pinned


def _fake_torch(initialized: bool) -> tuple[types.ModuleType, list[str]]:
    calls: list[str] = []
    cuda = types.SimpleNamespace(is_initialized=lambda: initialized, empty_cache=lambda: calls.append("empty_cache"))
    module = types.ModuleType("torch")
    module.cuda = cuda  # type: ignore[attr-defined]
    return module, calls


def test_frees_cupy_pools_and_torch_cache_once_cuda_is_initialised(monkeypatch):
    cupy, device, pinned = _fake_cupy()
    torch, calls = _fake_torch(initialized=True)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "torch", torch)
    release_cached_device_memory()
    assert (device.freed, pinned.freed, calls) == (1, 1, ["empty_cache"])


def test_leaves_an_uninitialised_torch_and_an_absent_cupy_alone(monkeypatch):
    torch, calls = _fake_torch(initialized=False)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    release_cached_device_memory()
    assert calls == []
    assert "cupy" not in sys.modules


def test_leaves_cupy_alone_without_a_cuda_driver(monkeypatch):
    cupy, device, pinned = _fake_cupy(available=False)  # imported to plan or compile on a CPU machine
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    release_cached_device_memory()
    assert (device.freed, pinned.freed) == (0, 0)


def test_runs_with_the_real_cupy_imported_with_or_without_a_gpu():
    pytest.importorskip("cupy")
    release_cached_device_memory()  # without a driver, cupy's pools would raise cudaErrorInsufficientDriver
