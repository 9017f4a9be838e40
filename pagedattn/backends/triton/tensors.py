"""NumPy (ml_dtypes included) <-> torch tensors, bit for bit.

bfloat16 and fp8 travel as same-width unsigned integers (``uint16``/``uint8`` views), since
neither NumPy nor torch converts the other's ml_dtypes arrays. torch is imported inside
the functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.spec.dtypes import dtype_name, numpy_dtype

#: Canonical dtype name -> (torch dtype attribute, NumPy integer view of the same width).
_BIT_VIEWS: dict[str, tuple[str, type]] = {
    "bfloat16": ("bfloat16", np.uint16),
    "float8_e4m3fn": ("float8_e4m3fn", np.uint8),
    "float8_e5m2": ("float8_e5m2", np.uint8),
}
_TORCH_INT_VIEWS: dict[str, str] = {"bfloat16": "int16", "float8_e4m3fn": "uint8", "float8_e5m2": "uint8"}


def torch_dtype(name: str) -> Any:
    """The torch dtype of a canonical dtype name."""
    import torch

    return getattr(torch, name)


def numpy_to_torch(array: np.ndarray, device: Any) -> Any:
    """Return a torch tensor on ``device`` with the values (bits) and shape of ``array``."""
    import torch

    host = np.ascontiguousarray(array)
    name = dtype_name(host.dtype)
    if name in _BIT_VIEWS:
        torch_name, int_view = _BIT_VIEWS[name]
        tensor = torch.from_numpy(host.view(int_view)).view(getattr(torch, torch_name))
    else:
        tensor = torch.from_numpy(host)
    return tensor.to(device)


def as_tensor(array: Any, device: Any) -> Any:
    """A torch tensor for ``array``: torch as is, NumPy copied to ``device``, others via DLPack."""
    import torch

    if isinstance(array, torch.Tensor):
        return array
    if isinstance(array, np.ndarray):
        return numpy_to_torch(array, device)
    return torch.from_dlpack(array)


def torch_to_numpy(tensor: Any) -> np.ndarray:
    """Return a host NumPy copy of a torch tensor (or NumPy array), ml_dtypes for bf16/fp8."""
    import torch

    if isinstance(tensor, np.ndarray):
        return tensor
    if not isinstance(tensor, torch.Tensor):
        tensor = torch.from_dlpack(tensor)
    host = tensor.detach().to("cpu").contiguous()
    name = dtype_name(host.dtype)
    if name in _TORCH_INT_VIEWS:
        return host.view(getattr(torch, _TORCH_INT_VIEWS[name])).numpy().view(numpy_dtype(name))
    return host.numpy()
