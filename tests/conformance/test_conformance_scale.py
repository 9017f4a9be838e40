"""The scale cells reach what they claim: split plans, pools past 2**31 elements at little memory,
a query and output past 2**31 elements, sizes that are no power of two, groups cut into several
tiles, more work than one wave, more tokens than a grid's y or z axis, several query tiles per
sequence, more keys than 16 bits hold and more split parts than 64; a capped backend is
unsupported. (That quick kills their mutants
in a scale cell is in test_mutants.py.)"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from pagedattn.backends.capabilities import Capabilities
from pagedattn.backends.numpy.backend import NumpyBackend
from pagedattn.backends.triton.backend import _work_list
from pagedattn.backends.triton.launch_config import Tiles, choose_num_splits, choose_tiles
from pagedattn.conformance import checks, scale, test_scale
from pagedattn.conformance.assertions import ConformanceFailure
from pagedattn.conformance.cases import load_case, save_case
from pagedattn.conformance.repeated_blocks import exact_by_distinct_blocks
from pagedattn.conformance.runner import Unsupported, require
from pagedattn.errors import UnsupportedError
from pagedattn.reference.paged import paged_attention_reference
from pagedattn.spec.arrays import check_paged_attention
from pagedattn.spec.dtypes import FP8_DTYPES
from pagedattn.spec.error_model import tolerance
from pagedattn.spec.exact import exact_attention_problem
from pagedattn.spec.online_softmax import merge_states as spec_merge_states
from pagedattn.spec.pools import (
    INT32_OFFSET_LIMIT,
    UINT32_OFFSET_LIMIT,
    lazy_copy,
    occupied_blocks,
    random_paged_inputs,
)

ANY = Capabilities()
#: A GPU backend's envelope (cupy's kind): declared head dims and block sizes.
DECLARED = Capabilities(head_dims=(64, 128, 256), block_sizes=(16, 32, 64))
H200_SMS = 132
INTERPRETER_SMS = 4
#: CTAs of cupy's decode kernel resident on an H200 (two per multiprocessor)
H200_CUPY_DECODE_SLOTS = 2 * H200_SMS


def h200_cupy_work(problem):  # type: ignore[no-untyped-def]
    """cupy's work plan of ``problem`` on an H200: split for the slots ``split_slots`` gives there."""
    from pagedattn.backends.cupy.planning import build_work, choose_kernel, split_slots

    choice = choose_kernel(problem)
    return build_work(problem, choice, slots=split_slots(problem, choice, H200_CUPY_DECODE_SLOTS, H200_SMS))


class TritonGrid(NamedTuple):
    """triton's tiles for a problem, its programs before split-KV and each work item's key tiles."""

    tiles: Tiles
    programs: int
    key_tiles: np.ndarray

    def splits(self, sms: int = H200_SMS) -> int:
        """triton's split-KV count on ``sms`` multiprocessors (an H200's unless given)."""
        return choose_num_splits(self.programs, int(self.key_tiles.max()), sms, self.tiles.resident,
                                 self.tiles.saturation)


def triton_grid(problem) -> TritonGrid:
    """triton's grid for ``problem``: tiles, programs before split-KV, key tiles a work item."""
    tiles = choose_tiles(int(problem.q_lens.max()), problem.group_size, problem.head_dim, problem.dtype,
                         problem.block_size)
    work_seq, _, key_tiles = _work_list(problem, tiles)
    return TritonGrid(tiles, work_seq.shape[0] * problem.num_kv_heads * tiles.num_group_tiles, key_tiles)


def drawn(strategy, count: int) -> list:
    """The first ``count`` examples the suite's derandomized profiles draw (the first is the shrink target)."""
    found: list = []

    @settings(max_examples=count, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def collect(case):
        found.append(case)

    collect()
    return found[:count]


def assert_batch_kind(problem, batch: str) -> None:  # type: ignore[no-untyped-def]
    """``problem`` is of ``batch``: decode, or a varlen batch with 2 queries or more in some sequence."""
    assert problem.is_decode == (batch == "decode") and (batch == "decode" or int(problem.q_lens.max()) >= 2)


def rss_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


class CappedNumpy(NumpyBackend):
    name = "capped-numpy"

    def capabilities(self) -> Capabilities:
        return Capabilities(max_pool_elements=2**30)


# -- limits --------------------------------------------------------------------------------

def test_every_profile_has_limits_and_large_widens_them(monkeypatch):
    for name in ("quick", "ci", "thorough"):
        limits = scale.scale_limits(name)
        assert limits.min_long >= 4096 and limits.pool_elements >= INT32_OFFSET_LIMIT
    assert scale.scale_limits("quick").max_long < scale.scale_limits("thorough").max_long
    monkeypatch.setenv("PAGEDATTN_SIZE", "large")
    assert scale.scale_limits("quick").max_long == 65_536
    assert scale.scale_limits("quick").pool_elements == 2**32


# -- split plans ---------------------------------------------------------------------------

#: The long cells' strategy as the long cells and as the long-plan cells draw it, and their examples.
LONG_CELLS = {"long": ({"dtype": "float16"}, int),
              "long-bfloat16": ({"dtype": "bfloat16"}, int),
              "long-plans": ({"dtype": test_scale.PLAN_DTYPE, "groups": test_scale.PLAN_GROUPS},
                             test_scale.few_long_examples)}


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
@pytest.mark.parametrize("profile", ["quick", "ci"])
@pytest.mark.parametrize("cell", sorted(LONG_CELLS))
def test_long_cases_reach_split_plans_of_triton_and_cupy(profile, cell, batch):
    from pagedattn.backends.cupy.planning import build_work

    limits = scale.scale_limits(profile)
    for caps in (ANY, DECLARED):
        drawing, examples = LONG_CELLS[cell]
        strategy = scale.long_sequence_cases(caps, limits=limits, decode=batch == "decode", **drawing)
        cases = drawn(strategy, examples(limits.long_examples))
        for index, case in enumerate(cases):
            problem = checks.problem_of(case)
            assert problem.is_decode == (batch == "decode") and problem.q_lens.min() >= (batch != "decode") + 1
            assert problem.seq_lens.min() >= limits.min_long
            assert int(problem.seq_lens.max()) % problem.block_size or len(problem.seq_lens) > 1
            # the H200 splits every case; the interpreter's 4 "SMs" are filled by a batch of a few heads,
            # so there only the first case (one sequence, one KV head) is sure to split
            grid = triton_grid(problem)
            for sms in (H200_SMS,) if index else (INTERPRETER_SMS, H200_SMS):
                assert grid.splits(sms) > 1, (case, sms)
            if caps is DECLARED:
                assert build_work(problem).num_partials > 0, case


@pytest.mark.parametrize("cache", sorted(test_scale.VERIFY_CACHES))
def test_long_verify_cases_hold_8_to_16_queries_a_sequence_in_split_plans_of_triton_and_cupys_tensor_cores(cache):
    from pagedattn.backends.cupy.planning import choose_kernel

    fewest, most = scale.LONG_VERIFY_QUERIES
    drawing = test_scale.VERIFY_CACHES[cache]
    fp8 = drawing.get("fp8", False)
    for caps in (ANY, DECLARED):
        strategy = scale.long_sequence_cases(caps, dtype="float16", limits=scale.scale_limits("quick"),
                                             verify=True, groups=test_scale.VERIFY_GROUPS, max_kv_heads=1, **drawing)
        for case in drawn(strategy, 4):
            problem = checks.problem_of(case)
            assert not problem.is_decode and fewest <= problem.q_lens.min() <= problem.q_lens.max() <= most
            split = problem.sliding_window is None  # under a window both walk the window's keys alone, split or not
            assert triton_grid(problem).splits(H200_SMS) > 1 or not split
            if caps is DECLARED:  # cupy: the mma.sync prefill kernel at head_dim 64 and 128
                choice = choose_kernel(problem, sm90=True)
                tensor_cores = problem.head_dim in (64, 128) or fp8
                assert (choice.spec.module == "paged_attention_mma") == tensor_cores, (choice, problem.head_dim)
                assert h200_cupy_work(problem).num_partials > 0 or not split, case


@pytest.mark.parametrize("profile", ["quick", "ci"])
def test_mixed_length_cases_put_split_and_unsplit_sequences_in_one_plan_of_triton_and_cupy(profile):
    from pagedattn.conformance.mutants.scale import SPLIT_MAX_SEQS

    limits = scale.scale_limits(profile)
    cases = drawn(scale.long_sequence_cases(DECLARED, dtype="float16", limits=limits,
                                            short_seqs=test_scale.MIXED_SHORT_SEQS), limits.long_examples)
    for case in cases:
        problem = checks.problem_of(case)
        lens = problem.seq_lens
        assert lens[0] <= scale.MIXED_SHORT_MAX and lens.max() >= limits.min_long, lens  # a short one first
        assert problem.num_seqs <= SPLIT_MAX_SEQS  # a batch the mutants' kernel splits
        # cupy on an H200: the long sequences' parts merged into rows after the first sequence's,
        # the short ones written whole
        work = h200_cupy_work(problem)
        assert (work.items[:, 8] < 0).any() and work.merges.shape[0] > 0, work.items
        assert work.merges[:, 0].min() > 0, work.merges
        # triton on an H200: as many parts for every sequence; the short ones' later parts hold no key
        grid = triton_grid(problem)
        assert grid.splits() > int(grid.key_tiles.min()), grid.key_tiles
    # the shrink target: a padding entry (L = 0), then a long sequence
    assert list(cases[0].seq_lens) == [0, limits.min_long + limits.min_long // 6 + 1]


@pytest.mark.parametrize("profile", ["quick", "ci"])
def test_speculative_long_cases_split_sequences_whose_rows_a_padded_layout_misplaces(profile):
    limits = scale.scale_limits(profile)
    cases = drawn(scale.long_sequence_cases(DECLARED, dtype="float16", limits=limits, ragged=True),
                  limits.long_examples)
    for case in cases:
        problem = checks.problem_of(case)
        widest = int(problem.q_lens.max())
        assert problem.num_seqs >= 2 and len(set(problem.q_lens.tolist())) >= 2, problem.q_lens
        assert any(int(problem.query_start_loc[s]) != s * widest for s in range(problem.num_seqs))
        assert triton_grid(problem).splits() > 1
        assert h200_cupy_work(problem).merges.shape[0] > 0, case  # cupy's H200 plan splits too
    assert cases[0].query_start_loc.tolist() == [0, 1, 3]  # the shrink target: 1 query, then 2
    target = checks.problem_of(cases[0])
    assert target.seq_lens.tolist() == [limits.min_long + limits.min_long // 6 + 1, limits.min_long]
    work = h200_cupy_work(target)
    assert len(set(work.merges[:, 6].tolist())) > 1, work.merges  # cupy cuts them into other numbers of parts


@pytest.mark.parametrize("profile", ["quick", "ci"])
def test_wide_group_long_cases_split_groups_past_8_rows_in_triton_and_cupy(profile):
    from pagedattn.conformance.mutants.scale import ROW_SLOT_ROWS, SPLIT_MIN_KEYS

    limits = scale.scale_limits(profile)
    cases = drawn(scale.long_sequence_cases(DECLARED, dtype="float16", limits=limits, groups=scale.LONG_WIDE_GROUPS,
                                            max_kv_heads=test_scale.WIDE_LONG_KV_HEADS), limits.long_examples)
    for case in cases:
        problem = checks.problem_of(case)
        assert problem.group_size > ROW_SLOT_ROWS and problem.seq_lens.min() >= SPLIT_MIN_KEYS
        assert triton_grid(problem).splits() > 1
        assert h200_cupy_work(problem).merges.shape[0] > 0, case  # cupy's H200 plan splits too
    assert checks.problem_of(cases[0]).group_size == scale.LONG_WIDE_GROUPS[0]  # the shrink target


def test_wide_group_long_fp8_shrink_target_takes_cupys_fp8_decode_kernel_split_on_an_h200():
    from pagedattn.backends.cupy.planning import choose_kernel
    from pagedattn.backends.cupy.specializations import DECODE_ROWS
    from pagedattn.conformance.mutants.scale import ROW_SLOT_ROWS

    (case,) = drawn(scale.long_sequence_cases(DECLARED, dtype="float16", limits=scale.scale_limits("quick"), fp8=True,
                                              groups=scale.LONG_WIDE_GROUPS,
                                              max_kv_heads=test_scale.WIDE_LONG_KV_HEADS), 1)
    problem = checks.problem_of(case)
    assert problem.cache_dtype.startswith("float8") and problem.is_decode
    assert ROW_SLOT_ROWS < problem.group_size <= DECODE_ROWS  # a tile's second row slot holds query heads
    assert choose_kernel(problem).rows == DECODE_ROWS  # cupy's fp8 decode kernel
    assert h200_cupy_work(problem).merges.shape[0] > 0  # split on an H200


@pytest.mark.parametrize("fp8", [False, True])
def test_head_needle_cases_raise_one_rows_max_at_a_key_where_no_other_row_does(fp8):
    from pagedattn.backends.cupy.planning import choose_kernel
    from pagedattn.backends.cupy.specializations import DECODE_ROWS
    from pagedattn.conformance.mutants.scale import ROW_SLOT_ROWS
    from pagedattn.spec.exact import gather_kv, scores_and_mask

    limits = scale.scale_limits("quick")
    cases = drawn(scale.long_sequence_cases(DECLARED, dtype="bfloat16" if fp8 else "float16", limits=limits, fp8=fp8,
                                            groups=scale.LONG_WIDE_GROUPS, kinds=scale.LONG_HEAD_NEEDLE_KINDS,
                                            max_kv_heads=test_scale.WIDE_LONG_KV_HEADS), limits.long_examples)
    needle_score = scale.HEAD_NEEDLE_QUERY * scale.HEAD_NEEDLE_KEY
    for case in cases:
        problem = checks.problem_of(case)
        owned = min(problem.group_size, problem.head_dim)
        p_q = problem.token_positions()[1]
        for seq in range(problem.num_seqs):
            k, _ = gather_kv(problem, case.key_cache, case.value_cache, seq)
            first = int(problem.query_start_loc[seq])
            q = case.query[first:first + 1].astype(np.float64)  # the sequence's first query [1, Hq, D]
            s = scores_and_mask(problem, q, k, p_q[first:first + 1])[0][0]  # [Hq, L]
            owners = np.arange(problem.num_q_heads) % problem.group_size < owned
            np.testing.assert_array_equal(s[~owners], 0.0)  # heads past head_dim own no needle
            # every owner scores 0 but at one key, its needle, past the first quarter: a rise of 16
            nonzero = s[owners] != 0
            assert (nonzero.sum(axis=1) == 1).all()
            np.testing.assert_allclose(s[owners][nonzero], needle_score, rtol=2**-7)
            assert (np.argmax(nonzero, axis=1) >= problem.seq_lens[seq] // 4).all()
    problem = checks.problem_of(cases[0])  # the shrink target: a group past a tile's first 8 rows
    assert ROW_SLOT_ROWS < problem.group_size <= DECODE_ROWS and problem.is_decode
    if fp8:  # cupy's fp8 decode kernel, split on an H200
        assert choose_kernel(problem).rows == DECODE_ROWS and h200_cupy_work(problem).merges.shape[0] > 0


def test_quick_shrink_target_splits_into_an_odd_part_count_with_a_partial_last_part():
    from pagedattn.backends.cupy.planning import build_work

    (case,) = drawn(scale.long_sequence_cases(DECLARED, dtype="float16", limits=scale.scale_limits("quick")), 1)
    problem = checks.problem_of(case)
    for slots, work in (("H200", h200_cupy_work(problem)), ("default", build_work(problem))):
        ranges = work.items[work.items[:, 8] >= 0][:, 6:8]
        assert work.merges.shape[0] > 0 and work.merges[:, 6].min() % 2 == 1, (slots, work.merges)  # odd parts
        assert len({int(b - a) for a, b in ranges}) > 1, (slots, ranges)  # parts of unequal length: one is partial
    assert case.seq_lens[0] % work.tile_n != 0
    grid = triton_grid(problem)
    for sms in (INTERPRETER_SMS, H200_SMS):  # triton: resident x 132 slots on the H200
        assert grid.splits(sms) > 1, sms


# -- pools past 2**31 elements ----------------------------------------------------------------

def test_far_cases_use_blocks_past_element_2_31_at_little_memory():
    before = rss_mib()
    limits = scale.scale_limits("quick")
    backend = NumpyBackend()
    for case in drawn(scale.far_pool_cases(ANY, dtype="float16", limits=limits), 3):
        problem = checks.problem_of(case)
        block_elements = case.key_cache[0].size
        assert case.key_cache.size > INT32_OFFSET_LIMIT
        assert checks.table_blocks(problem).min() * block_elements >= INT32_OFFSET_LIMIT
        checks.far_pool_matches_spec(backend, case)
    for fp8 in (False, True):
        for case in drawn(scale.far_write_kv_cases(ANY, dtype="float16", limits=limits, fp8=fp8), 3):
            slots = case.slot_mapping[case.slot_mapping >= 0]
            slot_elements = case.key_cache[0].size // case.key_cache.shape[1 if case.kv_layout == "NHD" else 2]
            assert case.key_cache.size > UINT32_OFFSET_LIMIT and case.key_cache.itemsize == (1 if fp8 else 2)
            assert slots.min() * slot_elements >= INT32_OFFSET_LIMIT
            assert slots.max() * slot_elements >= UINT32_OFFSET_LIMIT  # one slot in the last block
            checks.far_write_kv_matches_spec(backend, case)
        for case in drawn(scale.far_copy_blocks_cases(ANY, dtype="float16", limits=limits, fp8=fp8), 3):
            assert case.key_cache.size > UINT32_OFFSET_LIMIT and case.key_cache.itemsize == (1 if fp8 else 2)
            assert case.pairs[:, 1].min() * case.key_cache[0].size >= INT32_OFFSET_LIMIT
            assert case.pairs[:, 1].max() == case.key_cache.shape[0] - 1  # the last block, past element 2**32
            checks.far_copy_blocks_matches_spec(backend, case)
    assert rss_mib() - before < 512  # pools of 4 to 8 GiB each, lazily allocated: only used blocks cost memory


@pytest.mark.parametrize("blocks", ["small", "large"])
def test_far_pools_of_small_and_large_blocks_start_at_the_extreme_size(blocks):
    sizes = test_scale.FAR_BLOCK_SIZES[blocks](ANY)
    assert sizes[0] == (1 if blocks == "small" else max(scale.LARGE_BLOCK_SIZES))
    cases = drawn(scale.far_pool_cases(ANY, dtype="float16", limits=scale.scale_limits("quick"), block_sizes=sizes), 3)
    assert cases[0].key_cache.shape[1] == sizes[0]  # the first example, the shrink target, at the extreme size
    for case in cases:
        problem = checks.problem_of(case)
        assert problem.block_size in sizes and case.key_cache.size > INT32_OFFSET_LIMIT
        assert checks.table_blocks(problem).min() * case.key_cache[0].size >= INT32_OFFSET_LIMIT
        checks.far_pool_matches_spec(NumpyBackend(), case)


def test_far_layer_views_are_small_views_of_a_pool_past_element_2_31_at_little_memory():
    before = rss_mib()
    backend = NumpyBackend()
    for case in drawn(scale.far_layer_view_cases(ANY, dtype="float16", limits=scale.scale_limits("quick")), 3):
        problem = checks.problem_of(case)
        assert case.pool is not None and case.pool.size > INT32_OFFSET_LIMIT > case.key_cache.size
        assert case.key_cache.base is case.pool or case.key_cache.base is case.pool.base
        block_stride = case.key_cache.strides[0] // case.key_cache.itemsize
        assert block_stride == 2 * scale.FAR_VIEW_LAYERS * case.key_cache[0].size
        assert checks.table_blocks(problem).min() * block_stride >= INT32_OFFSET_LIMIT
        checks.matches_spec(backend, case)
    assert rss_mib() - before < 512  # pools of 4 GiB, lazily allocated, compared a chunk at a time


@pytest.mark.parametrize("decode", [True, False])
def test_far_tables_put_every_row_with_keys_past_entry_2_32_of_the_engines_table_at_little_memory(decode):
    before = rss_mib()
    backend = NumpyBackend()
    cases = scale.far_table_cases(ANY, dtype="float16", limits=scale.scale_limits("quick"), decode=decode)
    for case in drawn(cases, 3):
        q_lens = [] if case.query_start_loc is None else np.diff(case.query_start_loc)[scale.FAR_TABLE_PADDING:]
        assert (case.query_start_loc is None) == decode and all(n in (2, 3) for n in q_lens)  # the batch's kind
        wide = case.wide_tables
        assert wide is not None and wide.size > UINT32_OFFSET_LIMIT and wide.shape[1] == scale.FAR_TABLE_WIDTH
        assert case.block_tables.base is wide and case.block_tables.shape[0] == wide.shape[0]
        row_stride = case.block_tables.strides[0] // case.block_tables.itemsize
        live = np.flatnonzero(case.seq_lens)
        assert len(live) in (1, 2) and live.min() * row_stride >= UINT32_OFFSET_LIMIT
        problem = checks.problem_of(case)
        in_use = [problem.block_tables[s, :-(-problem.seq_lens[s] // problem.block_size)] for s in live]
        assert 0 not in np.concatenate(in_use)  # block 0, what the table's other entries name, unused
        if case.query_start_loc is not None:  # the padding entries hold no queries in a prefill
            assert np.all(np.diff(case.query_start_loc)[:scale.FAR_TABLE_PADDING] == 0)
        checks.matches_spec(backend, case)
    assert rss_mib() - before < 512  # tables of 16 GiB, lazily allocated: only the rows in use cost memory


def test_bit_comparison_goes_a_chunk_at_a_time_and_names_the_first_difference(monkeypatch):
    from pagedattn.conformance import assertions

    monkeypatch.setattr(assertions, "COMPARE_CHUNK_ELEMENTS", 12)
    a = np.zeros((10, 2, 3), dtype=np.float16)
    b = a.copy()
    assert assertions.first_difference(a, b) is None
    assert assertions.first_difference(a[:0], b[:0]) is None  # nothing to compare
    b[7, 1, 2] = np.nan
    assert assertions.first_difference(a, b) == (7, 1, 2)  # in the fourth chunk of two rows
    with pytest.raises(ConformanceFailure, match=r"1 byte\(s\) differ"):
        assertions.assert_bit_identical("pool", b, a, "changed", "[call]")


def test_far_fp8_pools_put_every_block_in_use_past_byte_2_32():
    before = rss_mib()
    for case in drawn(scale.far_pool_cases(ANY, dtype="bfloat16", limits=scale.scale_limits("quick"), fp8=True), 2):
        problem = checks.problem_of(case)
        assert case.key_cache.itemsize == 1 and case.key_cache.size > scale.FAR_BYTE_LIMIT
        assert checks.table_blocks(problem).min() * case.key_cache[0].size >= scale.FAR_BYTE_LIMIT
        checks.far_pool_matches_spec(NumpyBackend(), case)
    assert scale.far_pool_limit("bfloat16") == INT32_OFFSET_LIMIT  # byte 2**32 of a 16-bit cache
    assert rss_mib() - before < 512


#: The far strategies whose draw order follows their dtype (`scale.LARGEST_FIRST_DTYPE`).
FAR_LARGEST_FIRST_CASES = {
    "attention": scale.far_pool_cases,
    "fp8": partial(scale.far_pool_cases, fp8=True),
    "verify": partial(scale.far_pool_cases, verify=True),
    "long_prefill": partial(scale.far_pool_cases, long_prefill=True),
    "layer_view": scale.far_layer_view_cases,
}


@pytest.mark.parametrize("cases", FAR_LARGEST_FIRST_CASES)
@pytest.mark.parametrize("dtype", test_scale.FAR_DTYPES)
def test_far_cells_first_examples_take_the_first_or_the_largest_block_size_group_and_layout(dtype, cases):
    """A `quick` far cell draws one example, its first: the float16 cells' in the first declared block
    size with one query head a KV head, one KV head, in NHD; the bfloat16 cells' in the largest with
    groups of 3, two KV heads, in HND."""
    largest = dtype == scale.LARGEST_FIRST_DTYPE
    caps = replace(ANY, block_sizes=(16, 32, 64))
    (case,) = drawn(FAR_LARGEST_FIRST_CASES[cases](caps, dtype=dtype, limits=scale.scale_limits("quick")), 1)
    problem = checks.problem_of(case)
    expected = (64, max(scale.FAR_GROUPS), "HND", 2) if largest else (16, 1, "NHD", 1)
    assert (problem.block_size, problem.group_size, problem.kv_layout, problem.num_kv_heads) == expected


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
@pytest.mark.parametrize("dtype", test_scale.FAR_DTYPES)
def test_long_cells_first_examples_take_the_first_or_the_widest_geometry(dtype, batch):
    """A `quick` long cell draws one example, its first: the float16 cells' in the first declared
    block size and head_dim with one query head a KV head, the bfloat16 cells' in the largest block
    size with the largest group and head_dim the spec's budget holds (GQA 8 at head_dim 256 for
    decode, at 128 for two queries a sequence)."""
    widest = dtype == scale.LARGEST_FIRST_DTYPE
    limits = scale.scale_limits("quick")
    (case,) = drawn(scale.long_sequence_cases(DECLARED, dtype=dtype, limits=limits, decode=batch == "decode"), 1)
    problem = checks.problem_of(case)
    geometry = (problem.block_size, problem.kv_layout, problem.num_kv_heads, problem.group_size, problem.head_dim)
    if not widest:
        assert geometry == (16, "NHD", 1, 1, 64)
        return
    assert geometry == (64, "HND", 1, max(scale.LONG_GROUPS), 256 if batch == "decode" else 128)
    rows = 1 if batch == "decode" else 2
    assert problem.num_q_heads * problem.head_dim * limits.min_long * rows <= scale.SPEC_ELEMENTS


@pytest.mark.parametrize("dtype", test_scale.FAR_DTYPES)
def test_long_cells_of_their_own_groups_keep_their_first_group_and_take_the_most_kv_heads_in_bfloat16(dtype):
    """A long cell that names its groups (the wide-group cell: 16 first) keeps their order; its
    bfloat16 cell draws the most KV heads first, in HND, where a layout read as the other shows."""
    (case,) = drawn(scale.long_sequence_cases(DECLARED, dtype=dtype, limits=scale.scale_limits("quick"),
                                              groups=scale.LONG_WIDE_GROUPS,
                                              max_kv_heads=test_scale.WIDE_LONG_KV_HEADS), 1)
    problem = checks.problem_of(case)
    assert problem.group_size == scale.LONG_WIDE_GROUPS[0]
    widest = dtype == scale.LARGEST_FIRST_DTYPE
    expected = ("HND", test_scale.WIDE_LONG_KV_HEADS, 64) if widest else ("NHD", 1, 16)
    assert (problem.kv_layout, problem.num_kv_heads, problem.block_size) == expected


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
@pytest.mark.parametrize("dtype", test_scale.FAR_DTYPES)
def test_far_fp8_cases_move_every_row_past_the_bound_where_the_blocks_in_use_read_as_zeros(dtype, batch):
    """With fp8 caches the bound is loose (products rounded to the query dtype): the values keep each
    row's output far enough from 0 that a read of blocks of zeros, where a wrapped offset lands in
    a lazy pool, fails every row."""
    (case,) = drawn(scale.far_pool_cases(ANY, dtype=dtype, limits=scale.scale_limits("quick"), fp8=True,
                                         decode=batch == "decode"), 1)
    problem = checks.problem_of(case)
    exact = exact_attention_problem(problem, case.query, case.key_cache, case.value_cache)
    bound = tolerance(problem.dtype, problem.head_dim, cache_dtype=problem.cache_dtype).out_bound(
        exact.out, exact.value_scale, exact.score_scale, exact.num_visible)
    assert problem.cache_dtype in FP8_DTYPES
    assert (np.abs(exact.out) > bound).any(axis=-1).all()  # zero keys and values give out = 0


def test_far_case_saves_as_its_blocks_and_replays(tmp_path):
    (case,) = drawn(scale.far_pool_cases(ANY, dtype="bfloat16", limits=scale.scale_limits("quick")), 1)
    path = save_case(tmp_path / "far.npz", case, check="far_pool_matches_spec")
    assert path.stat().st_size < 1 << 20
    loaded, check, _ = load_case(path)
    assert check == "far_pool_matches_spec" and loaded.key_cache.shape == case.key_cache.shape
    blocks = occupied_blocks(case.key_cache)
    assert np.array_equal(occupied_blocks(loaded.key_cache), blocks)
    assert np.array_equal(loaded.key_cache[blocks].view(np.uint16), case.key_cache[blocks].view(np.uint16))
    assert checks.CHECKS[check](NumpyBackend(), loaded) >= 0.0


def test_lazy_copy_holds_the_blocks_given_and_zeros_elsewhere():
    cache = np.arange(6 * 4, dtype=np.float32).reshape(6, 4)
    copy = lazy_copy(cache, np.array([4, 1, 4]))
    assert np.array_equal(copy[[1, 4]], cache[[1, 4]]) and not copy[[0, 2, 3, 5]].any()


def test_a_backend_with_a_smaller_max_pool_is_unsupported_not_passed():
    backend = CappedNumpy()
    with pytest.raises(Unsupported, match="max_pool_elements"):
        require(backend, pool_elements=INT32_OFFSET_LIMIT)
    (case,) = drawn(scale.far_pool_cases(ANY, dtype="float16", limits=scale.scale_limits("quick")), 1)
    with pytest.raises(UnsupportedError, match="max_pool_elements"):
        checks.far_pool_matches_spec(backend, case)


class FilledRowsOnly(NumpyBackend):
    """Attention of the rows whose query is not all zero (the rows a far-row case fills), zero
    elsewhere; with ``wrap``, none past element 2**31, as a kernel whose row offsets wrap at 32 bits
    leaves them (it writes them before the output instead)."""

    name = "filled-rows-only"

    def __init__(self, wrap: bool) -> None:
        self.wrap = wrap

    def _run(self, plan, query, key_cache, value_cache):
        pr = plan.problem
        out = np.zeros(query.shape, dtype=query.dtype)  # lazy, as the case's query
        lse = np.full((pr.num_tokens, pr.num_q_heads), -np.inf, dtype=np.float32)
        row_elements = query.strides[0] // query.itemsize  # the row stride: Hq * D, or a fused view's
        filled = occupied_blocks(query)
        for seq in np.unique(np.searchsorted(pr.query_start_loc, filled, side="right") - 1):
            rows = slice(int(pr.query_start_loc[seq]), int(pr.query_start_loc[seq + 1]))
            if self.wrap and rows.stop * row_elements > INT32_OFFSET_LIMIT:
                continue
            single = check_paged_attention(query[rows], key_cache, value_cache, pr.block_tables[seq:seq + 1],
                                           pr.seq_lens[seq:seq + 1], np.array([0, rows.stop - rows.start]),
                                           kv_layout=pr.kv_layout)
            out[rows], lse[rows] = paged_attention_reference(single, query[rows], key_cache, value_cache)
        return out, (lse if pr.return_lse else None)


@pytest.mark.parametrize("queries", ["decode", "prompts", "prefills"])
def test_far_row_cases_take_the_query_past_element_2_31_at_little_memory(queries):
    before = rss_mib()
    (case,) = drawn(scale.far_row_cases(DECLARED, dtype="bfloat16", queries=queries), 1)
    problem = checks.problem_of(case)
    row_elements = problem.num_q_heads * problem.head_dim
    assert problem.head_dim == 128 and row_elements >= scale.FAR_ROW_ELEMENTS
    assert INT32_OFFSET_LIMIT < problem.num_tokens * row_elements <= INT32_OFFSET_LIMIT + 64 * row_elements
    assert (case.query_start_loc is None) == (queries == "decode")
    assert problem.num_seqs > (2**11 if queries == "prefills" else 2**15)
    if queries == "prefills":  # every sequence a long prefill's rows
        assert (problem.q_lens * problem.group_size >= scale.LONG_PREFILL_ROWS).all() and problem.q_lens.min() >= 8
    checked = scale.far_row_sequences(case.query_start_loc, problem.num_tokens, row_elements, case.seed)
    first_far = INT32_OFFSET_LIMIT // row_elements
    assert first_far * row_elements <= INT32_OFFSET_LIMIT < (first_far + 1) * row_elements
    rows = np.concatenate([np.arange(problem.query_start_loc[s], problem.query_start_loc[s + 1]) for s in checked])
    assert np.isin(np.arange(first_far, problem.num_tokens), rows).all() and 0 in rows
    assert np.array_equal(occupied_blocks(case.query), np.sort(rows))  # only the checked rows hold values
    assert problem.seq_lens.min() >= 2 and np.all(problem.seq_lens > problem.q_lens)  # every query sees 2 keys
    assert case.key_cache.shape[0] == scale.FAR_ROW_BLOCKS
    assert rss_mib() - before < 512  # a query of 4 GiB, lazily allocated: only the checked rows cost memory


@pytest.mark.parametrize("queries", ["prompts", "prefills"])
def test_far_rows_check_fails_rows_past_element_2_31_left_unwritten(queries):
    (case,) = drawn(scale.far_row_cases(ANY, dtype="bfloat16", queries=queries), 1)
    assert checks.far_rows_match_spec(FilledRowsOnly(wrap=False), case) <= 1.0
    with pytest.raises(ConformanceFailure, match="elements from 2,14"):
        checks.far_rows_match_spec(FilledRowsOnly(wrap=True), case)


def test_fused_far_row_cases_take_the_views_rows_past_element_2_31_and_leave_the_view_below_it():
    before = rss_mib()
    (case,) = drawn(scale.far_row_cases(DECLARED, dtype="bfloat16", fused=True), 1)
    problem = checks.problem_of(case)
    assert case.qkv is not None and np.shares_memory(case.query, case.qkv)
    stride = case.qkv.shape[1] * problem.head_dim
    assert case.query.strides[0] == stride * case.query.itemsize
    assert problem.num_tokens * problem.num_q_heads * problem.head_dim < INT32_OFFSET_LIMIT  # the view, the output
    assert INT32_OFFSET_LIMIT < problem.num_tokens * stride <= INT32_OFFSET_LIMIT + 64 * stride
    checked = scale.far_row_sequences(case.query_start_loc, problem.num_tokens, stride, case.seed)
    assert np.isin(np.arange(INT32_OFFSET_LIMIT // stride, problem.num_tokens), checked).all()
    assert np.isnan(case.qkv[checked[-1], problem.num_q_heads:]).all()  # key and value heads never read
    assert np.isfinite(case.query[checked]).all()
    assert rss_mib() - before < 512
    assert checks.far_rows_match_spec(FilledRowsOnly(wrap=False), case) <= 1.0
    with pytest.raises(ConformanceFailure, match="elements from 2,14"):
        checks.far_rows_match_spec(FilledRowsOnly(wrap=True), case)


class FilledMergeRowsOnly(NumpyBackend):
    """merge_states of the rows with a non-zero lse (the rows a far-row merge case fills), zero
    elsewhere; with ``wrap``, none past element 2**31, as a kernel whose offsets wrap at 32 bits."""

    name = "filled-merge-rows-only"

    def __init__(self, wrap: bool) -> None:
        self.wrap = wrap

    def _merge_states(self, out_a, lse_a, out_b, lse_b):
        _, H, D = out_a.shape
        out, lse = np.zeros_like(out_a), np.zeros_like(lse_a)  # lazy, as the case's outs
        rows = np.flatnonzero((lse_a != 0).any(axis=1) | (lse_b != 0).any(axis=1))
        if self.wrap:
            rows = rows[(rows + 1) * H * D <= INT32_OFFSET_LIMIT]
        merged_out, merged_lse = spec_merge_states(out_a[rows], lse_a[rows], out_b[rows], lse_b[rows])
        out[rows], lse[rows] = merged_out.astype(out.dtype), merged_lse
        return out, lse


def test_far_merge_row_cases_take_the_states_past_element_2_31_and_the_check_sees_those_rows():
    before = rss_mib()
    (case,) = drawn(scale.far_merge_row_cases(dtype="bfloat16"), 1)
    T, H, D = case.out_a.shape
    assert INT32_OFFSET_LIMIT < T * H * D <= INT32_OFFSET_LIMIT + 64 * H * D
    rows = scale.far_row_sequences(None, T, H * D, scale.FAR_MERGE_SEED)
    assert np.isin(np.arange(INT32_OFFSET_LIMIT // (H * D), T), rows).all() and 0 in rows
    assert np.array_equal(occupied_blocks(case.out_a), rows) and np.isneginf(case.lse_a[rows]).any()
    assert rss_mib() - before < 512
    assert checks.far_merge_rows_match_spec(FilledMergeRowsOnly(wrap=False), case) <= 1.0
    with pytest.raises(ConformanceFailure, match="merge_states"):
        checks.far_merge_rows_match_spec(FilledMergeRowsOnly(wrap=True), case)


class LastSequenceUnwritten(NumpyBackend):
    """The numpy reference, but the last sequence's rows left zero (the sequence a far-partials
    check compares whose partials lie furthest)."""

    name = "last-sequence-unwritten"

    def _run(self, plan, query, key_cache, value_cache):
        out, lse = super()._run(plan, query, key_cache, value_cache)
        last = slice(int(plan.problem.query_start_loc[-2]), None)
        out[last] = 0
        if lse is not None:
            lse[last] = -np.inf
        return out, lse


def test_far_partial_cases_take_partials_laid_out_by_sequence_past_element_2_31():
    (case,) = drawn(scale.far_partial_cases(DECLARED, dtype="bfloat16"), 1)
    problem = checks.problem_of(case)
    row_elements = problem.num_q_heads * problem.head_dim
    assert row_elements == scale.FAR_PARTIAL_ROW and problem.q_lens.max() == 1
    assert int(problem.seq_lens.max()) == scale.FAR_PARTIAL_KEYS == problem.seq_lens[0]
    parts = scale.FAR_PARTIAL_KEYS // scale.FAR_PARTIAL_PART_KEYS
    per_seq = row_elements * parts  # partials of one sequence, laid out [sequence, head, part, head_dim]
    assert INT32_OFFSET_LIMIT < problem.num_seqs * per_seq <= INT32_OFFSET_LIMIT + 64 * per_seq
    assert 64 * problem.num_tokens * row_elements > INT32_OFFSET_LIMIT  # triton's [splits, T, Hq, D] at 64 splits
    seqs = scale.far_partial_sequences(problem.seq_lens, row_elements, case.seed)
    assert np.isin(np.arange(INT32_OFFSET_LIMIT // per_seq, problem.num_seqs), seqs).all() and 0 in seqs


def test_far_partials_check_compares_the_far_sequences_alone():
    # a batch far smaller than the limit: its last sequence stands for the first one past it
    (case,) = drawn(scale.odd_size_cases(ANY, dtype="float32", limits=scale.scale_limits("quick")), 1)
    problem = checks.problem_of(case)
    seqs = scale.far_partial_sequences(problem.seq_lens, problem.num_q_heads * problem.head_dim, case.seed)
    assert problem.num_seqs - 1 in seqs and int(np.argmax(problem.seq_lens)) in seqs
    assert checks.far_partials_match_spec(NumpyBackend(), case) <= 1.0
    with pytest.raises(ConformanceFailure, match=f"sequence {problem.num_seqs - 1}: .*partials from element"):
        checks.far_partials_match_spec(LastSequenceUnwritten(), case)


def test_far_score_cases_pass_element_2_31_of_a_heads_scores():
    (case,) = drawn(scale.far_score_cases(DECLARED, dtype="bfloat16"), 1)
    problem = checks.problem_of(case)
    q_len, length = int(problem.q_lens[0]), int(problem.seq_lens[0])
    assert problem.num_seqs == 1 and problem.causal and problem.num_q_heads == scale.FAR_SCORE_HEADS
    assert scale.FAR_SCORE_QUERIES <= q_len <= length and q_len * length > INT32_OFFSET_LIMIT
    rows = scale.far_score_rows(q_len, length, case.seed)
    first_far = -(-INT32_OFFSET_LIMIT // length)
    assert first_far < q_len - scale.FAR_SCORE_ROWS and {0, first_far, q_len - 1} <= set(rows.tolist())
    assert (rows >= first_far).sum() >= 2 and rows.max() < q_len


def test_far_score_uint32_cases_pass_element_2_32_of_a_heads_scores_on_a_small_pool():
    (case,) = drawn(scale.far_score_uint32_cases(DECLARED, dtype="bfloat16"), 1)
    problem = checks.problem_of(case)
    q_len, length = int(problem.q_lens[0]), int(problem.seq_lens[0])
    assert problem.num_seqs == 1 and problem.causal and problem.num_q_heads == scale.FAR_SCORE_HEADS
    assert problem.alibi_slopes is None and problem.sliding_window is None  # the distinct-block answer holds
    assert q_len > 8192 and q_len * length > UINT32_OFFSET_LIMIT
    rows = scale.far_score_rows(q_len, length, case.seed, limit=UINT32_OFFSET_LIMIT)
    first_far = -(-UINT32_OFFSET_LIMIT // length)
    assert first_far < q_len - scale.FAR_SCORE_ROWS and {0, first_far, q_len - 1} <= set(rows.tolist())
    assert (rows >= first_far).sum() >= 2 and rows.max() < q_len
    row = problem.block_tables[0, :-(-length // problem.block_size)]
    assert len(set(row.tolist())) >= scale.KV_BYTES_DISTINCT_BLOCKS[0] // 2 and problem.num_blocks <= 1035
    assert problem.block_tables[0, -1] not in set(row.tolist())  # a garbage block past the sequence


class LastRowWrong(NumpyBackend):
    """The numpy reference, but the last query row's output negated (the row a far-scores check
    compares whose scores lie furthest)."""

    name = "last-row-wrong"

    def _run(self, plan, query, key_cache, value_cache):
        out, lse = super()._run(plan, query, key_cache, value_cache)
        out[-1] = -out[-1]
        return out, lse


SLOPES = np.linspace(0.1, 0.4, 4, dtype=np.float32)


@pytest.mark.parametrize("options", [{}, {"softcap": 5.0, "return_lse": True},
                                     {"sliding_window": 40, "alibi_slopes": SLOPES}],
                         ids=["causal", "softcap-lse", "window-alibi"])
def test_far_scores_check_compares_rows_alone(options):
    # a prefill far smaller than the limit: its last row stands for the first one past it
    case = random_paged_inputs([300], [200], num_q_heads=4, num_kv_heads=2, head_dim=16, dtype="bfloat16",
                               garbage="nan", seed=3, **options)
    for token in (0, 57, 199):  # a decode of the row's sequence cut after its position
        single = checks.row_alone(case, token)
        assert int(single.seq_lens[0]) == 300 - 200 + token + 1 and single.query_start_loc is None
        assert np.array_equal(single.query[0], case.query[token])
    # the reference's rows of the whole prefill against the spec's answer for each row alone
    assert checks.far_scores_match_spec(NumpyBackend(), case) <= 1.0
    with pytest.raises(ConformanceFailure, match="row 199: its scores from element 59,700"):
        checks.far_scores_match_spec(LastRowWrong(), case)
    with pytest.raises(ValueError, match="causal"):
        checks.row_alone(case.replace(options={**case.options, "causal": False}), 0)


def test_far_scores_past_2_32_check_compares_rows_alone_by_distinct_blocks():
    # a prefill far smaller than the limit, its table naming 3 blocks again and again: its last row
    # stands for the first one past element 2**32
    case = random_paged_inputs([300], [200], num_q_heads=4, num_kv_heads=2, head_dim=16, dtype="bfloat16",
                               garbage="nan", seed=5, return_lse=True)
    tables = np.array(case.block_tables, copy=True)
    tables[0, :19] = np.resize(tables[0, :3], 19)  # 300 keys in blocks of 16: 19 columns
    case = case.replace(block_tables=tables)
    assert checks.far_scores_past_uint32_match_spec(NumpyBackend(), case) <= 1.0
    with pytest.raises(ConformanceFailure, match="row 199: its scores from element 59,700"):
        checks.far_scores_past_uint32_match_spec(LastRowWrong(), case)


def test_far_row_write_kv_cases_pass_element_2_31_of_the_inputs_and_write_the_far_tokens():
    before = rss_mib()
    (case,) = drawn(scale.far_row_write_kv_cases(DECLARED, dtype="bfloat16"), 1)
    T, heads, head_dim = case.key.shape
    row_elements = heads * head_dim
    assert head_dim == 128 and row_elements >= scale.FAR_WRITE_ROW_ELEMENTS
    assert INT32_OFFSET_LIMIT < T * row_elements <= INT32_OFFSET_LIMIT + 64 * row_elements
    written = np.flatnonzero(case.slot_mapping >= 0)
    assert np.isin(np.arange(INT32_OFFSET_LIMIT // row_elements, T), written).all() and 0 in written
    assert np.array_equal(occupied_blocks(case.key), written) and np.array_equal(occupied_blocks(case.value), written)
    assert len(np.unique(case.slot_mapping[written])) == written.size
    assert rss_mib() - before < 512  # inputs of 4 GiB each, lazily allocated
    assert checks.write_kv_matches_spec(NumpyBackend(), case) == 0.0
    assert "not -1" in repr(case) and len(repr(case)) < 400  # the repr names the slots written, not 524,291 of them


def test_far_rows_are_unsupported_on_a_cpu_unless_sizes_are_large(monkeypatch):
    monkeypatch.delenv("PAGEDATTN_SIZE", raising=False)
    with pytest.raises(Unsupported, match="PAGEDATTN_SIZE=large"):
        require(NumpyBackend(), large_arrays=True)
    require(NumpyBackend(), many_programs=True)  # numpy runs its write_kv at once
    monkeypatch.setenv("PAGEDATTN_SIZE", "large")
    require(NumpyBackend(), large_arrays=True)


def test_many_programs_are_unsupported_in_an_interpreter_unless_sizes_are_large(monkeypatch):
    class Interpreted(NumpyBackend):
        def capabilities(self) -> Capabilities:
            return Capabilities(device="cpu (Triton interpreter)")

    monkeypatch.delenv("PAGEDATTN_SIZE", raising=False)
    with pytest.raises(Unsupported, match=r"interpreter.*PAGEDATTN_SIZE=large"):
        require(Interpreted(), many_programs=True)
    monkeypatch.setenv("PAGEDATTN_SIZE", "large")
    require(Interpreted(), many_programs=True)


# -- sizes that are no power of two ----------------------------------------------------------

def test_odd_cases_have_no_power_of_two_sizes():
    def odd(n: int) -> bool:
        return n & (n - 1) != 0

    for case in drawn(scale.odd_size_cases(ANY, dtype="float32", limits=scale.scale_limits("quick")), 4):
        problem = checks.problem_of(case)
        assert odd(problem.num_kv_heads) and odd(problem.head_dim) and odd(problem.block_size)
        assert problem.num_blocks % 2 == 1 and problem.num_seqs in (1, 3, 5)
        assert all(odd(int(n)) or n == 1 for n in problem.seq_lens)


def test_large_block_cases_take_blocks_past_a_tile_of_128_and_sequences_at_their_edges():
    cases = drawn(scale.large_block_cases(ANY, dtype="float32"), 12)
    sizes = {checks.problem_of(case).block_size for case in cases}
    assert sizes <= set(scale.LARGE_BLOCK_SIZES) and len(sizes) >= 2, sizes
    for case in cases:
        problem = checks.problem_of(case)
        far = scale.LARGE_BLOCK_FAR_KEYS + problem.block_size
        assert far < problem.seq_lens[0] <= far + 2048, "the first sequence passes 4,096 keys by more than a block"
        assert problem.seq_lens[1:].max(initial=1) <= 3 * problem.block_size
    lengths = [(int(n), checks.problem_of(c).block_size) for c in cases for n in checks.problem_of(c).seq_lens[1:]]
    assert any(n > bs for n, bs in lengths), "some sequence spans two blocks"
    assert any(n % bs in (0, 1, bs - 1) and n > 1 for n, bs in lengths), "some sequence ends at a block's edge"


def test_large_block_cases_of_a_backend_declaring_small_blocks_only_are_unsupported():
    """cupy's kind (16, 32, 64): every case draws a block size it does not declare; one declaring
    256 gets 256 only."""
    (case,) = drawn(scale.large_block_cases(DECLARED, dtype="float32"), 1)
    assert DECLARED.unsupported_reason(checks.problem_of(case)) is not None
    declared = Capabilities(block_sizes=(16, 256))
    assert {checks.problem_of(c).block_size for c in drawn(scale.large_block_cases(declared, dtype="float32"), 4)} \
        == {256}


def test_small_block_cases_take_blocks_of_a_slot_and_sizes_no_run_of_8_fits():
    cases = drawn(scale.small_block_cases(ANY, dtype="float32"), 12)
    assert checks.problem_of(cases[0]).block_size == 1  # the shrink target: SGLang's page of one token
    sizes = {checks.problem_of(case).block_size for case in cases}
    assert sizes <= set(scale.SMALL_BLOCK_SIZES) and len(sizes) >= 2, sizes
    assert any(bs % 8 for bs in sizes), "a size of which a run of 8 slots spans two blocks"
    for case in cases:
        problem = checks.problem_of(case)
        assert -(-int(problem.seq_lens[0]) // problem.block_size) > scale.LARGE_BLOCK_FAR_KEYS // problem.block_size
        assert problem.seq_lens[1:].max(initial=1) <= 48


def test_small_block_cases_of_a_backend_declaring_the_contracts_blocks_only_are_unsupported():
    """cupy's kind (16, 32, 64): every case draws a block size it does not declare; one declaring 8
    gets 8 only."""
    (case,) = drawn(scale.small_block_cases(DECLARED, dtype="float32"), 1)
    assert DECLARED.unsupported_reason(checks.problem_of(case)) is not None
    declared = Capabilities(block_sizes=(8, 16))
    assert {checks.problem_of(c).block_size for c in drawn(scale.small_block_cases(declared, dtype="float32"), 4)} \
        == {8}


def test_large_block_operation_cases_write_past_the_128th_slot_of_a_block():
    write_cases = drawn(scale.large_block_operation_cases(ANY, dtype="bfloat16", operation="write_kv"), 6)
    block_sizes = {case.key_cache.shape[1 if case.kv_layout == "NHD" else 2] for case in write_cases}
    assert block_sizes <= set(scale.LARGE_BLOCK_SIZES), block_sizes
    offsets = [int(slot) % bs for case, bs in ((c, c.key_cache.shape[1 if c.kv_layout == "NHD" else 2])
                                                for c in write_cases) for slot in case.slot_mapping if slot >= 0]
    assert any(offset >= 128 for offset in offsets), "some token lands past a block's 128th slot"
    (copy,) = drawn(scale.large_block_operation_cases(ANY, dtype="bfloat16", operation="copy_blocks"), 1)
    assert copy.key_cache.shape[1 if copy.kv_layout == "NHD" else 2] in scale.LARGE_BLOCK_SIZES


def test_large_head_dim_cases_pass_a_256_wide_tile():
    dims = {checks.problem_of(case).head_dim for case in drawn(scale.large_head_dim_cases(ANY, dtype="float32"), 8)}
    assert dims == set(scale.LARGE_HEAD_DIMS), dims
    declared = Capabilities(head_dims=(128, 576))
    assert {checks.problem_of(c).head_dim for c in drawn(scale.large_head_dim_cases(declared, dtype="float32"), 3)} \
        == {576}


class DeclaredNumpy(NumpyBackend):
    name = "declared-numpy"

    def capabilities(self) -> Capabilities:
        return DECLARED


class UpTo256(NumpyBackend):
    name = "up-to-256"

    def capabilities(self) -> Capabilities:
        return Capabilities(max_head_dim=256)


def test_a_backend_capped_below_the_large_head_dims_is_unsupported_before_any_draw():
    (case,) = drawn(scale.large_head_dim_cases(ANY, dtype="float32"), 1)
    assert UpTo256().capabilities().unsupported_reason(checks.problem_of(case)) == (
        "query", f"head_dim {checks.problem_of(case).head_dim} (supported: <= 256)")
    with pytest.raises(Unsupported, match="max_head_dim 256"):
        require(UpTo256(), head_dim=scale.large_head_dims(UpTo256().capabilities())[0])
    with pytest.raises(Unsupported, match="head_dim 384 not declared"):
        require(DeclaredNumpy(), head_dim=384)
    require(NumpyBackend(), head_dim=512)


# -- wide groups and large batches ------------------------------------------------------------

@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
def test_wide_group_cases_cut_a_group_into_several_tiles_of_triton_and_cupy(batch):
    from pagedattn.backends.cupy.planning import build_work

    cases = drawn(scale.wide_group_cases(DECLARED, dtype="bfloat16", limits=scale.scale_limits("quick"),
                                         decode=batch == "decode"), 6)
    for case in cases:
        assert_batch_kind(checks.problem_of(case), batch)
    assert all(checks.problem_of(case).group_size >= 12 for case in cases)
    assert len({checks.problem_of(case).group_size for case in cases}) > 1
    problem = checks.problem_of(cases[0])  # the shrink target: past a 16-row and a 64-row tile
    assert problem.group_size > 64 and problem.group_size & (problem.group_size - 1)
    tiles = choose_tiles(int(problem.q_lens.max()), problem.group_size, problem.head_dim, problem.dtype,
                         problem.block_size)
    assert tiles.num_group_tiles > 1
    work = build_work(problem)
    assert len(set(work.items[:, 4].tolist())) > 1  # cupy's items start at more than one query head of a group


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
def test_large_batch_cases_hold_more_work_than_one_wave_of_triton_and_cupy(batch):
    cases = scale.large_batch_cases(DECLARED, dtype="float16", limits=scale.scale_limits("quick"),
                                    decode=batch == "decode")
    for case in drawn(cases, 3):
        problem = checks.problem_of(case)
        assert_batch_kind(problem, batch)
        assert problem.num_seqs > scale.MAX_RESIDENT_CTAS  # one CTA per sequence: more than one wave
        assert int(problem.seq_lens.max()) <= scale.LARGE_BATCH_MAX_LEN
        tiles, programs, _ = triton_grid(problem)
        assert programs > tiles.resident * H200_SMS
        assert h200_cupy_work(problem).items.shape[0] > 2 * H200_CUPY_DECODE_SLOTS


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
@pytest.mark.parametrize("fp8", [False, True])
def test_very_long_batch_cases_fill_an_h200_with_unsplit_ranges_past_16_bit_offsets(fp8, batch):
    cases = drawn(scale.very_long_batch_cases(DECLARED, dtype="bfloat16", fp8=fp8, decode=batch == "decode"), 3)
    wrap = scale.VERY_LONG_BATCH_WRAP
    for case in cases:
        problem = checks.problem_of(case)
        fp8_caches = problem.cache_dtype in FP8_DTYPES and problem.v_scale != 1
        assert fp8_caches if fp8 else problem.cache_dtype == "bfloat16"
        assert_batch_kind(problem, batch)
        assert int(problem.q_lens.max()) <= 3 and problem.num_seqs * problem.num_kv_heads >= scale.LONG_BATCH_PAIRS
        lens, bs = np.asarray(problem.seq_lens), problem.block_size
        assert wrap + scale.VERY_LONG_BATCH_PAST[0] <= lens.min() and lens.max() <= wrap + scale.VERY_LONG_BATCH_PAST[1]
        assert triton_grid(problem).splits() == 1  # each program walks a whole sequence's range
        tables = problem.block_tables
        before, after = set(tables[:, :wrap // bs].ravel().tolist()), set(tables[:, wrap // bs].tolist())
        assert not before & after and problem.num_blocks <= 2 * scale.VERY_LONG_BATCH_DISTINCT_BLOCKS[1] + 4
        past = np.arange(tables.shape[1])[None, :] >= -(-lens // bs)[:, None]
        assert past.any(axis=1).all() and not (set(tables[past].tolist()) & (before | after))  # garbage past each
    # cupy walks the first case's ranges whole too (a few-query batch of GQA 4 it may split)
    assert len(h200_cupy_work(checks.problem_of(cases[0])).merges) == 0


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
def test_very_long_batch_cases_move_every_row_past_the_bound_when_offsets_wrap_at_16_bits(batch):
    from pagedattn.spec.error_model import tolerance

    wrap = scale.VERY_LONG_BATCH_WRAP
    cases = scale.very_long_batch_cases(NumpyBackend().capabilities(), dtype="bfloat16", decode=batch == "decode")
    for case in drawn(cases, 2):
        problem = checks.problem_of(case)
        exact = exact_by_distinct_blocks(problem, case.query, case.key_cache, case.value_cache)
        tol = tolerance(problem.dtype, problem.head_dim, cache_dtype=problem.cache_dtype)
        bound = tol.out_bound(exact.out, exact.value_scale, exact.score_scale, exact.num_visible)
        tables = problem.block_tables.copy()
        columns = np.arange(tables.shape[1])
        first_after = wrap // problem.block_size
        tables[:, first_after:] = tables[:, columns[first_after:] - first_after]  # the key at p read from p - wrap
        wrapped = replace(case, block_tables=tables)
        other = exact_by_distinct_blocks(checks.problem_of(wrapped), case.query, case.key_cache, case.value_cache)
        assert (np.abs(other.out - exact.out) > bound).any(axis=-1).all()  # each row and head beyond it


@pytest.mark.parametrize("fp8", [False, True])
def test_split_batch_cases_split_every_sequence_in_triton_and_cupy(fp8):
    cases = drawn(scale.long_batch_cases(DECLARED, dtype="bfloat16", fp8=fp8, pairs=scale.SPLIT_BATCH_PAIRS), 3)
    for case in cases:
        problem = checks.problem_of(case)
        assert problem.num_seqs * problem.num_kv_heads == scale.SPLIT_BATCH_PAIRS < H200_SMS
        assert int(problem.seq_lens.min()) >= scale.LONG_BATCH_KEYS[0]
        assert triton_grid(problem).splits() > 1
        work = h200_cupy_work(problem)
        # every (sequence, KV head) pair is merged from parts: the plan splits each sequence
        assert work.merges.shape[0] >= problem.num_seqs * problem.num_kv_heads, work.merges.shape
    target = checks.problem_of(cases[0])  # the shrink target: llama3-70b's tensor-parallel decode
    assert (target.num_seqs, target.num_kv_heads, target.group_size) == (64, 1, 8)
    assert triton_grid(target).splits() * target.num_seqs > 2 * H200_SMS  # hundreds of parts share the partials


def test_large_batch_fp8_cases_hold_fp8_caches_past_one_wave_of_cupy():
    for case in drawn(scale.large_batch_cases(DECLARED, dtype="bfloat16", limits=scale.scale_limits("quick"),
                                              fp8=True), 3):
        problem = checks.problem_of(case)
        assert problem.cache_dtype.startswith("float8") and problem.v_scale != 1.0
        assert problem.num_seqs > scale.MAX_RESIDENT_CTAS
        assert h200_cupy_work(problem).items.shape[0] > 2 * H200_CUPY_DECODE_SLOTS


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
@pytest.mark.parametrize("prefixes", [1, 2])
def test_shared_prefix_cases_share_the_blocks_of_a_long_prefix_before_every_query(prefixes, batch):
    from pagedattn.conformance.mutants.scale import CASCADE_MIN_KEYS, CASCADE_MIN_SEQS, CascadeKernelBackend

    cases = scale.shared_prefix_batch_cases(ANY, dtype="bfloat16", prefixes=prefixes, decode=batch == "decode")
    for case in drawn(cases, 3):
        problem = checks.problem_of(case)
        assert_batch_kind(problem, batch)
        tables, bs = problem.block_tables, problem.block_size
        assert problem.num_seqs >= 2 * CASCADE_MIN_SEQS and problem.num_q_heads >= 4
        shared = CascadeKernelBackend().shared_blocks(problem)  # leading blocks alike in every row
        first_two = int((tables[0] == tables[1]).argmin())  # leading blocks the first two rows share
        assert first_two * bs >= CASCADE_MIN_KEYS
        assert shared == (first_two if prefixes == 1 else 0)
        if prefixes == 1:  # every query past the prefix: a cascade path takes the batch
            assert CascadeKernelBackend().cascade_blocks(problem) == shared
        groups = {tuple(row[:CASCADE_MIN_KEYS // bs]) for row in tables}
        assert len(groups) == prefixes


def test_many_token_cases_hold_more_query_tokens_than_a_grid_axis_y_or_z():
    from pagedattn.conformance.mutants.scale import GRID_YZ_LIMIT

    for caps in (ANY, Capabilities(features=frozenset({"lse"}))):  # varlen, and decode only
        (case,) = drawn(scale.many_token_cases(caps, dtype="bfloat16", limits=scale.scale_limits("quick")), 1)
        problem = checks.problem_of(case)
        assert problem.num_tokens > GRID_YZ_LIMIT
        assert problem.is_decode != caps.supports("varlen")
        if caps.supports("varlen"):  # whole prompts: far fewer sequences than tokens
            assert problem.num_seqs < problem.num_tokens // 10
    for fp8 in (False, True):
        (write,) = drawn(scale.many_token_write_kv_cases(ANY, dtype="bfloat16", limits=scale.scale_limits("quick"),
                                                         fp8=fp8), 1)
        assert len(write.slot_mapping) > GRID_YZ_LIMIT and write.slot_mapping[-1] >= 0
        assert 0 < int((write.slot_mapping < 0).sum()) < len(write.slot_mapping) // 50  # a few skipped
        cache = str(write.key_cache.dtype)
        if fp8:  # an fp8 cache, with the long cells' scales
            assert cache.startswith("float8") and write.k_scale in scale.LONG_FP8_K_SCALES
            assert write.v_scale in scale.LONG_FP8_V_SCALES
        else:
            assert cache == "bfloat16" and write.k_scale == write.v_scale == 1.0


def test_many_sequence_cases_hold_more_sequences_than_a_grid_axis_y_or_z():
    from pagedattn.conformance.mutants.scale import GRID_YZ_LIMIT

    for queries, per_seq in (("decode", 1), ("prompts", 2)):
        (case,) = drawn(scale.many_sequence_cases(ANY, dtype="bfloat16", limits=scale.scale_limits("quick"),
                                                  queries=queries), 1)
        problem = checks.problem_of(case)
        assert problem.num_seqs > max(GRID_YZ_LIMIT, scale.MANY_SEQUENCES)  # an index past 16 bits
        assert problem.is_decode == (queries == "decode")
        assert (case.query_start_loc is None) == (queries == "decode")  # decode: a decode call
        assert np.all(problem.q_lens == per_seq) and np.all(problem.seq_lens >= per_seq)
        assert int(problem.seq_lens.max()) <= max(scale.MANY_SEQUENCE_MAX_LEN, problem.block_size + 1)


def test_many_pair_copy_blocks_cases_hold_more_pairs_than_a_grid_axis_y_or_z_with_chains():
    from pagedattn.conformance.mutants.scale import GRID_YZ_LIMIT

    (case,) = drawn(scale.many_pair_copy_blocks_cases(ANY, dtype="bfloat16", limits=scale.scale_limits("quick")), 1)
    src, dst = case.pairs[:, 0], case.pairs[:, 1]
    assert len(case.pairs) > GRID_YZ_LIMIT and len(np.unique(dst)) == len(dst)
    assert int(case.pairs.max()) < case.key_cache.shape[0]
    assert np.isin(src, dst).sum() > len(src) // 2  # chains: most sources are also destinations


def test_many_token_merge_cases_hold_more_tokens_than_a_grid_axis_y_or_z_with_rows_to_merge_past_it():
    from pagedattn.conformance.mutants.scale import GRID_YZ_LIMIT

    (case,) = drawn(scale.many_token_merge_cases(ANY, dtype="bfloat16", limits=scale.scale_limits("quick")), 1)
    T = case.out_a.shape[0]
    assert T > GRID_YZ_LIMIT and case.lse_a.shape == case.lse_b.shape == case.out_a.shape[:2]
    past = slice(GRID_YZ_LIMIT, T)
    both = np.isfinite(case.lse_a[past]) & np.isfinite(case.lse_b[past])
    assert both.any()  # rows past the limit that a merge must weigh from both sides
    assert len(repr(case)) < 200  # a failure's message names the case without listing its lses


def test_wide_merge_cases_pass_a_block_of_a_row_per_head_and_a_256_dim_row_tile():
    from pagedattn.conformance.mutants.scale import BLOCK_THREADS, MERGE_ROW_TILE, VECTOR_BYTES

    cases = drawn(scale.wide_merge_cases(ANY, dtype="bfloat16", limits=scale.scale_limits("quick")), 8)
    low, high = scale.WIDE_MERGE_HEADS
    for case in cases:
        T, H, D = case.out_a.shape
        assert 1 <= T <= 4 and low <= H <= high and D in scale.WIDE_MERGE_HEAD_DIMS
        assert low > BLOCK_THREADS // (128 * 2 // VECTOR_BYTES)  # head_dim 128 in 16 bits: past the block
    T, H, D = cases[0].out_a.shape  # the shrink target
    assert D > MERGE_ROW_TILE and D * 2 // VECTOR_BYTES * H > BLOCK_THREADS
    assert len({case.out_a.shape[2] for case in cases}) > 1


@pytest.mark.parametrize("operation", ["write_kv", "copy_blocks"])
def test_wide_head_operation_cases_pass_a_block_of_every_head_of_a_slot_and_move_data(operation):
    from pagedattn.conformance.mutants.scale import BLOCK_THREADS, threads_of_heads_in_one_block

    cases = drawn(scale.wide_head_operation_cases(ANY, dtype="bfloat16", operation=operation), 4)
    for case in cases:
        layout = case.kv_layout
        shape = case.key_cache.shape
        heads, head_dim = (shape[2] if layout == "NHD" else shape[1]), shape[-1]
        assert scale.WIDE_KV_HEADS[0] <= heads <= scale.WIDE_KV_HEADS[1] and head_dim in scale.WIDE_KV_HEAD_DIMS
        assert threads_of_heads_in_one_block(heads, head_dim, 2) > BLOCK_THREADS
        if operation == "write_kv":
            assert case.key.shape[1:] == (heads, head_dim) and np.any(np.asarray(case.slot_mapping) >= 0)
        else:  # at least one pair copies another block: a copy left undone shows
            assert np.any(case.pairs[:, 0] != case.pairs[:, 1])


def test_long_prefill_cases_take_several_query_tiles_and_cupys_hopper_kernel():
    from pagedattn.backends.cupy.planning import choose_kernel
    from pagedattn.backends.cupy.specializations import WGMMA_ROWS

    for case in drawn(scale.long_prefill_cases(DECLARED, dtype="bfloat16", limits=scale.scale_limits("ci")), 3):
        problem = checks.problem_of(case)
        assert problem.causal and int(problem.q_lens.min()) >= 64
        assert int(problem.q_lens.min()) * problem.group_size >= scale.LONG_PREFILL_ROWS
        assert choose_kernel(problem, sm90=True).rows == WGMMA_ROWS  # cupy's Hopper prefill kernel on an H200
        tiles = choose_tiles(int(problem.q_lens.max()), problem.group_size, problem.head_dim, problem.dtype,
                             problem.block_size)
        assert int(problem.q_lens.max()) > 2 * tiles.block_q  # several of triton's query tiles


def test_non_causal_long_prefill_cases_take_several_query_tiles_without_the_mask():
    for case in drawn(scale.long_prefill_cases(DECLARED, dtype="float16", limits=scale.scale_limits("quick"),
                                               causal=False), 3):
        problem = checks.problem_of(case)
        assert not problem.causal and int(problem.q_lens.min()) >= 64
        tiles = choose_tiles(int(problem.q_lens.max()), problem.group_size, problem.head_dim, problem.dtype,
                             problem.block_size)
        assert int(problem.q_lens.max()) > 2 * tiles.block_q  # several of triton's query tiles


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
def test_very_long_cases_pass_16_bit_positions_and_fill_the_split_plans_of_triton_and_cupy(batch):
    from pagedattn.backends.triton.launch_config import MAX_SPLITS
    from pagedattn.conformance.mutants.scale import MERGE_MAX_PARTS, PART_KEYS, UINT16_POSITIONS

    for profile in ("quick", "ci"):
        limits = scale.scale_limits(profile)
        (case,) = drawn(scale.very_long_sequence_cases(DECLARED, dtype="float16", limits=limits,
                                                       decode=batch == "decode"), 1)
        problem = checks.problem_of(case)
        assert_batch_kind(problem, batch)
        length = int(problem.seq_lens[0])
        assert problem.num_seqs == 1 and problem.num_kv_heads == 1
        assert length > UINT16_POSITIONS and length % problem.block_size  # a partial last block
        assert -(-length // PART_KEYS) > MERGE_MAX_PARTS + 8  # the mutants' merge drops more than 8 parts
        grid = triton_grid(problem)
        longest, splits = int(grid.key_tiles.max()), grid.splits()
        assert -(-longest // splits) == -(-longest // MAX_SPLITS)  # parts as short as MAX_SPLITS makes them
        work = h200_cupy_work(problem)
        assert int(work.merges[:, 6].max()) > MERGE_MAX_PARTS, work.merges  # more parts than a fixed merge holds


def test_very_long_window_cases_put_every_query_past_16_bit_positions_under_a_narrow_window():
    """The first cases: every query past position 32,767 (where a signed 16-bit position wraps), a
    window of 100 to 4,096 keys; the shrink target's queries past 65,535 too, without ALiBi (whose
    slopes would weigh far keys at nothing) and softcap; ALiBi in some."""
    cases = drawn(scale.very_long_window_sequence_cases(ANY, dtype="float16", limits=scale.scale_limits("quick")), 8)
    for case in cases:
        problem = checks.problem_of(case)
        positions = problem.token_positions()[1]
        assert problem.num_seqs == 1 and int(positions.min()) >= 2**15
        assert scale.LONG_WINDOW_MIN <= problem.sliding_window <= scale.VERY_LONG_MAX_WINDOW
    first = checks.problem_of(cases[0])
    assert int(first.token_positions()[1].min()) >= 2**16
    assert first.sliding_window == scale.LONG_WINDOW_MIN and first.alibi_slopes is None and first.softcap is None
    assert any(checks.problem_of(case).alibi_slopes is not None for case in cases)


def test_very_long_fp8_cases_take_cupys_fp8_plan_past_the_parts_of_its_16_bit_plan():
    from pagedattn.conformance.mutants.scale import MERGE_MAX_PARTS

    limits = scale.scale_limits("quick")
    (fp8,) = drawn(scale.very_long_sequence_cases(DECLARED, dtype="float16", limits=limits, fp8=True), 1)
    (same,) = drawn(scale.very_long_sequence_cases(DECLARED, dtype="float16", limits=limits), 1)
    fp8_problem, same_problem = checks.problem_of(fp8), checks.problem_of(same)
    assert fp8_problem.cache_dtype.startswith("float8") and fp8_problem.v_scale != 1.0
    assert list(fp8_problem.seq_lens) == list(same_problem.seq_lens)
    fp8_parts = int(h200_cupy_work(fp8_problem).merges[:, 6].max())
    same_parts = int(h200_cupy_work(same_problem).merges[:, 6].max())
    assert fp8_parts > same_parts > MERGE_MAX_PARTS  # the fp8 plan splits finer


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
def test_million_key_cases_pass_a_128k_context_and_fill_the_split_plans_of_triton_and_cupy(batch):
    from pagedattn.backends.triton.launch_config import MAX_SPLITS
    from pagedattn.conformance.mutants.scale import MERGE_MAX_KEYS, PART_KEYS

    (case,) = drawn(scale.million_key_sequence_cases(DECLARED, dtype="float16", limits=scale.scale_limits("quick"),
                                                     decode=batch == "decode"), 1)
    problem = checks.problem_of(case)
    assert_batch_kind(problem, batch)
    length = int(problem.seq_lens[0])
    assert problem.num_seqs == 1 and problem.num_kv_heads == 1 and problem.num_q_heads <= 2  # the spec's memory
    assert length > 2**20 and length % problem.block_size  # a partial last block
    assert 2**16 * min(DECLARED.block_sizes or ()) < scale.MILLION_KEYS  # columns past 16 bits at block size 16
    assert -(-length // PART_KEYS) > 8 * (MERGE_MAX_KEYS // PART_KEYS)  # the mutant's merge drops most parts
    assert triton_grid(problem).splits() == MAX_SPLITS
    work = h200_cupy_work(problem)
    assert int(work.merges[:, 6].max()) > MERGE_MAX_KEYS // PART_KEYS, work.merges  # more parts than 131,072 keys'


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
@pytest.mark.parametrize(("dtype", "fp8", "head_dim", "wrap"),
                         [("bfloat16", False, 128, 2**22), ("float32", False, 256, 2**20),
                          ("bfloat16", True, 128, 2**23)])
def test_kv_bytes_cases_pass_2_31_bytes_of_one_heads_keys_and_values_on_a_small_pool(dtype, fp8, head_dim, wrap,
                                                                                     batch):
    """The shrink target: FlashAttention's wrap at 4,194,304 keys of head_dim 128 in 16 bits (8,388,608
    in fp8), the fewest keys (float32, head_dim 256) for a CPU; the keys past the wrap in blocks of
    their own, weighing a share of the row that moves out by whole units when dropped."""
    (case,) = drawn(scale.kv_bytes_past_int32_cases(DECLARED, dtype=dtype, fp8=fp8, decode=batch == "decode"), 1)
    problem = checks.problem_of(case)
    assert_batch_kind(problem, batch)
    assert (problem.cache_dtype in FP8_DTYPES and problem.v_scale != 1) if fp8 else problem.cache_dtype == dtype
    assert scale.kv_bytes_wrap_keys(head_dim, problem.cache_dtype) == wrap
    length, bs = int(problem.seq_lens[0]), problem.block_size
    assert problem.head_dim == head_dim
    assert wrap + wrap // 64 <= length <= wrap + wrap // 8  # L * 2 * head_dim * itemsize past 2**31
    row = problem.block_tables[0, :-(-length // bs)]
    before, after = set(row[:wrap // bs].tolist()), set(row[wrap // bs:].tolist())
    assert not before & after and min(len(before), len(after)) >= scale.KV_BYTES_DISTINCT_BLOCKS[0] // 2
    assert problem.num_blocks <= 2 * scale.KV_BYTES_DISTINCT_BLOCKS[1] + 4 and problem.return_lse
    assert problem.block_tables[0, -1] not in before | after  # a garbage block past the sequence
    exact = exact_by_distinct_blocks(problem, case.query, case.key_cache, case.value_cache)
    dropped = replace(case, seq_lens=np.array([wrap], np.int32))  # the keys past the wrap dropped
    without = exact_by_distinct_blocks(checks.problem_of(dropped), dropped.query, dropped.key_cache,
                                       dropped.value_cache)
    assert np.abs(exact.out - without.out).mean() > 0.5


def test_long_cases_never_draw_a_sequence_below_the_cells_shortest():
    limits = scale.scale_limits("quick")._replace(min_long=scale.VERY_LONG_KEYS, max_long=scale.VERY_LONG_MAX,
                                                  max_long_seqs=1)
    caps = Capabilities(head_dims=(128,), block_sizes=(64,))  # heads x head_dim hold the longest to the shortest
    for case in drawn(scale.long_sequence_cases(caps, dtype="float16", limits=limits, max_kv_heads=1), 8):
        assert int(np.asarray(case.seq_lens).min()) >= scale.VERY_LONG_KEYS


def test_long_chunk_cases_have_split_parts_past_the_first_query_tiles_of_triton_and_cupy():
    from pagedattn.conformance.mutants.scale import PART_KEYS, QUERY_TILE

    for case in drawn(scale.long_chunk_cases(DECLARED, dtype="float16"), 2):
        problem = checks.problem_of(case)
        q_lens, lens = problem.q_lens, np.asarray(problem.seq_lens)
        assert problem.causal and int(q_lens.min()) > PART_KEYS + QUERY_TILE  # parts past the mutant's first tile
        assert int((lens - q_lens).min()) >= scale.LONG_CHUNK_CONTEXT[0]
        tiles, _, key_tiles = grid = triton_grid(problem)
        splits = grid.splits()
        part_keys = -(-int(key_tiles.max()) // splits) * tiles.block_n
        first_tile_end = int((lens - q_lens)[int(np.argmax(lens))]) + tiles.block_m // problem.group_size
        assert splits > 1 and (splits - 1) * part_keys > first_tile_end  # triton: a part past the first tile's queries
        assert int(h200_cupy_work(problem).merges[:, 6].max()) > 1  # cupy splits too


def test_window_long_chunk_cases_move_each_rows_window_edge_through_the_unmasked_tiles_of_its_query_tile():
    """Every chunk's window lies inside its context, and in some 64-query tile the window edges of
    the first and the last query lie in different 64-key tiles: the mutant's extra keys."""
    from pagedattn.conformance.mutants.scale import KV_TILE_KEYS, QUERY_TILE_TOKENS

    for case in drawn(scale.long_chunk_cases(DECLARED, dtype="float16", window=True), 3):
        problem = checks.problem_of(case)
        q_lens, lens = problem.q_lens, np.asarray(problem.seq_lens)
        window = problem.sliding_window
        assert window is not None and window <= int((lens - q_lens).min())
        crossed = False
        for n, q in zip(lens.tolist(), q_lens.tolist(), strict=True):
            first = n - q + np.arange(0, q, QUERY_TILE_TOKENS)  # each query tile's first position
            last = np.minimum(first + QUERY_TILE_TOKENS - 1, n - 1)
            crossed |= bool(np.any((first - window + 1) // KV_TILE_KEYS != (last - window + 1) // KV_TILE_KEYS))
        assert crossed


def test_long_chunk_rows_sample_every_16_query_tile_and_each_chunks_ends():
    qsl = np.array([0, 1100, 3000])
    rows = scale.long_chunk_rows(qsl, seed=5)
    assert {0, 1099, 1100, 2999} <= set(rows.tolist())
    for start, stop in ((0, 1100), (1100, 3000)):
        tiles = (rows[(rows >= start) & (rows < stop)] - start) // scale.LONG_CHUNK_ROW_STRIDE
        assert set(tiles.tolist()) == set(range(-(-(stop - start) // scale.LONG_CHUNK_ROW_STRIDE)))


def test_long_chunk_check_fails_a_backend_whose_middle_rows_are_wrong():
    (case,) = drawn(scale.long_chunk_cases(Capabilities(), dtype="float16"), 1)

    class MiddleRowsWrong(NumpyBackend):
        def _run(self, plan, query, key_cache, value_cache):
            out, lse = super()._run(plan, query, key_cache, value_cache)
            out = np.array(out)
            out[500:516] += 1.0  # one 16-query tile of the first chunk
            return out, lse

    assert checks.long_chunks_match_spec(NumpyBackend(), case) <= 1.0
    with pytest.raises(ConformanceFailure, match="query 5"):
        checks.long_chunks_match_spec(MiddleRowsWrong(), case)


def test_fp8_long_chunks_store_scaled_fp8_keys_and_values_that_split_plans_must_scale_once():
    for case in drawn(scale.long_chunk_cases(ANY, dtype="bfloat16", fp8=True), 1):
        problem = checks.problem_of(case)
        assert case.key_cache.itemsize == 1 and problem.cache_dtype in ("float8_e4m3fn", "float8_e5m2")
        assert problem.v_scale in scale.LONG_FP8_V_SCALES and problem.v_scale != 1.0
        assert case.labels["cache_dtype"] == problem.cache_dtype
        assert checks.long_chunks_match_spec(NumpyBackend(), case) <= 1.0


def tail_mass(case) -> tuple[np.ndarray, np.ndarray]:
    """The share of each row's mass (rows x heads) in weights under 2**-10 of its sink's, and the keys
    each row sees; asserts the sink outweighs every other key and the answer moves with the tail."""
    from pagedattn.conformance.mutants.scale import NEGLIGIBLE_WEIGHT
    from pagedattn.spec.exact import gather_kv, scores_and_mask

    problem = checks.problem_of(case)
    assert case.labels["values"] == "tail"
    p_q = problem.token_positions()[1]
    shares, seen = [], []
    for s in range(problem.num_seqs):
        rows = slice(int(problem.query_start_loc[s]), int(problem.query_start_loc[s + 1]))
        k, v = gather_kv(problem, case.key_cache, case.value_cache, s)
        scores, visible, _ = scores_and_mask(problem, case.query[rows].astype(np.float64), k, p_q[rows])
        assert visible[..., 0].all()  # every row sees the sink
        weights = np.where(visible, np.exp(scores - scores[..., :1]), 0.0)  # [n, Hq, L], the sink's 1
        assert weights[..., 1:].max() < NEGLIGIBLE_WEIGHT  # every other weight: under 2**-10
        assert v[0].max() < 0 < v[1:].min()  # the answer moves from the sink's value to the others'
        tail = weights[..., 1:].sum(axis=-1)
        shares.append((tail / (1 + tail)).ravel())
        seen.append(visible.sum(axis=-1).ravel())
    return np.concatenate(shares), np.concatenate(seen)


@pytest.mark.parametrize("cases, fp8", [(scale.long_sequence_cases, False), (scale.long_sequence_cases, True),
                                        (scale.long_chunk_cases, True)])
def test_long_tail_cases_hold_much_of_each_rows_mass_in_weights_the_mutants_drop(cases, fp8):
    drawn_cases = drawn(cases(NumpyBackend().capabilities(), dtype="float16", limits=scale.scale_limits("quick"),
                              fp8=fp8, kinds=scale.LONG_TAIL_KINDS), 3)
    for case in drawn_cases:
        assert checks.problem_of(case).cache_dtype.startswith("float8") == fp8
        share, seen = tail_mass(case)
        assert share[seen >= 4096].min(initial=1.0) > 0.4  # about half at 4,096 keys
        assert share.min() > 0.25  # a third at 2,049 keys (a chunk's first rows)


def test_long_needle_cases_put_each_rows_mass_on_two_late_keys_past_float32s_exp_range():
    from pagedattn.spec.exact import gather_kv, scores_and_mask

    exp_range = np.log(np.finfo(np.float32).max)  # 88.7
    for case in drawn(scale.long_sequence_cases(NumpyBackend().capabilities(), dtype="float16",
                                                limits=scale.scale_limits("quick"), kinds=scale.LONG_NEEDLE_KINDS), 3):
        problem = checks.problem_of(case)
        assert case.labels["values"] == "needle"
        p_q = problem.token_positions()[1]
        for s in range(problem.num_seqs):
            rows = slice(int(problem.query_start_loc[s]), int(problem.query_start_loc[s + 1]))
            k, _ = gather_kv(problem, case.key_cache, case.value_cache, s)
            scores, visible, _ = scores_and_mask(problem, case.query[rows].astype(np.float64), k, p_q[rows])
            assert visible.all()  # decode or the last queries: every row sees every key
            order = np.argsort(scores, axis=-1)
            needles, rest = order[..., -2:], order[..., :-2]
            length = int(problem.seq_lens[s])
            assert (np.sort(needles, axis=-1) >= [length // 2, 3 * length // 4]).all()  # in the last two quarters
            top = np.take_along_axis(scores, needles, axis=-1).min(axis=-1)
            assert (top - np.take_along_axis(scores, rest, axis=-1).max(axis=-1) > exp_range).all()


@pytest.mark.parametrize("batch", scale.BATCH_KINDS)
def test_window_edge_cases_move_every_rows_output_past_the_bound_when_its_window_edge_moves_one_key(batch):
    from pagedattn.spec.error_model import tolerance
    from pagedattn.spec.exact import exact_attention_problem

    cases = scale.long_sequence_cases(NumpyBackend().capabilities(), dtype="float16", fp8=True, window=True,
                                      limits=scale.scale_limits("quick"), kinds=scale.LONG_WINDOW_EDGE_KINDS,
                                      decode=batch == "decode")
    for case in drawn(cases, 3):
        problem = checks.problem_of(case)
        assert case.labels["values"] == "window_edges" and problem.is_decode == (batch == "decode")
        exact = exact_attention_problem(problem, case.query, case.key_cache, case.value_cache)
        tol = tolerance(problem.dtype, problem.head_dim, cache_dtype=problem.cache_dtype)
        bound = tol.out_bound(exact.out, exact.value_scale, exact.score_scale, exact.num_visible)
        window = int(problem.sliding_window)
        for moved in (window - 1, window + 1):  # every row's edge one key in, one key out
            other = exact_attention_problem(replace(problem, sliding_window=moved), case.query, case.key_cache,
                                            case.value_cache)
            assert (np.abs(other.out - exact.out) > bound).any(axis=-1).all()  # each row and head beyond it


def test_long_tail_batches_fill_an_h200_without_split_kv_of_triton_and_cupy():
    for case in drawn(scale.long_tail_batch_cases(DECLARED, dtype="float16"), 2):
        problem = checks.problem_of(case)
        assert problem.num_seqs == scale.TAIL_BATCH_SEQS and problem.cache_dtype.startswith("float8")
        share, _ = tail_mass(case)
        assert share.min() > 0.3  # about 40% of every row's mass
        assert triton_grid(problem).splits() == 1
        assert len(h200_cupy_work(problem).merges) == 0  # cupy: no part merged
