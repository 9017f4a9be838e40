"""The contract's rules as checks: each takes a backend and a case, raises ConformanceFailure or returns
the worst error as a fraction of the tolerance (0.0 for rules that demand identical bits).

Meaning: :func:`matches_spec` (:func:`matches_spec_by_distinct_blocks` where tables repeat a few
blocks over millions of keys). Never: :func:`garbage_ignored`, :func:`nonfinite_propagates`,
:func:`relocation_invariant`, :func:`deterministic`, :func:`alone_equals_batch` (and every
attention check asserts that no input was written). Plans: :func:`plan_serves_many_runs`,
:func:`replay_matches_eager`, :func:`run_follows_callers_stream`, :func:`step_writes_then_attends`,
:func:`runs_hold_no_memory`, :func:`many_plans_stay_independent`. Other operations:
:func:`write_kv_matches_spec`, :func:`copy_blocks_matches_spec`, :func:`merge_states_matches_spec`,
and each on the caller's side stream (:func:`write_kv_follows_callers_stream` and its siblings).
A check uses the backend through the public :class:`~pagedattn.backends.interface.Backend` interface only.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc
import weakref
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

import ml_dtypes
import numpy as np

from pagedattn.backends.engine_calls import CaptureFailed, capture_runs, engine_array, takes_torch_cuda
from pagedattn.backends.interface import Backend, Plan
from pagedattn.conformance.assertions import (
    ConformanceFailure,
    assert_array_form,
    assert_attention_matches,
    assert_bit_identical,
    assert_close_to_spec,
    describe_call,
)
from pagedattn.conformance.cases import (
    AttentionCase,
    AttentionResult,
    CopyBlocksCase,
    MergeCase,
    WriteKVCase,
    device_arguments,
    device_caches,
    device_kv,
    device_merge_arguments,
    host_result,
    run_case,
)
from pagedattn.conformance.repeated_blocks import exact_by_distinct_blocks
from pagedattn.conformance.scale import (
    FAR_MERGE_SEED,
    far_partial_parts,
    far_partial_sequences,
    far_row_sequences,
    far_score_rows,
    long_chunk_rows,
)
from pagedattn.conformance.uploads import upload
from pagedattn.errors import UnsupportedError
from pagedattn.spec import kv_ops
from pagedattn.spec.arrays import AttentionProblem, check_paged_attention
from pagedattn.spec.case import listed, pool_views
from pagedattn.spec.dtypes import FP8_DTYPES, dtype_name
from pagedattn.spec.error_model import merge_tolerance, tolerance
from pagedattn.spec.exact import ExactResult, exact_attention_problem
from pagedattn.spec.online_softmax import merge_states as spec_merge_states
from pagedattn.spec.pools import INT32_OFFSET_LIMIT, UINT32_OFFSET_LIMIT, lazy_copy


def problem_of(case: AttentionCase) -> AttentionProblem:
    """The validated problem of a case (the spec's own check)."""
    return check_paged_attention(*case.args(), **case.options)


def _call(backend: Backend, case: AttentionCase) -> str:
    return describe_call(backend.name, problem_of(case), case.options)


def run_checked(backend: Backend, case: AttentionCase) -> AttentionResult:
    """Run ``case`` and assert the backend wrote nothing but its outputs (caches, pool, inputs intact)."""
    __tracebackhide__ = True
    caches = device_caches(backend, case)
    result = run_case(backend, case, caches=caches)
    call = _call(backend, case)
    key_cache, value_cache, pool = caches
    if pool is not None and case.pool is not None:
        after = np.asarray(backend.to_numpy(pool))
        # a host backend takes the case's pool itself (a lazy one is not copied): it is its own
        # "before", and comparing it with itself, 8 GiB of a far pool, would prove nothing
        if not np.may_share_memory(after, case.pool):
            assert_bit_identical("pool", after, case.pool, "the call wrote into the K/V pool", call,
                                 coordinates="pool index")
    else:
        assert_bit_identical("key_cache", np.asarray(backend.to_numpy(key_cache)), case.key_cache,
                             "the call wrote into key_cache", call, coordinates="cache index")
        assert_bit_identical("value_cache", np.asarray(backend.to_numpy(value_cache)), case.value_cache,
                             "the call wrote into value_cache", call, coordinates="cache index")
    return result


def matches_spec(backend: Backend, case: AttentionCase) -> float:
    """out (and lse) within the error model of the exact float64 answer; nothing else written."""
    __tracebackhide__ = True
    return _result_matches_spec(backend, case, run_checked(backend, case))


def matches_spec_by_distinct_blocks(backend: Backend, case: AttentionCase) -> float:
    """:func:`matches_spec` for a case whose block table names a few blocks many times (millions of
    keys): the exact answer computed once per distinct block a row sees
    (:func:`~pagedattn.conformance.repeated_blocks.exact_by_distinct_blocks`)."""
    __tracebackhide__ = True
    return _result_matches_spec(backend, case, run_checked(backend, case), exact_of=exact_by_distinct_blocks)


def _result_matches_spec(backend: Backend, case: AttentionCase, result: AttentionResult, context: str = "",
                         exact_of: Callable[..., ExactResult] = exact_attention_problem) -> float:
    """``result`` of ``case`` within the error model of the exact float64 answer, as ``exact_of``
    computes it from the problem and the host arrays (``context`` ends the description of the call)."""
    __tracebackhide__ = True
    problem = problem_of(case)
    exact = exact_of(problem, case.query, case.key_cache, case.value_cache)
    tol = tolerance(problem.dtype, problem.head_dim, cache_dtype=problem.cache_dtype,
                    tf32=backend.capabilities().tf32)
    call = _call(backend, case) + context
    if problem.return_lse and result.lse is None:
        assert_array_form("lse", np.zeros(0), (problem.num_tokens, problem.num_q_heads), "float32", call)
    return assert_attention_matches(result.out, result.lse, exact, tol, problem, call)


# -- never ------------------------------------------------------------------------------

def used_slots(problem: AttentionProblem) -> np.ndarray:
    """bool ``[num_blocks, block_size]``: slots some sequence holds (positions < L)."""
    used = np.zeros((problem.num_blocks, problem.block_size), dtype=bool)
    for s in range(problem.num_seqs):
        positions = np.arange(int(problem.seq_lens[s]))
        used[problem.block_tables[s, positions // problem.block_size], positions % problem.block_size] = True
    return used


def _nhd(cache: np.ndarray, kv_layout: str) -> np.ndarray:
    return kv_ops.slot_view(cache, kv_layout)


def with_garbage(case: AttentionCase, rng: np.random.Generator) -> AttentionCase:
    """The same logical call with new garbage (NaN, inf, random) in every unused slot, unused block,
    unused block-table entry and, for pool views, in the other layers and past head_dim in padded rows."""
    problem = problem_of(case)
    unused = ~used_slots(problem)
    dtype = case.key_cache.dtype

    def garbage(shape: tuple[int, ...]) -> np.ndarray:
        values = rng.standard_normal(shape) * 1e3
        pick = rng.random(shape)
        values[pick < 0.3] = np.nan
        values[(pick >= 0.3) & (pick < 0.45)] = np.inf
        values[(pick >= 0.45) & (pick < 0.6)] = -np.inf
        with np.errstate(over="ignore", invalid="ignore"):
            return values.astype(dtype)

    tables = case.block_tables.copy()
    for s in range(problem.num_seqs):
        first_unused = -(-int(problem.seq_lens[s]) // problem.block_size)
        tail = tables[s, first_unused:]
        tail[:] = rng.choice(np.array([-1, 2**31 - 1, 0, problem.num_blocks - 1, -(2**31)], dtype=np.int64),
                             size=tail.shape)
    if case.pool is not None:
        pool = case.pool.copy()
        others = [layer for layer in range(pool.shape[2]) if layer != case.layer]
        for layer in others:
            pool[:, :, layer] = garbage(pool[:, :, layer].shape)
        pool[..., case.head_dim:] = garbage(pool[..., case.head_dim:].shape)  # padded rows' tails, if any
        for cache in pool_views(pool, case.layer, case.head_dim):
            view = _nhd(cache, case.kv_layout)
            view[unused] = garbage(view[unused].shape)
        return case.replace(pool=pool, block_tables=tables)
    caches = []
    for cache in (case.key_cache, case.value_cache):
        new = cache.copy()
        view = _nhd(new, case.kv_layout)
        view[unused] = garbage(view[unused].shape)
        caches.append(new)
    return case.replace(key_cache=caches[0], value_cache=caches[1], block_tables=tables)


def _kept_result(backend: Backend, result: Any, return_lse: bool) -> AttentionResult:
    """What ``run`` returned, copied to the host and kept apart (a host backend's out may be its own
    array, which a later run writes)."""
    seen = host_result(backend, result, return_lse)
    return AttentionResult(seen.out.copy(), None if seen.lse is None else seen.lse.copy())


def _assert_same_result(backend: Backend, a: AttentionResult, b: AttentionResult, what: str,
                        case: AttentionCase) -> None:
    __tracebackhide__ = True
    problem = problem_of(case)
    call = _call(backend, case)
    assert_bit_identical("out", a.out, b.out, what, call, problem)
    if a.lse is not None and b.lse is not None:
        assert_bit_identical("lse", a.lse, b.lse, what, call, problem)


def _unchanged_by(backend: Backend, case: AttentionCase,
                  variant: Callable[[AttentionCase, np.random.Generator], AttentionCase], what: str) -> float:
    """The variant of ``case`` (seeded by ``case.seed``) gives the same bits as ``case`` itself."""
    __tracebackhide__ = True
    first = run_checked(backend, case)
    other = variant(case, np.random.default_rng(case.seed))
    _assert_same_result(backend, run_checked(backend, other), first, what, case)
    return 0.0


def garbage_ignored(backend: Backend, case: AttentionCase) -> float:
    """New garbage in unused slots, blocks and table entries leaves the output's bits unchanged."""
    __tracebackhide__ = True
    return _unchanged_by(backend, case, with_garbage, "garbage in unused slots/blocks/table entries changed the output")


#: Non-finite data put where a row can see it: its query, or the key or value of a visible slot.
#: ±inf keys fill the whole key vector, so q . k is inf - inf = NaN for a query of mixed signs.
#: "minus_inf_scores" makes every score of one row -inf (:data:`MINUS_INF_SCORES`).
NONFINITE_KINDS: tuple[str, ...] = (
    "nan_query", "nan_key", "inf_key", "minus_inf_key", "nan_value", "inf_value", "minus_inf_value",
    "minus_inf_scores",
)
#: The kinds that reach a row's scores with NaN or inf: a query or a key (a row of -inf scores only,
#: which is a row without keys, has a check of its own: :func:`minus_inf_rows_are_empty`).
NONFINITE_SCORE_KINDS: tuple[str, ...] = ("nan_query", "nan_key", "inf_key", "minus_inf_key")
#: A row whose every visible score is -inf: its query holds -inf (against the scale's sign) in one
#: dim, and every key of its sequence holds 1 there, so q . k is -inf for each key it sees. The
#: contract makes it a row without keys (out 0, lse -inf); an online softmax that skips the
#: ``m = -inf`` guard gets exp(-inf + inf) = NaN, and so does a split-KV merge of its parts, which
#: are all empty.
MINUS_INF_SCORES = "minus_inf_scores"


def with_nonfinite(case: AttentionCase, rng: np.random.Generator,
                   kinds: tuple[str, ...] = NONFINITE_KINDS) -> tuple[AttentionCase, list[str]]:
    """The case with non-finite data in what rows see: per sequence with queries and keys, one of
    ``kinds`` (:data:`NONFINITE_KINDS`) in its last query, or in a key/value slot that every query of the
    sequence sees, in a block no other sequence shares (a slot hidden from some row by the
    causal mask or the window is not used: see the contract's section on non-finite data), or
    (:data:`MINUS_INF_SCORES`) across one row's query and the sequence's keys.

    Returns the poisoned case and one line per poisoned sequence (kind, where).
    """
    problem = problem_of(case)
    _, p_q = problem.token_positions()
    query = case.query.copy()
    pool = case.pool.copy() if case.pool is not None else None
    if pool is not None:
        caches = list(pool_views(pool, case.layer, case.head_dim))
    else:
        caches = [case.key_cache.copy(), case.value_cache.copy()]
    views = [kv_ops.slot_view(c, case.kv_layout) for c in caches]
    start_kind = int(rng.integers(len(kinds)))
    sharers = np.zeros(problem.num_blocks, dtype=np.int64)  # sequences holding each block
    for s in range(problem.num_seqs):
        needed = -(-int(problem.seq_lens[s]) // problem.block_size)
        sharers[np.unique(problem.block_tables[s, :needed])] += 1
    placed = []
    for s in range(problem.num_seqs):
        start, stop = int(problem.query_start_loc[s]), int(problem.query_start_loc[s + 1])
        length = int(problem.seq_lens[s])
        if stop == start or length == 0:
            continue
        t = stop - 1
        # a slot every query of the sequence sees: p <= the first query's p_q, inside the last one's window
        last = int(p_q[start]) if problem.causal else length - 1
        first = max(0, int(p_q[t]) - problem.sliding_window + 1) if problem.sliding_window is not None else 0
        kind = kinds[(start_kind + s) % len(kinds)]
        if kind == MINUS_INF_SCORES:
            head, dim = int(rng.integers(problem.num_q_heads)), int(rng.integers(problem.head_dim))
            positions = np.arange(length)
            blocks = problem.block_tables[s, positions // problem.block_size]
            views[0][blocks, positions % problem.block_size, head // problem.group_size, dim] = 1
            query[t, head, dim] = -np.copysign(np.inf, problem.scale)
            placed.append(f"{kind}: token {t}, head {head}, dim {dim} (every key of sequence {s}: 1 there)")
            continue
        position = int(rng.integers(first, last + 1)) if first <= last else 0
        block = int(problem.block_tables[s, position // problem.block_size])
        if first > last or sharers[block] > 1:  # no such slot, or its block is shared with another sequence
            kind = "nan_query"
        value = {"nan": np.nan, "inf": np.inf, "minus": -np.inf}[kind.split("_")[0]]
        head = int(rng.integers(problem.num_q_heads))
        dim = int(rng.integers(problem.head_dim))
        if kind == "nan_query":
            query[t, head, dim] = value
            placed.append(f"{kind}: token {t}, head {head}, dim {dim}")
            continue
        slot, kv_head = position % problem.block_size, head // problem.group_size
        view = views[0 if kind.endswith("key") else 1]
        with np.errstate(invalid="ignore", over="ignore"):
            if kind in ("inf_key", "minus_inf_key"):
                view[block, slot, kv_head] = value
            else:
                view[block, slot, kv_head, dim] = value
        placed.append(f"{kind}: sequence {s}, position {position}, kv head {kv_head}, dim {dim}")
    if pool is not None:
        return case.replace(query=query, pool=pool), placed
    return case.replace(query=query, key_cache=caches[0], value_cache=caches[1]), placed


def nonfinite_propagates(backend: Backend, case: AttentionCase) -> float:
    """NaN/inf in a row's query or in a key/value it sees reaches its out and lse as IEEE arithmetic
    says (NaN where the spec is NaN): a backend must not turn it into zeros or "no visible key"."""
    __tracebackhide__ = True
    return _nonfinite_reaches_rows(backend, case, NONFINITE_KINDS)


def nonfinite_scores_propagate(backend: Backend, case: AttentionCase) -> float:
    """NaN/inf in a row's query or in a key it sees (what reaches its scores, and so a split part's
    max and lse and the merge of the parts) reaches its out and lse as IEEE arithmetic says."""
    __tracebackhide__ = True
    return _nonfinite_reaches_rows(backend, case, NONFINITE_SCORE_KINDS)


def minus_inf_rows_are_empty(backend: Backend, case: AttentionCase) -> float:
    """A row whose every visible score is -inf (:data:`MINUS_INF_SCORES`, one row of each sequence)
    gets out 0 and lse -inf, as a row without keys: never NaN, in one part or across a split's."""
    __tracebackhide__ = True
    return _nonfinite_reaches_rows(backend, case, (MINUS_INF_SCORES,))


def _nonfinite_reaches_rows(backend: Backend, case: AttentionCase, kinds: tuple[str, ...]) -> float:
    __tracebackhide__ = True
    poisoned, placed = with_nonfinite(case, np.random.default_rng(case.seed), kinds)
    try:
        return matches_spec(backend, poisoned)
    except ConformanceFailure as error:
        error.add_note("non-finite data placed where rows see it:\n  " + "\n  ".join(placed))
        raise


def relocated(case: AttentionCase, rng: np.random.Generator) -> AttentionCase:
    """The same logical K/V in other physical blocks: block b moves to perm[b] (tables follow); with
    two blocks or more, some block in use moves."""
    problem = problem_of(case)
    perm = rng.permutation(problem.num_blocks)
    in_use = np.flatnonzero(used_slots(problem).any(axis=1))
    if problem.num_blocks > 1 and (perm[in_use] == in_use).all():
        perm = np.roll(perm, 1)  # the blocks in use all stayed: after the roll each of them moves
    tables = case.block_tables.copy()
    for s in range(problem.num_seqs):
        needed = -(-int(problem.seq_lens[s]) // problem.block_size)
        tables[s, :needed] = perm[problem.block_tables[s, :needed]]
    inverse = np.argsort(perm)  # new block n holds old block inverse[n]
    if case.pool is not None:
        return case.replace(pool=np.ascontiguousarray(case.pool[inverse]), block_tables=tables)
    return case.replace(key_cache=np.ascontiguousarray(case.key_cache[inverse]),
                        value_cache=np.ascontiguousarray(case.value_cache[inverse]), block_tables=tables)


def relocation_invariant(backend: Backend, case: AttentionCase) -> float:
    """The same logical K/V placed in other physical blocks gives bit-identical output."""
    __tracebackhide__ = True
    return _unchanged_by(backend, case, relocated, "moving the blocks to other physical ids changed the output")


def deterministic(backend: Backend, case: AttentionCase) -> float:
    """The same call twice gives the same bits, the second time with the block table as a list of
    lists of ints (the contract's other form of it)."""
    __tracebackhide__ = True
    first = run_checked(backend, case)
    (query, key_cache, value_cache, _, seq_lens, query_start_loc), options = device_arguments(
        backend, case, device_caches(backend, case))
    result = backend.paged_attention(query, key_cache, value_cache, case.block_tables.tolist(), seq_lens,
                                     query_start_loc, **options)
    backend.synchronize()
    second = host_result(backend, result, bool(options.get("return_lse")))
    _assert_same_result(backend, second, first, "the same call twice (the second with block_tables as a list of "
                        "lists of ints) gave different bits", case)
    return 0.0


def next_layer(case: AttentionCase, rng: np.random.Generator) -> AttentionCase:
    """The same batch (index arrays, options) as the model's next layer has it: a new query, and
    every K and V element negated (its sign bit: exact in every dtype; NaN stays NaN)."""
    query = rng.standard_normal(case.query.shape).astype(case.query.dtype)
    if case.pool is not None:
        return case.replace(query=query, pool=-case.pool)
    return case.replace(query=query, key_cache=-case.key_cache, value_cache=-case.value_cache)


def plan_check_rng(case: AttentionCase) -> np.random.Generator:
    """The random stream of :func:`plan_serves_many_runs`: seeded by the case, but not the stream the
    strategies drew the case's own values from (the next layer's query would be this one's)."""
    return np.random.default_rng((case.seed, 1))


def plan_serves_many_runs(backend: Backend, case: AttentionCase) -> float:
    """As an engine uses a plan: planned beside a second plan (the batch relocated), run on this
    layer's arrays, the second plan run, then the first run on the next layer's query and caches
    (other arrays, same shapes), then on this layer's arrays again. Each run within the error model
    of its own inputs; a later run leaves an earlier run's out and lse as they were; the last run
    gives the first run's bits."""
    __tracebackhide__ = True
    rng = plan_check_rng(case)
    other, layer = relocated(case, rng), next_layer(case, rng)
    return_lse = bool(case.options.get("return_lse"))
    arrays, options = device_arguments(backend, case, device_caches(backend, case))
    other_arrays, other_options = device_arguments(backend, other, device_caches(backend, other))
    layer_arrays = (backend.to_device(layer.query), *device_caches(backend, layer)[:2])  # its index arrays: the plan's
    plan = backend.plan(*arrays, **options)
    other_plan = backend.plan(*other_arrays, **other_options)
    first = backend.run(plan, *arrays[:3])
    backend.synchronize()
    first_seen = _kept_result(backend, first, return_lse)
    between = backend.run(other_plan, *other_arrays[:3])
    last = backend.run(plan, *layer_arrays[:3])
    backend.synchronize()
    _assert_same_result(backend, host_result(backend, first, return_lse), first_seen,
                        "a later run (of this plan or another) changed an earlier run's output", case)
    again = backend.run(plan, *arrays[:3])
    backend.synchronize()
    _assert_same_result(backend, host_result(backend, again, return_lse), first_seen,
                        "the plan run again on the same arrays gave other bits than its first run", case)
    return max(
        _result_matches_spec(backend, case, first_seen, " (the plan's first run, a second plan made)"),
        _result_matches_spec(backend, other, host_result(backend, between, return_lse),
                             " (the second plan's run, between the first plan's runs)"),
        _result_matches_spec(backend, layer, host_result(backend, last, return_lse),
                             " (the first plan's second run: the next layer's query and caches)"),
    )


#: Runs of a plan :func:`runs_hold_no_memory` measures, after two that warm caches up.
MEMORY_RUNS = 4


def host_array_bytes() -> int:
    """Bytes of NumPy array data alive now that tracemalloc traced (NumPy reports its buffers in a
    tracemalloc domain of its own; Python's own objects are left out)."""
    traces = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)])
    return sum(trace.size for trace in traces.traces)


def device_memory_in_use() -> int:
    """Bytes torch's and CuPy's allocators hand out on the GPU now (their cached free memory not
    counted), after the device has finished its work; 0 where neither has used a GPU."""
    total = 0
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.synchronize()
        total += torch.cuda.memory_allocated()
    cupy = sys.modules.get("cupy")
    if cupy is not None and cupy.cuda.is_available():
        total += cupy.get_default_memory_pool().used_bytes()
    return total


def runs_hold_no_memory(backend: Backend, case: AttentionCase) -> float:
    """As an engine runs a plan step after step, each time on a query and caches it allocated anew
    and drops after the step. Once dropped, a step's arrays are freed (the backend keeps no
    reference to them); over :data:`MEMORY_RUNS` runs, after two that warm caches up, the device
    memory in use (:func:`device_memory_in_use`) and the NumPy arrays alive on the host
    (:func:`host_array_bytes`) each grow by less than one run's out and lse. A backend that keeps
    every run's arrays, or allocates on every run and never frees, runs an engine out of memory.
    The second run within the error model of its inputs."""
    __tracebackhide__ = True
    rng = plan_check_rng(case)
    return_lse = bool(case.options.get("return_lse"))
    to_engine = partial(engine_array, backend)
    plan, arrays, caches = _plan_as_engine(backend, case)
    del arrays, caches  # an engine keeps its index arrays; the plan holds what it needs of them
    T, Hq, D = case.query.shape
    out_bytes = T * Hq * (D * case.query.dtype.itemsize + (4 if return_lse else 0))

    def step() -> tuple[AttentionCase, AttentionResult, list[weakref.ref[Any]]]:
        layer = next_layer(case, rng)
        layer_arrays, _ = device_arguments(backend, layer, device_caches(backend, layer, to_engine), to_engine)
        handed = [weakref.ref(x) for x in layer_arrays[:3]]
        result = host_result(backend, backend.run(plan, *layer_arrays[:3]), return_lse)
        return layer, result, handed

    step()
    layer, result, _ = step()
    gc.collect()
    device_before = device_memory_in_use()
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        host_before = host_array_bytes()
        handed = [ref for _ in range(MEMORY_RUNS) for ref in step()[2]]
        gc.collect()
        host_grown = host_array_bytes() - host_before
    finally:
        if not tracing:
            tracemalloc.stop()
    kept = sorted({name for name, ref in zip(("query", "key_cache", "value_cache") * MEMORY_RUNS, handed, strict=True)
                   if ref() is not None})
    if kept:
        raise ConformanceFailure(
            f"the backend keeps a reference to {', '.join(kept)} of a run after the caller dropped them and the "
            f"run's outputs: an engine's every step would stay in memory {_call(backend, case)}")
    for where, grown in (("device", device_memory_in_use() - device_before), ("host array", host_grown)):
        if grown >= out_bytes:
            raise ConformanceFailure(
                f"{where} memory in use grew by {grown:,} bytes over {MEMORY_RUNS} runs of one plan, each on arrays "
                f"of its own dropped after it ({out_bytes:,} bytes of out and lse a run): the backend keeps "
                f"something of every run {_call(backend, case)}")
    return _result_matches_spec(backend, layer, result, " (the second of several runs of one plan)")


#: Plans alive at once in :func:`many_plans_stay_independent`: as many as an engine keeps for its
#: CUDA graphs, one per capture size of vLLM's default list (1, 2, 4, then 8 to 512 in steps of 8).
MANY_PLANS = 67


def many_plans_stay_independent(backend: Backend, case: AttentionCase) -> float:
    """As an engine keeps a plan per CUDA-graph batch size: the case planned and run, then
    :data:`MANY_PLANS` - 1 more plans made and kept (the batch relocated, each time to other
    blocks), the last of them run on its own arrays, and the first plan run again on its arrays.
    The first plan gives its first run's bits (no later plan took its place); each run within the
    error model of its inputs."""
    __tracebackhide__ = True
    rng = plan_check_rng(case)
    return_lse = bool(case.options.get("return_lse"))
    caches = device_caches(backend, case)
    arrays, options = device_arguments(backend, case, caches)
    plan = backend.plan(*arrays, **options)
    first = _kept_result(backend, backend.run(plan, *arrays[:3]), return_lse)
    plans = []
    for _ in range(MANY_PLANS - 1):
        other = relocated(case, rng)
        other_arrays, other_options = device_arguments(backend, other, caches)  # planning needs their shapes only
        plans.append(backend.plan(*other_arrays, **other_options))
    last_arrays = device_arguments(backend, other, device_caches(backend, other))[0]
    last = host_result(backend, backend.run(plans[-1], *last_arrays[:3]), return_lse)
    again = host_result(backend, backend.run(plan, *arrays[:3]), return_lse)
    _assert_same_result(backend, again, first, f"the first of {MANY_PLANS} plans alive at once, run again on the "
                        "same arrays, gave other bits than its first run", case)
    return max(_result_matches_spec(backend, case, first, f" (the first of {MANY_PLANS} plans)"),
               _result_matches_spec(backend, other, last, f" (the last of {MANY_PLANS} plans)"))


def _assign(target: Any, source: Any) -> None:
    """Write ``source``'s elements into the device array ``target`` in place (torch, CuPy, NumPy)."""
    target[...] = source


def _plan_as_engine(backend: Backend, case: AttentionCase) -> tuple[Plan, tuple[Any, ...], tuple[Any, Any, Any]]:
    """``case`` planned on the arrays an engine hands over (torch CUDA tensors where the backend
    takes them): the plan, its arrays (:func:`device_arguments`) and caches (:func:`device_caches`)."""
    to_engine = partial(engine_array, backend)
    caches = device_caches(backend, case, to_engine)
    arrays, options = device_arguments(backend, case, caches, to_engine)
    return backend.plan(*arrays, **options), arrays, caches


def _next_layer_arrays(backend: Backend, layer: AttentionCase, arrays: tuple[Any, ...],
                       caches: tuple[Any, Any, Any]) -> tuple[tuple[Any, Any, Any], Callable[[], None]]:
    """``layer``'s query and caches in arrays of their own, and a function that writes them into the
    planned ``arrays`` and ``caches`` (from :func:`_plan_as_engine`) in place."""
    to_engine = partial(engine_array, backend)
    layer_caches = device_caches(backend, layer, to_engine)
    layer_arrays = (to_engine(layer.query), *layer_caches[:2])

    def write() -> None:
        pool = caches[2]
        if pool is not None:  # the caches are views of the pool: write the next layer's pool into it
            _assign(pool, layer_caches[2])
        else:
            _assign(caches[0], layer_arrays[1])
            _assign(caches[1], layer_arrays[2])
        _assign(arrays[0], layer_arrays[0])

    return layer_arrays, write


def _same_as_eager(backend: Backend, plan: Plan, layer: AttentionCase, layer_arrays: tuple[Any, Any, Any],
                   seen: AttentionResult, what: str) -> None:
    """``seen`` (host copies of a run of ``plan`` on ``layer``'s contents) has the bits of an eager run
    of ``plan`` on ``layer_arrays`` (``what`` otherwise)."""
    __tracebackhide__ = True
    eager = host_result(backend, backend.run(plan, *layer_arrays), bool(layer.options.get("return_lse")))
    backend.synchronize()
    _assert_same_result(backend, seen, eager, what, layer)


def _matches_eager(backend: Backend, plan: Plan, layer: AttentionCase, layer_arrays: tuple[Any, Any, Any],
                   seen: AttentionResult, what: str, context: str) -> float:
    """:func:`_same_as_eager`, and ``seen`` is within the error model of the spec."""
    __tracebackhide__ = True
    _same_as_eager(backend, plan, layer, layer_arrays, seen, what)
    return _result_matches_spec(backend, layer, seen, context)


#: Replays of the one graph :func:`replay_matches_eager` captures, each after other contents are
#: written: an engine replays a decode step's graph for every layer of every step, and state a
#: kernel keeps on the device from one launch to the next (a work counter, a readiness flag, the
#: tail a launch leaves) can show from the second replay on.
GRAPH_REPLAYS = 3


def replay_matches_eager(backend: Backend, case: AttentionCase) -> float:
    """As an engine replays a captured decode step: a run of a capturable plan captured in a CUDA
    graph, then, GRAPH_REPLAYS times, other contents written into the captured arrays and the
    graph replayed (the next layer's query and caches, the layer after's, the case's own). Each
    replay gives the bits of an eager run of the same plan on those contents (other arrays); the
    first is also held to the spec's error model. A plan that is not capturable is unsupported;
    one that says it is and cannot be captured fails."""
    __tracebackhide__ = True
    rng = plan_check_rng(case)
    layer = next_layer(case, rng)
    contents = [layer, next_layer(layer, rng), case][:GRAPH_REPLAYS]
    return_lse = bool(case.options.get("return_lse"))
    plan, arrays, caches = _plan_as_engine(backend, case)
    if not plan.capturable:
        raise UnsupportedError("plan", "its plans are not capturable in a CUDA graph (Plan.capturable)",
                               backend=backend.name, capability="cuda_graphs")
    captured: list[Any] = []
    try:
        replay = capture_runs(lambda _: captured.append(backend.run(plan, *arrays[:3])), 1)
    except CaptureFailed as error:
        raise ConformanceFailure(f"the plan says it is capturable, but {error} {_call(backend, case)}") from None
    worst = 0.0
    for i, written in enumerate(contents):
        layer_arrays, write = _next_layer_arrays(backend, written, arrays, caches)
        write()
        replay()
        backend.synchronize()
        seen = host_result(backend, captured[-1], return_lse)
        if i == 0:
            worst = _matches_eager(backend, plan, written, layer_arrays, seen,
                                   "a CUDA-graph replay on new contents differs from an eager run on them",
                                   " (a CUDA-graph replay on the next layer's contents)")
        else:
            _same_as_eager(backend, plan, written, layer_arrays, seen,
                           f"replay {i + 1} of a CUDA graph, each on new contents, differs from an eager run on "
                           "its contents")
    return worst


#: Cycles the caller's stream sleeps (``torch.cuda._sleep``) before it writes the next layer's
#: contents: 2**26, about 34 ms on a GPU clocked near 2 GHz. That is far longer than a warmed
#: run's host time, so a run launched on another stream runs before the writes land.
STREAM_DELAY_CYCLES = 2**26


def _torch_with_streams(backend: Backend, operation: str) -> Any:
    """torch, for a check that sets its CUDA streams; unsupported unless ``backend`` takes torch
    CUDA tensors and a CUDA device is here."""
    if not takes_torch_cuda(backend):
        raise UnsupportedError(operation, "it does not take torch CUDA tensors, whose streams this check sets",
                               backend=backend.name, capability="cuda_streams")
    import torch

    if not torch.cuda.is_available():
        raise UnsupportedError(operation, "no CUDA device, whose streams this check sets", backend=backend.name,
                               capability="cuda_streams")
    return torch


def run_follows_callers_stream(backend: Backend, case: AttentionCase) -> float:
    """As an engine runs a layer on a side stream of its own (torch's streams do not wait for the
    default stream): the plan made and run once on the default stream; then, queued on a side
    stream behind a delay, the next layer's query and caches written into the planned arrays, the
    plan run and its output copied. The copies have the bits of an eager run on those contents,
    within the error model of the spec: a run launches on the caller's current stream, not on the
    default stream, on one of its own or on the plan's. Unsupported unless the backend takes torch
    CUDA tensors and a CUDA device is here."""
    __tracebackhide__ = True
    torch = _torch_with_streams(backend, "run")
    layer = next_layer(case, plan_check_rng(case))
    return_lse = bool(case.options.get("return_lse"))
    plan, arrays, caches = _plan_as_engine(backend, case)
    backend.run(plan, *arrays[:3])  # an earlier layer: compilation and launch caches out of the way
    layer_arrays, write = _next_layer_arrays(backend, layer, arrays, caches)
    torch.cuda.synchronize()  # the side stream below waits for nothing queued before it
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(STREAM_DELAY_CYCLES)
        write()
        result = backend.run(plan, *arrays[:3])
        # an engine reads the output on its own stream
        copied = tuple(x.clone() for x in result) if return_lse else result.clone()
    torch.cuda.synchronize()
    return _matches_eager(backend, plan, layer, layer_arrays, host_result(backend, copied, return_lse),
                          "a run on the caller's stream, behind a delay, differs from an eager run on the same "
                          "contents", " (a run on the caller's side stream, behind a delay, on the next layer's "
                          "contents)")


class _InputsLandLate:
    """``backend`` as an operation check meets it when the caller works on a side stream: every array
    the check hands over is a torch CUDA tensor, of zeros where it holds data (index arrays hold
    theirs, so that a check of them on the host passes), and the operation is called on a side
    stream behind a delay (:data:`STREAM_DELAY_CYCLES`), right after the arrays' contents are
    written there. An operation launched anywhere but the caller's current stream reads the zeros,
    or its writes are overwritten by the contents landing after them."""

    def __init__(self, backend: Backend, torch: Any) -> None:
        self._backend, self._torch = backend, torch
        self._landing: list[tuple[Any, Any]] = []  # (the array handed over, the contents it gets)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def to_device(self, array: np.ndarray) -> Any:
        contents = engine_array(self._backend, array)
        handed = engine_array(self._backend, array if array.dtype.kind in "iu" else np.zeros_like(array))
        self._landing.append((handed, contents))
        return handed

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def _late(self, operation: str, *args: Any, **kwargs: Any) -> Any:
        torch = self._torch
        torch.cuda.synchronize()  # the side stream below waits for nothing queued before it
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda._sleep(STREAM_DELAY_CYCLES)
            for handed, contents in self._landing:
                handed.copy_(contents)
            return getattr(self._backend, operation)(*args, **kwargs)

    def write_kv(self, *args: Any, **kwargs: Any) -> None:
        self._late("write_kv", *args, **kwargs)

    def copy_blocks(self, *args: Any, **kwargs: Any) -> None:
        self._late("copy_blocks", *args, **kwargs)

    def merge_states(self, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        return self._late("merge_states", *args, **kwargs)  # type: ignore[no-any-return]


def _operation_on_callers_stream(check: Callable[[Backend, Any], float], operation: str,
                                 backend: Backend, case: Any) -> float:
    """``check`` with the operation called as an engine calls it on a side stream of its own: its
    inputs written on that stream behind a delay, right before the call (:class:`_InputsLandLate`).
    Unsupported unless the backend takes torch CUDA tensors and a CUDA device is here."""
    __tracebackhide__ = True
    return check(_InputsLandLate(backend, _torch_with_streams(backend, operation)), case)  # type: ignore[arg-type]


def write_kv_follows_callers_stream(backend: Backend, case: WriteKVCase) -> float:
    """:func:`write_kv_matches_spec` with key, value, caches and slot_mapping written on the caller's
    side stream behind a delay, and write_kv called there: it launches on that stream."""
    __tracebackhide__ = True
    return _operation_on_callers_stream(write_kv_matches_spec, "write_kv", backend, case)


def copy_blocks_follows_callers_stream(backend: Backend, case: CopyBlocksCase) -> float:
    """:func:`copy_blocks_matches_spec` with the caches and pairs written on the caller's side stream
    behind a delay, and copy_blocks called there: it launches on that stream."""
    __tracebackhide__ = True
    return _operation_on_callers_stream(copy_blocks_matches_spec, "copy_blocks", backend, case)


def merge_states_follows_callers_stream(backend: Backend, case: MergeCase) -> float:
    """:func:`merge_states_matches_spec` with both states written on the caller's side stream behind
    a delay, and merge_states called there: it launches on that stream."""
    __tracebackhide__ = True
    return _operation_on_callers_stream(merge_states_matches_spec, "merge_states", backend, case)


def newest_slots(problem: AttentionProblem) -> np.ndarray:
    """Slots of each sequence's newest tokens, the ones a step writes before its attention: the
    positions of its queries (the last one in decode; none for a padding entry), each slot once
    (sequences may share a block)."""
    seqs, positions = problem.token_positions()
    keep = problem.seq_lens[seqs] > 0
    seqs, positions = seqs[keep], positions[keep]
    blocks = problem.block_tables[seqs, positions // problem.block_size].astype(np.int64)
    return np.unique(blocks * problem.block_size + positions % problem.block_size)


def step_writes_then_attends(backend: Backend, case: AttentionCase) -> float:
    """As an engine's step: the batch planned, then ``write_kv`` of the newest tokens' keys and
    values (their slots hold NaN before it), then the plan run on the same caches with no
    synchronisation between. The attention sees what ``write_kv`` wrote: within the error model
    of the spec on the caches as they are after the step (what ``write_kv`` stores is the
    ``write_kv`` cells' concern)."""
    __tracebackhide__ = True
    problem = problem_of(case)
    slots = newest_slots(problem)
    rng = plan_check_rng(case)
    k_host, v_host = case.key_cache.copy(), case.value_cache.copy()
    for cache in (k_host, v_host):
        view = kv_ops.slot_view(cache, problem.kv_layout)
        view[slots // problem.block_size, slots % problem.block_size] = np.nan  # stale until written
    stale = case.replace(pool=None, key_cache=k_host, value_cache=v_host)
    new_kv = [rng.standard_normal((len(slots), problem.num_kv_heads, problem.head_dim)).astype(case.query.dtype)
              for _ in range(2)]
    caches = device_caches(backend, stale)
    arrays, options = device_arguments(backend, stale, caches)
    scales = {name: options[name] for name in ("k_scale", "v_scale") if name in options}
    plan = backend.plan(*arrays, **options)  # an engine plans the step first, then each layer writes and attends
    backend.write_kv(backend.to_device(new_kv[0]), backend.to_device(new_kv[1]), caches[0], caches[1],
                     backend.to_device(slots), kv_layout=problem.kv_layout, **scales)
    result = backend.run(plan, *arrays[:3])
    backend.synchronize()
    after = stale.replace(key_cache=np.asarray(backend.to_numpy(caches[0])),
                          value_cache=np.asarray(backend.to_numpy(caches[1])))
    for name, cache in (("key_cache", after.key_cache), ("value_cache", after.value_cache)):
        view = kv_ops.slot_view(cache, problem.kv_layout)
        if np.isnan(view[slots // problem.block_size, slots % problem.block_size].astype(np.float32)).any():
            raise ConformanceFailure(f"{name}: write_kv left a newest token's slot unwritten {_call(backend, case)}")
    return _result_matches_spec(backend, after, host_result(backend, result, bool(options.get("return_lse"))),
                                " (attention right after write_kv of the newest tokens)")


def alone(case: AttentionCase, seq: int) -> AttentionCase:
    """Sequence ``seq`` of the batch as a batch of one (same caches, its table row and queries)."""
    options = dict(case.options)
    if case.query_start_loc is None:
        rows = slice(seq, seq + 1)
        qsl = None
    else:
        rows = slice(int(case.query_start_loc[seq]), int(case.query_start_loc[seq + 1]))
        qsl = np.array([0, rows.stop - rows.start], dtype=np.int32)
    return case.replace(query=case.query[rows].copy(), block_tables=case.block_tables[seq:seq + 1].copy(),
                        seq_lens=case.seq_lens[seq:seq + 1].copy(), query_start_loc=qsl, options=options)


def alone_equals_batch(backend: Backend, case: AttentionCase) -> float:
    """A sequence alone gives, within tolerance, what it gets inside the batch (twice the error model)."""
    __tracebackhide__ = True
    problem = problem_of(case)
    q_lens = problem.q_lens
    with_queries = np.flatnonzero(q_lens > 0)
    seq = int(with_queries[case.seed % len(with_queries)])
    single = alone(case, seq)
    batch = run_checked(backend, case)
    solo = run_checked(backend, single)
    solo_problem = problem_of(single)
    exact = exact_attention_problem(solo_problem, single.query, single.key_cache, single.value_cache)
    tol = tolerance(problem.dtype, problem.head_dim, cache_dtype=problem.cache_dtype,
                    tf32=backend.capabilities().tf32)
    rows = slice(int(problem.query_start_loc[seq]), int(problem.query_start_loc[seq + 1]))
    bound = 2 * tol.out_bound(exact.out, exact.value_scale, exact.score_scale, exact.num_visible)
    call = _call(backend, single) + f" (sequence {seq} of the batch, alone)"
    expected = batch.out[rows].astype(np.float64)
    return assert_close_to_spec("out", solo.out, expected, bound, solo_problem, call, tolerance=tol)


# -- other operations ---------------------------------------------------------------------

def _guarded_on_device(backend: Backend, cache: np.ndarray) -> tuple[Any, np.ndarray]:
    """``cache`` on the device as the middle of three caches in one array, and that host array: the
    other two hold random bytes, so that an in-place operation writing before or after the cache
    (a slot of -1 taken as block -1, a block past the last) writes into them. Returns the device
    array ``[3, ...]``; the operation gets its ``[1]``, a view."""
    rng = np.random.default_rng(GUARD_SEED)
    guards = [rng.integers(0, 256, size=cache.nbytes, dtype=np.uint8).view(cache.dtype).reshape(cache.shape)
              for _ in range(2)]
    host = np.stack([guards[0], cache, guards[1]])
    return backend.to_device(host.copy()), host  # a backend on the host may take the array itself


def _inside_guards(backend: Backend, name: str, device: Any, host: np.ndarray, operation: str, call: str) -> np.ndarray:
    """The cache (``[1]``) of a :func:`_guarded_on_device` array after ``operation``, on the host,
    once the memory before and after it is found unchanged."""
    __tracebackhide__ = True
    after = np.asarray(backend.to_numpy(device))
    for index, where in ((0, "before"), (2, "after")):
        assert_bit_identical(f"{name} (the cache-sized memory {where} it)", np.ascontiguousarray(after[index]),
                             host[index], f"{operation} wrote outside the cache it was given", call,
                             coordinates="(element of the neighbouring memory, as the cache's shape)")
    return after[1]


#: The seed of the random bytes around the caches of write_kv and copy_blocks.
GUARD_SEED = 2024


#: relative distance from x / scale within which a quotient may be rounded before it is rounded to
#: fp8: a kernel may take x / scale in float32, or x times 1 / scale, and round that (double rounding)
FP8_QUOTIENT_SLACK = 2.0**-20


def _written_quotients(case: WriteKVCase) -> tuple[np.ndarray, np.ndarray]:
    """float64 ``x / scale`` of keys and values at their slots, as caches ``[blocks, block_size, Hkv, D]``
    (NaN where nothing is written)."""
    shape = kv_ops.slot_view(case.key_cache, case.kv_layout).shape
    tokens, blocks, offsets = kv_ops.written_slots(case.slot_mapping, shape[1])
    quotients = []
    for x, scale in ((case.key, case.k_scale), (case.value, case.v_scale)):
        q = np.full(shape, np.nan)
        with np.errstate(over="ignore", invalid="ignore"):
            q[blocks, offsets] = np.asarray(x[tokens], np.float64) / scale
        quotients.append(q)
    return quotients[0], quotients[1]


def _fp8_as_rounded_from(actual: np.ndarray, quotient: np.ndarray) -> np.ndarray:
    """``actual`` (fp8) where it is a conforming rounding of ``quotient`` (float64), else the spec's.

    Conforming: the nearest-even rounding of a number within :data:`FP8_QUOTIENT_SLACK` of the
    quotient (one of at most two neighbours); NaN for NaN; beyond the fp8 range (inf included)
    what ml_dtypes gives (NaN for float8_e4m3fn, inf for float8_e5m2) or the largest finite value
    of the quotient's sign (a saturating conversion). Never a finite value for NaN."""
    dtype = actual.dtype
    with np.errstate(over="ignore", invalid="ignore"):
        roundings = [(quotient * f).astype(dtype) for f in (1.0, 1.0 - FP8_QUOTIENT_SLACK, 1.0 + FP8_QUOTIENT_SLACK)]
    bits = actual.view(np.uint8)
    ok = np.zeros(actual.shape, dtype=bool)
    for r in roundings:
        ok |= bits == r.view(np.uint8)
    spec = roundings[0]
    spec_f = spec.astype(np.float64)
    ok |= np.isnan(spec_f) & np.isnan(actual.astype(np.float64))
    largest = np.asarray(ml_dtypes.finfo(dtype).max, dtype=dtype)
    overflow = ~np.isnan(quotient) & (np.isnan(spec_f) | np.isinf(spec_f))
    saturated = np.where(np.signbit(quotient), -largest, largest).astype(dtype)
    ok |= overflow & (bits == saturated.view(np.uint8))
    return np.where(ok, bits, spec.view(np.uint8)).view(dtype)


def write_kv_matches_spec(backend: Backend, case: WriteKVCase) -> float:
    """write_kv stores x / scale at each slot (-1 skipped) and leaves every other slot's bits alone."""
    __tracebackhide__ = True
    expected_k, expected_v = case.key_cache.copy(), case.value_cache.copy()
    kv_ops.write_kv(case.key, case.value, expected_k, expected_v, case.slot_mapping, kv_layout=case.kv_layout,
                    k_scale=case.k_scale, v_scale=case.v_scale)
    (key_pool, key_host), (value_pool, value_host) = (_guarded_on_device(backend, c)
                                                      for c in (case.key_cache, case.value_cache))
    backend.write_kv(*device_kv(backend, case), key_pool[1], value_pool[1],
                     case.slot_mapping_for(backend), kv_layout=case.kv_layout, k_scale=case.k_scale,
                     v_scale=case.v_scale)
    backend.synchronize()
    block_size = case.key_cache.shape[1 if case.kv_layout == "NHD" else 2]
    written = np.zeros(kv_ops.slot_view(case.key_cache, case.kv_layout).shape[:2], dtype=bool)
    slots = case.slot_mapping[case.slot_mapping >= 0].astype(np.int64)
    written[slots // block_size, slots % block_size] = True
    call = (f"[call: backend={backend.name} write_kv dtype={dtype_name(case.key.dtype)}"
            f" cache_dtype={dtype_name(case.key_cache.dtype)} kv_layout={case.kv_layout} block_size={block_size}"
            f" k_scale={case.k_scale} v_scale={case.v_scale}]")
    fp8 = dtype_name(case.key_cache.dtype) in FP8_DTYPES
    quotients = _written_quotients(case) if fp8 else (None, None)
    for name, pool, host, expected, quotient in (("key_cache", key_pool, key_host, expected_k, quotients[0]),
                                                 ("value_cache", value_pool, value_host, expected_v, quotients[1])):
        actual = _inside_guards(backend, name, pool, host, "write_kv", call)
        actual_nhd, expected_nhd = kv_ops.slot_view(actual, case.kv_layout), kv_ops.slot_view(expected, case.kv_layout)
        assert_bit_identical(name, np.ascontiguousarray(actual_nhd[~written]),
                             np.ascontiguousarray(expected_nhd[~written]),
                             "write_kv changed a slot not in slot_mapping", call,
                             coordinates="(unwritten slot number, head, dim)")
        if quotient is not None:
            stored = np.ascontiguousarray(actual_nhd[written])
            assert_bit_identical(name, stored, _fp8_as_rounded_from(stored, quotient[written]),
                                 "write_kv stored other than x / scale rounded to nearest even (beyond the fp8"
                                 " range: NaN or inf as ml_dtypes converts, or saturated; NaN stays NaN)", call,
                                 coordinates="(written slot number, head, dim)")
        else:
            assert_bit_identical(name, np.ascontiguousarray(actual_nhd[written]),
                                 np.ascontiguousarray(expected_nhd[written]),
                                 "write_kv stored other bits than the key/value given", call,
                                 coordinates="(written slot number, head, dim)")
    return 0.0


def copy_blocks_matches_spec(backend: Backend, case: CopyBlocksCase) -> float:
    """copy_blocks equals the spec's (every source read before any destination is written), bit for bit."""
    __tracebackhide__ = True
    expected_k, expected_v = case.key_cache.copy(), case.value_cache.copy()
    kv_ops.copy_blocks(expected_k, expected_v, case.pairs, kv_layout=case.kv_layout)
    (key_pool, key_host), (value_pool, value_host) = (_guarded_on_device(backend, c)
                                                      for c in (case.key_cache, case.value_cache))
    backend.copy_blocks(key_pool[1], value_pool[1], backend.to_device(case.pairs), kv_layout=case.kv_layout)
    backend.synchronize()
    call = (f"[call: backend={backend.name} copy_blocks dtype={dtype_name(case.key_cache.dtype)}"
            f" kv_layout={case.kv_layout} pairs={listed(case.pairs)}]")
    for name, pool, host, expected in (("key_cache", key_pool, key_host, expected_k),
                                       ("value_cache", value_pool, value_host, expected_v)):
        actual = _inside_guards(backend, name, pool, host, "copy_blocks", call)
        assert_bit_identical(name, np.ascontiguousarray(actual), expected, "copy_blocks differs from the spec", call,
                             coordinates="(block, ...)")
    return 0.0


def merge_states_matches_spec(backend: Backend, case: MergeCase) -> float:
    """merge_states within rounding of the exact merge; an empty side (-inf) is ignored, even NaN."""
    __tracebackhide__ = True
    return _merged_rows_match_spec(backend, case, np.arange(case.out_a.shape[0]))


def far_merge_rows_match_spec(backend: Backend, case: MergeCase) -> float:
    """merge_states of states past 2**31 elements: the first row, one more and every row past element
    2**31 (:func:`~pagedattn.conformance.scale.far_row_sequences`) within rounding of the exact merge."""
    __tracebackhide__ = True
    T, H, D = case.out_a.shape
    rows = far_row_sequences(None, T, H * D, FAR_MERGE_SEED)
    return _merged_rows_match_spec(backend, case, rows)


def _merged_rows_match_spec(backend: Backend, case: MergeCase, rows: np.ndarray) -> float:
    """merge_states of the whole case; its ``rows`` compared with the exact merge of those rows."""
    __tracebackhide__ = True
    out, lse = backend.merge_states(*device_merge_arguments(backend, case))
    backend.synchronize()
    T, H, D = case.out_a.shape
    dtype = dtype_name(case.out_a.dtype)
    call = f"[call: backend={backend.name} merge_states dtype={dtype} shape={[T, H, D]}]"
    out, lse = np.asarray(backend.to_numpy(out)), np.asarray(backend.to_numpy(lse))
    assert_array_form("out", out, (T, H, D), dtype, call)
    assert_array_form("lse", lse, (T, H), "float32", call)
    if len(rows) < T:
        call = call[:-1] + f" rows={rows.tolist() if len(rows) <= 8 else f'{len(rows)} from {rows.min()}'}]"
        out, lse = out[rows], lse[rows]
        case = MergeCase(out_a=case.out_a[rows], lse_a=case.lse_a[rows], out_b=case.out_b[rows],
                         lse_b=case.lse_b[rows])
    exact_out, exact_lse = spec_merge_states(case.out_a, case.lse_a, case.out_b, case.lse_b)
    tol = merge_tolerance(dtype)
    # magnitudes over the finite values of parts that are not empty, as attention's bound takes them
    value_scale = np.maximum(*(
        np.where(np.isfinite(lse)[..., None] & np.isfinite(part), np.abs(part.astype(np.float64)), 0).max(axis=-1)
        for part, lse in ((case.out_a, case.lse_a), (case.out_b, case.lse_b))))
    score_scale = np.maximum(np.where(np.isfinite(case.lse_a), np.abs(case.lse_a), 0),
                             np.where(np.isfinite(case.lse_b), np.abs(case.lse_b), 0)).astype(np.float64)
    num_visible = np.full(case.lse_a.shape, 2)
    rows_kept, heads, head_dim = case.out_a.shape
    problem = _merge_problem(rows_kept, heads, head_dim, dtype)
    worst = assert_close_to_spec("out", out, exact_out,
                                 tol.out_bound(exact_out, value_scale, score_scale, num_visible), problem, call,
                                 tolerance=tol, inf_may_be_nan=True)
    return max(worst, assert_close_to_spec("lse", lse, exact_lse, tol.lse_bound(score_scale, num_visible),
                                           problem, call, tolerance=tol))


def _merge_problem(T: int, H: int, D: int, dtype: str) -> AttentionProblem:
    """A stand-in problem so that messages name (token, head, dim) of a merge as decode tokens."""
    dummy = np.zeros((T, H, D), dtype=ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype)
    cache = np.zeros((1, 1, H, D), dtype=dummy.dtype)
    return check_paged_attention(dummy, cache, cache, np.zeros((T, 1), np.int32), np.ones(T, np.int32))


# -- caches past 2**31 elements ------------------------------------------------------------
# A far-pool case's caches are zero outside the blocks its index arrays name (see
# pagedattn.conformance.scale), so each check copies only those blocks to the device
# (pools.lazy_copy) and compares only those blocks: a huge pool never costs its size.

def _require_pool(backend: Backend, elements: int) -> None:
    """Raise UnsupportedError if the backend declares a smaller ``max_pool_elements``."""
    limit = backend.capabilities().max_pool_elements
    if limit is not None and elements > limit:
        raise UnsupportedError("key_cache", f"caches of {elements:,} elements (max_pool_elements {limit:,})",
                               backend=backend.name, capability="max_pool_elements")


def table_blocks(problem: AttentionProblem) -> np.ndarray:
    """int64 ids of every block a block table names (valid ids in any column)."""
    ids = problem.block_tables[(problem.block_tables >= 0) & (problem.block_tables < problem.num_blocks)]
    return np.unique(ids.astype(np.int64))


def far_pool_matches_spec(backend: Backend, case: AttentionCase) -> float:
    """On caches past 2**31 elements: out (and lse) within the error model; the blocks in use unchanged."""
    __tracebackhide__ = True
    problem = problem_of(case)
    _require_pool(backend, case.key_cache.size)
    blocks = table_blocks(problem)
    caches = [upload(backend, lazy_copy(c, blocks)) for c in (case.key_cache, case.value_cache)]
    result = run_case(backend, case, caches=(caches[0], caches[1], None))
    call = _call(backend, case)
    for name, device, original in zip(("key_cache", "value_cache"), caches, (case.key_cache, case.value_cache),
                                      strict=True):
        assert_bit_identical(name, np.asarray(backend.to_numpy(device))[blocks], original[blocks],
                             "the call wrote into a block in use", call, coordinates="(block in use, ...)")
    exact = exact_attention_problem(problem, case.query, case.key_cache, case.value_cache)
    tol = tolerance(problem.dtype, problem.head_dim, cache_dtype=problem.cache_dtype,
                    tf32=backend.capabilities().tf32)
    return assert_attention_matches(result.out, result.lse, exact, tol, problem, call)


def far_rows_match_spec(backend: Backend, case: AttentionCase) -> float:
    """On a query and output past 2**31 elements (or a fused QKV view whose rows pass it): the rows
    of the first sequence, one more, and every sequence past element 2**31
    (:func:`~pagedattn.conformance.scale.far_row_sequences`) within the error model; nothing else
    written. Each is compared with the spec's answer for it alone, so the spec never holds the
    whole output in float64."""
    __tracebackhide__ = True
    problem = problem_of(case)
    row_elements = (problem.num_q_heads if case.qkv is None else case.qkv.shape[1]) * problem.head_dim  # row stride
    seqs = far_row_sequences(case.query_start_loc, problem.num_tokens, row_elements, case.seed)
    return _sequences_match_spec(backend, case, seqs, lambda seq, rows: f"elements from {rows.start * row_elements:,}")


def far_partials_match_spec(backend: Backend, case: AttentionCase) -> float:
    """On a batch whose split-KV partials, laid out by sequence, pass 2**31 elements: the rows of the
    first sequence, one more, the longest, and every sequence whose partials start past element
    2**31 (:func:`~pagedattn.conformance.scale.far_partial_sequences`) within the error model;
    nothing else written. Each is compared with the spec's answer for it alone."""
    __tracebackhide__ = True
    problem = problem_of(case)
    row_elements = int(problem.num_q_heads) * int(problem.head_dim)
    seqs = far_partial_sequences(case.seq_lens, row_elements, case.seed)
    parts = far_partial_parts(np.asarray(case.seq_lens))
    return _sequences_match_spec(backend, case, seqs,
                                 lambda seq, rows: f"partials from element {seq * row_elements * parts:,}")


def row_alone(case: AttentionCase, token: int) -> AttentionCase:
    """Query row ``token`` of a causal batch as a decode of its own: the same caches, its sequence's
    table row, the sequence cut after the row's position. The contract gives it the same answer:
    a causal row sees ``p <= p_q``, and a decode's query sits at ``p_q`` too (from where a window
    and ALiBi's distances are measured)."""
    problem = problem_of(case)
    if not problem.causal:
        raise ValueError("row_alone needs a causal batch: a non-causal row sees keys past its position")
    seq = int(np.searchsorted(problem.query_start_loc, token, side="right")) - 1
    p_q = int(problem.seq_lens[seq]) - int(problem.q_lens[seq]) + token - int(problem.query_start_loc[seq])
    return case.replace(query=case.query[token:token + 1].copy(), block_tables=case.block_tables[seq:seq + 1].copy(),
                        seq_lens=np.array([p_q + 1], dtype=case.seq_lens.dtype), query_start_loc=None,
                        options=dict(case.options))


def far_scores_match_spec(backend: Backend, case: AttentionCase) -> float:
    """On one causal prefill whose scores, queries x keys of a head, pass 2**31 elements: the first
    and last rows, one more, and rows whose scores start past element 2**31
    (:func:`~pagedattn.conformance.scale.far_score_rows`) within the error model, each against
    the spec's answer for it alone (:func:`row_alone`); nothing else written."""
    __tracebackhide__ = True
    return _far_score_rows_match_spec(backend, case, INT32_OFFSET_LIMIT, exact_attention_problem)


def far_scores_past_uint32_match_spec(backend: Backend, case: AttentionCase) -> float:
    """:func:`far_scores_match_spec` for a chunk whose scores pass 2**32 elements, its table naming a
    few blocks many times: the rows compared include those whose scores start past element 2**32,
    each against the spec's answer for it alone computed once per distinct block
    (:func:`~pagedattn.conformance.repeated_blocks.exact_by_distinct_blocks`)."""
    __tracebackhide__ = True
    return _far_score_rows_match_spec(backend, case, UINT32_OFFSET_LIMIT, exact_by_distinct_blocks)


def _far_score_rows_match_spec(backend: Backend, case: AttentionCase, limit: int,
                               exact_of: Callable[..., ExactResult]) -> float:
    """The rows :func:`~pagedattn.conformance.scale.far_score_rows` picks past element ``limit`` of
    a head's scores, each against ``exact_of``'s answer for it alone (:func:`row_alone`)."""
    __tracebackhide__ = True
    problem = problem_of(case)
    length = int(problem.seq_lens[0])
    tokens = far_score_rows(int(problem.q_lens[0]), length, case.seed, limit=limit)
    return _parts_match_spec(backend, case, (
        (slice(int(t), int(t) + 1), row_alone(case, int(t)), f"row {t}: its scores from element {int(t) * length:,}")
        for t in tokens), exact_of=exact_of)


def long_chunks_match_spec(backend: Backend, case: AttentionCase) -> float:
    """On chunks of many queries after long contexts: each chunk's first and last rows and a sample
    of the others (:func:`~pagedattn.conformance.scale.long_chunk_rows`) within the error model,
    each against the spec's answer for it alone (:func:`row_alone`); nothing else written."""
    __tracebackhide__ = True
    qsl = problem_of(case).query_start_loc
    tokens = long_chunk_rows(qsl, case.seed)
    return _parts_match_spec(backend, case, (
        (slice(int(t), int(t) + 1), row_alone(case, int(t)),
         f"row {t}: query {int(t) - int(qsl[np.searchsorted(qsl, t, side='right') - 1])} of its chunk")
        for t in tokens))


def _sequences_match_spec(backend: Backend, case: AttentionCase, seqs: np.ndarray,
                          where: Callable[[int, slice], str]) -> float:
    """Run ``case`` once; the rows of each of ``seqs`` within the error model of the spec's answer
    for that sequence alone (``where(seq, rows)`` says where its data lies, for the message)."""
    __tracebackhide__ = True
    qsl = problem_of(case).query_start_loc

    def parts() -> Iterator[tuple[slice, AttentionCase, str]]:
        for seq in map(int, seqs):
            rows = slice(int(qsl[seq]), int(qsl[seq + 1]))
            yield rows, alone(case, seq), f"sequence {seq}: rows {rows.start} to {rows.stop - 1}, {where(seq, rows)}"

    return _parts_match_spec(backend, case, parts())


def _parts_match_spec(backend: Backend, case: AttentionCase, parts: Iterable[tuple[slice, AttentionCase, str]],
                      exact_of: Callable[..., ExactResult] = exact_attention_problem) -> float:
    """Run ``case`` once; for each ``(rows, single, where)`` of ``parts`` the result's ``rows``
    within the error model of the spec's answer for ``single``, as ``exact_of`` computes it
    (``where`` names them in a failure)."""
    __tracebackhide__ = True
    problem = problem_of(case)
    result = run_checked(backend, case)
    tol = tolerance(problem.dtype, problem.head_dim, cache_dtype=problem.cache_dtype,
                    tf32=backend.capabilities().tf32)
    worst = 0.0
    for rows, single, where in parts:
        single_problem = problem_of(single)
        exact = exact_of(single_problem, single.query, single.key_cache, single.value_cache)
        call = _call(backend, case) + f" ({where})"
        lse = None if result.lse is None else result.lse[rows]
        worst = max(worst, assert_attention_matches(result.out[rows], lse, exact, tol, single_problem, call))
    return worst


def _remapped(ids: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """Positions of ``ids`` (all in the sorted ``blocks``) in ``blocks``."""
    return np.searchsorted(blocks, ids)


def _far_blocks_match_spec(backend: Backend, case: WriteKVCase | CopyBlocksCase, blocks: np.ndarray,
                           spec: Callable[[np.ndarray, np.ndarray], None], run: Callable[[Any, Any], None],
                           what: str, call: str) -> float:
    """Run ``run(key_cache, value_cache)`` on device caches holding only ``blocks`` of the case's, and
    ``spec`` on host copies of those blocks: the blocks must then be bit-identical."""
    __tracebackhide__ = True
    expected = [c[blocks].copy() for c in (case.key_cache, case.value_cache)]
    spec(expected[0], expected[1])
    caches = [upload(backend, lazy_copy(c, blocks)) for c in (case.key_cache, case.value_cache)]
    run(caches[0], caches[1])
    backend.synchronize()
    for name, device, want in zip(("key_cache", "value_cache"), caches, expected, strict=True):
        assert_bit_identical(name, np.asarray(backend.to_numpy(device))[blocks], want, what, call,
                             coordinates=f"(index in blocks {blocks.tolist()}, ...)")
    return 0.0


def far_write_kv_matches_spec(backend: Backend, case: WriteKVCase) -> float:
    """write_kv past element 2**31: the slots written hold x, the other slots of their blocks unchanged."""
    __tracebackhide__ = True
    _require_pool(backend, case.key_cache.size)
    block_size = case.key_cache.shape[1 if case.kv_layout == "NHD" else 2]
    slots = case.slot_mapping.astype(np.int64)
    blocks = np.unique(slots[slots >= 0] // block_size)
    small = np.where(slots >= 0, _remapped(np.maximum(slots, 0) // block_size, blocks) * block_size
                     + slots % block_size, -1)
    call = (f"[call: backend={backend.name} write_kv dtype={dtype_name(case.key.dtype)}"
            f" cache_dtype={dtype_name(case.key_cache.dtype)} kv_layout={case.kv_layout}"
            f" k_scale={case.k_scale} v_scale={case.v_scale}"
            f" block_size={block_size} caches of {case.key_cache.size:,} elements,"
            f" slot_mapping={listed(case.slot_mapping)}]")
    return _far_blocks_match_spec(
        backend, case, blocks,
        lambda key_cache, value_cache: kv_ops.write_kv(case.key, case.value, key_cache, value_cache, small,
                                                       kv_layout=case.kv_layout, k_scale=case.k_scale,
                                                       v_scale=case.v_scale),
        lambda key_cache, value_cache: backend.write_kv(
            backend.to_device(case.key), backend.to_device(case.value), key_cache, value_cache,
            case.slot_mapping_for(backend), kv_layout=case.kv_layout, k_scale=case.k_scale,
            v_scale=case.v_scale),
        "write_kv past element 2**31 differs from the spec in the blocks written", call)


def far_copy_blocks_matches_spec(backend: Backend, case: CopyBlocksCase) -> float:
    """copy_blocks past element 2**31 equals the spec's on every block named, bit for bit."""
    __tracebackhide__ = True
    _require_pool(backend, case.key_cache.size)
    blocks = np.unique(case.pairs.astype(np.int64))
    call = (f"[call: backend={backend.name} copy_blocks dtype={dtype_name(case.key_cache.dtype)}"
            f" kv_layout={case.kv_layout} caches of {case.key_cache.size:,} elements pairs={listed(case.pairs)}]")
    return _far_blocks_match_spec(
        backend, case, blocks,
        lambda key_cache, value_cache: kv_ops.copy_blocks(
            key_cache, value_cache, _remapped(case.pairs.astype(np.int64), blocks), kv_layout=case.kv_layout),
        lambda key_cache, value_cache: backend.copy_blocks(key_cache, value_cache, backend.to_device(case.pairs),
                                                           kv_layout=case.kv_layout),
        "copy_blocks past element 2**31 differs from the spec", call)


Check = Callable[[Backend, Any], float]

#: Every check a cell runs, by name (saved cases record the name; ``replay`` looks it up here).
CHECKS: dict[str, Check] = {check.__name__: check for check in (
    matches_spec, matches_spec_by_distinct_blocks, garbage_ignored, nonfinite_propagates, nonfinite_scores_propagate,
    minus_inf_rows_are_empty, relocation_invariant,
    deterministic, alone_equals_batch,
    plan_serves_many_runs, replay_matches_eager, run_follows_callers_stream, step_writes_then_attends,
    runs_hold_no_memory, many_plans_stay_independent,
    write_kv_matches_spec, copy_blocks_matches_spec, merge_states_matches_spec,
    write_kv_follows_callers_stream, copy_blocks_follows_callers_stream, merge_states_follows_callers_stream,
    far_pool_matches_spec, far_write_kv_matches_spec, far_copy_blocks_matches_spec, far_rows_match_spec,
    far_merge_rows_match_spec, far_partials_match_spec, far_scores_match_spec, far_scores_past_uint32_match_spec,
    long_chunks_match_spec,
)}
