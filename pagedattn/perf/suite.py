"""What the pytest-benchmark files share: the cases per device, prepared runs, the figures.

A prepared run plans a case once per rotation through the Backend interface and returns
a function doing one ``run`` and ``synchronize``, so pytest-benchmark's timer is a
synchronized timer; the rotation advances on every call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from pagedattn.backends.interface import Backend
from pagedattn.perf import gpu_state, inputs, shapes
from pagedattn.perf.ceilings import Ceilings
from pagedattn.perf.measure import DevicePool, case_work
from pagedattn.perf.roofline import Work

#: Cases of the regression suite: few, covering decode (small and large), GQA/MQA, softcap, mixed.
GPU_CASES: tuple[str, ...] = (
    "llama3-8b/decode/b8/ctx1024/bs16",
    "llama3-8b/decode/b64/ctx4096/bs16",
    "llama3-8b/decode/b64/ctx4096/bs64",
    "llama3-70b-tp8/decode/b64/ctx16384/bs16",
    "gemma2-9b/decode/b32/ctx4096/bs16",
    "llama3-8b/mixed/b64/ctx4096/bs16",
    "llama3-8b/prefill/b4/ctx1024/bs16",
)
CPU_CASES: tuple[str, ...] = (
    "llama3-8b/decode/b4/ctx256/bs16",
    "llama3-70b-tp8/decode/b8/ctx1024/bs16",
)
GPU_FLUSH_BYTES = 256 << 20
CPU_FLUSH_BYTES = 64 << 20


def suite_cases(on_gpu: bool) -> list[shapes.Case]:
    """The regression suite's cases for this kind of device."""
    return shapes.resolve(GPU_CASES) if on_gpu else shapes.resolve(CPU_CASES, dtype="float32")


@dataclass
class PreparedRun:
    """One case planned on one backend: ``step()`` queues the next rotation's run, ``call()`` also synchronizes."""

    step: Callable[[], Any]
    synchronize: Callable[[], Any]
    work: Work
    rotations: int

    def call(self) -> None:
        self.step()
        self.synchronize()

    def warm_up(self) -> None:
        """Run every rotation at least once (twice at least): compiles and touches the inputs before timing."""
        for _ in range(max(2, self.rotations)):
            self.call()

    def batch(self, runs: int) -> Callable[[], None]:
        """A call queuing ``runs`` runs back to back and synchronizing once (amortizes the synchronization)."""

        def call() -> None:
            for _ in range(runs):
                self.step()
            self.synchronize()

        return call


@functools.lru_cache(maxsize=2)
def _pool(case_key: tuple[object, ...], case: shapes.Case, flush_bytes: int) -> inputs.Pool:
    return inputs.make_pool(case, inputs.rotations_for(case, flush_bytes))


def prepare(backend: Backend, case: shapes.Case, flush_bytes: int, input_kind: str = "torch") -> PreparedRun:
    """Upload the case's pool (torch tensors where the backend takes them, unless
    ``input_kind="native"``), plan each rotation, and return the timed call."""
    pool = _pool(inputs.pool_key(case), case, flush_bytes)
    device_pool = DevicePool(backend, pool, input_kind)
    kc, vc = device_pool.caches(case)
    plans = device_pool.plans(backend, case)
    counter = [0]

    def step() -> None:
        r = counter[0] % pool.rotations
        counter[0] += 1
        backend.run(plans[r], device_pool.queries[r], kc, vc)

    return PreparedRun(step, backend.synchronize, case_work(case, pool), pool.rotations)


def extra_info(work: Work, median_s: float, ceilings: Ceilings) -> dict[str, Any]:
    """GB/s, TFLOP/s and % of the roofline floor of one median time."""
    floor = work.floor_seconds(ceilings.read_bytes_per_s, ceilings.matmul_flops_per_s)
    return {
        "bytes": work.bytes,
        "flops": work.flops,
        "gbps": work.bytes / median_s / 1e9,
        "tflops": work.flops / median_s / 1e12,
        "pct_of_ceiling": 100.0 * floor / median_s,
        "read_ceiling_gbps": ceilings.read_bytes_per_s / 1e9,
        "matmul_ceiling_tflops": ceilings.matmul_flops_per_s / 1e12,
        "device": ceilings.device,
    }


@contextmanager
def settled_rounds(benchmark: Any) -> Iterator[gpu_state.Sampled]:
    """Let the GPU settle, then sample it while the block times ``benchmark``'s rounds (as the
    bench times a cell: :func:`pagedattn.perf.gpu_state.sampling`); the summary goes to
    ``extra_info["gpu_state"]`` (None without NVML or a GPU)."""
    with gpu_state.sampling(gpu_state.nvml_gpu()) as sampled:
        yield sampled
    benchmark.extra_info["gpu_state"] = None if sampled.state is None else asdict(sampled.state)
