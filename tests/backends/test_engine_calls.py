"""How an engine calls a backend: torch CUDA tensors only to backends that take them on CUDA, and a
capture that says why it cannot happen."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.backends.capabilities import Capabilities
from pagedattn.backends.engine_calls import CaptureFailed, capture_runs, engine_array, takes_torch_cuda
from pagedattn.backends.numpy.backend import NumpyBackend


class CudaTorchNumpy(NumpyBackend):
    """Says it runs on CUDA and takes torch tensors (nothing here runs it)."""

    name = "cuda-torch-numpy"
    accepts_torch = True

    def capabilities(self) -> Capabilities:
        return Capabilities(device="cuda")


def test_only_a_cuda_backend_that_accepts_torch_takes_torch_tensors() -> None:
    assert not takes_torch_cuda(NumpyBackend())  # on the CPU, no torch
    assert takes_torch_cuda(CudaTorchNumpy())
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = engine_array(NumpyBackend(), array)  # the backend's own array
    assert isinstance(got, np.ndarray) and np.array_equal(got, array)


def test_capture_without_a_cuda_device_says_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the GPU backends' graph tests capture")
    runs: list[int] = []
    with pytest.raises(CaptureFailed, match="no CUDA device"):
        capture_runs(runs.append, 2)
    assert runs == []  # nothing ran
