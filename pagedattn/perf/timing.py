"""Timing device work: warm-up, synchronized host timers around batches of runs, medians.

Work is queued asynchronously, so every timed batch starts and ends with the backend's
``synchronize``; a batch holds enough runs to last ``target_batch_s`` (amortizing the
synchronization), and the reported time is the median over batches of the time per run.
On a GPU a batch lasts 20 ms: the first run of a batch starts only when the host has
launched it, so that launch's host time (tens of microseconds for a Python backend) is
part of each batch; at 20 ms it weighs well under 1 % of a 250 us decode call (at 2 ms it
would weigh 2-3 %, and more for a backend with more host work). Runs rotate over
``rotations`` input sets (see :mod:`pagedattn.perf.inputs`).

What an engine sees is timed three ways (:func:`three_timings`): one call with the L2 cache
flushed before it (as ``triton.testing.do_bench`` does), calls back to back (:func:`measure`),
and the replay of a CUDA graph holding ``GRAPH_CALLS`` runs, where the runner can be captured.
A :class:`Marks` source times the first and the third: device events on a GPU (the time from
an event queued before the call to one queued after, which holds the host's launch time when
the device waits for it), a synchronised host clock elsewhere. :func:`host_time_per_call`
times the host alone.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from pagedattn.perf.gpu_state import SETTLE_MAX_S


@dataclass(frozen=True)
class TimingPolicy:
    """How long to time: per-batch target, total budget and the repeat bounds."""

    target_batch_s: float = 20e-3
    budget_s: float = 0.25
    min_repeats: int = 5
    max_repeats: int = 100
    max_per_batch: int = 1000
    settle_max_s: float = SETTLE_MAX_S  # longest wait for the GPU to settle before a case; 0: none


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


#: runs one captured CUDA graph holds; its replay time is divided by this
GRAPH_CALLS = 10
#: one-call samples per measurement (each after an L2 flush)
ONE_CALL_REPEATS = 25


class Marks(Protocol):
    """Time marks: ``mark()`` queues (or takes) one, ``seconds(a, b)`` waits and returns b - a."""

    def mark(self) -> Any: ...

    def seconds(self, start: Any, stop: Any) -> float: ...


class HostMarks:
    """Marks of a host clock taken after ``synchronize`` (the CPU, or a GPU without events)."""

    def __init__(self, synchronize: Callable[[], None], clock: Callable[[], float] = time.perf_counter) -> None:
        self.synchronize = synchronize
        self.clock = clock

    def mark(self) -> float:
        self.synchronize()
        return self.clock()

    def seconds(self, start: Any, stop: Any) -> float:
        return float(stop - start)


class CudaEventMarks:
    """Marks of CUDA events on torch's current stream (what ``triton.testing.do_bench`` reads)."""

    def mark(self) -> Any:
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def seconds(self, start: Any, stop: Any) -> float:
        stop.synchronize()
        return float(start.elapsed_time(stop)) / 1e3


class GraphUnsupported(Exception):
    """A runner cannot be captured in a CUDA graph; the message says why (the graph column)."""


@dataclass(frozen=True)
class ThreeTimings:
    """One call (L2 flushed), back to back, and graph replay (None with ``graph_note`` saying why)."""

    one_call: Timing
    back_to_back: Timing
    graph: Timing | None
    graph_note: str = ""


def one_call(run: Callable[[int], object], marks: Marks, flush: Callable[[], object], *,
             repeats: int = ONE_CALL_REPEATS, first: int = 0) -> Timing:
    """Median of ``repeats`` single runs, each after ``flush()`` (the L2 cache, or a CPU's caches)."""
    samples = []
    for k in range(repeats):
        flush()
        start = marks.mark()
        run(first + k)
        stop = marks.mark()
        samples.append(marks.seconds(start, stop))
    return Timing(statistics.median(samples), samples, 1)


def graph_replay(replay: Callable[[], object], marks: Marks, *, calls: int = GRAPH_CALLS,
                 repeats: int = ONE_CALL_REPEATS) -> Timing:
    """Median over ``repeats`` replays of a graph holding ``calls`` runs, per run."""
    replay()  # the first replay uploads the graph
    samples = []
    for _ in range(repeats):
        start = marks.mark()
        replay()
        stop = marks.mark()
        samples.append(marks.seconds(start, stop) / calls)
    return Timing(statistics.median(samples), samples, calls)


def three_timings(run: Callable[[int], object], synchronize: Callable[[], None], *, marks: Marks,
                  flush: Callable[[], object], capture: Callable[[Callable[[int], object], int], Callable[[], object]]
                  | None, rotations: int = 1, policy: TimingPolicy = GPU_POLICY,
                  graph_note: str = "") -> ThreeTimings:
    """Time ``run`` the three ways. ``capture(run, calls)`` returns a replay of a graph of
    ``calls`` runs, or raises :class:`GraphUnsupported`; None: not capturable (``graph_note``
    says why)."""
    back = measure(run, synchronize, rotations=rotations, policy=policy)
    single = one_call(run, marks, flush)
    if capture is None:
        return ThreeTimings(single, back, None, graph_note or "not capturable")
    try:
        replay = capture(run, GRAPH_CALLS)
    except GraphUnsupported as error:
        return ThreeTimings(single, back, None, str(error))
    return ThreeTimings(single, back, graph_replay(replay, marks, calls=GRAPH_CALLS))


def host_time_per_call(run: Callable[[int], object], *, calls: int = 1000, repeats: int = 5,
                       clock: Callable[[], float] = time.perf_counter,
                       synchronize: Callable[[], None] = lambda: None) -> Timing:
    """Host seconds per ``run`` over ``calls`` runs queued without waiting (median of ``repeats``);
    ``synchronize`` runs between repeats, outside the timed span."""
    run(0)
    synchronize()
    samples = []
    for _ in range(repeats):
        start = clock()
        for i in range(calls):
            run(i)
        samples.append((clock() - start) / calls)
        synchronize()
    return Timing(statistics.median(samples), samples, calls)
