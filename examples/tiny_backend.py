"""The README's minimal backend: dense float32 attention over each sequence's gathered K/V."""

import numpy as np

from pagedattn.backends import Backend, Capabilities, Plan
from pagedattn.spec.exact import gather_kv


class TinyBackend(Backend):
    """Dense attention over each sequence's gathered K/V, in NumPy."""

    name = "tiny"
    version = "0.1.0"

    def capabilities(self) -> Capabilities:
        # Declare only what _run implements: any other case raises UnsupportedError.
        return Capabilities(dtypes=("float32",), cache_dtypes=("float32",),
                            features=frozenset({"varlen", "non_causal", "sliding_window", "lse"}))

    def to_device(self, array):
        return np.asarray(array)

    def to_numpy(self, array):
        return np.asarray(array)

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        return None  # per-batch state (uploads, work lists); plan.state in _run

    def _run(self, plan: Plan, query, key_cache, value_cache):
        pr = plan.problem  # validated: sizes, options, scale resolved, host index arrays
        out = np.zeros(query.shape, np.float32)
        lse = np.full(query.shape[:2], -np.inf, np.float32)
        _, p_q = pr.token_positions()  # each query token's position in its sequence
        heads = np.arange(pr.num_q_heads) // pr.group_size  # query head -> KV head
        for s in range(pr.num_seqs):
            rows = slice(pr.query_start_loc[s], pr.query_start_loc[s + 1])
            k, v = gather_kv(pr, key_cache, value_cache, s)  # [L, Hkv, D]: slots p < L only
            if len(k) == 0:
                continue  # decode padding (L = 0): out 0, lse -inf
            p, q_pos = np.arange(len(k)), p_q[rows, None]
            visible = p <= q_pos if pr.causal else np.ones((len(q_pos), len(p)), bool)
            if pr.sliding_window is not None:
                visible &= p > q_pos - pr.sliding_window
            scores = pr.scale * np.einsum("thd,lhd->thl", query[rows], k[:, heads])
            scores = np.where(visible[:, None, :], scores, -np.inf)
            m = scores.max(-1, keepdims=True)
            m = np.where(m == -np.inf, 0.0, m)  # every visible score -inf: a row without keys
            w = np.exp(scores - m)
            l = w.sum(-1)
            safe = np.where(l == 0, 1.0, l)
            out[rows] = np.einsum("thl,lhd->thd", w, v[:, heads]) / safe[..., None]
            lse[rows] = np.where(l == 0, -np.inf, m[..., 0] + np.log(safe))
        return out, (lse if pr.return_lse else None)
