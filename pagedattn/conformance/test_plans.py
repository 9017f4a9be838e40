"""How an engine uses a backend: a plan serves many runs (planned once per batch beside other
plans, run once per layer on that layer's query and caches, captured in a CUDA graph and
replayed, run on the engine's own stream, run step after step without holding memory, kept
beside as many plans as an engine keeps for its CUDA graphs), and a step writes its newest keys
and values before it attends.

Each cell draws the ``combined`` row of the strategies (every declared feature at random), a
block size and a KV layout the backend declares, and checks it with
:func:`~pagedattn.conformance.checks.plan_serves_many_runs`,
:func:`~pagedattn.conformance.checks.replay_matches_eager` (on a CUDA device),
:func:`~pagedattn.conformance.checks.run_follows_callers_stream` (on a CUDA device),
:func:`~pagedattn.conformance.checks.step_writes_then_attends`,
:func:`~pagedattn.conformance.checks.runs_hold_no_memory` or
:func:`~pagedattn.conformance.checks.many_plans_stay_independent`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import strategies as st

from pagedattn.backends.capabilities import Capabilities
from pagedattn.backends.interface import Backend
from pagedattn.conformance import another_gpu, checks
from pagedattn.conformance.cases import AttentionCase
from pagedattn.conformance.runner import run_property
from pagedattn.conformance.strategies import CONTRACT_BLOCK_SIZES, attention_cases
from pagedattn.spec.dtypes import QUERY_DTYPES

pytestmark = pytest.mark.pagedattn_conformance


def planned_cases(capabilities: Capabilities, *, dtype: str) -> st.SearchStrategy[AttentionCase]:
    """Return a strategy for a ``combined`` attention case of ``dtype`` in any declared block size and layout."""
    block_sizes = tuple(capabilities.block_sizes or CONTRACT_BLOCK_SIZES)
    return st.tuples(st.sampled_from(block_sizes), st.sampled_from(tuple(capabilities.kv_layouts))).flatmap(
        lambda drawn: attention_cases(capabilities, dtype=dtype, block_size=drawn[0], kv_layout=drawn[1]))


def _run_plan_cell(request: Any, backend: Backend, dtype: str, check: Callable[[Backend, AttentionCase], float],
                   **requires: Any) -> None:
    """``check`` on :func:`planned_cases` of ``dtype``; ``requires`` adds to what the cell requires beyond it."""
    run_property(
        request, backend, lambda: planned_cases(backend.capabilities(), dtype=dtype), check,
        cell={"feature": check.__name__, "dtype": dtype, "block_size": "-", "kv_layout": "-"},
        requires={"dtype": dtype, **requires},
    )


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_a_plan_serves_many_runs(request, backend, dtype):
    """A plan run on one layer's arrays, then (after another plan's run) on the next layer's query
    and caches: every run within the error model of its own inputs, and an earlier run's out and
    lse left as they were."""
    _run_plan_cell(request, backend, dtype, checks.plan_serves_many_runs)


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_a_captured_run_replays_new_contents(request, backend, dtype):
    """A run of a capturable plan captured in a CUDA graph and replayed after the next layer's query
    and caches are written into its arrays: the bits of an eager run on those contents, within the
    error model. Unsupported off CUDA and for plans that are not capturable."""
    _run_plan_cell(request, backend, dtype, checks.replay_matches_eager, device="cuda")


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_a_run_follows_the_callers_stream(request, backend, dtype):
    """A plan run on a side stream of torch's, behind a delay and after the next layer's query and
    caches are written into its arrays there, its output copied there: the bits of an eager run on
    those contents, within the error model. Unsupported off CUDA and for backends that do not take
    torch CUDA tensors."""
    _run_plan_cell(request, backend, dtype, checks.run_follows_callers_stream, device="cuda")


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_a_call_on_another_gpu_matches_spec(request, backend, dtype):
    """Every array on a GPU other than the current one (an engine that splits a model's layers over
    GPUs): the spec's answer, returned on that GPU, the current device unchanged. Unsupported with
    fewer than two GPUs, and for backends that run only on the current device."""
    _run_plan_cell(request, backend, dtype, another_gpu.attention_on_another_gpu, device="cuda")


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_a_step_writes_then_attends(request, backend, dtype):
    """write_kv of the batch's newest tokens, then attention on the same caches with no
    synchronisation between: the attention sees the written keys and values."""
    _run_plan_cell(request, backend, dtype, checks.step_writes_then_attends, features=("write_kv",))


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_runs_hold_no_memory(request, backend, dtype):
    """A plan run step after step on arrays allocated anew and dropped after each step: the dropped
    arrays freed, the memory in use grows by less than one run's out and lse, the runs within the
    error model."""
    _run_plan_cell(request, backend, dtype, checks.runs_hold_no_memory)


@pytest.mark.parametrize("dtype", QUERY_DTYPES)
def test_many_plans_stay_independent(request, backend, dtype):
    """A plan run, 66 more plans made and kept (one per CUDA-graph capture size an engine keeps), then
    the first plan run again: its first run's bits, every run within the error model."""
    _run_plan_cell(request, backend, dtype, checks.many_plans_stay_independent)
