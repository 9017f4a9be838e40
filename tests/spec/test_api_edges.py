"""The public API's edges: the allocator's block ids, the spec's merge_states shapes, a cache
read in the wrong layout, read-only caches, and index arrays of any integer dtype."""

from __future__ import annotations

import numpy as np
import pytest

from pagedattn.backends import load_backend
from pagedattn.errors import PagedAttentionError
from pagedattn.spec import BlockAllocator, check_paged_attention, exact_attention, merge_states
from pagedattn.spec.kv_ops import copy_blocks, write_kv
from pagedattn.spec.pools import random_paged_inputs

NUMPY = load_backend("numpy")


@pytest.mark.parametrize("block", [-1, 99, 4, True, 1.0, "0"])
def test_refcount_of_a_block_outside_the_pool(block: object) -> None:
    allocator = BlockAllocator(4, 16)
    with pytest.raises(PagedAttentionError, match=r"expected a block id in \[0, num_blocks=4\)") as error:
        allocator.refcount(block)  # type: ignore[arg-type]
    assert error.value.argument == "block"


def test_refcount_of_a_block_in_the_pool() -> None:
    allocator = BlockAllocator(4, 16)
    assert [allocator.refcount(b) for b in range(4)] == [0, 0, 0, 0]
    assert allocator.refcount(np.int64(3)) == 0


@pytest.mark.parametrize(("argument", "shapes"), [
    ("out_b", ((1, 4, 16), (1, 4), (2, 4, 16), (1, 4))),
    ("lse_b", ((2, 4, 16), (2, 4), (2, 4, 16), (1, 4))),
    ("lse_a", ((2, 4, 16), (4,), (2, 4, 16), (2, 4))),
])
def test_spec_merge_states_does_not_broadcast(argument: str, shapes: tuple[tuple[int, ...], ...]) -> None:
    arrays = [np.zeros(shape, np.float32) for shape in shapes]
    with pytest.raises(PagedAttentionError) as spec_error:
        merge_states(*arrays)
    assert spec_error.value.argument == argument
    with pytest.raises(PagedAttentionError):
        NUMPY.merge_states(*arrays)  # the backends refuse the same call


def test_hnd_layout_on_an_nhd_cache_names_the_layout() -> None:
    case = random_paged_inputs([20, 5], [1, 1], num_q_heads=4, num_kv_heads=2, kv_layout="NHD")
    with pytest.raises(PagedAttentionError, match="kv_layout='HND' reads key_cache") as error:
        check_paged_attention(*case.args(), kv_layout="HND")
    assert error.value.argument == "kv_layout" and "pass kv_layout='NHD'" in str(error.value)


def test_heads_not_a_multiple_still_names_the_query() -> None:
    case = random_paged_inputs([20], [1], num_q_heads=3, num_kv_heads=2)
    with pytest.raises(PagedAttentionError, match="read as kv_layout='NHD'") as error:
        check_paged_attention(*case.args())
    assert error.value.argument == "query"


@pytest.mark.parametrize("frozen", ["key_cache", "value_cache"])
def test_read_only_caches_are_named_and_nothing_is_written(frozen: str) -> None:
    case = random_paged_inputs([20], [1])
    caches = {"key_cache": case.key_cache.copy(), "value_cache": case.value_cache.copy()}
    caches[frozen].flags.writeable = False
    before = {name: cache.copy() for name, cache in caches.items()}
    key = np.ones((2, 2, 16), np.float32)
    for operation in (
        lambda: write_kv(key, key, caches["key_cache"], caches["value_cache"], np.array([0, 1])),
        lambda: NUMPY.write_kv(key, key, caches["key_cache"], caches["value_cache"], np.array([0, 1])),
        lambda: copy_blocks(caches["key_cache"], caches["value_cache"], np.array([[0, 1]])),
        lambda: NUMPY.copy_blocks(caches["key_cache"], caches["value_cache"], np.array([[0, 1]])),
    ):
        with pytest.raises(PagedAttentionError, match="is read-only") as error:
            operation()
        assert error.value.argument == frozen
        assert all(np.array_equal(caches[name], before[name]) for name in caches)


@pytest.mark.parametrize("convert", [
    lambda a: a.astype(np.int64), lambda a: a.astype(np.int16), lambda a: a.astype(np.uint32), lambda a: a.tolist(),
], ids=["int64", "int16", "uint32", "list"])
def test_spec_takes_any_integer_index_array_that_fits(convert: object) -> None:
    case = random_paged_inputs([20, 5, 33], [4, 5, 1])
    tables = np.where(case.block_tables < 0, 0, case.block_tables)  # uint32 cannot hold the -1 padding
    want = exact_attention(*case.args()[:3], tables, case.seq_lens, case.query_start_loc)
    got = exact_attention(*case.args()[:3], convert(tables), convert(case.seq_lens),  # type: ignore[operator]
                          convert(case.query_start_loc))  # type: ignore[operator]
    assert np.array_equal(got.out, want.out) and np.array_equal(got.lse, want.lse)


def test_a_list_of_slots_and_an_empty_list() -> None:
    case = random_paged_inputs([20], [1])
    key = np.ones((2, 2, 16), np.float32)
    write_kv(key, key, case.key_cache, case.value_cache, [0, 1])
    assert (case.key_cache[0, :2] == 1).all()
    write_kv(key[:0], key[:0], case.key_cache, case.value_cache, [])
