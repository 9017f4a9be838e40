"""Conformance cases: the inputs of one call, how to run them on a backend, and their ``.npz`` form.

The attention case is the spec's :class:`~pagedattn.spec.case.AttentionCase`; :func:`run_case`
moves it to the backend's device, calls it through the public interface only, and brings
the results back. Saved
cases are standalone: ``pagedattn replay CASE.npz --backend NAME`` needs nothing else.
bfloat16/fp8 arrays are stored as their raw bits plus the dtype name, because ``.npz``
does not know ml_dtypes. Caches of more than :data:`SPARSE_ELEMENTS` elements (the scale
cells' pools past 2**31 elements) are stored as their non-zero blocks and rebuilt lazily
(:func:`~pagedattn.spec.pools.lazy_cache`), so such a case file stays small.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from pagedattn.backends.interface import Backend
from pagedattn.conformance.uploads import upload
from pagedattn.errors import PagedAttentionError
from pagedattn.spec.case import (
    LISTED_ELEMENTS,
    AttentionCase,
    listed,
    pool_views,
    pretty,
    query_view,
    summary,
    table_view,
)
from pagedattn.spec.dtypes import dtype_name, numpy_dtype
from pagedattn.spec.pools import INT32_OFFSET_LIMIT, occupied_blocks

_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
#: Arrays with more elements are saved as their non-zero blocks (axis 0) only.
SPARSE_ELEMENTS = 2**26


class AttentionResult(NamedTuple):
    """A backend's answer on the host: out ``[T, Hq, D]`` and lse float32 ``[T, Hq]`` (or None)."""

    out: np.ndarray
    lse: np.ndarray | None


def device_caches(backend: Backend, case: AttentionCase,
                  to_device: Callable[[np.ndarray], Any] | None = None) -> tuple[Any, Any, Any]:
    """Return ``(key_cache, value_cache, pool or None)`` of ``case`` on the backend's device, views
    kept (``to_device``: how the arrays get there, by default :func:`~pagedattn.conformance.uploads.upload`)."""
    to_device = to_device or partial(upload, backend)
    if case.pool is not None:
        # a pool past 2**31 elements is lazy (pools.lazy_cache) and handed over as it is, which a
        # host backend takes without copying; a smaller one is copied, so that the case keeps its
        # bits from before the call to compare with
        pool = to_device(case.pool if case.pool.size >= INT32_OFFSET_LIMIT else case.pool.copy())
        return (*pool_views(pool, case.layer, case.head_dim), pool)
    return to_device(case.key_cache.copy()), to_device(case.value_cache.copy()), None


def device_arguments(backend: Backend, case: AttentionCase, caches: tuple[Any, Any, Any],
                     to_device: Callable[[np.ndarray], Any] | None = None) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(query, key_cache, value_cache, block_tables, seq_lens, query_start_loc)`` of ``case`` on
    the backend's device (the caches given, from :func:`device_caches`; the query, or the fused
    rows it is a view of, through ``to_device``, by default :func:`~pagedattn.conformance.uploads.upload`;
    the block table, or the wider table it is a view of, through ``upload``), and its options."""
    key_cache, value_cache, _ = caches
    options = dict(case.options)
    if options.get("alibi_slopes") is not None:
        options["alibi_slopes"] = upload(backend, options["alibi_slopes"])
    qsl = None if case.query_start_loc is None else upload(backend, case.query_start_loc)
    to_device = to_device or partial(upload, backend)
    # a query of fused QKV rows reaches the backend as the strided view an engine passes
    query = to_device(case.query) if case.qkv is None else query_view(to_device(case.qkv), case.query.shape[1])
    tables = (upload(backend, case.block_tables) if case.wide_tables is None
              else table_view(upload(backend, case.wide_tables), case.block_tables.shape[1]))
    lens = upload(backend, case.seq_lens)
    arrays = (query, key_cache, value_cache, tables, lens, qsl)
    return arrays, options


def device_kv(backend: Backend, case: WriteKVCase) -> tuple[Any, Any]:
    """``write_kv``'s key and value on the backend's device: views of the fused rows on the device
    where the case has them (strided, as an engine passes them), else arrays of their own."""
    if case.qkv is not None:
        return kv_views(upload(backend, case.qkv), case.key.shape[1])
    return upload(backend, case.key), upload(backend, case.value)


def host_result(backend: Backend, result: Any, return_lse: bool) -> AttentionResult:
    """What ``run`` returned (``out`` or ``(out, lse)``), copied to the host."""
    if return_lse:
        out, lse = result
        return AttentionResult(np.asarray(backend.to_numpy(out)), np.asarray(backend.to_numpy(lse)))
    return AttentionResult(np.asarray(backend.to_numpy(result)), None)


def run_case(backend: Backend, case: AttentionCase, *, caches: tuple[Any, Any, Any] | None = None) -> AttentionResult:
    """Call ``backend.paged_attention`` on device copies of ``case``; return host results."""
    arrays, options = device_arguments(backend, case, caches if caches is not None else device_caches(backend, case))
    result = backend.paged_attention(*arrays, **options)
    backend.synchronize()
    return host_result(backend, result, bool(options.get("return_lse")))


def _short(index: np.ndarray) -> str:
    """An index array as :func:`listed` lists it, or past that many entries as its size and the
    entries that are not -1."""
    if index.size <= LISTED_ELEMENTS:
        return listed(index)
    kept = np.flatnonzero(index.ravel() != -1)
    return f"{summary(index)} ({kept.size} not -1, from entry {int(kept[0]) if kept.size else '-'})"


class _ShortRepr:
    """Hypothesis' and IPython's pretty printers show a case by its short repr."""

    _repr_pretty_ = pretty


def kv_views(qkv: Any, num_kv_heads: int) -> tuple[Any, Any]:
    """``(key, value)`` ``[T, Hkv, D]`` as the views of the last ``2 * Hkv`` heads of a fused QKV
    projection's rows ``[T, Hq + 2 * Hkv, D]`` (host or device array), as an engine splits them."""
    first = qkv.shape[1] - 2 * num_kv_heads
    return qkv[:, first:first + num_kv_heads], qkv[:, first + num_kv_heads:]


@dataclass(frozen=True)
class WriteKVCase(_ShortRepr):
    """A ``write_kv`` call: key/value ``[T, Hkv, D]``, caches of ``kv_layout``, slot_mapping ``[T]``
    (passed as a list of ints where ``slots_as_list``); ``qkv`` (when not None) the fused QKV rows
    of which key and value are views (:func:`kv_views`)."""

    key: np.ndarray
    value: np.ndarray
    key_cache: np.ndarray
    value_cache: np.ndarray
    slot_mapping: np.ndarray
    kv_layout: str
    k_scale: float = 1.0
    v_scale: float = 1.0
    qkv: np.ndarray | None = None
    slots_as_list: bool = False

    def __repr__(self) -> str:
        qkv = "" if self.qkv is None else f" of qkv={summary(self.qkv)}"
        form = " as a list" if self.slots_as_list else ""
        return (f"WriteKVCase(key={summary(self.key)}{qkv}, key_cache={summary(self.key_cache)} {self.kv_layout},"
                f" slot_mapping={_short(self.slot_mapping)}{form}, k_scale={self.k_scale}, v_scale={self.v_scale})")

    def slot_mapping_for(self, backend: Backend) -> Any:
        """slot_mapping as the call passes it: a list of ints, or an array on the backend's device."""
        return self.slot_mapping.tolist() if self.slots_as_list else upload(backend, self.slot_mapping)


@dataclass(frozen=True)
class CopyBlocksCase(_ShortRepr):
    """A ``copy_blocks`` call: caches of ``kv_layout`` and pairs int ``[n, 2]`` of (src, dst)."""

    key_cache: np.ndarray
    value_cache: np.ndarray
    pairs: np.ndarray
    kv_layout: str

    def __repr__(self) -> str:
        return (f"CopyBlocksCase(key_cache={summary(self.key_cache)} {self.kv_layout},"
                f" pairs={listed(self.pairs)})")


@dataclass(frozen=True)
class MergeCase(_ShortRepr):
    """A ``merge_states`` call: outs ``[T, H, D]``, lses float32 ``[T, H]`` (-inf = empty part);
    with ``lse_heads_first`` the lses reach the backend as transposed views of ``[H, T]`` arrays,
    the layout FlashAttention returns (:func:`device_merge_arguments`)."""

    out_a: np.ndarray
    lse_a: np.ndarray
    out_b: np.ndarray
    lse_b: np.ndarray
    lse_heads_first: bool = False

    def __repr__(self) -> str:
        layout = ", lse_heads_first=True" if self.lse_heads_first else ""
        lses = [listed(x) for x in (self.lse_a, self.lse_b)]
        return f"MergeCase(out_a={summary(self.out_a)}, lse_a={lses[0]}, lse_b={lses[1]}{layout})"


def device_merge_arguments(backend: Backend, case: MergeCase) -> tuple[Any, Any, Any, Any]:
    """``merge_states``' arguments on the backend's device; with ``lse_heads_first`` each lse the
    view ``.T`` of a device array ``[H, T]`` (strided, as an engine holding FlashAttention's lse passes it)."""
    def lse(x: np.ndarray) -> Any:
        return upload(backend, np.ascontiguousarray(x.T)).T if case.lse_heads_first else upload(backend, x)

    return upload(backend, case.out_a), lse(case.lse_a), upload(backend, case.out_b), lse(case.lse_b)


Case = AttentionCase | WriteKVCase | CopyBlocksCase | MergeCase
_CASE_TYPES: dict[str, type] = {cls.__name__: cls for cls in (AttentionCase, WriteKVCase, CopyBlocksCase, MergeCase)}


# -- .npz -------------------------------------------------------------------------------

def _pack(arrays: dict[str, np.ndarray], meta: dict[str, Any], name: str, x: np.ndarray) -> None:
    x = np.ascontiguousarray(x)
    meta["dtypes"][name] = dtype_name(x.dtype)
    arrays[name] = x.view(_BITS[x.dtype.itemsize]) if x.dtype.kind == "V" or x.dtype.itemsize in (1, 2) else x


def _pack_array(arrays: dict[str, np.ndarray], meta: dict[str, Any], name: str, x: np.ndarray) -> None:
    """Pack ``x`` whole, or past :data:`SPARSE_ELEMENTS` as its shape, non-zero block ids and blocks."""
    if x.size <= SPARSE_ELEMENTS or x.ndim < 2:
        _pack(arrays, meta, name, x)
        return
    blocks = occupied_blocks(x)
    meta.setdefault("sparse", {})[name] = list(x.shape)
    arrays[f"{name}.blocks"] = blocks
    _pack(arrays, meta, name, x[blocks])


def _unpack(data: Any, meta: dict[str, Any], name: str) -> np.ndarray:
    x = data[name]
    dtype = numpy_dtype(meta["dtypes"][name])
    x = x.view(dtype) if x.dtype != dtype else x
    shape = meta.get("sparse", {}).get(name)
    if shape is None:
        return x
    full = np.zeros(tuple(shape), dtype=dtype)  # lazy: only the stored blocks are touched
    full[data[f"{name}.blocks"]] = x
    return full


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
            if f.name == "query" and getattr(case, "qkv", None) is not None:
                meta["query_heads"] = int(value.shape[1])
                continue  # a view of the fused rows: rebuilt from them
            if f.name == "block_tables" and getattr(case, "wide_tables", None) is not None:
                meta["table_width"] = int(value.shape[1])
                continue  # a view of the wider table: rebuilt from it
            if f.name in ("key", "value") and getattr(case, "qkv", None) is not None:
                meta["kv_heads"] = int(value.shape[1])
                continue  # views of the fused rows: rebuilt from them
            _pack_array(arrays, meta, f.name, value)
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
    # An .npz as np.savez_compressed writes it, at zlib level 1: the caches hold garbage (random
    # bits, which no level compresses much), and the default level took seconds a scale case.
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)
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
            if f.name not in values and f.name in ("query_start_loc", "pool", "qkv", "wide_tables"):
                values[f.name] = None
        if values.get("qkv") is not None and "query_heads" in meta:
            values["query"] = query_view(values["qkv"], int(meta["query_heads"]))
        if values.get("wide_tables") is not None:
            values["block_tables"] = table_view(values["wide_tables"], int(meta["table_width"]))
        if values.get("qkv") is not None and "kv_heads" in meta:
            values["key"], values["value"] = kv_views(values["qkv"], int(meta["kv_heads"]))
        if values.get("pool") is not None:
            values["key_cache"], values["value_cache"] = pool_views(values["pool"], int(values["layer"]),
                                                                    int(values["query"].shape[-1]))
    return cls(**values), meta["check"], meta["context"]
