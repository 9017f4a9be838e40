"""Perf-only peers, timed beside the backends on a GPU (never conformance-checked here).

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` on contiguous
  ``[batch, Hkv, L, D]`` K/V, restricted to cuDNN, else flash, else memory-efficient
  attention: the unpaged reference that the ``ratio`` column divides by. Decode, prefill
  and chunked batches (a chunked batch's lower-right causal mask is an explicit boolean
  mask, since ``is_causal`` is upper-left); a mixed batch has no single-call unpaged form; a
  sliding window in decode reads the last ``W`` keys; softcap is not available in SDPA. An
  fp8 case runs with K/V in the query's dtype (SDPA takes no fp8 cache), and its rows say so
  in ``note``: there the peer is informational.
- ``flash``: the same, restricted to flash attention only, so that a bar can name "the
  faster of cuDNN and flash".
- ``flex``: FlexAttention on a paged ``[1, Hkv, num_slots, D]`` cache, the way
  ``torch.nn.attention.experimental._paged_attention`` does it (a block mask over
  physical pages of size = block size, a mask_mod mapping a page to its sequence and
  logical block), decode only, compiled per shape within a time budget.

Each peer's ``prepare(case, rotations)`` returns ``run(i)`` or raises
:class:`~pagedattn.errors.UnsupportedError` with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pagedattn.errors import UnsupportedError
from pagedattn.perf.shapes import Case


def _unsupported(peer: str, reason: str) -> UnsupportedError:
    return UnsupportedError("case", reason, backend=peer, capability="case")


def _torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def sdpa_query_len(case: Case) -> int | None:
    """Queries per sequence of ``case`` in SDPA's ``[batch, H, q_len, D]`` form; None for a mixed
    batch, which has no single-call unpaged form."""
    if case.kind == "mixed":
        return None
    return max(case.q_lens)  # decode, prefill and chunked batches: every sequence's alike


def lower_right_causal(q_len: int, keys: int) -> np.ndarray:
    """Host bool ``[q_len, keys]``: query ``i`` (position ``keys - q_len + i``) sees keys up to its own."""
    return np.arange(keys)[None, :] <= (keys - q_len + np.arange(q_len))[:, None]


def peer_note(case: Case) -> str:
    """What an unpaged SDPA peer runs differently from ``case``, for the report (``""``: nothing)."""
    if case.fp8:
        return (f"K/V in {case.dtype}, not {case.cache_dtype}: SDPA takes no fp8 cache; informational, "
                "the fp8 bar is % of the read ceiling")
    return ""


class SdpaPeer:
    """cuDNN/flash SDPA on contiguous K/V (the unpaged reference)."""

    name = "sdpa"
    uses_block_size = False  # contiguous K/V: one time per shape serves every block size
    capturable = True  # timed in a CUDA graph too, as the backends are
    SDPA_ORDER: tuple[str, ...] = ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION")

    def __init__(self) -> None:
        self.kernel = ""
        self.note = ""  # what the last prepared case runs differently (an fp8 cache in the query's dtype)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()

    def chunked_mask(self, q_len: int, keys: int) -> Any:
        """The lower-right causal mask of a chunked batch: an explicit boolean mask on the GPU."""
        import torch

        return torch.from_numpy(lower_right_causal(q_len, keys)).to("cuda")

    def prepare(self, case: Case, rotations: int) -> Callable[[int], Any]:
        import torch
        import torch.nn.functional as F
        from torch.nn.attention import sdpa_kernel

        if not torch.cuda.is_available():
            raise _unsupported(self.name, "needs a CUDA GPU")
        q_len = sdpa_query_len(case)
        if q_len is None:
            raise _unsupported(self.name, "a mixed batch has no single-call unpaged form")
        if case.model.softcap is not None:
            raise _unsupported(self.name, "SDPA has no softcap")
        if case.kind != "decode" and case.model.sliding_window is not None:
            raise _unsupported(self.name, "a sliding window in prefill needs a mask")
        m, dtype = case.model, _torch_dtype(case.dtype)  # an fp8 case's K/V in the query's dtype
        self.note = peer_note(case)
        keys = case.context
        if case.kind == "decode" and m.sliding_window is not None:
            keys = min(keys, m.sliding_window)  # the window's last W keys, contiguous
        shape = (rotations, case.batch, m.num_kv_heads, keys, m.head_dim)
        k = torch.randn(shape, dtype=dtype, device="cuda")
        v = torch.randn(shape, dtype=dtype, device="cuda")
        q = torch.randn((rotations, case.batch, m.num_q_heads, q_len, m.head_dim), dtype=dtype, device="cuda")
        causal = case.kind == "prefill"  # upper-left, which equals lower-right when q_len == keys
        mask = self.chunked_mask(q_len, keys) if case.kind == "chunked" else None
        gqa = m.num_q_heads != m.num_kv_heads

        def attend(i: int) -> Any:
            r = i % rotations
            return F.scaled_dot_product_attention(q[r], k[r], v[r], attn_mask=mask, is_causal=causal,
                                                  enable_gqa=gqa)

        kernel, error = self._first_kernel(attend)
        if kernel is None and gqa and mask is not None:  # no kernel takes GQA with a mask: whole heads
            repeats = m.num_q_heads // m.num_kv_heads
            k, v, gqa = k.repeat_interleave(repeats, dim=2), v.repeat_interleave(repeats, dim=2), False
            kernel, error = self._first_kernel(attend)
            self.note = f"K/V heads repeated to {m.num_q_heads}: no SDPA kernel here took GQA with a mask"
        if kernel is None:
            raise _unsupported(self.name, f"no fused SDPA kernel takes it: {error}")
        self.kernel = kernel.name.split("_")[0].lower()

        def run(i: int, kernel: Any = kernel) -> Any:
            with sdpa_kernel([kernel]):
                return attend(i)

        return run

    def _first_kernel(self, attend: Callable[[int], Any]) -> tuple[Any, Exception | None]:
        """The first SDPA kernel of ``SDPA_ORDER`` that runs ``attend(0)``, else None and the last error."""
        import torch
        from torch.nn.attention import SDPBackend, sdpa_kernel

        last_error: Exception | None = None
        for name in self.SDPA_ORDER:
            kernel = getattr(SDPBackend, name)
            try:
                with sdpa_kernel([kernel]):
                    attend(0)
                torch.cuda.synchronize()
            except Exception as error:  # this kernel does not take the case: try the next
                last_error = error
                continue
            return kernel, None
        return None, last_error


class FlashPeer(SdpaPeer):
    """Flash SDPA alone on contiguous K/V: the other half of "the faster of cuDNN and flash"."""

    name = "flash"
    SDPA_ORDER = ("FLASH_ATTENTION",)

    def chunked_mask(self, q_len: int, keys: int) -> Any:
        """Flash takes no explicit mask; torch's lower-right causal bias runs flash's own causal."""
        from torch.nn.attention.bias import causal_lower_right

        return causal_lower_right(q_len, keys)


class FlexPeer:
    """FlexAttention's paged attention (decode), compiled per shape within ``budget_s``."""

    name = "flex"
    uses_block_size = True  # pages of block_size tokens
    capturable = False  # torch.compile'd: its graph column says so

    def __init__(self, budget_s: float = 30.0, device: str = "cuda") -> None:
        self.budget_s = budget_s
        self.device = device
        self.spent_s = 0.0
        self._compiled: Any = None

    def synchronize(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()

    def prepare(self, case: Case, rotations: int) -> Callable[[int], Any]:
        import torch

        if self.device == "cuda" and not torch.cuda.is_available():
            raise _unsupported(self.name, "needs a CUDA GPU")
        if case.kind != "decode":
            raise _unsupported(self.name, "decode only here")
        if self.spent_s > self.budget_s:
            raise _unsupported(self.name, f"compile budget of {self.budget_s:g} s spent")
        start = time.perf_counter()
        try:
            return self._prepare(case, rotations)
        except UnsupportedError:
            raise
        except Exception as error:
            raise _unsupported(self.name, f"{type(error).__name__}: {str(error).splitlines()[0][:160]}") from error
        finally:
            self.spent_s += time.perf_counter() - start

    def _prepare(self, case: Case, rotations: int) -> Callable[[int], Any]:
        """Physical block masks built directly: page ``i`` of the pool belongs to one
        (rotation, sequence); the mask_mod reads its owner and logical block from two
        tensors, and one 1-element tensor selects the rotation, so every rotation runs
        the same compiled kernel."""
        import torch
        from torch.nn.attention.flex_attention import BlockMask, flex_attention

        if case.model.sliding_window is not None:
            raise _unsupported(self.name, "sliding window not wired for the paged block mask")
        if self._compiled is None:
            self._compiled = torch.compile(flex_attention)
        m, dtype, bs, B = case.model, _torch_dtype(case.dtype), case.block_size, case.batch
        blocks_per_seq = -(-case.context // bs)
        n_pages = rotations * B * blocks_per_seq
        dev = self.device
        order = torch.randperm(n_pages, device=dev).view(rotations, B, blocks_per_seq)  # physical pages
        owner = torch.empty(n_pages, dtype=torch.int64, device=dev)
        logical = torch.empty(n_pages, dtype=torch.int64, device=dev)
        seq_ids = torch.arange(rotations * B, device=dev).view(rotations, B, 1).expand_as(order)
        owner[order.reshape(-1)] = seq_ids.reshape(-1)
        logical[order.reshape(-1)] = torch.arange(blocks_per_seq, device=dev).expand_as(order).reshape(-1)
        rotation = torch.zeros(1, dtype=torch.int64, device=dev)
        length = case.context

        def mask_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            page = kv_idx // bs
            position = logical[page] * bs + kv_idx % bs
            return (owner[page] == rotation[0] * B + b) & (position < length)

        full = blocks_per_seq - (1 if length % bs else 0)  # blocks with every slot visible
        masks = []
        for r in range(rotations):
            # the block mask's index rows are n_pages wide, as PagedAttention.convert_logical_block_mask makes them
            partial_idx = torch.zeros((B, 1, 1, n_pages), dtype=torch.int32, device=dev)
            full_idx = torch.zeros((B, 1, 1, n_pages), dtype=torch.int32, device=dev)
            pages = order[r].to(torch.int32)  # [B, blocks]
            full_idx[:, 0, 0, :full] = pages[:, :full]
            partial_idx[:, 0, 0, : blocks_per_seq - full] = pages[:, full:]
            masks.append(BlockMask.from_kv_blocks(
                torch.full((B, 1, 1), blocks_per_seq - full, dtype=torch.int32, device=dev), partial_idx,
                torch.full((B, 1, 1), full, dtype=torch.int32, device=dev), full_idx,
                BLOCK_SIZE=(128, bs), mask_mod=mask_mod, seq_lengths=(1, n_pages * bs),
            ))
        cache_shape = (1, m.num_kv_heads, n_pages * bs, m.head_dim)
        k_cache = torch.randn(cache_shape, dtype=dtype, device=dev)
        v_cache = torch.randn(cache_shape, dtype=dtype, device=dev)
        # flex broadcasts the cache's batch of 1 over the B queries
        queries = [torch.randn((B, m.num_q_heads, 1, m.head_dim), dtype=dtype, device=dev)
                   for _ in range(rotations)]
        gqa = m.num_q_heads != m.num_kv_heads
        softcap = m.softcap

        def capped(score: Any, b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            cap = float(softcap or 1.0)
            return cap * torch.tanh(score / cap)

        def run(i: int) -> Any:
            r = i % rotations
            rotation.fill_(r)
            return self._compiled(queries[r], k_cache, v_cache, block_mask=masks[r],
                                  score_mod=capped if softcap is not None else None, enable_gqa=gqa)

        run(0)
        self.synchronize()
        return run


PEERS: dict[str, Callable[[], Any]] = {"sdpa": SdpaPeer, "flash": FlashPeer, "flex": FlexPeer}
