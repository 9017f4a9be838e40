"""The ``numpy`` backend: the kernel-style reference of :mod:`pagedattn.reference.paged`."""

from __future__ import annotations

from typing import Any

import numpy as np

from pagedattn.backends.capabilities import Capabilities
from pagedattn.backends.interface import Backend, Plan
from pagedattn.reference.paged import paged_attention_reference
from pagedattn.spec import kv_ops
from pagedattn.spec.arrays import AttentionProblem, WriteKVProblem
from pagedattn.spec.online_softmax import merge_states

#: Elements of the states merged at a time. The spec merges in float64: states past 2**31
#: elements merged whole would hold tens of GiB of temporaries at once; a chunk holds tens of MiB.
MERGE_CHUNK_ELEMENTS = 2**22


class NumpyBackend(Backend):
    """Block-by-block paged attention with an online softmax, in NumPy float32 on the CPU."""

    name = "numpy"
    version = "0.1.0"
    description = "NumPy reference: walks the block table, online softmax, float32"

    def capabilities(self) -> Capabilities:
        return Capabilities()

    def to_device(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def to_numpy(self, array: Any) -> np.ndarray:
        return np.asarray(array)

    def _plan(self, problem: AttentionProblem, block_tables: Any, seq_lens: Any,
              query_start_loc: Any, alibi_slopes: Any) -> None:
        return None

    def _run(self, plan: Plan, query: Any, key_cache: Any, value_cache: Any) -> tuple[Any, Any]:
        out, lse = paged_attention_reference(plan.problem, np.asarray(query), key_cache, value_cache)
        return out, (lse if plan.problem.return_lse else None)

    def _write_kv(self, problem: WriteKVProblem, key: Any, value: Any, key_cache: Any,
                  value_cache: Any, slot_mapping: Any) -> None:
        kv_ops.write_kv(key, value, key_cache, value_cache, problem.slot_mapping,
                        kv_layout=problem.kv_layout, k_scale=problem.k_scale, v_scale=problem.v_scale)

    def _copy_blocks(self, key_cache: Any, value_cache: Any, pairs: np.ndarray) -> None:
        for cache in (key_cache, value_cache):
            cache[pairs[:, 1]] = cache[pairs[:, 0]].copy()

    def _merge_states(self, out_a: Any, lse_a: Any, out_b: Any, lse_b: Any) -> tuple[Any, Any]:
        """The spec's exact merge, :data:`MERGE_CHUNK_ELEMENTS` elements of the states at a time
        (each row's answer is its own: the bits do not depend on the chunks)."""
        T, H, D = np.shape(out_a)
        out = np.empty((T, H, D), dtype=np.asarray(out_a).dtype)
        lse = np.empty((T, H), dtype=np.float32)
        rows = max(1, MERGE_CHUNK_ELEMENTS // max(1, H * D))
        for start in range(0, T, rows):
            part = slice(start, start + rows)
            out[part], lse[part] = merge_states(out_a[part], lse_a[part], out_b[part], lse_b[part])
        return out, lse
