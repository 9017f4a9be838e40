"""The shape catalog and the rotated pools built from it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from pagedattn.errors import PagedAttentionError
from pagedattn.perf import inputs, shapes
from pagedattn.spec.arrays import check_paged_attention


def test_catalog_holds_the_named_models() -> None:
    heads = {name: (m.num_q_heads, m.num_kv_heads, m.head_dim) for name, m in shapes.MODELS.items()}
    assert heads["llama3-8b"] == (32, 8, 128)
    assert heads["llama3-70b-tp8"] == (8, 1, 128)
    assert any(q == kv for q, kv, _ in heads.values()), "an MHA model"
    assert any(m.sliding_window for m in shapes.MODELS.values())
    assert any(m.softcap for m in shapes.MODELS.values())


QUICK_MODELS = {"llama3-8b", "llama3-70b-tp8", "llama2-7b", "mistral-7b", "gemma2-9b"}


@pytest.mark.parametrize("name, kinds, models", [
    ("quick", {"decode", "prefill", "mixed"}, QUICK_MODELS),
    ("full", set(shapes.KINDS), set(shapes.MODELS)),
])
def test_gpu_sets_cover_kinds_block_sizes_batches_contexts(name: str, kinds: set[str], models: set[str]) -> None:
    cases = shapes.SETS[name]
    assert {c.kind for c in cases} == kinds
    assert {c.block_size for c in cases} == {16, 32, 64}
    assert len({c.batch for c in cases}) >= 2 and len({c.context for c in cases}) >= 2
    assert {c.model.name for c in cases} == models
    assert len({c.name for c in cases}) == len(cases), "case names are unique"


def test_resolve_sets_and_case_names_without_repeats() -> None:
    first = shapes.SETS["cpu"][0]
    found = shapes.resolve(["cpu", first.name])
    assert found == shapes.SETS["cpu"]
    assert all(c.dtype == "float16" for c in shapes.resolve(["cpu"], dtype="float16"))


def test_resolve_unknown_name_lists_the_sets() -> None:
    with pytest.raises(PagedAttentionError, match="shapes: unknown set or case 'nope'; sets: cpu, quick"):
        shapes.resolve(["nope"])


@pytest.mark.parametrize("kind", shapes.KINDS)
def test_q_lens_of_each_kind(kind: str) -> None:
    case = shapes.Case(shapes.MODELS["llama3-8b"], kind, batch=3, context=600, block_size=16)
    expected = {"decode": [1, 1, 1], "prefill": [600] * 3, "mixed": [512, 1, 1], "chunked": [512] * 3}[kind]
    assert case.q_lens == expected


def test_pool_regions_are_disjoint_valid_and_shared_across_block_sizes() -> None:
    base = shapes.Case(shapes.MODELS["llama3-70b-tp8"], "mixed", batch=3, context=100, block_size=16,
                       dtype="float32", chunk=8)
    pool = inputs.make_pool(base, rotations=3)
    assert not (pool.key_cache == 0).any() and pool.key_cache.dtype == np.float32
    for bs in (16, 32, 64):
        case = shapes.Case(base.model, base.kind, base.batch, base.context, bs, base.dtype, base.chunk)
        assert inputs.pool_key(case) == pool.key
        used = []
        for r in range(pool.rotations):
            t = inputs.attention_case(case, pool, r)
            assert np.shares_memory(t.key_cache, pool.key_cache) and t.query is pool.queries[r]
            check_paged_attention(*t.args(), **t.options)
            used.append(set(t.block_tables.ravel().tolist()))
            assert len(used[-1]) == t.block_tables.size, "no block is shared inside a batch"
        assert not (used[0] & used[1]) and not (used[1] & used[2]), "rotations read disjoint regions"


def test_rotations_fill_the_flush_size() -> None:
    case = shapes.Case(shapes.MODELS["llama3-8b"], "decode", batch=1, context=1024, block_size=16)
    per = inputs.kv_bytes_per_rotation(case)
    assert per == 2 * 1024 * 8 * 128 * 2
    assert inputs.rotations_for(case, 8 * per) == 8
    assert inputs.rotations_for(case, 1000 * per) == 32
    assert inputs.rotations_for(case, 1) == 1


def test_in_order_blocks_are_consecutive_and_named() -> None:
    base = shapes.Case(shapes.MODELS["llama3-8b"], "decode", batch=3, context=100, block_size=16, dtype="float32")
    in_order = replace(base, blocks="in-order")
    assert in_order.name == base.name + "/in-order" and inputs.pool_key(in_order) == inputs.pool_key(base)
    pool = inputs.make_pool(base, rotations=2)
    per_region = base.batch * pool.slots_per_seq // base.block_size
    for r in range(2):
        scattered = inputs.attention_case(base, pool, r).block_tables
        ordered = inputs.attention_case(in_order, pool, r).block_tables
        assert (np.diff(ordered, axis=1) == 1).all(), "each sequence's blocks follow one another"
        assert set(ordered.ravel().tolist()) <= set(range(r * per_region, (r + 1) * per_region))
        assert (np.diff(scattered, axis=1) != 1).any(), "the default stays shuffled"


def test_resolve_sets_the_block_order() -> None:
    (case,) = shapes.resolve(["llama3-8b/decode/b64/ctx4096/bs16"], blocks="in-order")
    assert case.blocks == "in-order" and case.name.endswith("/bs16/in-order")
    with pytest.raises(PagedAttentionError, match="blocks: expected one of shuffled, in-order"):
        shapes.resolve(["quick"], blocks="sorted")
