"""What an engine's step looks like to the timers: its inputs, its L2 state, its CUDA graphs.

An engine passes torch CUDA tensors to every backend that takes them (``inputs="torch"``;
``"native"``: each backend's own ``to_device`` arrays), starts a layer's call with an L2 cache
that the previous layer filled with other data (:func:`flusher`), and captures a decode step
in a CUDA graph where the backend allows it (:func:`torch_graph_capture`, with the
``capturable`` flag of the backend's plan).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pagedattn.backends.engine_calls import CaptureFailed, capture_runs, engine_array, takes_torch_cuda
from pagedattn.backends.interface import Backend
from pagedattn.perf import timing

INPUT_KINDS: tuple[str, ...] = ("torch", "native")
GPU_FLUSH_BYTES = 256 << 20  # several times an H100/H200's 50 MB L2
CPU_FLUSH_BYTES = 64 << 20


__all__ = ["INPUT_KINDS", "flusher", "marks", "takes_torch_cuda", "to_device", "torch_graph_capture"]


def to_device(backend: Backend, array: np.ndarray, inputs: str) -> Any:
    """``array`` as ``backend`` receives it: a torch CUDA tensor under ``inputs="torch"`` when the
    backend takes one, else the backend's own device array."""
    if inputs not in INPUT_KINDS:
        raise ValueError(f"inputs={inputs!r}: expected one of {INPUT_KINDS}")
    return engine_array(backend, array) if inputs == "torch" else backend.to_device(array)


def flusher(on_gpu: bool) -> Callable[[], object]:
    """A function that evicts the caches: zeroes a buffer larger than the GPU's L2 (as
    ``triton.testing.do_bench``) or the CPU's last-level cache."""
    if on_gpu:
        import torch

        buffer = torch.empty(GPU_FLUSH_BYTES, dtype=torch.int8, device="cuda")
        return buffer.zero_
    host = np.empty(CPU_FLUSH_BYTES, dtype=np.int8)

    def flush() -> None:
        host.fill(0)

    return flush


def marks(on_gpu: bool, synchronize: Callable[[], None]) -> timing.Marks:
    """CUDA events on a GPU, else a synchronised host clock."""
    return timing.CudaEventMarks() if on_gpu else timing.HostMarks(synchronize)


def torch_graph_capture(run: Callable[[int], object], calls: int) -> Callable[[], object]:
    """Capture ``calls`` runs (``run(0)`` ... ``run(calls - 1)``) in one torch CUDA graph after a
    warm-up on a side stream (:func:`~pagedattn.backends.engine_calls.capture_runs`); return its
    replay. Raises :class:`~.timing.GraphUnsupported` with the error when the capture fails."""
    try:
        return capture_runs(run, calls)
    except CaptureFailed as error:
        raise timing.GraphUnsupported(str(error)) from None
