"""The backend interface: every backend subclasses :class:`Backend`.

The public methods validate on the host with :mod:`pagedattn.spec.arrays`, check the
declared :class:`Capabilities`, and only then call the backend's ``_`` methods, so bad
input raises :class:`~pagedattn.errors.PagedAttentionError` before any kernel runs and
an unsupported case raises :class:`~pagedattn.errors.UnsupportedError`.

Paged attention is split FlashInfer-style into ``plan`` (index arrays: validated once,
per-batch metadata built) and ``run`` (query and caches, once per layer);
``paged_attention`` does both. A backend module must not import its GPU library at import
time: do it inside methods, so that listing backends imports nothing heavy.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from pagedattn.backends.capabilities import Capabilities
from pagedattn.backends.devices import require_one_device
from pagedattn.errors import PagedAttentionError, UnsupportedError
from pagedattn.spec.arrays import (
    AttentionProblem,
    WriteKVProblem,
    check_copy_blocks,
    check_merge_states,
    check_paged_attention,
    check_write_kv,
)
from pagedattn.spec.dtypes import dtype_name


def array_signature(x: Any) -> tuple[tuple[int, ...], str]:
    """Return ``(shape, dtype name)`` of any array; what ``run`` re-checks against ``plan``."""
    return tuple(int(n) for n in x.shape), dtype_name(x.dtype)


@dataclass(frozen=True)
class Plan:
    """What ``plan`` saw and built: the validated problem, the array signatures, backend state."""

    problem: AttentionProblem
    signatures: dict[str, tuple[tuple[int, ...], str]]
    state: Any
    #: whether ``run`` also requires C-contiguous caches (a backend without ``strided_caches``)
    contiguous_caches: bool = False
    #: the ``(shape, dtype)`` objects of query, key_cache and value_cache that ``run`` last
    #: accepted: equal ones passed the same check, so ``run`` compares them and does no more
    accepted: list[tuple[Any, ...] | None] = field(default_factory=lambda: [None], compare=False, repr=False)

    @property
    def capturable(self) -> bool:
        """Whether ``run`` of this plan may be captured in a CUDA graph and replayed: the
        backend's state says so with a ``capturable`` attribute (False where it has none)."""
        return bool(getattr(self.state, "capturable", False))

    @property
    def fixed_in_graph(self) -> tuple[str, ...]:
        """What a CUDA graph that captured ``run`` of this plan holds fixed, as the backend's
        state lists it (``fixed_in_graph``): a replay sees new contents of the captured query
        and caches, never new index arrays, shapes or addresses; those need a new plan and a
        new capture."""
        return tuple(getattr(self.state, "fixed_in_graph", ()))


class Backend(abc.ABC):
    """Base class of all backends. Subclasses set ``name`` and implement the ``_`` methods.

    Entry points of the ``pagedattn.backends`` group name a subclass; it is instantiated
    with no arguments.
    """

    name: ClassVar[str] = ""
    version: ClassVar[str] = "0"
    description: ClassVar[str] = ""
    #: whether ``run`` takes torch tensors on the backend's device as they are (the benchmark
    #: then passes torch tensors, as an engine does)
    accepts_torch: ClassVar[bool] = False

    # -- what the backend is -------------------------------------------------
    @classmethod
    def availability(cls) -> str | None:
        """Return None if this backend can run here, else the reason (``"no CUDA device"``)."""
        return None

    @abc.abstractmethod
    def capabilities(self) -> Capabilities:
        """Return the declared envelope of supported cases."""

    def device_name(self) -> str:
        """A human-readable name of the device the backend runs on."""
        return "cpu"

    # -- arrays --------------------------------------------------------------
    @abc.abstractmethod
    def to_device(self, array: np.ndarray) -> Any:
        """Return ``array`` (NumPy, possibly ml_dtypes) as this backend's device array."""

    @abc.abstractmethod
    def to_numpy(self, array: Any) -> np.ndarray:
        """Return a device array as a NumPy array of the same dtype (ml_dtypes for bf16/fp8)."""

    def current_device(self) -> str | None:
        """The device this backend runs on now, as :func:`~pagedattn.backends.devices.array_device`
        names it (``"cuda:0"``); None where there is no such notion (a CPU backend). A backend
        without the ``other_device`` feature refuses, as unsupported, a call whose arrays are on
        another device than this one."""
        return None

    def _require_device(self, device: str | None, argument: str) -> None:
        """Raise :class:`UnsupportedError` when the call's arrays are on ``device``, not the current
        one, and the backend does not declare ``other_device``."""
        if device is None:
            return
        current = self.current_device()
        if current is not None and device != current and not self.capabilities().supports("other_device"):
            raise UnsupportedError(argument, f"arrays on {device} while {current} is the current device",
                                   backend=self.name, capability="other_device")

    def synchronize(self) -> None:
        """Wait until all work queued by this backend is done (for timing); CPU backends: no-op."""
        return None

    def _host_or_none(self, array: Any) -> Any:
        """A host copy of a device array for the spec's checks; None, lists and tuples as given."""
        if array is None or isinstance(array, list | tuple):
            return array
        return np.asarray(self.to_numpy(array))

    # -- paged attention -----------------------------------------------------
    def plan(self, query: Any, key_cache: Any, value_cache: Any, block_tables: Any, seq_lens: Any,
             query_start_loc: Any = None, **options: Any) -> Plan:
        """Validate a call and build per-batch metadata.

        The keyword options and their defaults are those of :func:`check_paged_attention`
        (kv_layout, scale, causal, sliding_window, softcap, alibi_slopes, k_scale, v_scale,
        return_lse). query and caches are inspected for shape, dtype and device only (one device:
        the key cache's); the index arrays and ``alibi_slopes`` are read on the host (copied from
        the device if needed).
        """
        device = require_one_device((("key_cache", key_cache), ("value_cache", value_cache), ("query", query)))
        alibi_slopes = options.get("alibi_slopes")
        host_options = {**options, "alibi_slopes": self._host_or_none(alibi_slopes)}
        problem = check_paged_attention(
            query, key_cache, value_cache,
            self._host_or_none(block_tables), self._host_or_none(seq_lens),
            self._host_or_none(query_start_loc), **host_options,
        )
        self.capabilities().require(problem, backend=self.name)
        self._require_device(device, "key_cache")
        contiguous = not self.capabilities().supports("strided_caches")
        if contiguous:
            self._require_contiguous(key_cache, "key_cache")
            self._require_contiguous(value_cache, "value_cache")
        signatures = {
            "query": array_signature(query),
            "key_cache": array_signature(key_cache),
            "value_cache": array_signature(value_cache),
        }
        state = self._plan(problem, block_tables, seq_lens, query_start_loc, alibi_slopes)
        return Plan(problem, signatures, state, contiguous)

    def run(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> Any:
        """Run a plan on ``query`` and the caches; return ``out`` or ``(out, lse)`` as planned.

        The arrays must have the shapes and dtypes ``plan`` saw; the argument that differs is named.
        """
        seen = (query.shape, query.dtype, key_cache.shape, key_cache.dtype, value_cache.shape, value_cache.dtype)
        if plan.contiguous_caches or seen != plan.accepted[0]:
            self._check_run_arrays(plan, query, key_cache, value_cache)
            plan.accepted[0] = seen
        out, lse = self._run(plan, query, key_cache, value_cache)
        return (out, lse) if plan.problem.return_lse else out

    def _check_run_arrays(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> None:
        """Raise the error naming the first array whose (shape, dtype) differs from what ``plan``
        saw, or (a backend without ``strided_caches``) the first cache that is not contiguous."""
        for argument, array in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
            if array_signature(array) != plan.signatures[argument]:
                shape, dtype = plan.signatures[argument]
                raise PagedAttentionError(
                    argument,
                    f"{array_signature(array)} differs from (shape, dtype) = ({shape}, {dtype}) given to plan",
                )
        if plan.contiguous_caches:
            self._require_contiguous(key_cache, "key_cache")
            self._require_contiguous(value_cache, "value_cache")

    def paged_attention(self, query: Any, key_cache: Any, value_cache: Any, block_tables: Any,
                        seq_lens: Any, query_start_loc: Any = None, **options: Any) -> Any:
        """Paged attention (``plan`` then ``run``): ``out`` ``[T, Hq, D]``, or ``(out, lse)``
        with lse float32 ``[T, Hq]`` when ``return_lse=True``.

        Options: kv_layout, scale, causal, sliding_window, softcap, alibi_slopes, k_scale,
        v_scale, return_lse, as in :mod:`pagedattn.spec.arrays`.
        """
        plan = self.plan(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc, **options)
        return self.run(plan, query, key_cache, value_cache)

    def _require_contiguous(self, cache: Any, argument: str) -> None:
        strides = self.element_strides(cache)
        shape = tuple(int(n) for n in cache.shape)
        expected, step = [], 1
        for n in reversed(shape):
            expected.append(step)
            step *= n
        if strides is not None and tuple(strides) != tuple(reversed(expected)):
            raise UnsupportedError(
                argument, f"strided cache views (strides {tuple(strides)})", backend=self.name,
                capability="strided_caches",
            )

    def element_strides(self, array: Any) -> tuple[int, ...] | None:
        """Strides of ``array`` in elements, or None if unknown (NumPy and torch handled)."""
        strides = getattr(array, "strides", None)
        if strides is None:
            return None
        if callable(strides):  # torch.Tensor.stride
            return tuple(int(s) for s in array.stride())
        itemsize = int(getattr(array, "itemsize", 0) or array.dtype.itemsize)
        return tuple(int(s) // itemsize for s in strides)

    @abc.abstractmethod
    def _plan(self, problem: AttentionProblem, block_tables: Any, seq_lens: Any,
              query_start_loc: Any, alibi_slopes: Any) -> Any:
        """Build per-batch state from validated input (device uploads, split choice)."""

    @abc.abstractmethod
    def _run(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> tuple[Any, Any]:
        """Compute ``(out, lse or None)`` on the device."""

    # -- other operations ------------------------------------------------------
    def write_kv(self, key: Any, value: Any, key_cache: Any, value_cache: Any, slot_mapping: Any, *,
                 kv_layout: str = "NHD", k_scale: float = 1.0, v_scale: float = 1.0) -> None:
        """Store key/value ``[T, Hkv, D]`` at ``slot_mapping`` (int ``[T]``, -1 = skip), in place."""
        device = require_one_device((("key_cache", key_cache), ("value_cache", value_cache), ("key", key),
                                     ("value", value)))
        problem = check_write_kv(key, value, key_cache, value_cache, self._host_or_none(slot_mapping),
                                 kv_layout=kv_layout, k_scale=k_scale, v_scale=v_scale)
        self.capabilities().require_operation("write_kv", backend=self.name)
        self._require_device(device, "key_cache")
        self._write_kv(problem, key, value, key_cache, value_cache, slot_mapping)

    def copy_blocks(self, key_cache: Any, value_cache: Any, pairs: Any, *, kv_layout: str = "NHD") -> None:
        """Copy whole blocks ``(src, dst)`` in both caches, all sources read before any write."""
        device = require_one_device((("key_cache", key_cache), ("value_cache", value_cache)))
        table = check_copy_blocks(key_cache, value_cache, self._host_or_none(pairs), kv_layout=kv_layout)
        self.capabilities().require_operation("copy_blocks", backend=self.name)
        self._require_device(device, "key_cache")
        self._copy_blocks(key_cache, value_cache, table)

    def merge_states(self, out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
        """Merge two partial results over disjoint keys: ``(out [T, H, D], lse float32 [T, H])``."""
        device = require_one_device((("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)))
        check_merge_states(out_a, lse_a, out_b, lse_b)
        self.capabilities().require_operation("merge_states", backend=self.name)
        self._require_device(device, "out_a")
        return self._merge_states(out_a, lse_a, out_b, lse_b)

    def _write_kv(self, problem: WriteKVProblem, key: Any, value: Any, key_cache: Any,
                  value_cache: Any, slot_mapping: Any) -> None:
        raise NotImplementedError

    def _copy_blocks(self, key_cache: Any, value_cache: Any, pairs: np.ndarray) -> None:
        raise NotImplementedError

    def _merge_states(self, out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} version={self.version!r}>"
