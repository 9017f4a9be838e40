"""What a backend declares it can do, and the check that turns a gap into UnsupportedError."""

from __future__ import annotations

from dataclasses import dataclass, field

from pagedattn.errors import UnsupportedError
from pagedattn.spec.arrays import AttentionProblem
from pagedattn.spec.dtypes import CACHE_DTYPES, QUERY_DTYPES

#: Attention features a call can use (see :attr:`AttentionProblem.features`).
ATTENTION_FEATURES: tuple[str, ...] = (
    "varlen", "non_causal", "sliding_window", "softcap", "alibi", "lse", "fp8",
)
#: Operations besides paged attention.
OPERATIONS: tuple[str, ...] = ("write_kv", "merge_states", "copy_blocks")
#: Other abilities: caches given as strided views of a larger pool; a call whose arrays are on a
#: GPU other than the current one, run on theirs.
OTHER_FEATURES: tuple[str, ...] = ("strided_caches", "other_device")
ALL_FEATURES: tuple[str, ...] = ATTENTION_FEATURES + OPERATIONS + OTHER_FEATURES
#: Every feature but ``other_device``: what a backend that launches on the current device declares.
ON_CURRENT_DEVICE_FEATURES: frozenset[str] = frozenset(ALL_FEATURES) - {"other_device"}


@dataclass(frozen=True)
class Capabilities:
    """A backend's declared envelope. ``None`` for block_sizes or head_dims means any.

    ``cache_dtypes`` lists the cache dtypes accepted (a cache in the query's own dtype
    counts only if that dtype is listed). ``tf32`` says float32 products run on TF32 units,
    which the error model then allows for. ``max_pool_elements`` bounds the elements of one
    cache (or of the pool it is a view of) the backend takes without copying all of it to
    host memory: a backend that copies whole caches on a CPU would turn a lazily allocated
    pool of 2**31 elements into gigabytes; ``None`` means no bound short of the device's memory.
    ``max_head_dim`` bounds the head dims of a backend that takes any up to it (``head_dims`` None).
    """

    dtypes: tuple[str, ...] = QUERY_DTYPES
    cache_dtypes: tuple[str, ...] = CACHE_DTYPES
    block_sizes: tuple[int, ...] | None = None
    head_dims: tuple[int, ...] | None = None
    kv_layouts: tuple[str, ...] = ("NHD", "HND")
    features: frozenset[str] = field(default_factory=lambda: frozenset(ALL_FEATURES))
    tf32: bool = False
    device: str = "cpu"
    max_pool_elements: int | None = None
    max_head_dim: int | None = None

    def __post_init__(self) -> None:
        unknown = set(self.features) - set(ALL_FEATURES)
        if unknown:
            raise ValueError(f"unknown features {sorted(unknown)}; known: {list(ALL_FEATURES)}")

    def supports(self, feature: str) -> bool:
        """Whether ``feature`` (an attention feature or an operation) is declared."""
        return feature in self.features

    def unsupported_reason(self, problem: AttentionProblem) -> tuple[str, str] | None:
        """Return ``(argument, reason)`` for the first capability the problem needs and lacks."""
        if problem.dtype not in self.dtypes:
            return "query", f"dtype {problem.dtype} (supported: {', '.join(self.dtypes)})"
        if problem.cache_dtype not in self.cache_dtypes:
            return "key_cache", f"cache dtype {problem.cache_dtype} (supported: {', '.join(self.cache_dtypes)})"
        if self.block_sizes is not None and problem.block_size not in self.block_sizes:
            return "key_cache", f"block_size {problem.block_size} (supported: {list(self.block_sizes)})"
        if self.head_dims is not None and problem.head_dim not in self.head_dims:
            return "query", f"head_dim {problem.head_dim} (supported: {list(self.head_dims)})"
        if self.max_head_dim is not None and problem.head_dim > self.max_head_dim:
            return "query", f"head_dim {problem.head_dim} (supported: <= {self.max_head_dim})"
        if problem.kv_layout not in self.kv_layouts:
            return "kv_layout", f"layout {problem.kv_layout} (supported: {', '.join(self.kv_layouts)})"
        missing = sorted(problem.features - self.features)
        if missing:
            return missing[0], f"feature {missing[0]!r}"
        return None

    def require(self, problem: AttentionProblem, *, backend: str) -> None:
        """Raise :class:`UnsupportedError` naming the capability if ``problem`` is outside."""
        reason = self.unsupported_reason(problem)
        if reason is not None:
            argument, text = reason
            raise UnsupportedError(argument, text, backend=backend, capability=argument)

    def require_operation(self, operation: str, *, backend: str) -> None:
        """Raise :class:`UnsupportedError` if ``operation`` is not declared."""
        if operation not in self.features:
            raise UnsupportedError(operation, f"operation {operation!r}", backend=backend, capability=operation)

    def summary(self) -> str:
        """One line for tables: dtypes, cache dtypes, block sizes, head dims, layouts, features."""
        sizes = "any" if self.block_sizes is None else "/".join(map(str, self.block_sizes))
        dims = "/".join(map(str, self.head_dims)) if self.head_dims is not None else (
            "any" if self.max_head_dim is None else f"<={self.max_head_dim}")
        return (
            f"dtypes={'/'.join(self.dtypes)} cache={'/'.join(self.cache_dtypes)} block_size={sizes}"
            f" head_dim={dims} layouts={'/'.join(self.kv_layouts)} features={','.join(sorted(self.features))}"
            + (" tf32" if self.tf32 else "")
            + ("" if self.max_pool_elements is None else f" max_pool_elements={self.max_pool_elements}")
        )
