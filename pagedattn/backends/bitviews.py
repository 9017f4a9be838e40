"""NumPy (ml_dtypes included) <-> torch tensors, bit for bit: the project's one conversion.

bfloat16 and fp8 travel as integers of the same width (NumPy ``uint16``/``uint8``, torch
``int16``/``uint8`` views), since neither NumPy nor torch converts the other's ml_dtypes
arrays. Every backend that meets torch tensors (torch, triton, cupy) converts through here.
torch is imported inside the functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.spec.dtypes import dtype_name, numpy_dtype

#: Contract dtype names held as raw bits -> (NumPy unsigned view, torch integer view) of that width.
BIT_VIEWS: dict[str, tuple[type, str]] = {
    "bfloat16": (np.uint16, "int16"),
    "float8_e4m3fn": (np.uint8, "uint8"),
    "float8_e5m2": (np.uint8, "uint8"),
}


def torch_dtype(name: str) -> Any:
    """The torch dtype of a canonical dtype name."""
    import torch

    return getattr(torch, name)


def torch_bits(tensor: Any) -> Any:
    """``tensor`` itself, or for a bit-held dtype (bfloat16, fp8) its integer view (no copy)."""
    name = dtype_name(tensor.dtype)
    if name in BIT_VIEWS:
        return tensor.view(torch_dtype(BIT_VIEWS[name][1]))
    return tensor


def numpy_to_torch(array: np.ndarray, device: Any) -> Any:
    """Return a torch tensor on ``device`` with the values (bits) and shape of ``array``."""
    import torch

    host = np.ascontiguousarray(array)
    name = dtype_name(host.dtype)
    if name in BIT_VIEWS:
        tensor = torch.from_numpy(host.view(BIT_VIEWS[name][0])).view(torch_dtype(name))
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
    if name in BIT_VIEWS:
        return torch_bits(host).numpy().view(numpy_dtype(name))
    return host.numpy()
