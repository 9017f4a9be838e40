"""What the GPU reported while a cell was timed: SM clock, board power, and clock slowdowns.

A cell timed while the GPU held its clocks down (its software power cap, a thermal or
hardware slowdown) reads slower than its kernel is. The bench samples NVML on a thread while
each cell is timed and keeps the summary with the cell's row, so that such a cell is marked
in the table and in the verdicts instead of being taken for the kernel's speed. NVML comes
from the ``nvidia-ml-py`` package (module ``pynvml``); without it, or without a GPU, nothing is
sampled and the rows carry no state.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

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


class Sample(NamedTuple):
    """One NVML reading: SM clock (MHz), board power (W) and the clock-event reason bits."""

    sm_clock_mhz: int
    power_w: float
    reasons: int


@dataclass(frozen=True)
class GpuState:
    """The summary of the samples taken while one cell was timed."""

    samples: int
    sm_clock_mhz_min: int
    sm_clock_mhz_max: int
    power_w_max: float
    slowdowns: tuple[str, ...]  # names of SLOWDOWNS active in any sample, in bit order

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


@functools.cache
def nvml_reader() -> Callable[[], Sample] | None:
    """A function reading the current CUDA device's :class:`Sample` through NVML, or None where
    there is no ``pynvml``, no CUDA device or NVML does not start (decided once a process)."""
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
    except pynvml.NVMLError:
        return None
    reasons = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons

    def read() -> Sample:
        return Sample(int(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
                      pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0, int(reasons(handle)))

    return read


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


class Sampled:
    """What :func:`sampling` saw: ``state`` once the block has ended (None: nothing sampled)."""

    state: GpuState | None = None


@contextmanager
def sampling(read: Callable[[], Sample] | None, interval_s: float = SAMPLE_INTERVAL_S) -> Iterator[Sampled]:
    """Sample ``read`` every ``interval_s`` on a thread while the block runs (once at its start
    and once at its end too); ``read`` None samples nothing."""
    sampled = Sampled()
    if read is None:
        yield sampled
        return
    samples: list[Sample] = [read()]
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            samples.append(read())

    thread = threading.Thread(target=loop, name="gpu-state", daemon=True)
    thread.start()
    try:
        yield sampled
    finally:
        stop.set()
        thread.join()
        samples.append(read())
        sampled.state = summarize(samples)
