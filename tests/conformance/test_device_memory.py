"""Cached device memory is handed back through the libraries a worker has imported, and only those;
workers sharing a GPU run their large cases within a share of its memory."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest

from pagedattn.conformance import device_memory
from pagedattn.conformance.device_memory import (
    LARGE_CASE_BYTES,
    LargeCaseLedger,
    case_bytes,
    gpu_key,
    large_case_admission,
    release_cached_device_memory,
)


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


@dataclasses.dataclass(frozen=True)
class _Case:
    query: np.ndarray
    pool: np.ndarray | None
    block_size: int


def test_case_bytes_counts_every_array_a_case_holds():
    pool = np.zeros((4, 1024), np.float16)
    case = _Case(query=np.zeros((3, 5), np.float32), pool=pool, block_size=16)
    assert case_bytes(case) == 3 * 5 * 4 + pool.nbytes
    assert case_bytes(_Case(query=pool[:2], pool=None, block_size=16)) == pool[:2].nbytes
    assert case_bytes(object()) == 0


@pytest.mark.parametrize(("visible", "key"), [(None, "0"), ("", "0"), ("3", "3"), ("2,0", "2"),
                                              ("GPU-1a2b/c", "GPU-1a2b_c")])
def test_the_ledger_is_the_first_visible_gpus(monkeypatch, visible, key):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert gpu_key() == key


def test_the_ledger_admits_within_its_budget_and_one_case_of_any_size_alone(tmp_path):
    ledger = LargeCaseLedger(tmp_path / "gpu.json", budget=100)
    assert ledger.try_admit("big", 500)  # nothing running: admitted whatever its size
    assert not ledger.try_admit("small", 1)
    ledger.release("big")
    assert ledger.try_admit("a", 60) and ledger.try_admit("b", 40)  # 100 bytes: within the budget
    assert not ledger.try_admit("c", 1)
    assert sorted(ledger.running()) == ["a", "b"]
    ledger.release("a")
    assert ledger.try_admit("c", 60)


def test_the_ledger_forgets_the_cases_of_processes_that_ended(tmp_path):
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                           text=True, check=True)
    path = tmp_path / "gpu.json"
    path.write_text(f'{{"gone": [{int(ended.stdout)}, 1000]}}')
    ledger = LargeCaseLedger(path, budget=100)
    assert ledger.try_admit("mine", 80)  # the ended worker's 1,000 bytes hold no room
    assert list(ledger.running()) == ["mine"]


def _on_a_gpu_of(monkeypatch, tmp_path, total: int) -> list[str]:
    """Admission as on a GPU of ``total`` bytes, its ledger under ``tmp_path``; the cached memory
    released on leaving is recorded in the returned list."""
    released: list[str] = []
    monkeypatch.setattr(device_memory, "device_total_bytes", lambda: total)
    monkeypatch.setattr(device_memory, "ledger_path", lambda key: tmp_path / f"gpu-{key}.json")
    monkeypatch.setattr(device_memory, "release_cached_device_memory", lambda: released.append("released"))
    monkeypatch.setattr(device_memory, "ADMISSION_POLL_SECONDS", 0.01)
    return released


def test_a_large_case_waits_until_the_gpu_has_room(monkeypatch, tmp_path):
    released = _on_a_gpu_of(monkeypatch, tmp_path, total=3 * LARGE_CASE_BYTES)  # room: 1.5 large cases
    case = _Case(query=np.zeros(0), pool=np.zeros(LARGE_CASE_BYTES, np.uint8), block_size=16)
    order: list[str] = []
    first_in, first_may_leave = threading.Event(), threading.Event()

    def first() -> None:
        with large_case_admission("cuda", case):
            order.append("first in")
            first_in.set()
            first_may_leave.wait(10)
            order.append("first out")

    worker = threading.Thread(target=first)
    worker.start()
    assert first_in.wait(10)
    def second_case() -> None:
        with large_case_admission("cuda", case):
            order.append("second in")

    second = threading.Thread(target=second_case)
    second.start()
    time.sleep(0.2)
    assert order == ["first in"]  # the second case does not fit beside the first
    first_may_leave.set()
    worker.join(10)
    second.join(10)
    assert order == ["first in", "first out", "second in"]
    assert released == ["released", "released"]  # each handed its cached memory back on leaving


def test_small_cases_and_cases_off_a_gpu_take_no_room(monkeypatch, tmp_path):
    _on_a_gpu_of(monkeypatch, tmp_path, total=2 * LARGE_CASE_BYTES)
    small = _Case(query=np.zeros(16), pool=None, block_size=16)
    large = _Case(query=np.zeros(0), pool=np.zeros(LARGE_CASE_BYTES, np.uint8), block_size=16)
    with large_case_admission("cuda", small), large_case_admission("cpu", large):
        pass
    assert list(tmp_path.iterdir()) == []


def test_a_ledger_that_cannot_be_written_leaves_the_case_to_run(monkeypatch, tmp_path):
    _on_a_gpu_of(monkeypatch, tmp_path, total=2 * LARGE_CASE_BYTES)
    monkeypatch.setattr(device_memory, "ledger_path", lambda key: tmp_path / "missing" / "gpu.json")
    large = _Case(query=np.zeros(0), pool=np.zeros(LARGE_CASE_BYTES, np.uint8), block_size=16)
    ran = []
    with large_case_admission("cuda", large):
        ran.append(True)
    assert ran == [True]


def test_each_user_and_gpu_has_its_own_ledger():
    assert device_memory.ledger_path("0") != device_memory.ledger_path("1")
    assert f"-{os.getuid()}-" in device_memory.ledger_path("0").name


def test_a_check_with_room_on_its_gpu_keeps_its_name_and_result_and_runs_admitted(monkeypatch, tmp_path):
    released = _on_a_gpu_of(monkeypatch, tmp_path, total=4 * LARGE_CASE_BYTES)
    large = _Case(query=np.zeros(0), pool=np.zeros(LARGE_CASE_BYTES, np.uint8), block_size=16)
    seen: list[dict[str, list[int]]] = []

    def matches_spec(backend, case) -> float:
        seen.append(LargeCaseLedger(device_memory.ledger_path(gpu_key()), 0).running())
        return 0.25

    checked = device_memory.with_room_on_its_gpu(matches_spec, "cuda")
    assert checked.__name__ == "matches_spec"
    assert checked(None, large) == 0.25
    assert [sorted(entry[1] for entry in running.values()) for running in seen] == [[case_bytes(large)]]
    assert released == ["released"]
