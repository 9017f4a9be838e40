"""Uploads of arrays past 2**31 elements that leave no other readable copy of their contents.

A kernel that keeps an offset in 32 bits reads, past element 2**31 of an array, the memory
2**32 elements before the element it wants. An upload can leave a full copy of the array
exactly there: cupy stages ``cupy.asarray(host)`` through pinned host memory, keeps that buffer
in its pinned pool, and pinned host memory is mapped into the GPU's address space. On an H100
a bf16 cache's block at element 2**31 + 2**18, read 2**32 elements early, returned that
block's own bits from the staging copy: the wrapped read passed every 16-bit far-pool cell.

:func:`upload` therefore hands a CUDA backend zeros of the array's shape in one piece, and
then writes the contents into the device array in pieces of at most :data:`PIECE_BYTES`,
skipping pieces that are all zero (most of a lazy pool). A copy of the whole array that an
upload leaves behind holds zeros; a read that wraps into it sees zero keys, values or queries,
not the case's. Arrays below 2**31 elements, backends on the CPU, and device arrays that take no
item assignment get ``backend.to_device`` as it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.backends.interface import Backend
from pagedattn.conformance.profiles import runs_on_cpu
from pagedattn.spec.pools import INT32_OFFSET_LIMIT

#: Arrays of at least this many elements are uploaded in pieces: past it a 32-bit offset wraps.
FAR_ELEMENTS = INT32_OFFSET_LIMIT
#: The most bytes one piece of a far array's contents takes to the device.
PIECE_BYTES = 2**26


def upload(backend: Backend, array: np.ndarray) -> Any:
    """``backend.to_device(array)``; past 2**31 elements on a backend off the CPU, zeros uploaded
    whole and the contents written in pieces (no full copy of the contents left anywhere else)."""
    if array.size < FAR_ELEMENTS or array.ndim == 0 or runs_on_cpu(backend.capabilities().device):
        return backend.to_device(array)
    device = backend.to_device(np.zeros(array.shape, array.dtype))  # np.zeros: pages only where touched
    try:
        write_in_pieces(device, array, backend.to_device)
    except TypeError:  # a device array without item assignment: the plain upload
        return backend.to_device(array)
    return device


def write_in_pieces(device: Any, array: np.ndarray, to_device: Any) -> None:
    """Write ``array`` into ``device`` (zeros of its shape) a run of rows (axis 0) at a time, each of
    at most :data:`PIECE_BYTES`, skipping runs that are all zero; a row that holds more is written
    the same way, a run of its own rows at a time (a one-dimensional one whole)."""
    row_bytes = max(1, array.nbytes // max(1, array.shape[0]))
    if row_bytes > PIECE_BYTES and array.ndim > 1:
        for row in range(array.shape[0]):
            write_in_pieces(device[row], array[row], to_device)
        return
    rows = max(1, PIECE_BYTES // row_bytes)
    bits = array.view(f"u{array.dtype.itemsize}")  # any() of the bits: fp8 and bf16 included
    for start in range(0, array.shape[0], rows):
        stop = min(start + rows, array.shape[0])
        if bits[start:stop].any():
            device[start:stop] = to_device(np.ascontiguousarray(array[start:stop]))
