"""Attention of one group of sequences on gathered K/V, in torch.

Two paths compute the contract's steps 1-4 (see :mod:`pagedattn.spec.arrays`):

- :func:`sdpa_attention`: ``torch.nn.functional.scaled_dot_product_attention`` on the query's
  dtype, with a boolean mask only where the visible keys are not SDPA's own pattern;
- :func:`explicit_attention`: scores in float32 (softcap, ALiBi, lse, float32 inputs),
  the softmax written out: ``m`` = max score, ``w = exp(s - m)``, ``out = (w @ v) / l``,
  ``lse = m + log l``.

Both return ``[S, q_len, Hq, D]``; rows with no visible key are 0 (lse ``-inf``); NaN or inf
in what a row sees propagates as IEEE arithmetic says.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch.nn.attention import SDPBackend

from pagedattn.spec.arrays import AttentionProblem


@dataclass(frozen=True)
class GroupTensors:
    """A group's index arrays on the device (see :class:`~.groups.Group`)."""

    q_len: int
    blocks: torch.Tensor  # int64 [S, ceil(L_max / block_size)]
    valid: torch.Tensor  # bool [S, L_max]
    tokens: torch.Tensor  # int64 [S, q_len]
    p_q: torch.Tensor  # int64 [S, q_len]
    lengths: torch.Tensor  # int64 [S]
    uniform: bool  # all lengths equal (and > 0)
    max_length: int  # gathered positions: L_max - offset (>= 1)
    offset: int  # position of the first gathered key (a multiple of block_size)
    pattern: str  # "all", "causal" or "mask" (see groups.sdpa_pattern)

    def row_chunks(self, num_q_heads: int, elements: int) -> list[GroupTensors]:
        """The group's query rows in chunks whose scores ``[S, Hq, rows, keys]`` hold at most
        ``elements`` (at least one row each): a long prefill's scores never exist whole. A
        chunk of a top-left causal group is masked (its first query is no longer position 0)."""
        S = int(self.tokens.shape[0])
        rows = max(1, elements // max(1, S * num_q_heads * self.max_length))
        if rows >= self.q_len:
            return [self]
        pattern = "mask" if self.pattern == "causal" else self.pattern
        return [replace(self, q_len=min(rows, self.q_len - a), tokens=self.tokens[:, a:a + rows],
                        p_q=self.p_q[:, a:a + rows], pattern=pattern)
                for a in range(0, self.q_len, rows)]


def gather(cache: torch.Tensor, kv_layout: str, group: GroupTensors) -> torch.Tensor:
    """Gather whole blocks into ``[S, Hkv, L_max, D]`` (any cache strides); positions ``p >= L`` zeroed."""
    raw = cache.view(torch.uint8) if cache.element_size() == 1 else cache  # fp8 indexing on CPU
    x = raw[group.blocks]  # NHD [S, nb, bs, Hkv, D]; HND [S, nb, Hkv, bs, D]
    S = x.shape[0]
    x = x.permute(0, 3, 1, 2, 4) if kv_layout == "NHD" else x.permute(0, 2, 1, 3, 4)  # [S, Hkv, nb, bs, D]
    x = x.reshape(S, x.shape[1], -1, x.shape[-1])[:, :, : group.max_length]
    if not group.uniform:  # shorter sequences: slots past their L may hold anything (NaN)
        x = torch.where(group.valid[:, None, :, None], x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.view(cache.dtype) if raw is not cache else x


def visibility(problem: AttentionProblem, group: GroupTensors) -> tuple[torch.Tensor, torch.Tensor]:
    """``(visible bool, distance float32 p - p_q)``, each ``[S, q_len, L_max - offset]``."""
    p = group.offset + torch.arange(group.max_length, device=group.p_q.device)
    distance = p[None, None, :] - group.p_q[:, :, None]
    visible = p[None, None, :] < group.lengths[:, None, None]
    if problem.causal:
        visible = visible & (distance <= 0)
    if problem.sliding_window is not None:
        visible = visible & (distance > -problem.sliding_window)
    return visible, distance.to(torch.float32)


def sdpa_mask(problem: AttentionProblem, group: GroupTensors) -> tuple[torch.Tensor | None, bool]:
    """The mask SDPA needs: ``(None, False)`` all visible, ``(None, True)`` SDPA's causal, else bool."""
    if group.pattern == "all":
        return None, False
    if group.pattern == "causal":
        return None, True
    visible, _ = visibility(problem, group)
    return visible[:, None], False  # [S, 1, q_len, L_max - offset], broadcast over heads


#: SDPA kernels that propagate NaN and inf as the contract says, by device type (any other
#: device: the math kernel). On the CPU,
#: the flash kernel returns 0 for a row whose every score is NaN (a NaN query); on CUDA, cuDNN
#: returns finite values for a row whose only visible key holds inf, and 0 for a float16 row
#: whose visible value holds inf (found by the conformance suite's non-finite cells).
IEEE_SDPA_KERNELS: dict[str, list[SDPBackend]] = {
    "cuda": [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
}


def sdpa_attention(problem: AttentionProblem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   group: GroupTensors) -> torch.Tensor:
    """q ``[S, q_len, Hq, D]``, k/v ``[S, Hkv, L_max, D]`` in q's dtype -> ``[S, q_len, Hq, D]``."""
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    mask, is_causal = sdpa_mask(problem, group)
    # scale * q.k is |scale| * (-q).k exactly: SDPA kernels that take the row max on q.k before
    # scaling it (FlashAttention-2's) keep the row's least score under a negative scale
    scale = problem.scale
    if scale < 0:
        q, scale = -q, -scale
    with sdpa_kernel(IEEE_SDPA_KERNELS.get(q.device.type, [SDPBackend.MATH])):
        out = F.scaled_dot_product_attention(
            q.permute(0, 2, 1, 3), k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
            enable_gqa=problem.group_size > 1,
        ).permute(0, 2, 1, 3)
    if mask is not None:  # rows with no visible key: SDPA may give NaN, the contract says 0
        any_visible = mask[:, 0].any(dim=-1)  # [S, q_len]
        out = torch.where(any_visible[:, :, None, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out


def explicit_attention(problem: AttentionProblem, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       group: GroupTensors, alibi_slopes: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 scores and softmax; returns ``(out float32 [S, q_len, Hq, D], lse [S, q_len, Hq])``.

    q ``[S, q_len, Hq, D]``, k/v ``[S, Hkv, L_max, D]``, all float32; alibi_slopes float32
    ``[Hq]`` tensor or None.
    """
    S, q_len, Hq, D = q.shape
    Hkv, G = problem.num_kv_heads, problem.group_size
    # query head h = kv_head * G + g: [S, Hkv, G * q_len, D] against k [S, Hkv, L_max, D]
    q_h = q.reshape(S, q_len, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(S, Hkv, G * q_len, D)
    s = (problem.scale * torch.matmul(q_h, k.transpose(-1, -2))).reshape(S, Hkv, G, q_len, -1)
    if problem.softcap is not None:
        s = problem.softcap * torch.tanh(s / problem.softcap)
    visible, distance = visibility(problem, group)
    if alibi_slopes is not None:
        s = s + alibi_slopes.reshape(1, Hkv, G, 1, 1) * distance[:, None, None]
    visible_h = visible[:, None, None]  # [S, 1, 1, q_len, L_max]
    s = torch.where(visible_h, s, torch.tensor(float("-inf"), device=s.device))
    m = s.amax(dim=-1)  # [S, Hkv, G, q_len]; NaN if a visible score is NaN
    shift = torch.where(m == float("-inf"), torch.zeros_like(m), m)  # NaN and +inf propagate
    w = torch.exp(s - shift[..., None])  # exactly 0 where invisible
    l_sum = w.sum(dim=-1)
    o = torch.matmul(w.reshape(S, Hkv, G * q_len, -1), v).reshape(S, Hkv, G, q_len, D)
    weighted = l_sum != 0  # False where nothing is visible (or every visible score is -inf)
    safe = torch.where(weighted, l_sum, torch.ones_like(l_sum))
    out = torch.where(weighted[..., None], o / safe[..., None], torch.zeros_like(o))
    lse = torch.where(weighted, shift + torch.log(safe), torch.full_like(shift, float("-inf")))
    out = out.permute(0, 3, 1, 2, 4).reshape(S, q_len, Hq, D)
    lse = lse.permute(0, 3, 1, 2).reshape(S, q_len, Hq)
    return out, lse
