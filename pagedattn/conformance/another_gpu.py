"""The contract's "Devices" on a host of several GPUs: a call whose arrays are on a GPU other than
the current one, as an engine that splits a model's layers over GPUs in one process makes it.

:class:`OnAnotherGPU` hands a backend every array on the first GPU that is not the current one
and holds each call to the rule: the current device is the same after it, and what it returns
is on the arrays' GPU. The checks below are the usual ones (``checks.matches_spec`` and its
siblings) made through it. A backend that runs only on the current device raises the
unsupported error (capability ``other_device``), and the cell says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from pagedattn.backends.bitviews import numpy_to_torch, torch_to_numpy
from pagedattn.backends.devices import array_device
from pagedattn.backends.engine_calls import takes_torch_cuda
from pagedattn.backends.interface import Backend
from pagedattn.conformance import checks
from pagedattn.conformance.assertions import ConformanceFailure
from pagedattn.conformance.cases import AttentionCase, CopyBlocksCase, MergeCase, WriteKVCase
from pagedattn.errors import UnsupportedError

#: The calls :class:`OnAnotherGPU` holds to the rule.
CALLS = ("plan", "run", "paged_attention", "write_kv", "copy_blocks", "merge_states")


class OnAnotherGPU:
    """``backend`` as a check meets it when the caller's arrays are on GPU ``other`` while GPU
    ``current`` is the current device."""

    def __init__(self, backend: Backend, torch: Any, current: int, other: int) -> None:
        self._backend, self._torch = backend, torch
        self._current, self._other = current, other
        self._device = torch.device("cuda", other)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._backend, name)
        return self._held(name, attribute) if name in CALLS else attribute

    def to_device(self, array: np.ndarray) -> Any:
        return numpy_to_torch(array, self._device)

    def to_numpy(self, array: Any) -> np.ndarray:
        return torch_to_numpy(array)

    def synchronize(self) -> None:
        for index in (self._current, self._other):
            self._torch.cuda.synchronize(index)

    def _held(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def held(*args: Any, **kwargs: Any) -> Any:
            result = call(*args, **kwargs)
            now = self._torch.cuda.current_device()
            if now != self._current:
                raise ConformanceFailure(f"{name} left cuda:{now} the current device; it was cuda:{self._current}"
                                         f" [call: backend={self._backend.name} {name} of arrays on"
                                         f" cuda:{self._other}]")
            for output in result if isinstance(result, tuple) else (result,):
                where = array_device(output)
                if where is not None and where != f"cuda:{self._other}":
                    raise ConformanceFailure(f"{name} returned an array on {where}, its arrays are on"
                                             f" cuda:{self._other} [call: backend={self._backend.name} {name}]")
            return result
        return held


def on_another_gpu(backend: Backend, operation: str) -> OnAnotherGPU:
    """``backend`` wrapped in :class:`OnAnotherGPU`: the current device and the next one. The
    unsupported error unless the backend takes torch CUDA tensors and this process sees two GPUs
    or more (under ``--gpus`` each worker sees one)."""
    if not takes_torch_cuda(backend):
        raise UnsupportedError(operation, "it does not take torch CUDA tensors, whose device this check sets",
                               backend=backend.name, capability="cuda_devices")
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count < 2:
        raise UnsupportedError(operation, f"{count} CUDA device(s) here: this check needs two",
                               backend=backend.name, capability="cuda_devices")
    current = torch.cuda.current_device()
    return OnAnotherGPU(backend, torch, current, (current + 1) % count)


def attention_on_another_gpu(backend: Backend, case: AttentionCase) -> float:
    """:func:`~pagedattn.conformance.checks.matches_spec` with every array on a GPU other than the
    current one: the spec's answer, on that GPU, the current device unchanged."""
    __tracebackhide__ = True
    return checks.matches_spec(on_another_gpu(backend, "paged_attention"), case)  # type: ignore[arg-type]


def write_kv_on_another_gpu(backend: Backend, case: WriteKVCase) -> float:
    """:func:`~pagedattn.conformance.checks.write_kv_matches_spec` with every array on a GPU other
    than the current one."""
    __tracebackhide__ = True
    return checks.write_kv_matches_spec(on_another_gpu(backend, "write_kv"), case)  # type: ignore[arg-type]


def copy_blocks_on_another_gpu(backend: Backend, case: CopyBlocksCase) -> float:
    """:func:`~pagedattn.conformance.checks.copy_blocks_matches_spec` with every array on a GPU
    other than the current one."""
    __tracebackhide__ = True
    return checks.copy_blocks_matches_spec(on_another_gpu(backend, "copy_blocks"), case)  # type: ignore[arg-type]


def merge_states_on_another_gpu(backend: Backend, case: MergeCase) -> float:
    """:func:`~pagedattn.conformance.checks.merge_states_matches_spec` with every array on a GPU
    other than the current one."""
    __tracebackhide__ = True
    return checks.merge_states_matches_spec(on_another_gpu(backend, "merge_states"), case)  # type: ignore[arg-type]
