"""A peer without blocks is timed once per shape; a paged peer once per block size."""

from __future__ import annotations

from typing import Any

import pytest

from pagedattn.perf import inputs, shapes, timing
from pagedattn.perf.ceilings import Ceilings
from pagedattn.perf.measure import case_work, measure_peer_group

CASES = shapes.cases(["llama3-8b"], ["decode"], [2], [64], dtype="float32")  # block sizes 16, 32, 64
POLICY = timing.TimingPolicy(target_batch_s=0.0, budget_s=0.01, min_repeats=2, max_repeats=3)


class FakePeer:
    """Counts prepare calls; a run does a little CPU work."""

    name = "fake"

    def __init__(self, uses_block_size: bool) -> None:
        self.uses_block_size = uses_block_size
        self.prepared: list[int] = []

    def prepare(self, case: shapes.Case, rotations: int) -> Any:
        self.prepared.append(case.block_size)
        return lambda i: sum(range(1000))

    def synchronize(self) -> None:
        return None


@pytest.fixture(scope="module")
def works() -> dict[shapes.Case, Any]:
    pool = inputs.make_pool(CASES[0], 1)
    return {case: case_work(case, pool) for case in CASES}


def ceilings() -> Ceilings:
    return Ceilings(read_bytes_per_s=1e10, matmul_flops_per_s=1e11, device="test", how="made up")


def test_a_peer_without_blocks_is_timed_once_and_restated_per_block_size(works: dict[shapes.Case, Any]) -> None:
    peer = FakePeer(uses_block_size=False)
    rows = measure_peer_group(peer, CASES, 1, works, ceilings(), POLICY)
    assert peer.prepared == [16]
    assert [r.block_size for r in rows] == [16, 32, 64] and [r.case for r in rows] == [c.name for c in CASES]
    assert all(r.status == "ok" and r.seconds == rows[0].seconds for r in rows)
    for r, c in zip(rows, CASES, strict=True):
        assert r.gbps == pytest.approx(works[c].bytes / (r.seconds or 1) / 1e9), "figures from the case's own work"
    assert "timed once per shape" in rows[1].detail


def test_a_paged_peer_is_timed_at_every_block_size(works: dict[shapes.Case, Any]) -> None:
    peer = FakePeer(uses_block_size=True)
    rows = measure_peer_group(peer, CASES, 1, works, ceilings(), POLICY)
    assert peer.prepared == [16, 32, 64] and all(r.status == "ok" for r in rows)
