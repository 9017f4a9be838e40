"""Conformance cases: the inputs of one call, how to run them on a backend, and their ``.npz`` form.

A case holds host (NumPy) arrays; :meth:`AttentionCase.run` moves them to the backend's
device, calls it through the public interface only, and brings the results back. Saved
cases are standalone: ``pagedattn replay CASE.npz --backend NAME`` needs nothing else.
bfloat16/fp8 arrays are stored as their raw bits plus the dtype name, because ``.npz``
does not know ml_dtypes.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from pagedattn.backends.interface import Backend
from pagedattn.errors import PagedAttentionError
from pagedattn.spec.dtypes import dtype_name, numpy_dtype

_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def _pretty(self: Any, printer: Any, cycle: bool) -> None:
    """Hypothesis' and IPython's pretty printers: the short repr, not every array element."""
    printer.text(repr(self))


def _summary(x: np.ndarray | None) -> str:
    return "None" if x is None else f"{dtype_name(x.dtype)}{list(x.shape)}"


class AttentionResult(NamedTuple):
    """A backend's answer on the host: out ``[T, Hq, D]`` and lse float32 ``[T, Hq]`` (or None)."""

    out: np.ndarray
    lse: np.ndarray | None


@dataclass(frozen=True, repr=False)
class AttentionCase:
    """One paged-attention call on host arrays (see :mod:`pagedattn.spec.arrays` for their meaning).

    ``pool`` (when not None) is the multi-layer pool ``[num_blocks, 2, num_layers, ...]`` of
    which ``key_cache = pool[:, 0, layer]`` and ``value_cache = pool[:, 1, layer]`` are strided
    views. ``seed`` drives the variants the invariant checks build; ``labels`` describe the draw.
    """

    query: np.ndarray
    key_cache: np.ndarray
    value_cache: np.ndarray
    block_tables: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray | None
    options: dict[str, Any]
    pool: np.ndarray | None = None
    layer: int = 0
    seed: int = 0
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def kv_layout(self) -> str:
        return str(self.options.get("kv_layout", "NHD"))

    @property
    def dtype(self) -> str:
        return dtype_name(self.query.dtype)

    @property
    def cache_dtype(self) -> str:
        return dtype_name(self.key_cache.dtype)

    @property
    def block_size(self) -> int:
        return int(self.key_cache.shape[1 if self.kv_layout == "NHD" else 2])

    def replace(self, **changes: Any) -> AttentionCase:
        """Return a copy with some fields changed (the caches follow ``pool`` when it changes)."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        if "pool" in changes and changes["pool"] is not None:
            values["key_cache"] = changes["pool"][:, 0, values["layer"]]
            values["value_cache"] = changes["pool"][:, 1, values["layer"]]
        return AttentionCase(**values)

    _repr_pretty_ = _pretty

    def __repr__(self) -> str:
        opts = {k: (_summary(v) if isinstance(v, np.ndarray) else v) for k, v in self.options.items()}
        qsl = None if self.query_start_loc is None else self.query_start_loc.tolist()
        pool = "" if self.pool is None else f", pool={_summary(self.pool)}[:, k/v, {self.layer}]"
        return (
            f"AttentionCase(query={_summary(self.query)}, key_cache={_summary(self.key_cache)}{pool},"
            f" seq_lens={self.seq_lens.tolist()}, query_start_loc={qsl},"
            f" block_tables={self.block_tables.tolist()}, options={opts}, labels={self.labels})"
        )

    # -- running --------------------------------------------------------------------------
    def device_caches(self, backend: Backend) -> tuple[Any, Any, Any]:
        """Return ``(key_cache, value_cache, pool or None)`` on the backend's device, views kept."""
        if self.pool is not None:
            pool = backend.to_device(self.pool)
            return pool[:, 0, self.layer], pool[:, 1, self.layer], pool
        return backend.to_device(self.key_cache.copy()), backend.to_device(self.value_cache.copy()), None

    def run(self, backend: Backend, *, caches: tuple[Any, Any, Any] | None = None) -> AttentionResult:
        """Call ``backend.paged_attention`` on device copies of this case; return host results."""
        key_cache, value_cache, _ = caches if caches is not None else self.device_caches(backend)
        options = dict(self.options)
        if options.get("alibi_slopes") is not None:
            options["alibi_slopes"] = backend.to_device(options["alibi_slopes"])
        qsl = None if self.query_start_loc is None else backend.to_device(self.query_start_loc)
        result = backend.paged_attention(
            backend.to_device(self.query), key_cache, value_cache,
            backend.to_device(self.block_tables), backend.to_device(self.seq_lens), qsl, **options,
        )
        backend.synchronize()
        if options.get("return_lse"):
            out, lse = result
            return AttentionResult(np.asarray(backend.to_numpy(out)), np.asarray(backend.to_numpy(lse)))
        return AttentionResult(np.asarray(backend.to_numpy(result)), None)

    def host_args(self) -> tuple[Any, ...]:
        """The positional arguments of the spec's :func:`~pagedattn.spec.exact.exact_attention`."""
        return (self.query, self.key_cache, self.value_cache, self.block_tables, self.seq_lens,
                self.query_start_loc)


@dataclass(frozen=True)
class WriteKVCase:
    """A ``write_kv`` call: key/value ``[T, Hkv, D]``, caches of ``kv_layout``, slot_mapping ``[T]``."""

    key: np.ndarray
    value: np.ndarray
    key_cache: np.ndarray
    value_cache: np.ndarray
    slot_mapping: np.ndarray
    kv_layout: str
    k_scale: float = 1.0
    v_scale: float = 1.0

    _repr_pretty_ = _pretty

    def __repr__(self) -> str:
        return (f"WriteKVCase(key={_summary(self.key)}, key_cache={_summary(self.key_cache)} {self.kv_layout},"
                f" slot_mapping={self.slot_mapping.tolist()}, k_scale={self.k_scale}, v_scale={self.v_scale})")


@dataclass(frozen=True)
class CopyBlocksCase:
    """A ``copy_blocks`` call: caches of ``kv_layout`` and pairs int ``[n, 2]`` of (src, dst)."""

    key_cache: np.ndarray
    value_cache: np.ndarray
    pairs: np.ndarray
    kv_layout: str

    _repr_pretty_ = _pretty

    def __repr__(self) -> str:
        return (f"CopyBlocksCase(key_cache={_summary(self.key_cache)} {self.kv_layout},"
                f" pairs={self.pairs.tolist()})")


@dataclass(frozen=True)
class MergeCase:
    """A ``merge_states`` call: outs ``[T, H, D]``, lses float32 ``[T, H]`` (-inf = empty part)."""

    out_a: np.ndarray
    lse_a: np.ndarray
    out_b: np.ndarray
    lse_b: np.ndarray

    _repr_pretty_ = _pretty

    def __repr__(self) -> str:
        return (f"MergeCase(out_a={_summary(self.out_a)}, lse_a={self.lse_a.tolist()},"
                f" lse_b={self.lse_b.tolist()})")


Case = AttentionCase | WriteKVCase | CopyBlocksCase | MergeCase
_CASE_TYPES: dict[str, type] = {cls.__name__: cls for cls in (AttentionCase, WriteKVCase, CopyBlocksCase, MergeCase)}


# -- .npz -------------------------------------------------------------------------------

def _pack(arrays: dict[str, np.ndarray], meta: dict[str, Any], name: str, x: np.ndarray) -> None:
    x = np.ascontiguousarray(x)
    meta["dtypes"][name] = dtype_name(x.dtype)
    arrays[name] = x.view(_BITS[x.dtype.itemsize]) if x.dtype.kind == "V" or x.dtype.itemsize in (1, 2) else x


def _unpack(data: Any, meta: dict[str, Any], name: str) -> np.ndarray:
    x = data[name]
    dtype = numpy_dtype(meta["dtypes"][name])
    return x.view(dtype) if x.dtype != dtype else x


def save_case(path: str | Path, case: Case, *, check: str, context: dict[str, Any] | None = None) -> Path:
    """Write ``case`` as a standalone ``.npz`` with the name of the ``check`` that failed on it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {"type": type(case).__name__, "check": check, "context": context or {},
                            "dtypes": {}, "scalars": {}}
    for f in fields(case):
        value = getattr(case, f.name)
        if isinstance(value, np.ndarray):
            if f.name in ("key_cache", "value_cache") and getattr(case, "pool", None) is not None:
                continue  # views of the pool: rebuilt from it
            _pack(arrays, meta, f.name, value)
        elif f.name == "options":
            opts = {}
            for key, item in value.items():
                if isinstance(item, np.ndarray):
                    _pack(arrays, meta, f"option.{key}", item)
                else:
                    opts[key] = item
            meta["scalars"]["options"] = opts
        else:
            meta["scalars"][f.name] = value
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    with path.open("wb") as stream:
        np.savez_compressed(stream, allow_pickle=False, **arrays)
    return path


def load_case(path: str | Path) -> tuple[Case, str, dict[str, Any]]:
    """Read a case saved by :func:`save_case`; return ``(case, check name, context)``.

    Raises :class:`PagedAttentionError` naming ``path`` if the file is not such a case.
    """
    try:
        return _load_case(Path(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, zipfile.BadZipFile) as error:
        raise PagedAttentionError(
            "path", f"{path} is not a case saved by the conformance suite ({type(error).__name__}: {error})"
        ) from error


def _load_case(path: Path) -> tuple[Case, str, dict[str, Any]]:
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(bytes(data["meta"]).decode())
        cls = _CASE_TYPES[meta["type"]]
        values: dict[str, Any] = dict(meta["scalars"])
        for name in meta["dtypes"]:
            if not name.startswith("option."):
                values[name] = _unpack(data, meta, name)
        if "options" in values:
            options = dict(values["options"])
            for name in meta["dtypes"]:
                if name.startswith("option."):
                    options[name[len("option."):]] = _unpack(data, meta, name)
            values["options"] = options
        for f in fields(cls):
            if f.name not in values and f.name in ("query_start_loc", "pool"):
                values[f.name] = None
        if values.get("pool") is not None:
            values["key_cache"] = values["pool"][:, 0, values["layer"]]
            values["value_cache"] = values["pool"][:, 1, values["layer"]]
    return cls(**values), meta["check"], meta["context"]
