"""How an inference engine calls a backend: torch CUDA tensors to every backend that takes them,
and a decode step's runs captured in a torch CUDA graph (warmed up on a side stream, then
captured on torch's capture stream, where the GPU backends launch: they follow torch's current
stream). The perf suite and the conformance suite both call backends this way. Imports torch
inside its functions only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pagedattn.backends.interface import Backend


def takes_torch_cuda(backend: Backend) -> bool:
    """Whether ``backend`` runs on CUDA and takes torch CUDA tensors (``accepts_torch``)."""
    return bool(getattr(backend, "accepts_torch", False)) and backend.capabilities().device == "cuda"


def engine_array(backend: Backend, array: np.ndarray) -> Any:
    """``array`` as an engine hands it to ``backend``: a torch CUDA tensor on the current device
    when the backend takes one, else the backend's own device array."""
    if takes_torch_cuda(backend):
        import torch

        from pagedattn.backends.bitviews import numpy_to_torch

        return numpy_to_torch(array, torch.device("cuda", torch.cuda.current_device()))
    return backend.to_device(array)


class CaptureFailed(Exception):
    """The runs could not be captured; the message says why."""


def capture_runs(run: Callable[[int], object], calls: int) -> Callable[[], object]:
    """Capture ``calls`` runs (``run(0)`` ... ``run(calls - 1)``) in one torch CUDA graph after a
    warm-up of the same runs on a side stream; return the graph's replay. Raises
    :class:`CaptureFailed` without a CUDA device or when the capture fails."""
    import torch

    if not torch.cuda.is_available():
        raise CaptureFailed("no CUDA device")
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
        raise CaptureFailed(f"capture failed: {type(error).__name__}: {first}"[:200]) from None
    return graph.replay
