"""One measurement: a case on a backend (through the Backend interface) or on a peer.

A backend receives the pool's caches once (``to_device``), views them at each block size,
plans once per rotation, and only ``run`` is timed. Figures: GB/s and TFLOP/s from
:mod:`pagedattn.perf.roofline`, and % of ceiling = roofline floor / measured time with the
ceilings of :mod:`pagedattn.perf.ceilings`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pagedattn.backends.interface import Backend, Plan
from pagedattn.errors import UnsupportedError
from pagedattn.perf import inputs, timing
from pagedattn.perf.ceilings import Ceilings
from pagedattn.perf.roofline import Work, work
from pagedattn.perf.shapes import Case
from pagedattn.spec.arrays import check_paged_attention


@dataclass
class Result:
    """One row of the report. ``status`` is ``ok``, ``unsupported`` or ``error`` (see ``reason``)."""

    runner: str
    case: str
    model: str
    kind: str
    batch: int
    context: int
    block_size: int
    dtype: str
    status: str
    reason: str = ""
    seconds: float | None = None
    bytes: int = 0
    flops: int = 0
    gbps: float | None = None
    tflops: float | None = None
    pct_of_ceiling: float | None = None
    ratio_to_reference: float | None = None
    rotations: int = 1
    samples_s: list[float] = field(default_factory=list)
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def case_work(case: Case, pool: inputs.Pool) -> Work:
    """The spec's work of ``case`` (rotation 0; every rotation has the same)."""
    call = inputs.attention_case(case, pool, 0)
    return work(check_paged_attention(*call.args(), **call.options))


def _result(runner: str, case: Case, status: str, **fields: Any) -> Result:
    return Result(runner=runner, case=case.name, model=case.model.name, kind=case.kind, batch=case.batch,
                  context=case.context, block_size=case.block_size, dtype=case.dtype, status=status, **fields)


def figures(runner: str, case: Case, seconds: timing.Timing, w: Work, ceilings: Ceilings, rotations: int,
            detail: str = "") -> Result:
    """A successful measurement's row: throughput and % of the roofline floor."""
    t = seconds.median_s
    floor = w.floor_seconds(ceilings.read_bytes_per_s, ceilings.matmul_flops_per_s)
    return _result(runner, case, "ok", seconds=t, bytes=w.bytes, flops=w.flops, gbps=w.bytes / t / 1e9,
                   tflops=w.flops / t / 1e12, pct_of_ceiling=100.0 * floor / t, rotations=rotations,
                   samples_s=seconds.samples_s, detail=detail)


def measure_peer_group(peer: Any, cases: Sequence[Case], rotations: int, works: Mapping[Case, Work],
                       ceilings: Ceilings, policy: timing.TimingPolicy) -> list[Result]:
    """Time ``peer`` on cases that differ only in block size (one pool).

    A peer whose ``uses_block_size`` is False (its inputs have no blocks: unpaged SDPA) is
    timed once, on the first case, and that time stands for every block size, so the
    reference of a shape does not carry the noise of three separate measurements.
    """
    if getattr(peer, "uses_block_size", True) or not cases:
        return [measure_peer(peer, case, rotations, works[case], ceilings, policy) for case in cases]
    first = measure_peer(peer, cases[0], rotations, works[cases[0]], ceilings, policy)
    return [first] + [restate(first, case, works[case], ceilings) for case in cases[1:]]


def restate(measured: Result, case: Case, w: Work, ceilings: Ceilings) -> Result:
    """``measured`` (a peer's row of another block size of the same shape) as ``case``'s row."""
    if measured.status != "ok" or measured.seconds is None:
        return _result(measured.runner, case, measured.status, reason=measured.reason, detail=measured.detail)
    detail = f"{measured.detail}; timed once per shape (bs{measured.block_size} row)".lstrip("; ")
    return figures(measured.runner, case, timing.Timing(measured.seconds, measured.samples_s, 1), w, ceilings,
                   measured.rotations, detail)


class DevicePool:
    """A pool's caches on one backend's device, viewed at any block size."""

    def __init__(self, backend: Backend, pool: inputs.Pool) -> None:
        self.pool = pool
        self.key_cache = backend.to_device(pool.key_cache)
        self.value_cache = backend.to_device(pool.value_cache)
        self.queries = [backend.to_device(q) for q in pool.queries]

    def caches(self, case: Case) -> tuple[Any, Any]:
        shape = inputs.cache_shape(case, self.pool)
        return self.key_cache.reshape(shape), self.value_cache.reshape(shape)

    def plans(self, backend: Backend, case: Case) -> list[Plan]:
        """``case`` planned once per rotation on the caches of :meth:`caches`."""
        kc, vc = self.caches(case)
        plans = []
        for r in range(self.pool.rotations):
            call = inputs.attention_case(case, self.pool, r)
            plans.append(backend.plan(self.queries[r], kc, vc, call.block_tables, call.seq_lens,
                                      call.query_start_loc, **call.options))
        return plans


def measure_backend(backend: Backend, case: Case, device_pool: DevicePool, w: Work, ceilings: Ceilings,
                    policy: timing.TimingPolicy) -> Result:
    """Plan ``case`` once per rotation, time ``run``; unsupported or failing cases become rows."""
    pool = device_pool.pool
    try:
        kc, vc = device_pool.caches(case)
        plans = device_pool.plans(backend, case)

        def run(i: int) -> Any:
            r = i % pool.rotations
            return backend.run(plans[r], device_pool.queries[r], kc, vc)

        measured = timing.measure(run, backend.synchronize, rotations=pool.rotations, policy=policy)
    except UnsupportedError as error:
        return _result(backend.name, case, "unsupported", reason=str(error))
    except Exception as error:  # a failing backend is reported, and the run goes on
        return _result(backend.name, case, "error", reason=f"{type(error).__name__}: {error}"[:300])
    return figures(backend.name, case, measured, w, ceilings, pool.rotations)


def measure_peer(peer: Any, case: Case, rotations: int, w: Work, ceilings: Ceilings,
                 policy: timing.TimingPolicy) -> Result:
    """Time a peer of :mod:`pagedattn.perf.peers` on ``case``."""
    try:
        start = time.perf_counter()
        run = peer.prepare(case, rotations)
        measured = timing.measure(run, peer.synchronize, rotations=rotations, policy=policy)
        detail = getattr(peer, "kernel", "") or f"prepare {time.perf_counter() - start:.1f} s"
    except UnsupportedError as error:
        return _result(peer.name, case, "unsupported", reason=error.problem)
    except Exception as error:
        return _result(peer.name, case, "error", reason=f"{type(error).__name__}: {error}"[:300])
    finally:
        _release_gpu_cache()
    return figures(peer.name, case, measured, w, ceilings, rotations, detail)


def _release_gpu_cache() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
