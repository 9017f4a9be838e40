"""How the cupy backend's ``run`` reads torch tensors (CPU): pointers, shapes and element strides
from the tensor itself, no conversion; a query copied only when misaligned or strided;
outputs allocated as torch tensors; an array on another device refused; the parameter block a
run writes its pointers and strides into. The launches themselves are ``gpu`` tests."""

from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest

from pagedattn.backends.cupy import arrays, runtime
from pagedattn.backends.cupy.backend import ATTENTION_STRIDE_SLOTS, CupyBackend
from pagedattn.errors import PagedAttentionError, UnsupportedError

torch = pytest.importorskip("torch")


def test_a_cpu_tensor_is_refused_naming_the_argument() -> None:
    with pytest.raises(PagedAttentionError) as error:
        arrays.launch_view(torch.zeros(2, 3), "key_cache")
    assert error.value.argument == "key_cache"


def test_something_else_is_refused_naming_the_argument() -> None:
    with pytest.raises(PagedAttentionError, match="received list") as error:
        arrays.launch_view([1, 2], "query")
    assert error.value.argument == "query"


def test_a_contiguous_aligned_query_is_passed_as_is_and_others_are_copied() -> None:
    query = torch.arange(2 * 4 * 8, dtype=torch.bfloat16).reshape(2, 4, 8)
    assert arrays.contiguous_query(query) is query
    strided = query.transpose(0, 1)
    copy = arrays.contiguous_query(strided)
    assert copy.is_contiguous() and copy.data_ptr() % 16 == 0 and torch.equal(copy, strided)
    misaligned = torch.zeros(2 * 4 * 8 + 1, dtype=torch.bfloat16)[1:].reshape(2, 4, 8)
    assert misaligned.data_ptr() % 16 != 0
    realigned = arrays.contiguous_query(misaligned)
    assert realigned.data_ptr() % 16 == 0 and torch.equal(realigned, misaligned)


def test_outputs_of_a_torch_query_are_torch_tensors_with_their_pointers() -> None:
    query = torch.zeros(3, 4, 8, dtype=torch.bfloat16)
    out, out_pointer, lse, lse_pointer = arrays.empty_outputs(query, (3, 4, 8))
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (3, 4, 8)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (3, 4)
    assert isinstance(out_pointer, int) and out_pointer == out.data_ptr()
    assert lse_pointer == lse.data_ptr()
    out, out_pointer, lse, lse_pointer = arrays.empty_outputs(query, (3, 4, 8), with_lse=False)
    assert out_pointer == out.data_ptr() and lse is None and lse_pointer == 0


class _DeviceArray:
    """What launch_view reads of a cupy array: data.ptr, data.device_id, shape, strides, itemsize."""

    def __init__(self, device_id: int) -> None:
        self.data = types.SimpleNamespace(ptr=4096, device_id=device_id)
        self.shape, self.strides, self.itemsize = (2, 3), (12, 4), 4


def test_an_array_on_another_device_is_refused_naming_the_argument() -> None:
    assert arrays.launch_view(_DeviceArray(1), "value_cache", 1) == (4096, (2, 3), (3, 1), 4)
    with pytest.raises(PagedAttentionError, match="device 0") as error:
        arrays.launch_view(_DeviceArray(1), "value_cache", 0)
    assert error.value.argument == "value_cache"
    with pytest.raises(PagedAttentionError, match="cuda:0") as error:
        arrays.launch_view(torch.zeros(2, 3), "query", 0)
    assert error.value.argument == "query"


def test_a_parameter_block_holds_each_value_s_bits_where_its_address_points() -> None:
    values = (0x7F00_0000_1230, np.int64(-3), np.int32(7), np.float32(0.5), np.float32(-2.0), np.uint64(2**63))
    block = runtime.KernelArguments(values)
    addresses = (ctypes.c_void_p * len(values)).from_address(block.address)
    read = [
        ctypes.c_uint64.from_address(addresses[0]).value,
        ctypes.c_int64.from_address(addresses[1]).value,
        ctypes.c_int32.from_address(addresses[2]).value,
        ctypes.c_float.from_address(addresses[3]).value,
        ctypes.c_float.from_address(addresses[4]).value,
        ctypes.c_uint64.from_address(addresses[5]).value,
    ]
    assert read == [0x7F00_0000_1230, -3, 7, 0.5, -2.0, 2**63]
    block[1] = -48  # a run rewrites a slot in place: the same address reads the new value
    assert ctypes.c_int64.from_address(addresses[1]).value == -48
    with pytest.raises(TypeError):
        runtime.KernelArguments((np.int16(1),))


def _strides_state() -> types.SimpleNamespace:
    values = (0,) * ATTENTION_STRIDE_SLOTS + (np.int64(0),) * 6
    return types.SimpleNamespace(attention_block=runtime.KernelArguments(values), strides_seen=None)


def _strides(state: types.SimpleNamespace) -> list[int]:
    """The six cache strides of the state's parameter block."""
    return [state.attention_block[i] for i in range(ATTENTION_STRIDE_SLOTS, ATTENTION_STRIDE_SLOTS + 6)]


def test_cache_strides_are_written_once_checked_and_a_bad_view_is_still_refused_after() -> None:
    backend = CupyBackend()
    state = _strides_state()
    view = (4096, (10, 16, 2, 64), (2048, 128, 64, 1), 2)  # NHD [blocks, slot, head, d], bf16
    backend._set_strides(state, view, view, "NHD")  # type: ignore[arg-type]
    assert _strides(state) == [2048, 128, 64, 2048, 128, 64]
    # HND [blocks, head, slot, d] of another cache: the kernel takes (block, slot, head)
    other = (8192, (10, 2, 16, 64), (2048, 1024, 64, 1), 2)
    backend._set_strides(state, other, other, "HND")  # type: ignore[arg-type]
    assert _strides(state) == [2048, 64, 1024, 2048, 64, 1024]
    for bad, argument in (((4096, (10, 16, 2, 64), (4096, 256, 128, 2), 2), "key_cache"),
                          ((4098, (10, 16, 2, 64), (2048, 128, 64, 1), 2), "key_cache")):
        with pytest.raises(UnsupportedError) as error:
            backend._set_strides(state, bad, view, "NHD")  # type: ignore[arg-type]
        assert error.value.argument == argument
        with pytest.raises(UnsupportedError) as error:
            backend._set_strides(state, view, bad, "NHD")  # type: ignore[arg-type]
        assert error.value.argument == "value_cache"

