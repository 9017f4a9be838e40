"""The contract's "Bad input" items: each turns a valid call into a bad one and names the argument
the error must name. :func:`check_bad_input` asserts the backend raises
:class:`~pagedattn.errors.PagedAttentionError` naming that argument and writes nothing.

The items ``*_on_another_device`` hand one array on another device than the rest (the contract's
"Devices"): a torch tensor on the host when the backend's arrays are on a GPU, on torch's meta
device when they are on the host. A backend whose arrays are NumPy's has no other device: those
items are unsupported there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from pagedattn.backends.bitviews import numpy_to_torch, torch_to_numpy
from pagedattn.backends.devices import array_device
from pagedattn.backends.interface import Backend
from pagedattn.conformance.assertions import ConformanceFailure, assert_bit_identical
from pagedattn.conformance.runner import Unsupported
from pagedattn.errors import PagedAttentionError
from pagedattn.spec.dtypes import numpy_dtype

Call = dict[str, Any]


class BadInput(NamedTuple):
    """One bad-input item: the operation, the argument the error must name, how to spoil a valid call."""

    operation: str  # "paged_attention", "write_kv", "copy_blocks", "merge_states"
    argument: str
    spoil: Callable[[Call], None]


def _set(key: str, make: Callable[[Call], Any]) -> Callable[[Call], None]:
    def spoil(call: Call) -> None:
        call[key] = make(call)
    return spoil


def _elsewhere(argument: str) -> Callable[[Call], None]:
    def spoil(call: Call) -> None:
        call["elsewhere"] = argument
    return spoil


def _table_entry(value: Callable[[Call], int]) -> Callable[[Call], None]:
    def spoil(call: Call) -> None:
        call["block_tables"] = call["block_tables"].copy()
        call["block_tables"][1, 0] = value(call)
    return spoil


BAD_INPUTS: dict[str, BadInput] = {
    "query_rank": BadInput("paged_attention", "query", _set("query", lambda c: c["query"][:, :, :, None])),
    "query_head_dim": BadInput("paged_attention", "query", _set("query", lambda c: c["query"][..., :-1].copy())),
    "heads_not_a_multiple": BadInput("paged_attention", "query", _set("query", lambda c: c["query"][:, :3].copy())),
    "query_dtype": BadInput("paged_attention", "query", _set("query", lambda c: c["query"].astype(np.float64))),
    "cache_dtypes_differ": BadInput("paged_attention", "value_cache",
                                    _set("value_cache", lambda c: c["value_cache"].astype(np.float64))),
    "cache_shapes_differ": BadInput("paged_attention", "value_cache",
                                    _set("value_cache", lambda c: c["value_cache"][:-1].copy())),
    "kv_layout_unknown": BadInput("paged_attention", "kv_layout", _set("kv_layout", lambda c: "NDH")),
    "table_entry_past_pool": BadInput("paged_attention", "block_tables",
                                      _table_entry(lambda c: c["key_cache"].shape[0])),
    "table_entry_negative": BadInput("paged_attention", "block_tables", _table_entry(lambda c: -1)),
    "block_tables_float": BadInput("paged_attention", "block_tables",
                                   _set("block_tables", lambda c: c["block_tables"].astype(np.float32))),
    "block_tables_past_int32": BadInput("paged_attention", "block_tables", _set(  # in unneeded columns
        "block_tables", lambda c: np.where(c["block_tables"] < 0, 2**31, c["block_tables"].astype(np.int64)))),
    "scale_string": BadInput("paged_attention", "scale", _set("scale", lambda c: "0.5")),
    "return_lse_string": BadInput("paged_attention", "return_lse", _set("return_lse", lambda c: "yes")),
    "seq_len_beyond_table": BadInput("paged_attention", "seq_lens", _set(
        "seq_lens", lambda c: np.array([5, c["block_tables"].shape[1] * c["block_size"] + 1], np.int32))),
    "seq_len_negative": BadInput("paged_attention", "seq_lens", _set("seq_lens", lambda c: np.array([-1, 20],
                                                                                                  np.int32))),
    "q_len_beyond_seq_len": BadInput("paged_attention", "query_start_loc",
                                     _set("query_start_loc", lambda c: np.array([0, 6, 7], np.int32))),
    "query_start_loc_not_from_zero": BadInput("paged_attention", "query_start_loc",
                                              _set("query_start_loc", lambda c: np.array([1, 3, 7], np.int32))),
    "query_start_loc_decreasing": BadInput("paged_attention", "query_start_loc",
                                           _set("query_start_loc", lambda c: np.array([0, 5, 4], np.int32))),
    "query_start_loc_wrong_end": BadInput("paged_attention", "query_start_loc",
                                          _set("query_start_loc", lambda c: np.array([0, 2, 6], np.int32))),
    "decode_token_count": BadInput("paged_attention", "query", _set("query_start_loc", lambda c: None)),
    "sliding_window_zero": BadInput("paged_attention", "sliding_window", _set("sliding_window", lambda c: 0)),
    "softcap_negative": BadInput("paged_attention", "softcap", _set("softcap", lambda c: -1.0)),
    "alibi_wrong_length": BadInput("paged_attention", "alibi_slopes",
                                   _set("alibi_slopes", lambda c: np.ones(3, np.float32))),
    "write_kv_duplicate_slots": BadInput("write_kv", "slot_mapping",
                                         _set("slot_mapping", lambda c: np.array([3, 4, 3], np.int64))),
    "write_kv_slot_past_pool": BadInput("write_kv", "slot_mapping", _set(
        "slot_mapping", lambda c: np.array([0, 1, c["key_cache"].shape[0] * c["block_size"]], np.int64))),
    "write_kv_heads_differ": BadInput("write_kv", "key", lambda c: c.update(key=c["key"][:, :1].copy(),
                                                                            value=c["value"][:, :1].copy())),
    "copy_blocks_repeated_destination": BadInput("copy_blocks", "pairs",
                                                 _set("pairs", lambda c: np.array([[0, 2], [1, 2]], np.int64))),
    "copy_blocks_past_pool": BadInput("copy_blocks", "pairs", _set(
        "pairs", lambda c: np.array([[0, c["key_cache"].shape[0]]], np.int64))),
    "merge_shapes_differ": BadInput("merge_states", "out_b", _set("out_b", lambda c: c["out_b"][:, :1].copy())),
    "merge_lse_dtype": BadInput("merge_states", "lse_a", _set("lse_a", lambda c: c["lse_a"].astype(np.float64))),
    "query_on_another_device": BadInput("paged_attention", "query", _elsewhere("query")),
    "value_cache_on_another_device": BadInput("paged_attention", "value_cache", _elsewhere("value_cache")),
    "write_kv_key_on_another_device": BadInput("write_kv", "key", _elsewhere("key")),
    "write_kv_value_cache_on_another_device": BadInput("write_kv", "value_cache", _elsewhere("value_cache")),
    "copy_blocks_value_cache_on_another_device": BadInput("copy_blocks", "value_cache", _elsewhere("value_cache")),
    "merge_lse_b_on_another_device": BadInput("merge_states", "lse_b", _elsewhere("lse_b")),
}


def other_device(backend: Backend) -> str:
    """The device an ``*_on_another_device`` item hands its array on: ``"cpu"`` when the backend's
    arrays are on a GPU, ``"meta"`` when on the host; :class:`Unsupported` when they are NumPy's."""
    device = array_device(backend.to_device(np.zeros(1, np.float32)))
    if device is None:
        raise Unsupported(f"{backend.name}: its arrays are on no device of their own, so none is on another")
    return "meta" if device.startswith("cpu") else "cpu"


def valid_call(dtype: str, block_size: int, kv_layout: str) -> Call:
    """A small valid call of every operation (2 sequences, L = 5 and 20, 4 query heads on 2 KV heads)."""
    rng = np.random.default_rng(0)
    np_dtype = numpy_dtype(dtype)
    num_blocks, heads, dim = 6, 2, 16
    shape = (num_blocks, block_size, heads, dim) if kv_layout == "NHD" else (num_blocks, heads, block_size, dim)
    tables = np.full((2, 3), -1, np.int32)
    tables[0, 0] = 4
    tables[1, :2] = [1, 3]
    return {
        "query": rng.standard_normal((7, 4, dim)).astype(np_dtype),
        "key_cache": rng.standard_normal(shape).astype(np_dtype),
        "value_cache": rng.standard_normal(shape).astype(np_dtype),
        "block_tables": tables, "seq_lens": np.array([5, 20], np.int32),
        "query_start_loc": np.array([0, 2, 7], np.int32), "kv_layout": kv_layout, "block_size": block_size,
        "key": rng.standard_normal((3, heads, dim)).astype(np_dtype),
        "value": rng.standard_normal((3, heads, dim)).astype(np_dtype),
        "slot_mapping": np.array([0, 5, -1], np.int64), "pairs": np.array([[0, 1]], np.int64),
        "out_a": rng.standard_normal((3, 4, dim)).astype(np_dtype), "lse_a": np.zeros((3, 4), np.float32),
        "out_b": rng.standard_normal((3, 4, dim)).astype(np_dtype), "lse_b": np.ones((3, 4), np.float32),
    }


def _invoke(backend: Backend, operation: str, call: Call, key_cache: Any, value_cache: Any, other: str) -> None:
    """Make the call, every array on the backend's device but the one ``call["elsewhere"]`` names, on ``other``."""
    elsewhere = call.get("elsewhere")

    def dev(array: np.ndarray, argument: str = "") -> Any:
        return numpy_to_torch(array, other) if argument == elsewhere else backend.to_device(array)

    if operation == "paged_attention":
        options: dict[str, Any] = {k: call[k] for k in ("sliding_window", "softcap", "scale", "return_lse")
                                   if k in call}
        if "alibi_slopes" in call:
            options["alibi_slopes"] = dev(call["alibi_slopes"])
        qsl = None if call["query_start_loc"] is None else dev(call["query_start_loc"])
        backend.paged_attention(dev(call["query"], "query"), key_cache, value_cache, dev(call["block_tables"]),
                                dev(call["seq_lens"]), qsl, kv_layout=call["kv_layout"], **options)
    elif operation == "write_kv":
        backend.write_kv(dev(call["key"], "key"), dev(call["value"], "value"), key_cache, value_cache,
                         dev(call["slot_mapping"]), kv_layout=call["kv_layout"])
    elif operation == "copy_blocks":
        backend.copy_blocks(key_cache, value_cache, dev(call["pairs"]), kv_layout=call["kv_layout"])
    else:
        backend.merge_states(dev(call["out_a"], "out_a"), dev(call["lse_a"], "lse_a"), dev(call["out_b"], "out_b"),
                             dev(call["lse_b"], "lse_b"))


def check_bad_input(backend: Backend, name: str, *, dtype: str, block_size: int, kv_layout: str) -> None:
    """Assert the spoiled call raises PagedAttentionError naming the argument and leaves the caches' bits."""
    __tracebackhide__ = True
    item = BAD_INPUTS[name]
    call = valid_call(dtype, block_size, kv_layout)
    item.spoil(call)
    where = f"[call: backend={backend.name} {item.operation} bad input {name!r} dtype={dtype} kv_layout={kv_layout}" \
            f" block_size={block_size}]"
    other = other_device(backend) if "elsewhere" in call else ""
    key_cache, value_cache = (numpy_to_torch(call[name].copy(), other) if call.get("elsewhere") == name
                              else backend.to_device(call[name].copy()) for name in ("key_cache", "value_cache"))
    try:
        _invoke(backend, item.operation, call, key_cache, value_cache, other)
    except PagedAttentionError as error:
        if error.argument != item.argument:
            raise ConformanceFailure(f"the error names {error.argument!r}, expected {item.argument!r}:"
                                     f" {error}\n{where}") from error
    except Exception as error:
        raise ConformanceFailure(f"raised {type(error).__name__}: {error}; expected PagedAttentionError naming"
                                 f" {item.argument!r}\n{where}") from error
    else:
        raise ConformanceFailure(f"no error raised; expected PagedAttentionError naming {item.argument!r}\n{where}")
    backend.synchronize()
    for label, device, original in (("key_cache", key_cache, call["key_cache"]),
                                    ("value_cache", value_cache, call["value_cache"])):
        if call.get("elsewhere") == label:
            if other == "meta":
                continue  # a meta tensor holds no data to write
            after = torch_to_numpy(device)
        else:
            after = np.asarray(backend.to_numpy(device))
        assert_bit_identical(label, after, original, "the call raised but wrote into the cache", where,
                             coordinates="cache index")
