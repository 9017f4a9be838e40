"""The one NumPy <-> torch conversion: every contract dtype round-trips bit for bit (CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.backends.bitviews import BIT_VIEWS, as_tensor, numpy_to_torch, torch_bits, torch_to_numpy
from pagedattn.spec.dtypes import numpy_dtype

torch = pytest.importorskip("torch")

NAMES = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2")


@pytest.mark.parametrize("name", NAMES)
def test_every_dtype_round_trips_bit_for_bit(name: str) -> None:
    width = np.dtype(numpy_dtype(name)).itemsize
    bits = np.random.default_rng(0).integers(0, 2 ** (8 * width), size=(3, 5), dtype=np.uint64)
    array = bits.astype(f"u{width}").view(numpy_dtype(name))  # NaNs and infs included
    tensor = numpy_to_torch(array, "cpu")
    assert tensor.dtype == getattr(torch, name) and tuple(tensor.shape) == (3, 5)
    back = torch_to_numpy(tensor)
    assert back.dtype == np.dtype(numpy_dtype(name))
    assert np.array_equal(back.view(f"u{width}"), array.view(f"u{width}"))
    assert torch_to_numpy(as_tensor(array, "cpu")).tobytes() == array.tobytes()


def test_torch_bits_is_a_view_of_the_same_memory() -> None:
    tensor = torch.zeros(4, dtype=torch.bfloat16)
    bits = torch_bits(tensor)
    assert bits.dtype == getattr(torch, BIT_VIEWS["bfloat16"][1])
    bits[0] = 0x3F80  # 1.0 in bfloat16
    assert float(tensor[0]) == 1.0
    plain = torch.zeros(2)
    assert torch_bits(plain) is plain
