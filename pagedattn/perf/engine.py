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

from pagedattn.backends.interface import Backend
from pagedattn.perf import timing

INPUT_KINDS: tuple[str, ...] = ("torch", "native")
GPU_FLUSH_BYTES = 256 << 20  # several times an H100/H200's 50 MB L2
CPU_FLUSH_BYTES = 64 << 20


def takes_torch_cuda(backend: Backend) -> bool:
    """Whether ``backend`` runs on CUDA and takes torch CUDA tensors (``accepts_torch``)."""
    return bool(getattr(backend, "accepts_torch", False)) and backend.capabilities().device == "cuda"


def to_device(backend: Backend, array: np.ndarray, inputs: str) -> Any:
    """``array`` as ``backend`` receives it: a torch CUDA tensor under ``inputs="torch"`` when the
    backend takes one, else the backend's own device array."""
    if inputs not in INPUT_KINDS:
        raise ValueError(f"inputs={inputs!r}: expected one of {INPUT_KINDS}")
    if inputs == "torch" and takes_torch_cuda(backend):
        import torch

        from pagedattn.backends.bitviews import numpy_to_torch

        return numpy_to_torch(array, torch.device("cuda", torch.cuda.current_device()))
    return backend.to_device(array)


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
    warm-up on a side stream; return its replay. Raises :class:`~.timing.GraphUnsupported`
    with the error when the capture fails."""
    import torch

    if not torch.cuda.is_available():
        raise timing.GraphUnsupported("no CUDA device")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(calls):
            run(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            for i in range(calls):
                run(i)
    except Exception as error:
        torch.cuda.synchronize()
        first = str(error).splitlines()[0] if str(error) else ""
        raise timing.GraphUnsupported(f"capture failed: {type(error).__name__}: {first}"[:200]) from None
    return graph.replay
