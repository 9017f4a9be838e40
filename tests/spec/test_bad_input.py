"""Contract section "Bad input": each item raises PagedAttentionError naming the argument,
before anything is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from pagedattn.backends import load_backend
from pagedattn.errors import PagedAttentionError, UnsupportedError
from pagedattn.spec import check_paged_attention, exact_attention
from pagedattn.spec.case import AttentionCase
from pagedattn.spec.pools import random_paged_inputs

BACKEND = load_backend("numpy")


def call(case_kwargs: dict[str, Any] | None = None, **overrides: Any) -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1], **(case_kwargs or {}))
    args = dict(zip(("query", "key_cache", "value_cache", "block_tables", "seq_lens", "query_start_loc"),
                    case.args(), strict=True))
    options = {k: overrides.pop(k) for k in list(overrides) if k not in args}
    args.update(overrides)
    options.setdefault("kv_layout", case.kv_layout)
    BACKEND.paged_attention(**args, **options)


def raises(argument: str, match: str | None = None) -> Any:
    """Expect PagedAttentionError whose argument is ``argument``."""

    class _Check:
        def __enter__(self) -> None:
            self.ctx = pytest.raises(PagedAttentionError, match=match)
            self.info = self.ctx.__enter__()

        def __exit__(self, *exc: Any) -> bool:
            handled = self.ctx.__exit__(*exc)  # raises if no PagedAttentionError came
            assert self.info.value.argument == argument, f"named {self.info.value.argument!r}, not {argument!r}"
            return bool(handled)

    return _Check()


def test_valid_call_runs() -> None:
    call()


#: Arrays of a valid case changed one way each: (the argument named, the message, the changed arrays).
BAD_ARRAYS: dict[str, tuple[str, str, Callable[[AttentionCase], dict[str, Any]]]] = {
    "query_head_dim_disagrees_with_cache": (
        "query", "head_dim 8 differs", lambda case: {"query": case.query[..., :8].copy()}),
    "value_cache_shape_differs": (
        "value_cache", "differs from key_cache", lambda case: {"value_cache": case.value_cache[:-1]}),
    "unsupported_query_dtype": (
        "query", "dtype float64 is not one of", lambda case: {"query": case.query.astype(np.float64)}),
    "cache_dtype_must_match_query_or_be_fp8": (
        "key_cache", "must equal query's float32",
        lambda case: {"key_cache": case.key_cache.astype(np.float16),
                      "value_cache": case.value_cache.astype(np.float16)}),
    "block_tables_must_hold_integers": (
        "block_tables", "expected integers that fit in int32, received dtype float32",
        lambda case: {"block_tables": case.block_tables.astype(np.float32)}),
}


@pytest.mark.parametrize(("argument", "match", "change"), BAD_ARRAYS.values(), ids=list(BAD_ARRAYS))
def test_bad_array(argument: str, match: str, change: Callable[[AttentionCase], dict[str, Any]]) -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    with raises(argument, match):
        call(**change(case))


def test_head_counts_disagree() -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1], num_q_heads=3, num_kv_heads=2)
    with raises("query", "not a positive multiple"):
        BACKEND.paged_attention(*case.args())


def test_unknown_layout() -> None:
    with raises("kv_layout", "expected 'NHD' or 'HND'"):
        call(kv_layout="NDH")


def test_index_values_must_fit_in_int32() -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    tables = case.block_tables.astype(np.int64)
    tables[1, 1:] = 2**31  # an unneeded column, but the device copy is int32
    with raises("block_tables", f"value {2**31} does not fit"):
        call(block_tables=tables)


@pytest.mark.parametrize("bad", [-1, 10_000])
def test_needed_block_table_entry_out_of_range(bad: int) -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    tables = case.block_tables.copy()
    tables[0, 1] = bad  # column 1 is needed: ceil(20 / 16) = 2
    with raises("block_tables", rf"block_tables\[0, 1\]={bad} is outside"):
        call(block_tables=tables)


def test_unneeded_block_table_entry_may_hold_anything() -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    tables = case.block_tables.copy()
    tables[1, 1:] = 2**31 - 1  # sequence 1 needs only column 0
    call(block_tables=tables)


def test_seq_len_beyond_capacity() -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    lens = case.seq_lens.copy()
    capacity = case.block_tables.shape[1] * 16
    lens[2] = capacity + 1
    with raises("seq_lens", rf"seq_lens\[2\]={capacity + 1} exceeds max_blocks_per_seq \* block_size"):
        call(seq_lens=lens)


def test_negative_seq_len() -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    with raises("seq_lens", "negative"):
        call(seq_lens=np.array([20, -1, 33], np.int32))
    assert case  # the case itself stays valid


def test_the_first_sequence_in_error_is_named() -> None:
    """Of several sequences in error, the message names the first (and its first column)."""
    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    capacity = case.block_tables.shape[1] * 16
    with raises("seq_lens", rf"seq_lens\[1\]={capacity + 1} exceeds"):
        call(seq_lens=np.array([20, capacity + 1, -1], np.int32))
    with raises("seq_lens", r"seq_lens\[1\]=-1 is negative"):
        call(seq_lens=np.array([20, -1, capacity + 1], np.int32))
    tables = case.block_tables.copy()
    tables[2, 0] = -1
    tables[1, 2] = tables[1, 3] = 10**6  # unneeded: sequence 1 holds 5 keys, one column
    tables[0, 1] = tables[2, 1] = 10**6
    with raises("block_tables", r"block_tables\[0, 1\]=1000000 is outside"):
        call(block_tables=tables)
    tables[0, 1] = case.block_tables[0, 1]
    with raises("block_tables", r"block_tables\[2, 0\]=-1 is outside"):
        call(block_tables=tables)


def test_q_len_beyond_seq_len() -> None:
    with raises("query_start_loc", "q_len=5 of sequence 1 exceeds seq_lens"):
        call(seq_lens=np.array([20, 4, 33], np.int32))


@pytest.mark.parametrize(
    ("starts", "match"),
    [
        ([1, 4, 9, 10], "must start at 0"),
        ([0, 4, 9, 9], "must end at num_tokens=10"),
        ([0, 6, 5, 10], "non-decreasing"),
        ([0, 4, 10], "expected num_seqs \\+ 1 = 4 entries"),
    ],
)
def test_bad_query_start_loc(starts: list[int], match: str) -> None:
    with raises("query_start_loc", match):
        call(query_start_loc=np.array(starts, np.int32))


def test_decode_needs_one_query_per_sequence() -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    with raises("query", "decode"):
        call(query_start_loc=None, query=case.query)


@pytest.mark.parametrize(
    ("option", "value"),
    [("sliding_window", 0), ("sliding_window", 2.5), ("softcap", 0.0), ("softcap", float("nan")),
     ("scale", float("inf")), ("k_scale", -1.0), ("v_scale", 0.0), ("causal", "yes"), ("return_lse", "yes"),
     ("return_lse", 1), ("scale", "0.5"), ("scale", True), ("softcap", "30"), ("k_scale", None)],
)
def test_bad_scalar_options(option: str, value: Any) -> None:
    with raises(option):
        call(**{option: value})


def test_bad_alibi_slopes() -> None:
    with raises("alibi_slopes", "expected num_q_heads=4"):
        call(alibi_slopes=np.ones(3, np.float32))
    with raises("alibi_slopes", "dtype float64"):
        call(alibi_slopes=np.ones(4, np.float64))


def test_write_kv_duplicate_slots_write_nothing() -> None:
    case = random_paged_inputs([20], [1])
    key = np.ones((3, 2, 16), np.float32)
    before = case.key_cache.copy(), case.value_cache.copy()
    with raises("slot_mapping", "appears more than once"):
        BACKEND.write_kv(key, key, case.key_cache, case.value_cache, np.array([5, -1, 5]))
    assert np.array_equal(case.key_cache, before[0]) and np.array_equal(case.value_cache, before[1])


def test_write_kv_slot_out_of_range_and_shape_mismatch() -> None:
    case = random_paged_inputs([20], [1])
    key = np.ones((2, 2, 16), np.float32)
    num_slots = case.key_cache.shape[0] * 16
    with raises("slot_mapping", "is outside"):
        BACKEND.write_kv(key, key, case.key_cache, case.value_cache, np.array([0, num_slots]))
    with raises("key", "does not match the caches'"):
        BACKEND.write_kv(key[:, :1], key[:, :1], case.key_cache, case.value_cache, np.array([0, 1]))


def test_copy_blocks_repeated_destination_and_range() -> None:
    case = random_paged_inputs([20], [1])
    before = case.key_cache.copy()
    with raises("pairs", "destination block 3 appears more than once"):
        BACKEND.copy_blocks(case.key_cache, case.value_cache, np.array([[0, 3], [1, 3]]))
    with raises("pairs", "is outside"):
        BACKEND.copy_blocks(case.key_cache, case.value_cache, np.array([[0, 99]]))
    assert np.array_equal(case.key_cache, before)


def test_merge_states_shapes() -> None:
    out = np.zeros((2, 3, 4), np.float32)
    lse = np.zeros((2, 3), np.float32)
    with raises("lse_b"):
        BACKEND.merge_states(out, lse, out, lse[:1])
    with raises("out_b", "dtype float16 differs"):
        BACKEND.merge_states(out, lse, out.astype(np.float16), lse)


def test_spec_and_backend_raise_the_same_error() -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    lens = np.array([20, 5, 999], np.int32)
    with pytest.raises(PagedAttentionError) as spec_error:
        exact_attention(*case.args()[:4], lens, case.query_start_loc)
    with pytest.raises(PagedAttentionError) as backend_error:
        call(seq_lens=lens)
    assert str(spec_error.value) == str(backend_error.value)


def test_unsupported_is_a_paged_attention_error_naming_the_capability() -> None:
    from pagedattn.backends.capabilities import Capabilities

    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    problem = check_paged_attention(*case.args(), sliding_window=4)
    with pytest.raises(UnsupportedError) as info:
        Capabilities(features=frozenset({"varlen"})).require(problem, backend="demo")
    assert info.value.capability == "sliding_window"
    assert "backend 'demo' does not support" in str(info.value)
