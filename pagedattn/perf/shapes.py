"""The catalog: attention shapes of real models, and the benchmark cases built from them.

A :class:`Case` is one batch: a model's heads, a kind (``decode``: one query per
sequence; ``prefill``: every position of each sequence queries, causal; ``mixed``: one
chunked-prefill sequence of ``PREFILL_CHUNK`` queries among decodes; ``chunked``: every
sequence queries its last ``chunk`` positions, the contract's lower-right causal), a batch
size, a context length (every sequence's ``L``), a block size, a dtype, the cache's dtype
(the query's, or fp8 with per-tensor ``k_scale``/``v_scale``), and the order of each
sequence's blocks in the pool (``shuffled``, as an engine's allocator leaves them after a
while, or ``in-order``: the same kernel on consecutive blocks, which shows what the
scattering itself costs). Named sets group cases; ``pagedattn bench --shapes`` takes set
names or case names.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pagedattn.errors import PagedAttentionError
from pagedattn.spec.dtypes import FP8_DTYPES

PREFILL_CHUNK = 512  # queries of the prefill sequence in a mixed batch, of each sequence in a chunked one
#: short names of the fp8 cache dtypes in case names (``/kv-e4m3``)
KV_LABELS: dict[str, str] = {"float8_e4m3fn": "e4m3", "float8_e5m2": "e5m2"}
#: per-tensor fp8 scales of a case "with scales" (a case without them uses 1.0)
FP8_SCALES: tuple[float, float] = (0.5, 2.0)


@dataclass(frozen=True)
class Model:
    """One layer's attention shape: heads, head_dim, and the options the model uses."""

    name: str
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    softcap: float | None = None
    source: str = ""


MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model("llama3-8b", 32, 8, 128, source="Llama 3 8B: GQA, 32 query / 8 KV heads"),
        Model("llama3-70b-tp8", 8, 1, 128, source="Llama 3 70B (64/8 heads) split over 8 GPUs"),
        Model("llama2-7b", 32, 32, 128, source="Llama 2 7B: MHA, 32 heads"),
        Model("mistral-7b", 32, 8, 128, sliding_window=4096, source="Mistral 7B v0.1: 4096-token window"),
        Model("gemma2-9b", 16, 8, 256, softcap=50.0, source="Gemma 2 9B: attention logit softcap 50"),
        Model("llama3.2-1b", 32, 8, 64, source="Llama 3.2 1B: GQA 32/8 at head_dim 64"),
        Model("gemma3-12b", 16, 8, 256, source="Gemma 3 12B's global layers: 16/8 heads at head_dim 256, no softcap"),
        Model("qwen2-7b", 28, 4, 128, source="Qwen2 7B: GQA 7, 28 query / 4 KV heads"),
        Model("llama3-70b", 64, 8, 128, source="Llama 3 70B on one GPU: GQA 8, 64 query / 8 KV heads"),
        Model("gemma4-26b", 8, 4, 512,
              source="Gemma 4 26B-A4B's global layers (per Dao-AILab/flash-attention issue 2427): 8/4 heads at 512"),
    )
}

KINDS: tuple[str, ...] = ("decode", "prefill", "mixed", "chunked")
BLOCK_SIZES: tuple[int, ...] = (16, 32, 64)
BLOCK_ORDERS: tuple[str, ...] = ("shuffled", "in-order")  # the first is every named set's


@dataclass(frozen=True)
class Case:
    """One benchmark batch of a model (see the module docstring)."""

    model: Model
    kind: str
    batch: int
    context: int
    block_size: int
    dtype: str = "bfloat16"
    chunk: int = PREFILL_CHUNK  # queries of the prefill sequence of a mixed batch, of each of a chunked one
    blocks: str = BLOCK_ORDERS[0]  # order of a sequence's blocks in the pool (BLOCK_ORDERS)
    kv_dtype: str | None = None  # the caches' dtype; None: the query's (``dtype``)
    k_scale: float = 1.0  # per-tensor fp8 scales (the contract ignores them for other caches)
    v_scale: float = 1.0

    @property
    def cache_dtype(self) -> str:
        """The dtype the pool holds K and V in."""
        return self.dtype if self.kv_dtype is None else self.kv_dtype

    @property
    def fp8(self) -> bool:
        return self.cache_dtype in FP8_DTYPES

    @property
    def scaled(self) -> bool:
        """Whether an fp8 case's scales differ from 1 (the scales of other caches are never used)."""
        return self.fp8 and (self.k_scale, self.v_scale) != (1.0, 1.0)

    @property
    def kind_label(self) -> str:
        """The kind, with the chunk when a mixed batch's is not the default."""
        if self.kind in ("mixed", "chunked") and self.chunk != PREFILL_CHUNK:
            return f"{self.kind}{self.chunk}"
        return self.kind

    @property
    def cache_suffix(self) -> str:
        """``""`` for a cache in the query's dtype, else ``/kv-e4m3`` (and ``/scaled`` with scales)."""
        if self.kv_dtype is None or self.kv_dtype == self.dtype:
            return ""
        label = KV_LABELS.get(self.kv_dtype, self.kv_dtype)
        return f"/kv-{label}" + ("/scaled" if self.scaled else "")

    @property
    def order_suffix(self) -> str:
        """``""`` for shuffled blocks (every named set's), else ``/in-order``: names keep the two apart."""
        return "" if self.blocks == BLOCK_ORDERS[0] else f"/{self.blocks}"

    @property
    def name(self) -> str:
        return (f"{self.model.name}/{self.kind_label}/b{self.batch}/ctx{self.context}/bs{self.block_size}"
                f"{self.cache_suffix}{self.order_suffix}")

    @property
    def q_lens(self) -> list[int]:
        """Queries of each sequence."""
        if self.kind == "decode":
            return [1] * self.batch
        if self.kind == "prefill":
            return [self.context] * self.batch
        if self.kind == "chunked":
            return [min(self.chunk, self.context)] * self.batch
        return [min(self.chunk, self.context)] + [1] * (self.batch - 1)

    @property
    def options(self) -> dict[str, Any]:
        """The keyword options for ``plan``: the model's (sliding_window, softcap), and an fp8
        cache's k_scale and v_scale."""
        options: dict[str, Any] = {}
        if self.model.sliding_window is not None:
            options["sliding_window"] = self.model.sliding_window
        if self.model.softcap is not None:
            options["softcap"] = self.model.softcap
        if self.fp8:
            options["k_scale"] = self.k_scale
            options["v_scale"] = self.v_scale
        return options

    @property
    def group(self) -> str:
        """Curve of the plot: model, kind, batch, block size and cache (context varies along it)."""
        return (f"{self.model.name}/{self.kind_label}/b{self.batch}/bs{self.block_size}{self.cache_suffix}"
                f"{self.order_suffix}")


def cases(models: Iterable[str], kinds: Iterable[str], batches: Iterable[int], contexts: Iterable[int],
          block_sizes: Iterable[int] = BLOCK_SIZES, dtype: str = "bfloat16", chunk: int = PREFILL_CHUNK,
          kv_dtype: str | None = None, scales: tuple[float, float] = (1.0, 1.0)) -> list[Case]:
    """Every combination of the arguments, as :class:`Case` objects (``scales``: k_scale, v_scale)."""
    return [
        Case(MODELS[m], k, b, c, bs, dtype, chunk, kv_dtype=kv_dtype, k_scale=scales[0], v_scale=scales[1])
        for m in models for k in kinds for b in batches for c in contexts for bs in block_sizes
    ]


#: (batch, context) of the small-batch decode targets (llama3-8b heads, every block size):
#: where latency matters most, and where a split-KV plan must fill the device
SMALL_BATCH_DECODE: tuple[tuple[int, int], ...] = ((1, 2048), (1, 32768), (4, 8192), (8, 2048), (16, 2048))


def _gpu_quick() -> list[Case]:
    return [
        *cases(["llama3-8b"], ["decode"], [1, 4, 8, 16], [2048, 8192]),
        *cases(["llama3-8b"], ["decode"], [8, 64], [1024, 4096, 16384]),
        *cases(["llama3-70b-tp8"], ["decode"], [64], [4096, 16384], [16]),
        *cases(["llama2-7b"], ["decode"], [16], [1024, 4096], [16]),
        *cases(["mistral-7b"], ["decode"], [32], [16384], [16]),
        *cases(["gemma2-9b"], ["decode"], [32], [4096], [16]),
        *cases(["llama3-8b"], ["prefill"], [4], [1024, 4096], [16]),
        *cases(["llama3-8b"], ["mixed"], [64], [4096], [16, 64]),
    ]


#: (batch, context) of the fp8-cache decode shapes (llama3-8b heads, bf16 queries)
FP8_DECODE: tuple[tuple[int, int], ...] = ((64, 4096), (2, 65536))
#: (model, batch, context) of the head_dim and head-layout decode shapes, each holding at least
#: 256 MiB of bf16 K/V: head_dim 64, 128 and 256 at GQA 4 (8 KV heads, 2 at d = 256), then at
#: head_dim 128 one KV head (GQA 8), 4 (GQA 7) and 8 (GQA 8)
LAYOUT_DECODE: tuple[tuple[str, int, int], ...] = (
    ("llama3.2-1b", 64, 4096),
    ("llama3-8b", 64, 4096),
    ("gemma3-12b", 32, 4096),
    ("llama3-70b-tp8", 64, 8192),
    ("qwen2-7b", 64, 4096),
    ("llama3-70b", 16, 16384),
)
#: (model, batch, context, dtype) of the causal prefill shapes
PREFILL_SHAPES: tuple[tuple[str, int, int, str], ...] = (
    ("llama3-8b", 8, 4096, "bfloat16"),
    ("llama3-8b", 4, 8192, "float16"),
    ("llama2-7b", 8, 2048, "float16"),
)
#: (batch, context) of the chunked prefill shape: each sequence's last PREFILL_CHUNK positions query
CHUNKED_SHAPE: tuple[int, int] = (16, 8192)


def _kernel_gaps() -> list[Case]:
    """fp8 caches at every block size (e4m3 and e5m2, with and without scales), head_dim and head
    layouts, short contexts at large batch, causal and chunked prefill: the kernels' open gaps."""
    fp8 = [
        c for batch, context in FP8_DECODE for kv in FP8_DTYPES for scales in ((1.0, 1.0), FP8_SCALES)
        for c in cases(["llama3-8b"], ["decode"], [batch], [context], kv_dtype=kv, scales=scales)
    ]
    layouts = [c for model, batch, context in LAYOUT_DECODE for c in cases([model], ["decode"], [batch], [context])]
    prefill = [c for model, batch, context, dtype in PREFILL_SHAPES
               for c in cases([model], ["prefill"], [batch], [context], dtype=dtype)]
    return [
        *fp8,
        *layouts,
        *cases(["llama3-8b"], ["decode"], [64], [1024]),
        *prefill,
        *cases(["llama3-8b"], ["chunked"], [CHUNKED_SHAPE[0]], [CHUNKED_SHAPE[1]]),
    ]


#: Named sets. ``cpu`` is small enough for a laptop; the others are sized for a large GPU.
SETS: dict[str, list[Case]] = {
    "cpu": [
        *cases(["llama3-8b"], ["decode"], [4], [256, 1024], [16, 64], "float32"),
        *cases(["llama3-70b-tp8"], ["decode"], [8], [1024], [16], "float32"),
        *cases(["llama2-7b"], ["decode"], [2], [512], [32], "float32"),
        *cases(["mistral-7b"], ["mixed"], [4], [512], [16], "float32", chunk=32),
        *cases(["llama3-8b"], ["prefill"], [1], [128], [16], "float32"),
        *cases(["llama3-8b"], ["decode"], [2], [256], [16], "float32", kv_dtype="float8_e4m3fn", scales=FP8_SCALES),
        *cases(["llama3-70b-tp8"], ["chunked"], [2], [128], [16], "float32", chunk=16),
    ],
    "quick": _gpu_quick(),
    "decode": [
        *cases(["llama3-8b", "llama3-70b-tp8", "llama2-7b"], ["decode"], [1, 8, 64], [1024, 4096, 16384]),
        *cases(["mistral-7b", "gemma2-9b"], ["decode"], [8, 64], [4096, 16384]),
    ],
    "prefill": cases(["llama3-8b", "llama3-70b-tp8", "mistral-7b", "gemma2-9b"], ["prefill"], [1, 4],
                     [1024, 4096]),
    "mixed": cases(["llama3-8b", "llama3-70b-tp8", "mistral-7b"], ["mixed"], [16, 64], [2048, 8192]),
    # The GPU backends' first speed targets: GQA 32/8, d = 128, bf16.
    "targets": [
        *cases(["llama3-8b"], ["decode"], [64], [4096]),
        *cases(["llama3-8b"], ["decode"], [2], [65536]),
        *cases(["llama3-8b"], ["prefill"], [8], [4096]),
    ],
    "small-batch": [c for batch, context in SMALL_BATCH_DECODE for c in cases(["llama3-8b"], ["decode"], [batch],
                                                                             [context])],
    "kernel-gaps": _kernel_gaps(),
    # head_dim 512 (Gemma 4's global layers): past the 256 of the other sets and of flash SDPA
    "wide-heads": [
        *cases(["gemma4-26b"], ["decode"], [32], [4096]),
        *cases(["gemma4-26b"], ["prefill"], [4], [4096]),
    ],
}
SETS["full"] = list(dict.fromkeys(SETS["decode"] + SETS["prefill"] + SETS["mixed"] + SETS["targets"]
                                  + SETS["small-batch"] + SETS["kernel-gaps"] + SETS["wide-heads"]))


#: ``kv_dtype`` of :func:`resolve` that keeps the cache in the query's dtype
KV_AS_QUERY = "query"


def with_kv_dtype(case: Case, kv_dtype: str) -> Case:
    """``case`` with its cache in ``kv_dtype`` (an fp8 dtype, or :data:`KV_AS_QUERY`); a cache in the
    query's dtype drops the scales, which the contract uses for fp8 caches only."""
    if kv_dtype == KV_AS_QUERY:
        return replace(case, kv_dtype=None, k_scale=1.0, v_scale=1.0)
    return replace(case, kv_dtype=kv_dtype)


def resolve(names: Sequence[str], *, dtype: str | None = None, blocks: str | None = None,
            kv_dtype: str | None = None) -> list[Case]:
    """Cases of the given set names or case names, in order, without repeats.

    ``dtype`` overrides the cases' dtype, ``blocks`` their block order (one of
    :data:`BLOCK_ORDERS`), ``kv_dtype`` their cache dtype (an fp8 dtype, or :data:`KV_AS_QUERY`).
    Raises :class:`PagedAttentionError` naming ``shapes`` (or ``blocks``, ``kv_dtype``) and
    listing the choices for an unknown name.
    """
    if blocks is not None and blocks not in BLOCK_ORDERS:
        raise PagedAttentionError("blocks", f"expected one of {', '.join(BLOCK_ORDERS)}, received {blocks!r}")
    kv_choices = (*FP8_DTYPES, KV_AS_QUERY)
    if kv_dtype is not None and kv_dtype not in kv_choices:
        raise PagedAttentionError("kv_dtype", f"expected one of {', '.join(kv_choices)}, received {kv_dtype!r}")
    by_name: dict[str, Case] = {}
    for group in SETS.values():
        for case in group:
            by_name.setdefault(case.name, case)  # the first set naming a case gives its dtype
    found: list[Case] = []
    for name in names:
        if name in SETS:
            chosen = SETS[name]
        elif name in by_name:
            chosen = [by_name[name]]
        else:
            raise PagedAttentionError(
                "shapes", f"unknown set or case {name!r}; sets: {', '.join(SETS)}; cases look like "
                f"{SETS['cpu'][0].name}"
            )
        for case in chosen:
            case = case if dtype is None else replace(case, dtype=dtype)
            case = case if blocks is None else replace(case, blocks=blocks)
            case = case if kv_dtype is None else with_kv_dtype(case, kv_dtype)
            if case not in found:
                found.append(case)
    return found
