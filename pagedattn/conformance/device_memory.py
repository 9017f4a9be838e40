"""Device memory a conformance worker keeps cached between cells, handed back to the driver.

torch's and cupy's allocators keep what a cell freed for reuse. A far-pool cell uploads two
caches of 4 GiB or more; when several pytest-xdist workers share one GPU, each keeping its
last cell's pools cached, the next worker's upload runs out of memory. The scale cells call
:func:`release_cached_device_memory` when they end.
"""

from __future__ import annotations

import gc
import sys


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
