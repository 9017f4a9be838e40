"""What a triton plan fixes for its runs (CPU, interpreter): the partial buffers and launch
constants are made once by ``plan`` and reused by every ``run``; the plan says it is capturable
and what a capture holds fixed. The real capture is ``test_triton_graphs.py`` (``gpu``)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

if importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None:
    pytest.skip("triton and torch are needed (pip install 'pagedattn[triton]')", allow_module_level=True)

from triton_mode import interpreter_setting

os.environ.setdefault("TRITON_INTERPRET", interpreter_setting())  # before any kernel module is imported

from pagedattn.backends.bitviews import numpy_to_torch, torch_bits
from pagedattn.backends.numpy.backend import NumpyBackend
from pagedattn.backends.triton.backend import TritonBackend
from pagedattn.spec.pools import random_paged_inputs


def _plan_and_tensors(backend, **options):  # type: ignore[no-untyped-def]
    inputs = random_paged_inputs([70, 33], [5, 3], block_size=16, num_q_heads=4, num_kv_heads=2, head_dim=16,
                                 seed=2, garbage="nan")
    q, k, v = (numpy_to_torch(x, "cpu") for x in inputs.args()[:3])
    plan = backend.plan(q, k, v, inputs.block_tables, inputs.seq_lens, inputs.query_start_loc,
                        return_lse=True, **options)
    return plan, q, k, v


def test_runs_reuse_the_partials_and_constants_the_plan_made() -> None:
    plan, q, k, v = _plan_and_tensors(TritonBackend(num_splits=3))
    state = plan.state
    part_out, part_lse, tail = state.part_out, state.part_lse, state.tail_args
    assert tuple(part_out.shape) == (3, 8, 4, 16) and tuple(part_lse.shape) == (3, 8, 4)
    first = TritonBackend(num_splits=3).run(plan, q, k, v)
    second = TritonBackend(num_splits=3).run(plan, q, k, v)
    assert state.part_out is part_out and state.part_lse is part_lse and state.tail_args is tail
    assert all(bool((torch_bits(a) == torch_bits(b)).all()) for a, b in zip(first, second, strict=True))
    assert not np.isnan(first[0].numpy()).any()


def test_the_plan_says_it_is_capturable_and_what_a_capture_fixes() -> None:
    plan, *_ = _plan_and_tensors(TritonBackend())
    assert plan.capturable
    assert any("partial" in line for line in plan.fixed_in_graph)
    assert any("block_tables" in line for line in plan.fixed_in_graph)


def test_a_backend_that_says_nothing_is_not_capturable() -> None:
    inputs = random_paged_inputs([20], block_size=16, num_q_heads=4, num_kv_heads=2, head_dim=16)
    plan = NumpyBackend().plan(*inputs.args())
    assert not plan.capturable and plan.fixed_in_graph == ()


def test_each_work_record_holds_its_sequence_first_query_and_lengths() -> None:
    """A program reads its work item from one record: (sequence, first query within it, L,
    the sequence's first token, q_len), longest key range first."""
    inputs = random_paged_inputs([70, 33, 150], [5, 33, 1], block_size=16, num_q_heads=4, num_kv_heads=2,
                                 head_dim=16, seed=3)
    q, k, v = (numpy_to_torch(x, "cpu") for x in inputs.args()[:3])
    plan = TritonBackend().plan(q, k, v, inputs.block_tables, inputs.seq_lens, inputs.query_start_loc)
    records = plan.state.work.numpy()
    tiles = plan.state.tiles
    starts = inputs.query_start_loc
    q_lens = np.diff(starts)
    expected = {(s, j, int(inputs.seq_lens[s]), int(starts[s]), int(q_lens[s]))
                for s in range(3) for j in range(0, int(q_lens[s]), tiles.block_q)}
    assert {tuple(int(x) for x in row) for row in records} == expected and len(records) == len(expected)
    ends = records[:, 2] - records[:, 4] + np.minimum(records[:, 1] + tiles.block_q, records[:, 4])  # causal
    assert (np.diff(-(-ends // tiles.block_n)) <= 0).all()
