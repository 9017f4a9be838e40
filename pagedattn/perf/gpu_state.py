"""What the GPU reported while a cell was timed: SM clock, board power, and clock slowdowns.

A cell timed while the GPU held its clocks down (its software power cap, a thermal or
hardware slowdown) reads slower than its kernel is. A GPU streaming its memory at full speed
draws close to its power limit, so a cell timed right after another inherits its heat. So
before each cell the bench lets the GPU settle (:func:`sampling`: no slowdown reported and the
board below :data:`SETTLED_POWER_FRACTION` of its power limit, waiting at most
:data:`SETTLE_MAX_S`), then samples NVML on a thread while the cell is timed and keeps the
summary with the cell's row: a cell that still slowed is marked in the table and in the
verdicts instead of being taken for the kernel's speed. NVML comes from the ``nvidia-ml-py``
package (module ``pynvml``); without it, or without a GPU, nothing is sampled or waited for
and the rows carry no state.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, NamedTuple, Protocol

#: NVML's clock-event reasons that slow a busy GPU down, by bit (nvmlClocksEventReason*). The
#: others (idle, application clocks, sync boost, display clock) are not slowdowns of a kernel.
SLOWDOWNS: dict[int, str] = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "power brake",
}
SAMPLE_INTERVAL_S = 0.02  # one NVML sample costs about 70 us of host time (H200)
SETTLED_POWER_FRACTION = 0.5  # of the enforced power limit: below it a cell starts (H200: 350 of 700 W)
SETTLE_MAX_S = 3.0  # the longest wait for the GPU to settle before a cell


class Sample(NamedTuple):
    """One NVML reading: SM clock (MHz), board power (W) and the clock-event reason bits."""

    sm_clock_mhz: int
    power_w: float
    reasons: int


class Gpu(Protocol):
    """A GPU whose state can be read: NVML's (:func:`nvml_gpu`) or a test's."""

    @property
    def power_limit_w(self) -> float: ...

    def read(self) -> Sample: ...


@dataclass(frozen=True)
class GpuState:
    """The summary of the samples taken while one cell was timed, and the wait before it."""

    samples: int
    sm_clock_mhz_min: int
    sm_clock_mhz_max: int
    power_w_max: float
    slowdowns: tuple[str, ...]  # names of SLOWDOWNS active in any sample, in bit order
    settle_s: float = 0.0  # waited before the cell for the GPU to settle
    unsettled: bool = False  # the wait reached its bound before the GPU settled

    def describe(self) -> str:
        """``software power cap (SM clock 1935-1980 MHz, up to 660 W)``; the clocks alone when not slowed."""
        clocks = f"SM clock {self.sm_clock_mhz_min}-{self.sm_clock_mhz_max} MHz, up to {self.power_w_max:.0f} W"
        return f"{', '.join(self.slowdowns)} ({clocks})" if self.slowdowns else clocks


def summarize(samples: Sequence[Sample]) -> GpuState | None:
    """The :class:`GpuState` of ``samples``; None for none."""
    if not samples:
        return None
    seen = 0
    for s in samples:
        seen |= s.reasons
    return GpuState(len(samples), min(s.sm_clock_mhz for s in samples), max(s.sm_clock_mhz for s in samples),
                    max(s.power_w for s in samples), tuple(name for bit, name in SLOWDOWNS.items() if seen & bit))


@dataclass(frozen=True)
class NvmlGpu:
    """The current CUDA device through NVML."""

    nvml: Any  # the pynvml module
    handle: Any
    power_limit_w: float
    reasons: Any  # pynvml's clock-event reasons query (its older name in older pynvml)

    def read(self) -> Sample:
        return Sample(int(self.nvml.nvmlDeviceGetClockInfo(self.handle, self.nvml.NVML_CLOCK_SM)),
                      self.nvml.nvmlDeviceGetPowerUsage(self.handle) / 1000.0, int(self.reasons(self.handle)))


@functools.cache
def nvml_gpu() -> NvmlGpu | None:
    """The current CUDA device through NVML, or None where there is no ``pynvml``, no CUDA device
    or NVML does not start (decided once a process)."""
    try:
        import pynvml
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    try:
        pynvml.nvmlInit()
        handle = _device_handle(pynvml, torch)
        reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
        return NvmlGpu(pynvml, handle, pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0, reasons)
    except pynvml.NVMLError:
        return None


def _device_handle(pynvml: Any, torch: Any) -> Any:
    """NVML's handle of torch's current device, found by UUID (NVML numbers every GPU of the
    host, CUDA only the visible ones); device 0 where torch gives no UUID."""
    uuid = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "uuid", None)
    if uuid is not None:
        try:
            return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
        except pynvml.NVMLError:
            pass
    return pynvml.nvmlDeviceGetHandleByIndex(0)


def settled(sample: Sample, power_limit_w: float) -> bool:
    """No slowdown reported and the board below :data:`SETTLED_POWER_FRACTION` of its limit."""
    return not any(sample.reasons & bit for bit in SLOWDOWNS) and \
        sample.power_w <= SETTLED_POWER_FRACTION * power_limit_w


def read_or_none(gpu: Gpu) -> Sample | None:
    """``gpu.read()``, or None where it fails: NVML failing must not fail a measurement."""
    try:
        return gpu.read()
    except Exception:  # pynvml.NVMLError and whatever a driver in trouble raises
        return None


def settle(gpu: Gpu, max_wait_s: float = SETTLE_MAX_S, interval_s: float = SAMPLE_INTERVAL_S) -> tuple[float, bool]:
    """Wait until ``gpu`` is :func:`settled` (or cannot be read) or ``max_wait_s`` has passed:
    the seconds waited, and whether the wait reached its bound with the GPU still unsettled."""
    start = time.perf_counter()
    while (sample := read_or_none(gpu)) is not None and not settled(sample, gpu.power_limit_w):
        waited = time.perf_counter() - start
        if waited >= max_wait_s:
            return waited, True
        time.sleep(min(interval_s, max_wait_s - waited))
    return time.perf_counter() - start, False


class Sampled:
    """What :func:`sampling` saw: ``state`` once the block has ended (None: nothing sampled)."""

    state: GpuState | None = None


@contextmanager
def sampling(gpu: Gpu | None, interval_s: float = SAMPLE_INTERVAL_S,
             settle_max_s: float = SETTLE_MAX_S) -> Iterator[Sampled]:
    """Let ``gpu`` settle (at most ``settle_max_s``), then sample it every ``interval_s`` on a
    thread while the block runs (once at its start and once at its end too); ``gpu`` None
    waits for and samples nothing."""
    sampled = Sampled()
    if gpu is None:
        yield sampled
        return
    waited, unsettled = settle(gpu, settle_max_s, interval_s) if settle_max_s > 0 else (0.0, False)
    samples: list[Sample] = []
    stop = threading.Event()

    def take() -> bool:
        sample = read_or_none(gpu)
        if sample is not None:
            samples.append(sample)
        return sample is not None

    def loop() -> None:
        while not stop.wait(interval_s) and take():
            pass

    thread = threading.Thread(target=loop, name="gpu-state", daemon=True)
    if take():
        thread.start()
    try:
        yield sampled
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
            take()
        state = summarize(samples)
        sampled.state = None if state is None else replace(state, settle_s=waited, unsettled=unsettled)
