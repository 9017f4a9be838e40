"""How the cupy backend's ``run`` reads torch tensors (CPU): pointers, shapes and element strides
from the tensor itself, no conversion; a query copied only when misaligned or strided;
outputs allocated as torch tensors. The launches themselves are ``gpu`` tests."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.backends.cupy import arrays
from pagedattn.errors import PagedAttentionError

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
    assert isinstance(out_pointer, np.uint64) and int(out_pointer) == out.data_ptr()
    assert int(lse_pointer) == lse.data_ptr()
