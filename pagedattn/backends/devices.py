"""Which device an array is on, and the contract's rule that one call's arrays share one device.

Read through DLPack's ``__dlpack_device__`` (torch, CuPy and every array library that speaks
DLPack), so no GPU library is imported here. A NumPy array is host data that a backend copies
where it needs it: it is on no device of its own and never disagrees.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from pagedattn.errors import PagedAttentionError

#: DLPack's device type codes (``DLDeviceType``), as names.
DLPACK_DEVICE_TYPES: dict[int, str] = {
    1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 9: "vpi", 10: "rocm",
    11: "rocm_host", 12: "ext_dev", 13: "cuda_managed", 14: "oneapi", 15: "webgpu", 16: "hexagon", 17: "maia",
}


def array_device(array: Any) -> str | None:
    """``"cuda:1"``, ``"cpu"``, ...: the device ``array`` is on; None for NumPy arrays, lists,
    None and anything without ``__dlpack_device__``. A torch tensor on the meta device, which has no
    data, is ``"meta"``."""
    if array is None or isinstance(array, np.ndarray | list | tuple):
        return None
    dlpack_device = getattr(array, "__dlpack_device__", None)
    if dlpack_device is None:
        return None
    try:
        kind, index = dlpack_device()
    except (BufferError, RuntimeError, TypeError, ValueError):
        device = getattr(array, "device", None)  # torch's meta tensors have no DLPack device
        return None if device is None else str(device)
    kind = int(kind)
    return f"{DLPACK_DEVICE_TYPES.get(kind, f'dlpack device type {kind}')}:{int(index)}"


def require_one_device(arrays: Iterable[tuple[str, Any]]) -> str | None:
    """Raise :class:`PagedAttentionError` naming the first array on another device than the first
    array that is on one (the contract's "Devices"); return that device, or None if none is."""
    first: tuple[str, str] | None = None
    for argument, array in arrays:
        device = array_device(array)
        if device is None:
            continue
        if first is None:
            first = (argument, device)
        elif device != first[1]:
            raise PagedAttentionError(argument, f"on {device}, while {first[0]} is on {first[1]}: the arrays of "
                                                f"one call must share one device")
    return None if first is None else first[1]
