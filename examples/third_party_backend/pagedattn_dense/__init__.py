"""A minimal third-party backend: gather each sequence's K/V, then a dense float32 softmax."""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.backends import Backend, Capabilities, Plan
from pagedattn.spec.arrays import AttentionProblem
from pagedattn.spec.exact import gather_kv


class DenseBackend(Backend):
    name = "dense"
    version = "0.1.0"
    description = "gather pages, then dense attention in float32 (NumPy)"

    def capabilities(self) -> Capabilities:
        # Declare only what is implemented: anything else raises UnsupportedError.
        return Capabilities(dtypes=("float32",), cache_dtypes=("float32",), kv_layouts=("NHD", "HND"),
                            features=frozenset({"varlen", "non_causal", "lse"}))

    def to_device(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def to_numpy(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def _plan(self, problem: AttentionProblem, block_tables: Any, seq_lens: Any, query_start_loc: Any,
              alibi_slopes: Any) -> None:
        return None  # nothing to precompute: _run reads the host copies in plan.problem

    def _run(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> tuple[Any, Any]:
        pr = plan.problem
        out = np.zeros(query.shape, np.float32)
        lse = np.full(query.shape[:2], -np.inf, np.float32)
        _, p_q = pr.token_positions()
        with np.errstate(invalid="ignore"):  # NaN and inf in the data propagate as IEEE says: no warning
            for s in range(pr.num_seqs):
                start, stop = pr.query_start_loc[s], pr.query_start_loc[s + 1]
                if stop == start or pr.seq_lens[s] == 0:
                    continue  # no query, or decode padding (L = 0): out 0, lse -inf
                k, v = (x.astype(np.float32) for x in gather_kv(pr, key_cache, value_cache, s))  # [L, Hkv, D]
                heads = np.arange(pr.num_q_heads) // pr.group_size  # query head -> KV head
                scores = pr.scale * np.einsum("thd,lhd->thl", query[start:stop], k[:, heads])
                visible = np.arange(k.shape[0])[None, :] <= p_q[start:stop, None] if pr.causal else True
                scores = np.where(visible, scores.transpose(1, 0, 2), -np.inf).transpose(1, 0, 2)
                m = scores.max(-1, keepdims=True)
                m = np.where(m == -np.inf, 0.0, m)  # every visible score -inf: a row without keys (out 0, lse -inf)
                w = np.exp(scores - m)
                l = w.sum(-1)
                safe = np.where(l == 0, 1.0, l)
                out[start:stop] = np.einsum("thl,lhd->thd", w, v[:, heads]) / safe[..., None]
                lse[start:stop] = np.where(l == 0, -np.inf, m[..., 0] + np.log(safe))
        return out, (lse if pr.return_lse else None)
