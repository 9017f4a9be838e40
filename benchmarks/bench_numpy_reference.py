"""The NumPy reference's benchmark (issue 2): decode, 8 sequences of 2,048 tokens, 32 query
heads, 8 KV heads, head_dim 128, float32, block size 16."""

from __future__ import annotations

from typing import Any

import pytest

from pagedattn.perf import shapes, suite
from pagedattn.perf.ceilings import Ceilings

CASE = shapes.Case(shapes.MODELS["llama3-8b"], "decode", batch=8, context=2048, block_size=16, dtype="float32")


@pytest.mark.benchmark(group="numpy/float32/bs16")
def test_numpy_reference_decode(benchmark: Any, cpu_ceilings: Ceilings) -> None:
    from pagedattn.backends.registry import load_backend

    prepared = suite.prepare(load_backend("numpy"), CASE, suite.CPU_FLUSH_BYTES)
    benchmark.pedantic(prepared.call, rounds=5, warmup_rounds=1)
    benchmark.extra_info.update(suite.extra_info(prepared.work, benchmark.stats.stats.median, cpu_ceilings))
    benchmark.extra_info["case"] = CASE.name
    assert prepared.work.visible_pairs == 8 * 2048
