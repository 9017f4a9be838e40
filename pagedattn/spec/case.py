"""One paged-attention call on host arrays: the case type of the spec's pools, the conformance
suite, perf and the GPU tests.

A case holds NumPy (and ml_dtypes) arrays and the call's keyword options; what the arrays
mean is :mod:`pagedattn.spec.arrays`. Building cases: :func:`pagedattn.spec.pools.random_paged_inputs`
(fixed shapes, poisoned pools), the conformance strategies (drawn), and
:func:`pagedattn.perf.inputs.attention_case` (benchmark shapes). Running one on a backend:
:func:`pagedattn.conformance.cases.run_case`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from pagedattn.spec.dtypes import dtype_name


def pretty(self: Any, printer: Any, cycle: bool) -> None:
    """Hypothesis' and IPython's pretty printers: the short repr, not every array element."""
    printer.text(repr(self))


def summary(x: np.ndarray | None) -> str:
    """``dtype[shape]`` of an array, or ``None``."""
    return "None" if x is None else f"{dtype_name(x.dtype)}{list(x.shape)}"


#: Elements of an array a message or repr lists; a larger one is shown by its dtype, shape and range.
LISTED_ELEMENTS = 64


def listed(x: np.ndarray) -> str:
    """A small array's values as a list; a larger one's dtype, shape and least and greatest value
    (a message about a call of 65,536 sequences stays a line)."""
    x = np.asarray(x)
    if x.size <= LISTED_ELEMENTS:
        return str(x.tolist())
    return f"{summary(x)} of {x.min()} to {x.max()}"


def pool_views(pool: Any, layer: int, head_dim: int) -> tuple[Any, Any]:
    """``(key_cache, value_cache)``: the views ``pool[:, 0, layer]`` and ``pool[:, 1, layer]`` of a
    multi-layer pool (host or device array), the last axis cut to ``head_dim`` where the pool's
    rows are longer (padded rows: strides not a multiple of head_dim, possibly odd)."""
    return pool[:, 0, layer][..., :head_dim], pool[:, 1, layer][..., :head_dim]


def query_view(qkv: Any, num_q_heads: int) -> Any:
    """The query ``[T, Hq, D]`` as the view ``qkv[:, :Hq]`` of a fused QKV projection's rows
    ``[T, Hq + 2 * Hkv, D]`` (host or device array): its stride between tokens is that of the rows."""
    return qkv[:, :num_q_heads]


def table_view(wide_tables: Any, width: int) -> Any:
    """The block table ``[num_seqs, width]`` as the view ``wide_tables[:, :width]`` of an engine's
    wider table (host or device array): its stride between rows is the wider table's."""
    return wide_tables[:, :width]


#: Fields of :class:`AttentionCase` that are views of another field when it is set: the view,
#: the array it is a view of, and how the view is taken (from the array and the view's shape).
_BACKED_VIEWS: tuple[tuple[str, str, Any], ...] = (
    ("query", "qkv", lambda qkv, shape: query_view(qkv, shape[1])),
    ("block_tables", "wide_tables", lambda wide, shape: table_view(wide, shape[1])),
)


@dataclass(frozen=True, repr=False)
class AttentionCase:
    """One paged-attention call on host arrays; ``query_start_loc`` None means decode.

    ``options`` are the keyword options of :func:`~pagedattn.spec.arrays.check_paged_attention`
    (``kv_layout`` included). ``pool`` (when not None) is the multi-layer pool
    ``[num_blocks, 2, num_layers, ...]`` of which ``key_cache`` and ``value_cache`` are strided
    views (:func:`pool_views`: its rows may be longer than head_dim). ``qkv`` (when not None) is a
    fused QKV projection's rows ``[T, Hq + 2 * Hkv, D]`` of which ``query`` is the strided view
    (:func:`query_view`), ``wide_tables`` (when not None) a wider block table of which
    ``block_tables`` is the view (:func:`table_view`). ``seed`` drives the variants the invariant
    checks build; ``labels`` describe the case (its name, or a strategy's draw).
    """

    query: np.ndarray
    key_cache: np.ndarray
    value_cache: np.ndarray
    block_tables: np.ndarray
    seq_lens: np.ndarray
    query_start_loc: np.ndarray | None
    options: dict[str, Any] = field(default_factory=dict)
    pool: np.ndarray | None = None
    layer: int = 0
    qkv: np.ndarray | None = None
    wide_tables: np.ndarray | None = None
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

    @property
    def head_dim(self) -> int:
        return int(self.query.shape[-1])

    @property
    def name(self) -> str:
        """The case's label ``name`` (hand-written cases carry one), else its repr."""
        return self.labels.get("name", repr(self))

    def args(self) -> tuple[Any, ...]:
        """The positional arguments of ``paged_attention``, ``plan`` and the spec's ``exact_attention``."""
        return (self.query, self.key_cache, self.value_cache, self.block_tables, self.seq_lens,
                self.query_start_loc)

    def replace(self, **changes: Any) -> AttentionCase:
        """Return a copy with some fields changed. The caches follow ``pool`` when it changes, the
        query ``qkv`` and the block table ``wide_tables``. A new query (block table) of the same
        shape and dtype is written into a copy of the array it was a view of, the rest of it kept;
        one of another shape is an array of its own."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        if "pool" in changes and changes["pool"] is not None:
            values["key_cache"], values["value_cache"] = pool_views(changes["pool"], values["layer"],
                                                                    int(values["query"].shape[-1]))
        for name, backing, view in _BACKED_VIEWS:
            array, old = values[backing], getattr(self, name)
            if backing in changes and array is not None:
                values[name] = view(array, old.shape)
            elif name in changes and array is not None:
                new = np.asarray(changes[name])
                if new.shape == old.shape and new.dtype == array.dtype:
                    values[backing] = array.copy()
                    values[name] = view(values[backing], old.shape)
                    values[name][...] = new
                else:
                    values[backing] = None
        return AttentionCase(**values)

    def with_options(self, **options: Any) -> AttentionCase:
        """Return a copy whose options are updated with ``options``."""
        return self.replace(options={**self.options, **options})

    _repr_pretty_ = pretty

    def __repr__(self) -> str:
        opts = {k: (summary(v) if isinstance(v, np.ndarray) else v) for k, v in self.options.items()}
        qsl = None if self.query_start_loc is None else listed(self.query_start_loc)
        pool = "" if self.pool is None else f", pool={summary(self.pool)}[:, k/v, {self.layer}]"
        qkv = "" if self.qkv is None else f" of qkv={summary(self.qkv)}"
        wide = "" if self.wide_tables is None else f" of {summary(self.wide_tables)}"
        return (
            f"AttentionCase(query={summary(self.query)}{qkv}, key_cache={summary(self.key_cache)}{pool},"
            f" seq_lens={listed(self.seq_lens)}, query_start_loc={qsl},"
            f" block_tables={listed(self.block_tables)}{wide}, options={opts}, labels={self.labels})"
        )
