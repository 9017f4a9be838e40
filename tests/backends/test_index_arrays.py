"""One rule for index arrays on every backend: any integer dtype (or a list of ints) whose
values fit in int32 is taken and gives the int32 result; anything else is refused with the
spec's own message (the check is the spec's, run by :class:`Backend.plan`)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from pagedattn.backends.registry import available_backends, load_backend
from pagedattn.errors import PagedAttentionError
from pagedattn.spec import check_paged_attention
from pagedattn.spec.case import AttentionCase
from pagedattn.spec.pools import random_paged_inputs

with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)
    BACKENDS = available_backends()


def _case() -> AttentionCase:
    return random_paged_inputs([20, 5], None, num_q_heads=2, num_kv_heads=1, head_dim=16)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("form", ["int64", "uint16", "list"])
def test_any_integer_index_array_gives_the_int32_result(name: str, form: str) -> None:
    backend = load_backend(name)
    case = _case()
    tables = np.where(case.block_tables < 0, 0, case.block_tables).astype(np.int32)  # unsigned: no -1 padding
    dev = backend.to_device
    query, key_cache, value_cache = (dev(x) for x in case.args()[:3])
    want = backend.to_numpy(backend.paged_attention(query, key_cache, value_cache, dev(tables), dev(case.seq_lens)))
    if form == "list":
        got = backend.paged_attention(query, key_cache, value_cache, tables.tolist(), case.seq_lens.tolist())
    else:
        got = backend.paged_attention(query, key_cache, value_cache, dev(tables.astype(form)),
                                      dev(case.seq_lens.astype(form)))
    assert np.array_equal(backend.to_numpy(got), want)


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("bad", ["float32", "past_int32"])
def test_other_index_arrays_are_refused_with_the_spec_message(name: str, bad: str) -> None:
    backend = load_backend(name)
    case = _case()
    tables = case.block_tables.astype(np.float32) if bad == "float32" else np.full_like(
        case.block_tables, 2**31, dtype=np.int64)
    with pytest.raises(PagedAttentionError) as spec_error:
        check_paged_attention(*case.args()[:3], tables, case.seq_lens)
    dev = backend.to_device
    with pytest.raises(PagedAttentionError) as backend_error:
        backend.paged_attention(*(dev(x) for x in case.args()[:3]), dev(tables), dev(case.seq_lens))
    assert backend_error.value.argument == "block_tables"
    assert str(backend_error.value) == str(spec_error.value)
