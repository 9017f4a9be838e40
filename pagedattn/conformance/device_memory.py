"""Device memory of the conformance workers: what a worker keeps cached between cells, handed back
to the driver, and the large cases that workers sharing one GPU run at once.

torch's and cupy's allocators keep what a cell freed for reuse. A far-pool cell uploads two
caches of 4 GiB or more, a far-table cell a block table of 16 GiB; when several pytest-xdist
workers share one GPU, each keeping its last cell's arrays cached, the next worker's upload runs
out of memory. The scale cells call :func:`release_cached_device_memory` when they end.

Out of memory is then still a matter of timing: on an 80 GB GPU, fourteen workers running their
far cells together failed nine of them, each with ``OutOfMemoryError``. A failure the backend did
not cause is a false alarm, so :func:`large_case_admission` lets the workers of one GPU run cases
of :data:`LARGE_CASE_BYTES` or more only while the bytes of those running together stay within
:data:`LARGE_CASE_SHARE` of the GPU's memory (one case at a time, whatever its size, when it would
not fit beside any other). The workers agree through a small ledger file per user and GPU in the
temporary directory, read and written under an exclusive ``flock``.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

#: A case whose arrays hold at least this many bytes waits for room on its GPU.
LARGE_CASE_BYTES = 2**30
#: The share of a GPU's memory that the large cases running together on it may hold.
LARGE_CASE_SHARE = 0.5
#: Seconds between looks at the ledger while a large case waits.
ADMISSION_POLL_SECONDS = 0.2


def release_cached_device_memory() -> None:
    """Free what torch's CUDA caching allocator and cupy's default pools hold unused; a no-op
    for a library this process has not imported, a device torch has not initialised, or a
    machine without a CUDA driver (where cupy is imported only to plan or compile)."""
    gc.collect()  # arrays of the finished cell still waiting for the cycle collector
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    cupy = sys.modules.get("cupy")
    if cupy is not None and cupy.cuda.is_available():
        cupy.get_default_memory_pool().free_all_blocks()
        cupy.get_default_pinned_memory_pool().free_all_blocks()


def case_bytes(case: Any) -> int:
    """Bytes of the NumPy arrays a case holds (a view and the array it views each count: an upper
    bound of what the backend's device copies take)."""
    if not dataclasses.is_dataclass(case):
        return 0
    return sum(value.nbytes for field in dataclasses.fields(case)
               if isinstance(value := getattr(case, field.name), np.ndarray))


def gpu_key() -> str:
    """The GPU a worker's backends run on by default: the first of ``CUDA_VISIBLE_DEVICES``
    (how ``--gpus`` pins a worker), else device 0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in visible) or "0"


def device_total_bytes() -> int | None:
    """Memory of the current CUDA device, from torch or cupy where this process imported them;
    None when neither knows of a device."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory)
    cupy = sys.modules.get("cupy")
    if cupy is not None and cupy.cuda.is_available():
        return int(cupy.cuda.Device().mem_info[1])
    return None


class LargeCaseLedger:
    """The large cases running on one GPU, in a JSON file ``{token: [pid, bytes]}`` that every
    worker reads and writes under an exclusive ``flock`` of the file."""

    def __init__(self, path: Path, budget: int) -> None:
        self.path = path
        self.budget = budget

    def _update(self, change: Any) -> Any:
        """Run ``change(entries)`` on the ledger's entries (those of live processes) under the
        lock, write them back, and return what it returned."""
        import fcntl

        with open(self.path, "a+") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            try:
                file.seek(0)
                text = file.read()
                entries = {token: entry for token, entry in (json.loads(text) if text.strip() else {}).items()
                           if _alive(entry[0])}
                result = change(entries)
                file.seek(0)
                file.truncate()
                file.write(json.dumps(entries))
                file.flush()
                return result
            finally:
                fcntl.flock(file, fcntl.LOCK_UN)

    def try_admit(self, token: str, size: int) -> bool:
        """Record the case ``token`` of ``size`` bytes and return True if it fits the budget
        beside those running (or none is running); else record nothing and return False."""
        def admit(entries: dict[str, list[int]]) -> bool:
            running = sum(entry[1] for entry in entries.values())
            if entries and running + size > self.budget:
                return False
            entries[token] = [os.getpid(), size]
            return True
        return bool(self._update(admit))

    def release(self, token: str) -> None:
        """Remove the case ``token`` from the ledger."""
        self._update(lambda entries: entries.pop(token, None))

    def running(self) -> dict[str, list[int]]:
        """The entries of the cases running now: ``{token: [pid, bytes]}``."""
        return dict(self._update(dict))


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists (a worker that died holding room gives it back)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ledger_path(key: str) -> Path:
    """The ledger file of GPU ``key`` in the temporary directory, one per user (another user's
    file would not be writable)."""
    return Path(tempfile.gettempdir()) / f"pagedattn-large-cases-{os.getuid()}-gpu-{key}.json"


@contextmanager
def large_case_admission(device: str, case: Any) -> Iterator[None]:
    """Run the body when the GPU has room for ``case`` among the large cases of the workers
    sharing it; a no-op for a backend off a CUDA device, a case under :data:`LARGE_CASE_BYTES`,
    a machine without ``fcntl``, or a ledger that cannot be written. On leaving, the worker hands
    its cached device memory back to the driver before it gives up its room."""
    size = case_bytes(case)
    total = device_total_bytes() if device.startswith("cuda") and size >= LARGE_CASE_BYTES else None
    if total is None or sys.platform == "win32":
        yield
        return
    ledger = LargeCaseLedger(ledger_path(gpu_key()), int(total * LARGE_CASE_SHARE))
    token = uuid.uuid4().hex
    try:
        while not ledger.try_admit(token, size):
            time.sleep(ADMISSION_POLL_SECONDS)
        admitted = True
    except OSError:  # no ledger to be had (a read-only temporary directory): run as before, unordered
        admitted = False
    if not admitted:
        yield
        return
    try:
        yield
    finally:
        try:
            release_cached_device_memory()
        finally:
            ledger.release(token)


def with_room_on_its_gpu(check: Callable[[Any, Any], float], device: str) -> Callable[[Any, Any], float]:
    """``check(backend, case)`` run inside :func:`large_case_admission` for a backend on ``device``."""
    @functools.wraps(check)
    def admitted(backend: Any, case: Any) -> float:
        with large_case_admission(device, case):
            return check(backend, case)
    return admitted
