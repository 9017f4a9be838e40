"""The catalog: attention shapes of real models, and the benchmark cases built from them.

A :class:`Case` is one batch: a model's heads, a kind (``decode``: one query per
sequence; ``prefill``: every position of each sequence queries, causal; ``mixed``: one
chunked-prefill sequence of ``PREFILL_CHUNK`` queries among decodes), a batch size, a
context length (every sequence's ``L``), a block size, a dtype, and the order of each
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

PREFILL_CHUNK = 512  # queries of the prefill sequence in a mixed batch


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
    )
}

KINDS: tuple[str, ...] = ("decode", "prefill", "mixed")
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
    chunk: int = PREFILL_CHUNK  # queries of the prefill sequence of a mixed batch
    blocks: str = BLOCK_ORDERS[0]  # order of a sequence's blocks in the pool (BLOCK_ORDERS)

    @property
    def kind_label(self) -> str:
        """The kind, with the chunk when a mixed batch's is not the default."""
        return f"mixed{self.chunk}" if self.kind == "mixed" and self.chunk != PREFILL_CHUNK else self.kind

    @property
    def order_suffix(self) -> str:
        """``""`` for shuffled blocks (every named set's), else ``/in-order``: names keep the two apart."""
        return "" if self.blocks == BLOCK_ORDERS[0] else f"/{self.blocks}"

    @property
    def name(self) -> str:
        return (f"{self.model.name}/{self.kind_label}/b{self.batch}/ctx{self.context}/bs{self.block_size}"
                f"{self.order_suffix}")

    @property
    def q_lens(self) -> list[int]:
        """Queries of each sequence."""
        if self.kind == "decode":
            return [1] * self.batch
        if self.kind == "prefill":
            return [self.context] * self.batch
        return [min(self.chunk, self.context)] + [1] * (self.batch - 1)

    @property
    def options(self) -> dict[str, Any]:
        """The model's keyword options for ``plan`` (sliding_window, softcap)."""
        options: dict[str, Any] = {}
        if self.model.sliding_window is not None:
            options["sliding_window"] = self.model.sliding_window
        if self.model.softcap is not None:
            options["softcap"] = self.model.softcap
        return options

    @property
    def group(self) -> str:
        """Curve of the plot: model, kind, batch and block size (context varies along it)."""
        return f"{self.model.name}/{self.kind_label}/b{self.batch}/bs{self.block_size}{self.order_suffix}"


def cases(models: Iterable[str], kinds: Iterable[str], batches: Iterable[int], contexts: Iterable[int],
          block_sizes: Iterable[int] = BLOCK_SIZES, dtype: str = "bfloat16", chunk: int = PREFILL_CHUNK) -> list[Case]:
    """Every combination of the arguments, as :class:`Case` objects."""
    return [
        Case(MODELS[m], k, b, c, bs, dtype, chunk)
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


#: Named sets. ``cpu`` is small enough for a laptop; the others are sized for a large GPU.
SETS: dict[str, list[Case]] = {
    "cpu": [
        *cases(["llama3-8b"], ["decode"], [4], [256, 1024], [16, 64], "float32"),
        *cases(["llama3-70b-tp8"], ["decode"], [8], [1024], [16], "float32"),
        *cases(["llama2-7b"], ["decode"], [2], [512], [32], "float32"),
        *cases(["mistral-7b"], ["mixed"], [4], [512], [16], "float32", chunk=32),
        *cases(["llama3-8b"], ["prefill"], [1], [128], [16], "float32"),
    ],
    "quick": _gpu_quick(),
    "decode": [
        *cases(["llama3-8b", "llama3-70b-tp8", "llama2-7b"], ["decode"], [1, 8, 64], [1024, 4096, 16384]),
        *cases(["mistral-7b", "gemma2-9b"], ["decode"], [8, 64], [4096, 16384]),
    ],
    "prefill": cases(["llama3-8b", "llama3-70b-tp8", "mistral-7b", "gemma2-9b"], ["prefill"], [1, 4],
                     [1024, 4096]),
    "mixed": cases(["llama3-8b", "llama3-70b-tp8", "mistral-7b"], ["mixed"], [16, 64], [2048, 8192]),
    # The GPU backends' speed targets (issues #4 and #5): GQA 32/8, d = 128, bf16.
    "targets": [
        *cases(["llama3-8b"], ["decode"], [64], [4096]),
        *cases(["llama3-8b"], ["decode"], [2], [65536]),
        *cases(["llama3-8b"], ["prefill"], [8], [4096]),
    ],
    "small-batch": [c for batch, context in SMALL_BATCH_DECODE for c in cases(["llama3-8b"], ["decode"], [batch],
                                                                             [context])],
}
SETS["full"] = SETS["decode"] + SETS["prefill"] + SETS["mixed"]
SETS["full"] += [c for c in SETS["targets"] + SETS["small-batch"] if c not in SETS["full"]]


def resolve(names: Sequence[str], *, dtype: str | None = None, blocks: str | None = None) -> list[Case]:
    """Cases of the given set names or case names, in order, without repeats.

    ``dtype`` overrides the cases' dtype, ``blocks`` their block order (one of
    :data:`BLOCK_ORDERS`). Raises :class:`PagedAttentionError` naming ``shapes`` (or
    ``blocks``) and listing the choices for an unknown name.
    """
    if blocks is not None and blocks not in BLOCK_ORDERS:
        raise PagedAttentionError("blocks", f"expected one of {', '.join(BLOCK_ORDERS)}, received {blocks!r}")
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
            if case not in found:
                found.append(case)
    return found
