"""Baselines of the pytest-benchmark suite, one per device, kept in the repository.

``benchmarks/baselines/<device slug>/baseline.json`` (in the repository) is a ``--benchmark-json`` file of
a run on that device (``nvidia-h200``, ...). When one exists for the device the suite
runs on, the suite compares with it and fails a benchmark whose median regressed by more
than :data:`DEFAULT_FAIL` (pytest-benchmark's ``--benchmark-compare-fail``).
"""

from __future__ import annotations

import os
from pathlib import Path

from pagedattn.perf.device import device_slug

DEFAULT_FAIL = "median:30%"  # launch-bound small cases move ~10% between runs on one GPU


def baseline_path(root: Path, slug: str | None = None) -> Path:
    """Where the baseline of device ``slug`` (default: this machine's) is kept under ``root``.

    ``PAGEDATTN_PERF_BASELINES`` names another folder of baselines in place of ``root`` (tests use it).
    """
    folder = Path(os.environ.get("PAGEDATTN_PERF_BASELINES", root))
    return folder / (slug or device_slug()) / "baseline.json"
