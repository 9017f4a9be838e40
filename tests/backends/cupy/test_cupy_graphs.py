"""``gpu``: the cupy backend's ``run`` on torch CUDA tensors, captured in a torch CUDA graph and
replayed, gives the bits of an eager run on new query/K/V contents (decode, varlen prefill,
mixed, split-KV); every kernel choice a plan can make is captured."""

from __future__ import annotations

import pytest
from graph_replay import GRAPH_SHAPES, assert_replay_matches_eager, gpu_reason, replay_matches_eager

from pagedattn.backends.cupy.backend import CupyBackend

REASON = gpu_reason() or CupyBackend.availability()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


@pytest.mark.parametrize("block_size", [16, 64], ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("shape", list(GRAPH_SHAPES))
def test_cupy_replay_equals_an_eager_run(shape: str, block_size: int) -> None:
    assert_replay_matches_eager(replay_matches_eager(CupyBackend(), shape, block_size=block_size))


@pytest.mark.parametrize(
    "options",
    [{"decode": "simt"}, {"prefill": "mma"}, {"prefill": "wgmma"}, {"split_kv": False}, {"merge": "kernel"}],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
@pytest.mark.parametrize("shape", ["decode", "varlen prefill", "long decode (split-KV)"])
def test_cupy_replay_with_each_kernel_choice(options: dict, shape: str) -> None:
    assert_replay_matches_eager(replay_matches_eager(CupyBackend(**options), shape))


def test_a_synchronising_plan_says_it_cannot_be_captured() -> None:
    import numpy as np

    from pagedattn.backends.bitviews import numpy_to_torch
    from pagedattn.spec.pools import random_paged_inputs

    inputs = random_paged_inputs([40], block_size=16, num_q_heads=8, num_kv_heads=2, head_dim=64,
                                 dtype="bfloat16")
    q, k, v = (numpy_to_torch(x, "cuda") for x in inputs.args()[:3])
    plan = CupyBackend(sync=True).plan(q, k, v, np.asarray(inputs.block_tables), np.asarray(inputs.seq_lens))
    assert not plan.capturable
