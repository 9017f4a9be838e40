"""``gpu``: the triton backend's ``run`` captured in a CUDA graph and replayed gives the bits of
an eager run on new query/K/V contents (decode, varlen prefill, mixed, split-KV).

Run without TRITON_INTERPRET (the interpreter runs on the CPU and cannot be captured)."""

from __future__ import annotations

import pytest
from graph_replay import GRAPH_SHAPES, assert_replay_matches_eager, gpu_reason, replay_matches_eager

from pagedattn.backends.triton.backend import TritonBackend, interpreter_mode


def _reason() -> str | None:
    if interpreter_mode():
        return "TRITON_INTERPRET is set: Triton runs on the CPU, which a CUDA graph cannot capture"
    return gpu_reason() or TritonBackend.availability()


REASON = _reason()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


@pytest.mark.parametrize("block_size", [16, 64], ids=lambda b: f"bs{b}")
@pytest.mark.parametrize("shape", list(GRAPH_SHAPES))
def test_triton_replay_equals_an_eager_run(shape: str, block_size: int) -> None:
    assert_replay_matches_eager(replay_matches_eager(TritonBackend(), shape, block_size=block_size))


def test_triton_forced_splits_replay_with_the_plans_partials() -> None:
    result = replay_matches_eager(TritonBackend(num_splits=4), "varlen prefill")
    assert result["plan"].state.num_splits == 4
    assert_replay_matches_eager(result)
