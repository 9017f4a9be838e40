"""The strategies draw what the contract names, cases survive the .npz round trip, messages read in contract terms."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest
from cases import poisoned_case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedattn.backends.capabilities import Capabilities
from pagedattn.backends.numpy.backend import NumpyBackend
from pagedattn.conformance import checks
from pagedattn.conformance.assertions import ConformanceFailure, describe_call
from pagedattn.conformance.cases import (
    AttentionCase,
    WriteKVCase,
    device_arguments,
    device_caches,
    load_case,
    save_case,
)
from pagedattn.conformance.strategies import (
    ARRANGEMENTS,
    attention_cases,
    block_tables,
    fused_qkv_rows,
    head_configs,
    query_layouts,
    seq_lens,
    wider_table,
)
from pagedattn.spec.arrays import check_paged_attention
from pagedattn.spec.dtypes import numpy_dtype
from pagedattn.spec.exact import exact_attention
from pagedattn.spec.pools import random_paged_inputs

FAST = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
CAPS = Capabilities()


@FAST
@given(st.data())
def test_block_tables_hold_each_sequence_and_poison_the_rest(data):
    bs = data.draw(st.sampled_from((16, 32)))
    lens = np.array(data.draw(st.lists(seq_lens(bs), min_size=1, max_size=4)), np.int32)
    arrangement = data.draw(st.sampled_from(ARRANGEMENTS))
    pool = data.draw(block_tables(lens, bs, (arrangement,)))
    needed = -(-lens // bs)
    used = [pool.block_tables[s, : needed[s]] for s in range(len(lens))]
    for row in used:
        assert ((row >= 0) & (row < pool.num_blocks)).all()
    if arrangement == "huge_pool" and needed.sum():
        assert min(int(r.min()) for r in used if len(r)) >= 32768
    if arrangement != "shared_prefix":
        ids = np.concatenate(used) if used else np.array([])
        assert len(np.unique(ids)) == len(ids)


def test_strategies_reach_the_edges():
    lens = set()

    @settings(max_examples=200, deadline=None, database=None, derandomize=True)
    @given(seq_lens(16))
    def collect(n):
        lens.add(n)

    collect()
    assert {0, 1, 15, 16, 17, 32, 48}.issubset(lens)
    kinds = set()

    @settings(max_examples=100, deadline=None, database=None, derandomize=True)
    @given(head_configs(), query_layouts(16, decode=False))
    def collect_heads(heads, layout):
        kinds.add(heads.kind)
        kinds.update(layout.kinds)
        assert heads.num_q_heads % heads.num_kv_heads == 0

    collect_heads()
    assert {"MHA", "GQA", "MQA", "decode", "prefill", "chunked"}.issubset(kinds)


def test_index_arrays_come_in_int32_and_int64_and_slots_as_a_list_as_the_contract_allows():
    from pagedattn.conformance.strategies import INDEX_DTYPES, copy_blocks_cases, write_kv_cases

    seen: dict[str, set[str]] = {"attention": set(), "pairs": set(), "slots": set()}

    @settings(max_examples=30, deadline=None, database=None, derandomize=True)
    @given(attention_cases(CAPS, dtype="float32", block_size=16, kv_layout="NHD", feature="combined"),
           copy_blocks_cases(dtype="float16", block_size=16, kv_layout="NHD"),
           write_kv_cases(dtype="float16", cache_dtype="float16", block_size=16, kv_layout="NHD"))
    def collect(case, copy, write):
        dtypes = {case.block_tables.dtype, case.seq_lens.dtype}
        if case.query_start_loc is not None:
            dtypes.add(case.query_start_loc.dtype)
        assert len(dtypes) == 1  # one index dtype a call
        seen["attention"].add(str(dtypes.pop()))
        seen["pairs"].add(str(copy.pairs.dtype))
        seen["slots"].add("list" if write.slots_as_list else str(write.slot_mapping.dtype))
        assert isinstance(write.slot_mapping_for(NumpyBackend()), list) == write.slots_as_list

    collect()
    assert seen == {"attention": set(INDEX_DTYPES), "pairs": set(INDEX_DTYPES), "slots": {*INDEX_DTYPES, "list"}}


@FAST
@given(data=st.data())
def test_attention_cases_are_valid_calls_and_round_trip_through_npz(data, tmp_path_factory):
    dtype = data.draw(st.sampled_from(("float32", "bfloat16")))
    feature = data.draw(st.sampled_from(("combined", "fp8", "strided_caches", "decode")))
    layout = data.draw(st.sampled_from(("NHD", "HND")))
    case = data.draw(attention_cases(CAPS, dtype=dtype, block_size=16, kv_layout=layout, feature=feature))
    problem = check_paged_attention(*case.args(), **case.options)
    if feature == "strided_caches":
        assert case.pool is not None and (np.shares_memory(case.key_cache, case.pool) or case.pool.size == 0)
    if feature == "fp8":
        assert problem.cache_dtype.startswith("float8")
    if case.qkv is not None:
        assert np.shares_memory(case.query, case.qkv)
        assert case.qkv.shape[1] == case.query.shape[1] + 2 * problem.num_kv_heads
    path = save_case(tmp_path_factory.mktemp("case") / "c.npz", case, check="matches_spec", context={"x": 1})
    loaded, check, context = load_case(path)
    assert check == "matches_spec" and context == {"x": 1}
    for name in ("query", "key_cache", "value_cache", "block_tables", "seq_lens"):
        a, b = getattr(loaded, name), getattr(case, name)
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.size:  # strides matter only along axes longer than 1
            assert [st_ for st_, n in zip(a.strides, a.shape, strict=True) if n > 1] == [
                st_ for st_, n in zip(b.strides, b.shape, strict=True) if n > 1]
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()
    assert loaded.options.keys() == case.options.keys()


def _case(feature="decode"):
    @settings(max_examples=1, deadline=None, database=None, derandomize=True)
    @given(attention_cases(CAPS, dtype="float32", block_size=16, kv_layout="NHD", feature=feature))
    def grab(case):
        found.append(case)

    found: list = []
    grab()
    return found[0]


class OffByOne(NumpyBackend):
    name = "off-by-one"

    def _run(self, plan, query, key_cache, value_cache):
        out, lse = super()._run(plan, query, key_cache, value_cache)
        out = out.copy()
        out[-1, -1, -1] += 1.0
        return out, lse


def test_failure_message_names_the_worst_element_and_the_call_last():
    case = _case()
    with pytest.raises(ConformanceFailure) as info:
        checks.matches_spec(OffByOne(), case)
    message = str(info.value)
    assert "tolerance from pagedattn.spec.error_model" in message
    last_token = case.query.shape[0] - 1
    assert f"token {last_token}" in message and "head" in message and "dim" in message
    assert message.splitlines()[-1].startswith("[call: backend=off-by-one dtype=float32")
    assert info.value.fraction > 1


class TableOfArraysOnly(NumpyBackend):
    """Plans on a block table it takes to be an array: a list's rows are read as one row."""

    name = "table-of-arrays-only"

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        if isinstance(block_tables, list):
            return replace(problem, block_tables=np.tile(problem.block_tables[:1], (problem.num_seqs, 1)))
        return problem

    def _run(self, plan, query, key_cache, value_cache):
        return super()._run(replace(plan, problem=plan.state), query, key_cache, value_cache)


def test_the_same_call_twice_passes_the_block_table_as_a_list_the_second_time():
    inputs = random_paged_inputs([9, 21, 4], None, block_size=16, head_dim=16, seed=0)
    case = AttentionCase(query=inputs.query, key_cache=inputs.key_cache, value_cache=inputs.value_cache,
                         block_tables=inputs.block_tables, seq_lens=inputs.seq_lens, query_start_loc=None,
                         options={"kv_layout": "NHD"}, seed=0)
    assert checks.deterministic(NumpyBackend(), case) == 0.0
    with pytest.raises(ConformanceFailure, match="list of lists"):
        checks.deterministic(TableOfArraysOnly(), case)


def test_the_call_line_of_a_batch_of_many_sequences_stays_one_short_line():
    num_seqs, block_size = 70_000, 16
    caches = np.zeros((num_seqs, block_size, 1, 8), np.float32)
    problem = check_paged_attention(np.zeros((num_seqs, 1, 8), np.float32), caches, caches,
                                    np.arange(num_seqs).reshape(num_seqs, 1), np.arange(num_seqs) % block_size + 1)
    line = describe_call("many", problem)
    assert len(line) < 250, line
    assert f"seq_lens=int64[{num_seqs}] of 1 to {block_size}" in line


class NaNBackend(NumpyBackend):
    name = "nan"

    def _run(self, plan, query, key_cache, value_cache):
        out, lse = super()._run(plan, query, key_cache, value_cache)
        return np.full_like(out, np.nan), lse


def test_nan_placement_is_reported_first():
    with pytest.raises(ConformanceFailure, match="NaN/inf where the spec has finite values"):
        checks.matches_spec(NaNBackend(), _case())


def test_invariant_checks_pass_on_the_reference():
    case = _case("combined")
    backend = NumpyBackend()
    for check in (checks.garbage_ignored, checks.relocation_invariant, checks.deterministic,
                  checks.alone_equals_batch):
        assert check(backend, case) <= 1.0


@FAST
@given(data=st.data())
def test_a_row_of_minus_inf_scores_is_a_row_without_keys_in_the_spec(data):
    case = data.draw(attention_cases(CAPS, dtype="float16", block_size=16, kv_layout="HND", feature="scale"))
    poisoned, placed = checks.with_nonfinite(case, np.random.default_rng(case.seed), (checks.MINUS_INF_SCORES,))
    problem = checks.problem_of(case)
    with_keys = [s for s in range(problem.num_seqs)
                 if problem.seq_lens[s] > 0 and problem.query_start_loc[s + 1] > problem.query_start_loc[s]]
    assert len(placed) == len(with_keys)
    exact = exact_attention(*poisoned.args(), **poisoned.options)
    for line in placed:  # "minus_inf_scores: token T, head H, ..."
        token, head = (int(word.strip(",")) for word in line.split()[2:5:2])
        if problem.scale != 0 and problem.softcap is None:  # 0 * -inf is NaN; a softcap makes it -softcap
            assert np.isneginf(exact.lse[token, head]) and (exact.out[token, head] == 0).all()
    assert checks.minus_inf_rows_are_empty(NumpyBackend(), case) <= 1.0


@FAST
@given(data=st.data())
def test_operation_cases_round_trip_and_pass_on_the_reference(data, tmp_path_factory):
    from pagedattn.conformance.strategies import copy_blocks_cases, merge_cases, write_kv_cases

    kind = data.draw(st.sampled_from(("write_kv", "copy_blocks", "merge_states")))
    if kind == "write_kv":
        cache = data.draw(st.sampled_from(("bfloat16", "float8_e4m3fn")))
        case = data.draw(write_kv_cases(dtype="bfloat16", cache_dtype=cache, block_size=16, kv_layout="HND"))
        check = checks.write_kv_matches_spec
    elif kind == "copy_blocks":
        case = data.draw(copy_blocks_cases(dtype="float16", block_size=16, kv_layout="NHD"))
        check = checks.copy_blocks_matches_spec
    else:
        case = data.draw(merge_cases(dtype="bfloat16"))
        check = checks.merge_states_matches_spec
    path = save_case(tmp_path_factory.mktemp("op") / "c.npz", case, check=check.__name__)
    loaded, name, _ = load_case(path)
    assert type(loaded) is type(case) and name == check.__name__
    for field in case.__dataclass_fields__:
        a, b = getattr(loaded, field), getattr(case, field)
        if isinstance(b, np.ndarray):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        else:
            assert a == b
    if isinstance(case, WriteKVCase) and case.qkv is not None:  # key and value stay views of the rows
        assert loaded.key.strides == case.key.strides and np.shares_memory(loaded.value, loaded.qkv)
    assert checks.CHECKS[name](NumpyBackend(), loaded) <= 1.0


@FAST
@given(st.data())
def test_the_plan_check_runs_other_blocks_and_the_next_layers_negated_contents(data):
    case = data.draw(attention_cases(CAPS, dtype="bfloat16", block_size=16, kv_layout="NHD"))
    rng = checks.plan_check_rng(case)
    other, layer = checks.relocated(case, rng), checks.next_layer(case, rng)
    problem = checks.problem_of(case)
    if problem.num_blocks > 1 and checks.used_slots(problem).any():  # a block in use moves: the tables differ
        assert not np.array_equal(other.block_tables, case.block_tables)
    for mine, theirs in ((layer.key_cache, case.key_cache), (layer.value_cache, case.value_cache)):
        bits, sign = (np.uint8, 0x80) if mine.dtype.itemsize == 1 else (np.uint16, 0x8000)  # 16-bit or fp8
        assert (mine.view(bits) == theirs.view(bits) ^ sign).all()  # the sign bit, exactly
    assert layer.query.shape == case.query.shape and not np.array_equal(layer.query, case.query)
    assert checks.plan_serves_many_runs(NumpyBackend(), case) >= 0.0


class _WritesIntoTheOtherLayer(NumpyBackend):
    """NumPy attention that then writes into the pool around the key cache view it was given."""

    def _run(self, plan, query, key_cache, value_cache):
        result = super()._run(plan, query, key_cache, value_cache)
        key_cache.base[0, 0, 0] = 0  # block 0 of the other layer's key cache
        return result


def test_a_host_backend_that_writes_into_a_pool_it_was_given_is_caught():
    """A small pool reaches a host backend as a copy, so the case keeps its bits to compare with."""
    case = poisoned_case("pool", [9, 21], pool=True, dtype="float32")
    assert checks.matches_spec(NumpyBackend(), case) <= 1.0
    with pytest.raises(ConformanceFailure, match="wrote into the K/V pool"):
        checks.matches_spec(_WritesIntoTheOtherLayer(), case)


def test_a_fused_qkv_query_reaches_the_backend_strided_and_follows_replace():
    plain = _case()
    rng = np.random.default_rng(0)
    rows = fused_qkv_rows(rng, "nan", plain.query.shape[1], plain.key_cache.shape[2], query=plain.query)
    case = plain.replace(qkv=rows)
    assert np.shares_memory(case.query, rows) and np.array_equal(case.query, plain.query)
    (query, *_), _ = device_arguments(NumpyBackend(), case, device_caches(NumpyBackend(), case))
    assert query.strides == case.query.strides != plain.query.strides
    assert checks.matches_spec(NumpyBackend(), case) <= 1.0
    negated = case.replace(query=-case.query)  # same shape: written into a copy of the rows
    assert negated.qkv is not rows and np.shares_memory(negated.query, negated.qkv)
    assert np.array_equal(negated.qkv[:, case.query.shape[1]:], rows[:, case.query.shape[1]:], equal_nan=True)
    assert np.array_equal(case.query, plain.query)  # the original rows untouched
    longer = np.concatenate([case.query, case.query])
    assert case.replace(query=longer).qkv is None  # another shape: a query of its own


def test_a_block_table_view_of_a_wider_table_reaches_the_backend_strided_and_round_trips(tmp_path):
    plain = _case()
    wide = wider_table(np.random.default_rng(0), plain.block_tables, plain.key_cache.shape[0], 3)
    case = plain.replace(wide_tables=wide)
    assert np.shares_memory(case.block_tables, wide) and np.array_equal(case.block_tables, plain.block_tables)
    arrays, _ = device_arguments(NumpyBackend(), case, device_caches(NumpyBackend(), case))
    assert arrays[3].strides == wide.strides and arrays[3].shape == plain.block_tables.shape
    assert checks.matches_spec(NumpyBackend(), case) <= 1.0
    loaded, _, _ = load_case(save_case(tmp_path / "c.npz", case, check="matches_spec"))
    assert loaded.block_tables.strides == case.block_tables.strides
    assert np.array_equal(loaded.wide_tables, wide)
    moved = case.replace(block_tables=plain.block_tables[::-1].copy())  # same shape: into a copy of the wide table
    assert moved.wide_tables is not wide and np.array_equal(moved.wide_tables[:, plain.block_tables.shape[1]:],
                                                           wide[:, plain.block_tables.shape[1]:])


def test_the_replay_check_calls_a_plan_that_is_not_capturable_unsupported():
    from pagedattn.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="not capturable"):
        checks.replay_matches_eager(NumpyBackend(), _case())


class _CapturableNumpy(NumpyBackend):
    """NumPy attention whose plans say they are capturable, for the replay check on a CPU with a
    stand-in for the CUDA graph."""

    def _plan(self, *args, **kwargs):
        return SimpleNamespace(capturable=True)


def _graph_of_runs(run, calls):
    """A stand-in for capture_runs: each replay runs the captured runs again, as a faithful graph."""
    for i in range(calls):
        run(i)
    return lambda: [run(i) for i in range(calls)]


def _graph_stale_after_one_replay(run, calls):
    """A stand-in for a graph whose kernels go stale from the second replay on (state a launch
    leaves on the device, a counter or a flag, that only the capture reset): later replays leave
    the output as the first replay wrote it."""
    replays = []

    def replay():
        if not replays:
            for i in range(calls):
                run(i)
        replays.append(True)

    for i in range(calls):
        run(i)
    return replay


def test_the_replay_check_replays_the_graph_on_new_contents_and_catches_a_stale_replay(monkeypatch):
    """Every replay, not only the first, gives the bits of an eager run on what was written before
    it: a graph right on its first replay and stale from its second fails."""
    case = poisoned_case("replays", [9, 21, 40], dtype="float32")
    monkeypatch.setattr(checks, "capture_runs", _graph_of_runs)
    assert checks.replay_matches_eager(_CapturableNumpy(), case) <= 1.0
    assert checks.GRAPH_REPLAYS >= 2
    monkeypatch.setattr(checks, "capture_runs", _graph_stale_after_one_replay)
    with pytest.raises(ConformanceFailure, match="replay 2 of a CUDA graph"):
        checks.replay_matches_eager(_CapturableNumpy(), case)


def test_the_stream_check_calls_a_backend_without_torch_cuda_tensors_unsupported():
    from pagedattn.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="torch CUDA tensors") as raised:
        checks.run_follows_callers_stream(NumpyBackend(), _case())
    assert raised.value.capability == "cuda_streams"


def test_newest_slots_are_the_query_positions_slots_once_each_and_none_for_padding():
    from pagedattn.spec.arrays import check_paged_attention as check

    tables = np.array([[3, 1], [0, -1], [2, -1]], dtype=np.int32)  # block size 16
    q = np.zeros((3, 1, 16), np.float32)
    k = np.zeros((4, 16, 1, 16), np.float32)
    decode = check(q, k, k, tables, np.array([20, 0, 5], np.int32))  # the middle entry is padding
    assert checks.newest_slots(decode).tolist() == sorted([1 * 16 + 3, 2 * 16 + 4])
    varlen = check(q, k, k, tables, np.array([20, 1, 5], np.int32), np.array([0, 2, 3, 3], np.int32))
    assert checks.newest_slots(varlen).tolist() == sorted([1 * 16 + 2, 1 * 16 + 3, 0])


def _fp8_written(quotients: list[float], stored: list[float], dtype: str) -> np.ndarray:
    """checks._fp8_as_rounded_from on fp8 values ``stored`` for float64 ``quotients``."""
    fp8 = numpy_dtype(dtype)
    return checks._fp8_as_rounded_from(np.array(stored, np.float64).astype(fp8), np.array(quotients, np.float64))


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_write_check_takes_nearest_even_double_rounding_and_saturation(dtype: str) -> None:
    largest = float(ml_dtypes.finfo(numpy_dtype(dtype)).max)
    tie = 1.0625 if dtype == "float8_e4m3fn" else 1.125  # halfway between 1.0 and the next value up
    just_past_a_tie = tie * (1 + 2.0**-22)  # float32 rounds it onto the tie, which rounds to even: 1.0
    quotients = [1.3, -2.6, just_past_a_tie, 1e9, -1e9, np.inf, np.nan]
    stored = list(np.array(quotients).astype(numpy_dtype(dtype)).astype(np.float64))
    stored[2] = 1.0  # the tie rounded to even from a float32 quotient
    stored[3], stored[4], stored[5] = largest, -largest, largest  # saturated
    got = _fp8_written(quotients, stored, dtype)
    assert got.view(np.uint8).tolist() == np.array(stored).astype(numpy_dtype(dtype)).view(np.uint8).tolist()


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_write_check_refuses_rounding_toward_zero_a_finite_nan_and_the_wrong_sign(dtype: str) -> None:
    fp8 = numpy_dtype(dtype)
    largest = float(ml_dtypes.finfo(fp8).max)
    quotients = [1.45, np.nan, 1e9]
    toward_zero = 1.375 if dtype == "float8_e4m3fn" else 1.25  # nearest even: 1.5 in both
    got = _fp8_written(quotients, [toward_zero, largest, -largest], dtype)
    spec = np.array(quotients).astype(fp8)
    assert got.view(np.uint8).tolist() == spec.view(np.uint8).tolist()  # each replaced by the spec's
