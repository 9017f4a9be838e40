"""Timing device work: warm-up, synchronized host timers around batches of runs, medians.

Work is queued asynchronously, so every timed batch starts and ends with the backend's
``synchronize``; a batch holds enough runs to last ``target_batch_s`` (amortizing the
synchronization), and the reported time is the median over batches of the time per run.
On a GPU a batch lasts 20 ms: the first run of a batch starts only when the host has
launched it, so that launch's host time (tens of microseconds for a Python backend) is
part of each batch; at 20 ms it weighs well under 1 % of a 250 us decode call (at 2 ms it
would weigh 2-3 %, and more for a backend with more host work).
Runs rotate over ``rotations`` input sets (see :mod:`pagedattn.perf.inputs`).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class TimingPolicy:
    """How long to time: per-batch target, total budget and the repeat bounds."""

    target_batch_s: float = 20e-3
    budget_s: float = 0.25
    min_repeats: int = 5
    max_repeats: int = 100
    max_per_batch: int = 1000


GPU_POLICY = TimingPolicy()
CPU_POLICY = TimingPolicy(target_batch_s=0.0, budget_s=0.5, min_repeats=3, max_repeats=20)


@dataclass(frozen=True)
class Timing:
    """Median seconds per run, the per-run time of every batch, and runs per batch."""

    median_s: float
    samples_s: list[float]
    runs_per_batch: int


def runs_per_batch(single_s: float, policy: TimingPolicy = GPU_POLICY) -> int:
    """Runs a timed batch holds so it lasts ``policy.target_batch_s`` (one run took ``single_s``)."""
    return max(1, min(policy.max_per_batch, math.ceil(policy.target_batch_s / max(single_s, 1e-7))))


def measure(run: Callable[[int], object], synchronize: Callable[[], None], *, rotations: int = 1,
            policy: TimingPolicy = GPU_POLICY) -> Timing:
    """Time ``run(i)`` (``i`` picks the input set, modulo ``rotations``) after a warm-up."""
    for i in range(max(2, rotations)):  # warm-up: compile, allocate, touch every input set once
        run(i)
    synchronize()
    start = time.perf_counter()
    run(0)
    synchronize()
    single = max(time.perf_counter() - start, 1e-7)
    per_batch = runs_per_batch(single, policy)
    repeats = max(policy.min_repeats, min(policy.max_repeats, int(policy.budget_s / (single * per_batch))))
    samples = []
    i = 1
    for _ in range(repeats):
        synchronize()
        start = time.perf_counter()
        for _ in range(per_batch):
            run(i)
            i += 1
        synchronize()
        samples.append((time.perf_counter() - start) / per_batch)
    return Timing(statistics.median(samples), samples, per_batch)
