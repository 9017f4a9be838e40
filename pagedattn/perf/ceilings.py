"""The two ceilings of the roofline, measured in the same run as the cases they judge.

Read bandwidth: a float32 sum over a buffer many times the last-level cache (bytes read
over time). Matrix rate: a square bf16 matrix product on the GPU (``2 n^3`` FLOPs over
time); on the CPU a float32 NumPy product, and the figures say so. On the GPU both are
timed as the cases are (:func:`pagedattn.perf.timing.measure`: batches of queued runs
between two synchronizations, median), so a host gap or one slow call moves neither.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pagedattn.perf import timing


@dataclass(frozen=True)
class Ceilings:
    """Measured ceilings of one device, and how they were measured."""

    device: str
    read_bytes_per_s: float
    matmul_flops_per_s: float
    how: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _median_seconds(fn: Callable[[], object], synchronize: Callable[[], None], repeats: int) -> float:
    fn()
    synchronize()
    samples = []
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        fn()
        synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def measure_gpu(read_gib: float = 2.0, matmul_n: int = 8192,
                policy: timing.TimingPolicy = timing.GPU_POLICY) -> Ceilings:
    """Ceilings of CUDA device 0 through torch: a float32 sum of ``read_gib`` GiB, a bf16 n^3 product."""
    import torch

    sync = torch.cuda.synchronize
    x = torch.randn(int(read_gib * 2**30) // 4, dtype=torch.float32, device="cuda")
    read = timing.measure(lambda _: x.sum(), sync, policy=policy)
    read_bytes = x.numel() * 4
    a = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(matmul_n, matmul_n, dtype=torch.bfloat16, device="cuda")
    mm = timing.measure(lambda _: a @ b, sync, policy=policy)
    torch.cuda.empty_cache()
    return Ceilings(
        device=str(torch.cuda.get_device_name(0)),
        read_bytes_per_s=read_bytes / read.median_s,
        matmul_flops_per_s=2 * matmul_n**3 / mm.median_s,
        how=f"torch.sum over {read_gib:g} GiB float32; bf16 {matmul_n}^3 matmul; median of {len(read.samples_s)} "
            f"and {len(mm.samples_s)} batches of {read.runs_per_batch} and {mm.runs_per_batch} runs",
    )


def measure_cpu(read_mib: int = 256, matmul_n: int = 1024, repeats: int = 5) -> Ceilings:
    """Ceilings of the CPU through NumPy: a float32 sum of ``read_mib`` MiB, a float32 n^3 product."""
    from pagedattn.perf.device import cpu_name

    x = np.random.default_rng(0).standard_normal(read_mib * 2**20 // 4, dtype=np.float32)
    read_s = _median_seconds(lambda: x.sum(), lambda: None, repeats)
    a = np.random.default_rng(1).standard_normal((matmul_n, matmul_n), dtype=np.float32)
    mm_s = _median_seconds(lambda: a @ a, lambda: None, repeats)
    return Ceilings(
        device=f"cpu: {cpu_name()}",
        read_bytes_per_s=x.nbytes / read_s,
        matmul_flops_per_s=2 * matmul_n**3 / mm_s,
        how=f"numpy sum over {read_mib} MiB float32; float32 {matmul_n}^3 matmul (CPU figures); median of {repeats}",
    )
