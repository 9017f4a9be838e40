"""One measurement: a case on a backend (through the Backend interface) or on a peer.

A backend receives the pool's caches once (torch tensors where it takes them, else its own
``to_device`` arrays: :mod:`pagedattn.perf.engine`), views them at each block size, plans
once per rotation, and only ``run`` is timed, three ways (:func:`pagedattn.perf.timing.three_timings`):
one call with the L2 flushed, back to back, and CUDA-graph replay where the plan is
capturable. Figures: GB/s and TFLOP/s from :mod:`pagedattn.perf.roofline`, and % of ceiling
= roofline floor / measured time with the ceilings of :mod:`pagedattn.perf.ceilings`, of the
back-to-back time (``seconds``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from pagedattn.backends.interface import Backend, Plan
from pagedattn.errors import UnsupportedError
from pagedattn.perf import device, engine, gpu_state, inputs, timing
from pagedattn.perf.ceilings import Ceilings
from pagedattn.perf.gpu_state import GpuState
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
    seconds: float | None = None  # back to back
    one_call_s: float | None = None  # one call after an L2 flush
    graph_s: float | None = None  # per run, replaying a CUDA graph
    graph_note: str = ""  # why graph_s is None
    inputs: str = "native"  # what run received: torch tensors or the backend's own arrays
    bytes: int = 0
    flops: int = 0
    gbps: float | None = None
    tflops: float | None = None
    pct_of_ceiling: float | None = None
    ratio_to_reference: float | None = None
    rotations: int = 1
    samples_s: list[float] = field(default_factory=list)
    detail: str = ""
    cache_dtype: str = ""  # the K/V dtype of the case ("" read as ``dtype``)
    note: str = ""  # what a peer ran differently from the case (fp8 K/V in the query's dtype)
    gpu_state: GpuState | None = None  # what NVML saw while the row was timed (None: not sampled)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def case_work(case: Case, pool: inputs.Pool) -> Work:
    """The spec's work of ``case`` (rotation 0; every rotation has the same)."""
    call = inputs.attention_case(case, pool, 0)
    return work(check_paged_attention(*call.args(), **call.options))


def _result(runner: str, case: Case, status: str, **fields: Any) -> Result:
    return Result(runner=runner, case=case.name, model=case.model.name, kind=case.kind, batch=case.batch,
                  context=case.context, block_size=case.block_size, dtype=case.dtype, status=status,
                  cache_dtype=case.cache_dtype, **fields)


def figures(runner: str, case: Case, seconds: timing.Timing, w: Work, ceilings: Ceilings, rotations: int,
            detail: str = "", three: timing.ThreeTimings | None = None, input_kind: str = "native") -> Result:
    """A successful measurement's row: throughput and % of the roofline floor of ``seconds``
    (back to back), and the one-call and graph times of ``three`` when given."""
    t = seconds.median_s
    floor = w.floor_seconds(ceilings.read_bytes_per_s, ceilings.matmul_flops_per_s)
    extra: dict[str, Any] = {}
    if three is not None:
        extra = dict(one_call_s=three.one_call.median_s,
                     graph_s=None if three.graph is None else three.graph.median_s, graph_note=three.graph_note)
    return _result(runner, case, "ok", seconds=t, bytes=w.bytes, flops=w.flops, gbps=w.bytes / t / 1e9,
                   tflops=w.flops / t / 1e12, pct_of_ceiling=100.0 * floor / t, rotations=rotations,
                   samples_s=seconds.samples_s, detail=detail, inputs=input_kind, **extra)


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
        return _result(measured.runner, case, measured.status, reason=measured.reason, detail=measured.detail,
                       note=measured.note)
    detail = f"{measured.detail}; timed once per shape (bs{measured.block_size} row)".lstrip("; ")
    row = figures(measured.runner, case, timing.Timing(measured.seconds, measured.samples_s, 1), w, ceilings,
                  measured.rotations, detail, input_kind=measured.inputs)
    row.one_call_s, row.graph_s, row.graph_note = measured.one_call_s, measured.graph_s, measured.graph_note
    row.note, row.gpu_state = measured.note, measured.gpu_state
    return row


class DevicePool:
    """A pool's caches on one backend's device, viewed at any block size: torch tensors under
    ``input_kind="torch"`` where the backend takes them, else its own arrays."""

    def __init__(self, backend: Backend, pool: inputs.Pool, input_kind: str = "torch") -> None:
        self.pool = pool
        self.input_kind = "torch" if input_kind == "torch" and engine.takes_torch_cuda(backend) else "native"
        self.key_cache = engine.to_device(backend, pool.key_cache, input_kind)
        self.value_cache = engine.to_device(backend, pool.value_cache, input_kind)
        self.queries = [engine.to_device(backend, q, input_kind) for q in pool.queries]

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


def capture_for(capturable: bool, on_gpu: bool, why_not: str) -> tuple[Any, str]:
    """The capture function of :func:`~.timing.three_timings` and, when there is none, why."""
    if not on_gpu:
        return None, "no CUDA device"
    if not capturable:
        return None, why_not
    return engine.torch_graph_capture, ""


def measure_backend(backend: Backend, case: Case, device_pool: DevicePool, w: Work, ceilings: Ceilings,
                    policy: timing.TimingPolicy, on_gpu: bool | None = None) -> Result:
    """Plan ``case`` once per rotation, time ``run`` three ways; unsupported or failing cases
    become rows. ``on_gpu`` (default: the backend runs on CUDA) picks events and the L2 flush."""
    pool = device_pool.pool
    try:
        kc, vc = device_pool.caches(case)
        plans = device_pool.plans(backend, case)

        def run(i: int) -> Any:
            r = i % pool.rotations
            return backend.run(plans[r], device_pool.queries[r], kc, vc)

        gpu = backend.capabilities().device == "cuda" if on_gpu is None else on_gpu
        capture, why_not = capture_for(all(p.capturable for p in plans), gpu,
                                       f"{backend.name}: its plan is not capturable")
        with gpu_state.sampling(gpu_state.nvml_gpu() if gpu else None, settle_max_s=policy.settle_max_s) as sampled:
            three = timing.three_timings(run, backend.synchronize, marks=engine.marks(gpu, backend.synchronize),
                                         flush=engine.flusher(gpu), capture=capture, rotations=pool.rotations,
                                         policy=policy, graph_note=why_not)
    except UnsupportedError as error:
        return _result(backend.name, case, "unsupported", reason=str(error))
    except Exception as error:  # a failing backend is reported, and the run goes on
        return _result(backend.name, case, "error", reason=f"{type(error).__name__}: {error}"[:300])
    row = figures(backend.name, case, three.back_to_back, w, ceilings, pool.rotations, three=three,
                  input_kind=device_pool.input_kind)
    row.gpu_state = sampled.state
    return row


def measure_peer(peer: Any, case: Case, rotations: int, w: Work, ceilings: Ceilings,
                 policy: timing.TimingPolicy) -> Result:
    """Time a peer of :mod:`pagedattn.perf.peers` on ``case``, the three ways a backend is
    (on a GPU: events, L2 flush, graph replay where its ``capturable`` says so)."""
    try:
        start = time.perf_counter()
        run = peer.prepare(case, rotations)
        gpu = getattr(peer, "device", "cuda") == "cuda" and device.gpu_name() is not None
        capture, why_not = capture_for(getattr(peer, "capturable", False), gpu, f"{peer.name}: not captured here")
        with gpu_state.sampling(gpu_state.nvml_gpu() if gpu else None, settle_max_s=policy.settle_max_s) as sampled:
            three = timing.three_timings(run, peer.synchronize, marks=engine.marks(gpu, peer.synchronize),
                                         flush=engine.flusher(gpu), capture=capture, rotations=rotations,
                                         policy=policy, graph_note=why_not)
        measured = three.back_to_back
        detail = getattr(peer, "kernel", "") or f"prepare {time.perf_counter() - start:.1f} s"
    except UnsupportedError as error:
        return _result(peer.name, case, "unsupported", reason=error.problem)
    except Exception as error:
        return _result(peer.name, case, "error", reason=f"{type(error).__name__}: {error}"[:300])
    finally:
        _release_gpu_cache()
    row = figures(peer.name, case, measured, w, ceilings, rotations, detail, three=three, input_kind="torch")
    row.note = getattr(peer, "note", "")
    row.gpu_state = sampled.state
    return row


def _release_gpu_cache() -> None:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
