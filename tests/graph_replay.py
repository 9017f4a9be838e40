"""CUDA-graph capture and replay of a backend's ``run``, shared by the GPU backends' ``gpu`` tests.

An engine captures ``run`` once per plan and replays the graph after writing new query/K/V
contents into the captured buffers. :func:`replay_matches_eager` does exactly that on torch
CUDA tensors and returns what the tests compare: the replay's outputs and those of an eager
``run`` on the same new contents (bit for bit), and the replay's output before the new
contents (which must differ, or the replay did not recompute).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.backends.bitviews import numpy_to_torch, torch_bits
from pagedattn.backends.interface import Backend
from pagedattn.spec.pools import random_paged_inputs

#: name -> (seq_lens, q_lens): decode, varlen prefill, a mixed batch, and long decode whose
#: plan splits the key ranges (split-KV partials and a merge inside the graph)
GRAPH_SHAPES: dict[str, tuple[list[int], list[int] | None]] = {
    "decode": ([300, 2048, 17, 1000, 1], None),
    "varlen prefill": ([300, 700, 64], [300, 500, 64]),
    "mixed": ([900, 300, 40, 2000], [1, 120, 40, 1]),
    "long decode (split-KV)": ([32768, 16384], None),
}


def gpu_reason() -> str | None:
    """Why CUDA-graph tests cannot run here (None: they can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device: CUDA-graph capture needs a GPU"
    return None


def same_bits(a: Any, b: Any) -> bool:
    """Whether two torch tensors hold the same bits (NaN payloads included)."""
    import torch

    x, y = torch_bits(a), torch_bits(b)
    if x.dtype.is_floating_point:  # float32: compare as int32
        x, y = x.view(torch.int32), y.view(torch.int32)
    return bool(torch.equal(x, y))


def replay_matches_eager(
    backend: Backend, shape: str, *, dtype: str = "bfloat16", block_size: int = 16
) -> dict[str, Any]:
    """Plan ``GRAPH_SHAPES[shape]``, capture ``run`` in a CUDA graph, write new q/K/V contents
    into the captured tensors, replay; return the plan, the outputs before and after, and
    those of an eager run on the new contents."""
    import torch

    seq_lens, q_lens = GRAPH_SHAPES[shape]
    inputs = random_paged_inputs(
        seq_lens, q_lens, block_size=block_size, num_q_heads=32, num_kv_heads=8, head_dim=128,
        dtype=dtype, seed=11, garbage="nan",
    )
    device = torch.device("cuda", torch.cuda.current_device())
    q, k, v = (numpy_to_torch(x, device) for x in (inputs.query, inputs.key_cache, inputs.value_cache))
    index = [None if x is None else np.asarray(x) for x in inputs.args()[3:]]
    plan = backend.plan(q, k, v, *index, kv_layout=inputs.kv_layout, return_lse=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up away from the capture (compiles, first allocations)
        for _ in range(2):
            backend.run(plan, q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_graph, lse_graph = backend.run(plan, q, k, v)
    graph.replay()
    torch.cuda.synchronize()
    before = (out_graph.clone(), lse_graph.clone())
    generator = torch.Generator(device=device).manual_seed(5)
    for tensor in (q, k, v):  # new contents in the captured buffers (the garbage too)
        fresh = torch.randn(tensor.shape, generator=generator, device=device, dtype=torch.float32)
        tensor.copy_(fresh.to(tensor.dtype))
    graph.replay()
    torch.cuda.synchronize()
    replayed = (out_graph.clone(), lse_graph.clone())
    graph.replay()
    torch.cuda.synchronize()
    again = (out_graph.clone(), lse_graph.clone())
    eager = backend.run(plan, q, k, v)
    torch.cuda.synchronize()
    return {"plan": plan, "before": before, "replayed": replayed, "again": again, "eager": eager}


def assert_replay_matches_eager(result: dict[str, Any]) -> None:
    """The checks every backend's capture test makes on :func:`replay_matches_eager`."""
    plan = result["plan"]
    assert plan.capturable, "the plan says run cannot be captured"
    assert plan.fixed_in_graph, "the plan must say what a capture holds fixed"
    for name, index in (("out", 0), ("lse", 1)):
        replayed, eager = result["replayed"][index], result["eager"][index]
        assert same_bits(replayed, eager), f"{name}: the replay differs from an eager run"
        assert same_bits(result["again"][index], replayed), f"{name}: two replays differ"
    assert not same_bits(result["before"][0], result["replayed"][0]), (
        "the replay's output did not change with new query/K/V contents"
    )
