"""Which machine the perf suite runs on: the GPU's name (through torch, if present) or the CPU."""

from __future__ import annotations

import functools
import platform
import re


@functools.cache
def gpu_name() -> str | None:
    """The name of CUDA device 0 as torch reports it, or None without torch or a GPU."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_name(0))


def cpu_name() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def slug(name: str) -> str:
    """A folder name for a device: ``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def device_slug() -> str:
    """``slug(gpu_name())`` on a GPU machine, else ``"cpu"``."""
    name = gpu_name()
    return slug(name) if name else "cpu"
