"""torch's getters of the current CUDA device and of a device's current stream handle, for the
GPU backends, which launch on torch's stream (where CUDA graphs capture) and ask on every run.

torch's internal getters are used where present: they cost a fraction of
``torch.cuda.current_stream``, which makes a Python stream object. ``torch`` is passed in, so
importing this module imports no GPU library.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def current_device_getter(torch: Any) -> Callable[[], int]:
    """A function returning the index of torch's current CUDA device."""
    get_device = getattr(torch._C, "_cuda_getDevice", None)
    if get_device is not None:
        return get_device  # type: ignore[no-any-return]

    def current_device() -> int:
        return int(torch.cuda.current_device())

    return current_device


def current_stream_getter(torch: Any) -> Callable[[int], int]:
    """A function returning the handle of torch's current stream on a device index."""
    get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get_raw is not None:
        return get_raw  # type: ignore[no-any-return]

    def current_stream(device_index: int) -> int:
        return int(torch.cuda.current_stream(device_index).cuda_stream)

    return current_stream
