"""Far uploads leave no full copy of their contents: zeros go up whole, the contents in pieces."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedattn.backends.capabilities import Capabilities
from pagedattn.backends.cupy.arrays import RawArray
from pagedattn.backends.numpy.backend import NumpyBackend
from pagedattn.conformance import checks, uploads
from pagedattn.conformance.cases import device_caches
from pagedattn.conformance.scale import far_layer_view_cases, far_pool_cases


class RecordingBackend:
    """A backend on ``device`` whose device arrays are host copies; it records what it uploads."""

    def __init__(self, device: str, assignable: bool = True) -> None:
        self.device = device
        self.assignable = assignable
        self.uploaded: list[np.ndarray] = []

    def capabilities(self) -> Capabilities:
        return Capabilities(device=self.device)

    def to_device(self, array: np.ndarray) -> Any:
        self.uploaded.append(array.copy())
        copy = array.copy()
        return copy if self.assignable else ReadOnly(copy)


class ReadOnly:
    """A device array without item assignment."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TypeError("read-only")


@pytest.fixture
def small_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads, "FAR_ELEMENTS", 1000)
    monkeypatch.setattr(uploads, "PIECE_BYTES", 64)


def _far_array(dtype: Any = ml_dtypes.bfloat16) -> np.ndarray:
    """[40, 4, 8] (1,280 elements, rows of 64 bytes at 16 bits), rows 3, 4 and 37 non-zero."""
    array = np.zeros((40, 4, 8), dtype)
    rng = np.random.default_rng(0)
    for row in (3, 4, 37):
        array[row] = rng.standard_normal((4, 8)).astype(dtype)
    return array


def test_a_far_array_goes_up_as_zeros_then_its_nonzero_pieces(small_limits: None) -> None:
    array = _far_array()
    backend = RecordingBackend("cuda")
    device = uploads.upload(backend, array)  # type: ignore[arg-type]
    assert np.array_equal(device.view(np.uint16), array.view(np.uint16))
    whole, *pieces = backend.uploaded
    assert whole.shape == array.shape and not whole.view(np.uint16).any()
    assert [piece.nbytes for piece in pieces] == [64, 64, 64]  # rows 3, 4 and 37, one row a piece
    assert all(piece.nbytes <= uploads.PIECE_BYTES for piece in pieces)


def test_pieces_span_several_rows_up_to_the_piece_size(small_limits: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(uploads, "PIECE_BYTES", 256)  # four rows a piece: rows 0-3, 4-7 and 36-39
    array = _far_array()
    backend = RecordingBackend("cuda")
    device = uploads.upload(backend, array)  # type: ignore[arg-type]
    assert np.array_equal(device.view(np.uint16), array.view(np.uint16))
    assert [piece.shape[0] for piece in backend.uploaded[1:]] == [4, 4, 4]


def test_rows_past_the_piece_size_go_up_a_run_of_their_own_rows_at_a_time(small_limits: None) -> None:
    array = np.zeros((2, 80, 8), ml_dtypes.bfloat16)  # rows of 1,280 bytes, pieces of 64: inner rows of 16
    array[1, 5] = 1.0
    array[1, 6, 3] = -2.0
    backend = RecordingBackend("cuda")
    device = uploads.upload(backend, array)  # type: ignore[arg-type]
    assert np.array_equal(device.view(np.uint16), array.view(np.uint16))
    assert [piece.shape for piece in backend.uploaded[1:]] == [(4, 8)]  # rows 4-7 of row 1: 64 bytes


@pytest.mark.parametrize("device", ["cpu", "cpu (triton interpreter)"])
def test_host_backends_get_the_plain_upload(small_limits: None, device: str) -> None:
    array = _far_array()
    backend = RecordingBackend(device)
    uploads.upload(backend, array)  # type: ignore[arg-type]
    assert len(backend.uploaded) == 1 and np.array_equal(backend.uploaded[0].view(np.uint16), array.view(np.uint16))


def test_small_arrays_and_arrays_without_assignment_get_the_plain_upload(small_limits: None) -> None:
    backend = RecordingBackend("cuda")
    small = np.ones((10, 4, 8), np.float32)
    uploads.upload(backend, small)  # type: ignore[arg-type]
    assert len(backend.uploaded) == 1
    read_only = RecordingBackend("cuda", assignable=False)
    array = _far_array(np.float16)
    device = uploads.upload(read_only, array)  # type: ignore[arg-type]
    assert np.array_equal(device.array, array)  # zeros, then the whole array once item assignment failed


def test_raw_arrays_take_item_assignment_of_their_own_dtype() -> None:
    target = RawArray(np.zeros((4, 3), np.uint16), ml_dtypes.bfloat16)
    source = np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3)
    target[1:3] = RawArray(source.view(np.uint16), ml_dtypes.bfloat16)
    assert np.array_equal(target.raw[1:3], source.view(np.uint16)) and not target.raw[[0, 3]].any()
    with pytest.raises(TypeError, match="RawArray"):
        target[0:2] = RawArray(np.zeros((2, 3), np.uint8), ml_dtypes.float8_e4m3fn)


class DeviceDeclaringNumpy(NumpyBackend):
    """The NumPy reference declared on a CUDA device. It fails an upload of 2**31 elements or more
    that carries contents: a staging copy of that upload would hold them."""

    def capabilities(self) -> Capabilities:
        return replace(super().capabilities(), device="cuda")

    def to_device(self, array: np.ndarray) -> np.ndarray:
        if array.size >= uploads.FAR_ELEMENTS and array.view(f"u{array.dtype.itemsize}").any():
            raise AssertionError(f"an upload of {array.size:,} elements carried contents")
        return super().to_device(array)


@settings(max_examples=1, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_far_cells_upload_their_pools_in_pieces(data: st.DataObject) -> None:
    """The far-pool check and the layer-view pool of ``device_caches`` reach a device backend only
    through :func:`uploads.upload`: no upload of a far array carries its contents whole."""
    backend = DeviceDeclaringNumpy()
    case = data.draw(far_pool_cases(backend.capabilities(), dtype="float16"))
    checks.far_pool_matches_spec(backend, case)
    views = data.draw(far_layer_view_cases(backend.capabilities(), dtype="float16"))
    key_cache, _, pool = device_caches(backend, views)
    blocks = checks.table_blocks(checks.problem_of(views))
    assert pool.size >= uploads.FAR_ELEMENTS
    assert np.array_equal(key_cache[blocks].view(np.uint16), views.key_cache[blocks].view(np.uint16))
