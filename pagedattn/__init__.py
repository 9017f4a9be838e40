"""pagedattn: a verification-first reference suite for PagedAttention.

``pagedattn.spec`` is the ground truth (NumPy only), ``pagedattn.reference`` the NumPy
paged algorithm, ``pagedattn.backends`` the interface and registry, ``pagedattn.conformance``
the fuzzing suite and ``pagedattn.perf`` the benchmarks. Importing pagedattn imports no
GPU library.
"""

from pagedattn.errors import (
    BackendNotFoundError,
    BackendUnavailableError,
    OutOfBlocksError,
    PagedAttentionError,
    UnsupportedError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendNotFoundError",
    "BackendUnavailableError",
    "OutOfBlocksError",
    "PagedAttentionError",
    "UnsupportedError",
    "__version__",
]
