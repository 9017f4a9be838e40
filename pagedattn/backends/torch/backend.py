"""The ``torch`` backend: gather the blocks through the block table, then attend.

For each group of sequences with equal ``q_len`` (see :mod:`.groups`) the keys and values
are gathered into padded contiguous tensors and passed to
``torch.nn.functional.scaled_dot_product_attention``; softcap, ALiBi, lse and float32
inputs take the explicit float32 path of :mod:`.attention`. fp8 caches are upcast
(``cache * scale``). Runs on CUDA when torch sees a GPU, else on the CPU. It must match
:func:`pagedattn.spec.exact.exact_attention` within :mod:`pagedattn.spec.error_model`.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np

from pagedattn.backends.bitviews import numpy_to_torch, torch_to_numpy
from pagedattn.backends.capabilities import ON_CURRENT_DEVICE_FEATURES, Capabilities
from pagedattn.backends.interface import Backend, Plan
from pagedattn.backends.torch import groups
from pagedattn.backends.torch.groups import plan_groups
from pagedattn.spec.arrays import AttentionProblem, WriteKVProblem
from pagedattn.spec.dtypes import FP8_DTYPES

#: Elements of the states ``merge_states`` merges at a time: its float64 temporaries then take about
#: 2 GiB, whatever the batch (two states of 2**31 elements took 16 GiB at once).
MERGE_CHUNK_ELEMENTS = 2**26


def _torch() -> Any:
    import torch

    return torch


def holds_scores(explicit: bool, device_type: str, pattern: str) -> bool:
    """Whether attending a group materializes its scores (or a mask as large), so that a long
    prefill takes its rows in chunks: the explicit path, SDPA's math kernel (any device but
    CUDA) and an explicit mask do; on CUDA, SDPA's flash and memory-efficient kernels with their
    own causal or full pattern do not (a chunk would need a mask and a slower kernel)."""
    return explicit or device_type != "cuda" or pattern == "mask"


class TorchBackend(Backend):
    """Paged attention in PyTorch: gather blocks, then SDPA (or explicit float32 softmax)."""

    name = "torch"
    accepts_torch = True
    version = "0.1.0"
    description = "PyTorch: gather the blocks, then scaled_dot_product_attention (CPU or CUDA)"

    def __init__(self, device: str | None = None) -> None:
        torch = _torch()
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @classmethod
    def availability(cls) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed (pip install 'pagedattn[torch]')"
        return None

    def capabilities(self) -> Capabilities:
        return Capabilities(device=self.device.type, features=ON_CURRENT_DEVICE_FEATURES)

    def current_device(self) -> str | None:
        """The device of the plan's index tensors (the backend's, else the current CUDA device): a
        call of arrays on another GPU is unsupported. None on the CPU."""
        if self.device.type != "cuda":
            return None
        index = self.device.index
        return f"cuda:{_torch().cuda.current_device() if index is None else index}"

    def device_name(self) -> str:
        torch = _torch()
        if self.device.type == "cuda":
            return str(torch.cuda.get_device_name(self.device))
        return "cpu"

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            _torch().cuda.synchronize(self.device)

    # -- arrays --------------------------------------------------------------
    def _torch_dtype(self, name: str) -> Any:
        return getattr(_torch(), name)

    def to_device(self, array: np.ndarray) -> Any:
        return numpy_to_torch(np.asarray(array), self.device)

    def to_numpy(self, array: Any) -> np.ndarray:
        if not isinstance(array, _torch().Tensor):
            return np.asarray(array)
        return torch_to_numpy(array)

    # -- paged attention -----------------------------------------------------
    def _plan(self, problem: AttentionProblem, block_tables: Any, seq_lens: Any,
              query_start_loc: Any, alibi_slopes: Any) -> dict[str, Any]:
        from pagedattn.backends.torch.attention import GroupTensors

        torch = _torch()

        def upload(x: np.ndarray) -> Any:
            return torch.from_numpy(np.ascontiguousarray(x)).to(self.device)

        planned = [
            GroupTensors(
                q_len=g.q_len, blocks=upload(g.blocks), valid=upload(g.valid),
                tokens=upload(g.tokens), p_q=upload(g.p_q), lengths=upload(g.lengths),
                uniform=g.uniform, max_length=int(g.valid.shape[1]), offset=g.offset, pattern=g.pattern,
            )
            for g in plan_groups(problem)
        ]
        slopes = None if problem.alibi_slopes is None else upload(problem.alibi_slopes)
        scaled = problem.cache_dtype in FP8_DTYPES or problem.k_scale != 1.0 or problem.v_scale != 1.0
        # a scale of 0: CUDA's flash SDPA returns NaN for it (the spec: every visible score 0)
        explicit = (
            problem.softcap is not None or problem.alibi_slopes is not None or problem.return_lse
            or problem.dtype == "float32" or (scaled and problem.cache_dtype not in FP8_DTYPES)
            or problem.scale == 0.0
        )
        return {"groups": planned, "alibi_slopes": slopes, "explicit": explicit}

    def _run(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> tuple[Any, Any]:
        """Attend each group, in row chunks where its scores would exist whole (:func:`holds_scores`)."""
        from pagedattn.backends.torch.attention import explicit_attention, gather, sdpa_attention

        torch = _torch()
        problem, state = plan.problem, plan.state
        T, Hq, D = problem.num_tokens, problem.num_q_heads, problem.head_dim
        out = torch.zeros((T, Hq, D), dtype=query.dtype, device=query.device)
        lse = torch.full((T, Hq), float("-inf"), dtype=torch.float32, device=query.device)
        fp8 = problem.cache_dtype in FP8_DTYPES
        for group in state["groups"]:
            k = gather(key_cache, problem.kv_layout, group)
            v = gather(value_cache, problem.kv_layout, group)
            if state["explicit"]:
                k = k.to(torch.float32) * problem.k_scale
                v = v.to(torch.float32) * problem.v_scale
            elif fp8:  # upcast: the value used is cache * scale, rounded to the query's dtype
                k = (k.to(torch.float32) * problem.k_scale).to(query.dtype)
                v = (v.to(torch.float32) * problem.v_scale).to(query.dtype)
            chunks = (group.row_chunks(Hq, groups.GROUP_ELEMENTS)
                      if holds_scores(state["explicit"], query.device.type, group.pattern) else [group])
            for rows in chunks:
                q = query[rows.tokens]  # [S, rows, Hq, D]
                if state["explicit"]:
                    o, lse_g = explicit_attention(problem, q.to(torch.float32), k, v, rows, state["alibi_slopes"])
                    lse[rows.tokens.reshape(-1)] = lse_g.reshape(-1, Hq)
                elif query.device.type != "cuda" and bool(torch.isinf(q).any()):
                    # SDPA's math kernel gives NaN for a row whose every score is -inf (an inf query
                    # element against keys of one sign), a row without keys: the explicit path gives 0
                    o, _ = explicit_attention(problem, q.to(torch.float32), k.to(torch.float32),
                                              v.to(torch.float32), rows, state["alibi_slopes"])
                else:
                    o = sdpa_attention(problem, q, k, v, rows)
                out[rows.tokens.reshape(-1)] = o.reshape(-1, Hq, D).to(query.dtype)
        return out, (lse if problem.return_lse else None)

    # -- other operations ------------------------------------------------------
    def _write_kv(self, problem: WriteKVProblem, key: Any, value: Any, key_cache: Any,
                  value_cache: Any, slot_mapping: Any) -> None:
        torch = _torch()
        tokens_np = np.flatnonzero(problem.slot_mapping >= 0)
        slots = problem.slot_mapping[tokens_np]
        tokens = torch.from_numpy(tokens_np).to(key_cache.device)
        blocks = torch.from_numpy(slots // problem.block_size).to(key_cache.device)
        offsets = torch.from_numpy(slots % problem.block_size).to(key_cache.device)
        for cache, x, scale in ((key_cache, key, problem.k_scale), (value_cache, value, problem.v_scale)):
            rows = x[tokens]
            if scale != 1.0:
                rows = rows.to(torch.float64) / scale
            stored = rows.to(cache.dtype)
            view = cache if problem.kv_layout == "NHD" else cache.transpose(1, 2)  # [N, bs, Hkv, D]
            if cache.element_size() == 1:  # fp8 index_put on CPU: move the raw bytes
                view.view(torch.uint8)[blocks, offsets] = stored.view(torch.uint8)
            else:
                view[blocks, offsets] = stored

    def _copy_blocks(self, key_cache: Any, value_cache: Any, pairs: np.ndarray) -> None:
        torch = _torch()
        for cache in (key_cache, value_cache):
            src = torch.from_numpy(pairs[:, 0].copy()).to(cache.device)
            dst = torch.from_numpy(pairs[:, 1].copy()).to(cache.device)
            raw = cache.view(torch.uint8) if cache.element_size() == 1 else cache
            sources = raw[src].clone()  # every source read before any destination is written
            raw[dst] = sources

    def _merge_states(self, out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
        """The exact merge in float64, :data:`MERGE_CHUNK_ELEMENTS` elements of the states at a time."""
        torch = _torch()
        out = torch.empty_like(out_a)
        lse = torch.empty(lse_a.shape, dtype=torch.float32, device=out_a.device)
        row_elements = max(1, int(np.prod(out_a.shape[1:])))
        rows = max(1, MERGE_CHUNK_ELEMENTS // row_elements)
        for start in range(0, out_a.shape[0], rows):
            part = slice(start, start + rows)
            out[part], lse[part] = _merged(torch, out_a[part], lse_a[part], out_b[part], lse_b[part])
        return out, lse


def _merged(torch: Any, out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
    """Merge two states (out [n, H, D], lse [n, H]) in float64; an empty side (lse = -inf) is ignored."""
    lse_a64, lse_b64 = lse_a.to(torch.float64), lse_b.to(torch.float64)
    m = torch.maximum(lse_a64, lse_b64)
    shift = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    w_a, w_b = torch.exp(lse_a64 - shift), torch.exp(lse_b64 - shift)
    zero = torch.zeros((), dtype=torch.float64, device=out_a.device)
    o_a = torch.where(torch.isneginf(lse_a64)[..., None], zero, out_a.to(torch.float64))  # an empty side may be NaN
    o_b = torch.where(torch.isneginf(lse_b64)[..., None], zero, out_b.to(torch.float64))
    total = w_a + w_b
    empty = total <= 0
    safe = torch.where(empty, torch.ones_like(total), total)
    out = (w_a[..., None] * o_a + w_b[..., None] * o_b) / safe[..., None]
    lse = torch.where(empty, torch.full_like(total, float("-inf")), shift + torch.log(safe))
    return out.to(out_a.dtype), lse.to(torch.float32)
