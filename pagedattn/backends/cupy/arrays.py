"""Device arrays of the cupy backend: cupy arrays, raw-bit views for bfloat16/fp8, torch via DLPack.

cupy has no bfloat16 or fp8 dtype the kernels rely on, so those arrays live on the device as
:class:`RawArray`: a cupy array of their 16-/8-bit patterns plus the contract dtype (ml_dtypes),
which is what validation reads. ``run`` reads any of them (and torch CUDA tensors) by pointer,
shape and strides (:func:`launch_view`), with no conversion; the other operations take torch
tensors through DLPack (bfloat16 and fp8 viewed as integers first). cupy and torch are
imported inside functions.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.backends.bitviews import BIT_VIEWS, torch_bits, torch_to_numpy
from pagedattn.errors import PagedAttentionError
from pagedattn.spec.dtypes import dtype_name, numpy_dtype

#: Contract dtypes held as raw bits, and the unsigned integer type of their bits.
RAW_DTYPES: dict[str, Any] = {name: views[0] for name, views in BIT_VIEWS.items()}


class RawArray:
    """A device array of a contract dtype (bfloat16, fp8) stored as a cupy array of its bits.

    ``raw``: the cupy array (uint16 or uint8, same shape and strides); ``dtype``: the NumPy
    (ml_dtypes) dtype it stands for. Indexing returns views, like cupy.
    """

    def __init__(self, raw: Any, dtype: Any) -> None:
        self.raw = raw
        self.dtype = np.dtype(dtype)

    shape = property(lambda self: tuple(self.raw.shape))
    strides = property(lambda self: tuple(self.raw.strides))
    ndim = property(lambda self: self.raw.ndim)
    size = property(lambda self: self.raw.size)
    itemsize = property(lambda self: self.raw.itemsize)

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, key: Any) -> RawArray:
        return RawArray(self.raw[key], self.dtype)

    def __setitem__(self, key: Any, value: RawArray) -> None:
        """Write ``value`` (a RawArray of this dtype) into the elements ``key`` selects, like cupy."""
        if not isinstance(value, RawArray) or value.dtype != self.dtype:
            raise TypeError(f"a RawArray of {dtype_name(self.dtype)} takes only RawArrays of its dtype")
        self.raw[key] = value.raw

    def reshape(self, *shape: Any) -> RawArray:
        return RawArray(self.raw.reshape(*shape), self.dtype)

    def swapaxes(self, a: int, b: int) -> RawArray:
        return RawArray(self.raw.swapaxes(a, b), self.dtype)

    def copy(self) -> RawArray:
        return RawArray(self.raw.copy(), self.dtype)

    def __repr__(self) -> str:
        return f"RawArray(shape={self.shape}, dtype={dtype_name(self.dtype)})"


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def to_device(array: Any) -> Any:
    """Return a NumPy array (ml_dtypes included) on the device: cupy, or RawArray for bf16/fp8."""
    import cupy

    host = np.ascontiguousarray(array)
    name = dtype_name(host.dtype)
    raw = host.view(RAW_DTYPES[name]) if name in RAW_DTYPES else host
    # ndarray.set copies from the pageable host array, in order on the current stream: cupy.asarray
    # would stage the whole array in pinned host memory and keep it in cupy's pinned pool (gigabytes
    # for a far pool's upload)
    device = cupy.empty(raw.shape, raw.dtype)
    device.set(raw, stream=cupy.cuda.get_current_stream())
    return RawArray(device, host.dtype) if name in RAW_DTYPES else device


def to_numpy(array: Any) -> np.ndarray:
    """Return a device array (cupy, RawArray, torch) as NumPy of the contract dtype."""
    if isinstance(array, RawArray):
        return np.asarray(array.raw.get()).view(array.dtype)
    if is_torch(array):
        return torch_to_numpy(array)
    if hasattr(array, "get"):  # cupy
        return np.asarray(array.get())
    return np.asarray(array)


def raw_view(array: Any, argument: str) -> tuple[Any, str]:
    """Return ``(cupy array of the bits or values, contract dtype name)`` of a device array."""
    import cupy

    if isinstance(array, RawArray):
        return array.raw, dtype_name(array.dtype)
    if isinstance(array, cupy.ndarray):
        return array, dtype_name(array.dtype)
    if is_torch(array):
        if not array.is_cuda:
            raise PagedAttentionError(
                argument, f"expected a CUDA tensor, received one on {array.device}"
            )
        name = dtype_name(array.dtype)
        raw = cupy.from_dlpack(torch_bits(array))
        return (raw.view(RAW_DTYPES[name]) if name in RAW_DTYPES else raw), name
    raise PagedAttentionError(
        argument,
        f"expected a cupy array, RawArray or torch CUDA tensor, received {type(array).__name__}",
    )


def launch_view(
    array: Any, argument: str, device: int | None = None
) -> tuple[int, tuple[int, ...], tuple[int, ...], int]:
    """``(pointer, shape, element strides, itemsize)`` of a device array (cupy, RawArray, torch
    CUDA tensor), read from its attributes with no conversion. What every ``run`` does with its
    arrays; an array that is not on the GPU ``device`` (when given) is refused, naming it."""
    raw = array.raw if isinstance(array, RawArray) else array
    if is_torch(raw):
        on = raw.get_device()
        if on < 0 or (device is not None and on != device):
            raise PagedAttentionError(
                argument,
                f"expected a CUDA tensor{'' if device is None else f' on cuda:{device}'},"
                f" received one on {raw.device}",
            )
        return raw.data_ptr(), tuple(raw.shape), tuple(raw.stride()), raw.element_size()
    data = getattr(raw, "data", None)
    if data is None or not hasattr(data, "ptr"):
        raise PagedAttentionError(
            argument,
            f"expected a cupy array, RawArray or torch CUDA tensor, received {type(array).__name__}",
        )
    if device is not None and data.device_id != device:
        raise PagedAttentionError(
            argument, f"expected an array on device {device}, received one on device {data.device_id}"
        )
    return int(data.ptr), tuple(raw.shape), element_strides(raw), raw.itemsize


def contiguous_query(query: Any) -> Any:
    """``query`` itself when C-contiguous and 16-byte aligned, else an aligned contiguous copy of
    the same kind (the kernels read query rows with 16-byte loads)."""
    raw = query.raw if isinstance(query, RawArray) else query
    if is_torch(raw):
        if raw.is_contiguous() and raw.data_ptr() % 16 == 0:
            return query
        return raw.contiguous().clone()
    if raw.flags.c_contiguous and raw.data.ptr % 16 == 0:
        return query
    import cupy

    copy = cupy.ascontiguousarray(raw).copy()
    return RawArray(copy, query.dtype) if isinstance(query, RawArray) else copy


def empty_outputs(
    query: Any, shape: tuple[int, int, int], with_lse: bool = True
) -> tuple[Any, int, Any, int]:
    """``(out, out pointer, lse, lse pointer)``: out ``shape`` in the query's dtype and float32 lse
    ``shape[:2]`` (``None`` and 0 unless ``with_lse``), both in the query's kind (torch,
    RawArray, cupy)."""
    raw = query.raw if isinstance(query, RawArray) else query
    if is_torch(raw):
        import torch

        out_t = torch.empty(shape, dtype=raw.dtype, device=raw.device)
        if not with_lse:
            return out_t, out_t.data_ptr(), None, 0
        lse_t = torch.empty(shape[:2], dtype=torch.float32, device=raw.device)
        return out_t, out_t.data_ptr(), lse_t, lse_t.data_ptr()
    import cupy

    raw_out = cupy.empty(shape, dtype=raw.dtype)
    out = RawArray(raw_out, query.dtype) if isinstance(query, RawArray) else raw_out
    if not with_lse:
        return out, int(raw_out.data.ptr), None, 0
    raw_lse = cupy.empty(shape[:2], dtype=cupy.float32)
    return out, int(raw_out.data.ptr), raw_lse, int(raw_lse.data.ptr)


def element_strides(raw: Any) -> tuple[int, ...]:
    """Strides of a cupy array in elements."""
    return tuple(int(s) // raw.itemsize for s in raw.strides)


def empty_like_output(query: Any, raw_query: Any, name: str) -> tuple[Any, Any]:
    """Allocate out ``[T, Hq, D]`` in the query's kind (torch, RawArray, cupy): ``(out, raw)``."""
    import cupy

    shape = tuple(raw_query.shape)
    if is_torch(query):
        import torch

        out = torch.empty(shape, dtype=query.dtype, device=query.device)
        raw, _ = raw_view(out, "out")
        return out, raw
    raw = cupy.empty(shape, dtype=raw_query.dtype)
    return (RawArray(raw, numpy_dtype(name)) if name in RAW_DTYPES else raw), raw


def empty_lse(query: Any, shape: tuple[int, int]) -> tuple[Any, Any]:
    """Allocate float32 lse ``[T, Hq]`` in the query's kind: ``(lse, raw)``."""
    import cupy

    if is_torch(query):
        import torch

        lse = torch.empty(shape, dtype=torch.float32, device=query.device)
        return lse, cupy.from_dlpack(lse)
    raw = cupy.empty(shape, dtype=cupy.float32)
    return raw, raw
