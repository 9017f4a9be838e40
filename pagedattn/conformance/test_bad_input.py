"""Contract section "Bad input": every item raises PagedAttentionError naming the argument, writing nothing."""

from __future__ import annotations

import pytest

from pagedattn.conformance.bad_inputs import BAD_INPUTS, check_bad_input, other_device
from pagedattn.conformance.runner import RECORD_KEY, Unsupported, require

pytestmark = pytest.mark.pagedattn_conformance

_OPERATION_FEATURE = {"write_kv": ("write_kv",), "copy_blocks": ("copy_blocks",),
                      "merge_states": ("merge_states",), "paged_attention": ()}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_raises_naming_the_argument(request, backend, name):
    """The spoiled call raises PagedAttentionError whose ``argument`` is the contract's; caches keep their bits."""
    caps = backend.capabilities()
    record = {"feature": "bad_input", "dtype": "-", "block_size": "-", "kv_layout": "-", "backend": backend.name,
              "check": name, "status": "pass", "examples": 1, "worst_fraction": 0.0}
    request.node.user_properties.append((RECORD_KEY, record))
    try:
        if not (caps.dtypes and caps.kv_layouts and (caps.block_sizes is None or caps.block_sizes)):
            raise Unsupported(f"{backend.name}: declares no dtype, layout or block size")
        require(backend, features=_OPERATION_FEATURE[BAD_INPUTS[name].operation])
        if name.endswith("_on_another_device"):
            other_device(backend)
    except Unsupported as error:
        record.update(status="unsupported", reason=str(error), examples=0)
        raise
    dtype = "float32" if "float32" in caps.dtypes else caps.dtypes[0]
    block_size = 16 if caps.block_sizes is None or 16 in caps.block_sizes else caps.block_sizes[0]
    kv_layout = caps.kv_layouts[0]
    try:
        check_bad_input(backend, name, dtype=dtype, block_size=block_size, kv_layout=kv_layout)
    except BaseException:
        record["status"] = "fail"
        raise
