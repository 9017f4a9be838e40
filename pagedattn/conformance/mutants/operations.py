"""Mutants of write_kv, copy_blocks and merge_states: each a small realistic bug."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from pagedattn.conformance.mutants.kernel import SteppedKernelBackend, read_as_dense
from pagedattn.spec import kv_ops
from pagedattn.spec.dtypes import FP8_DTYPES, numpy_dtype


class WriteKVClobbersNeighbour(SteppedKernelBackend):
    bug = "write_kv stores each token into its slot and the next one (a two-slot vector store)"
    models = "cache write clobbering neighbouring slots"
    killed_by = "test_write_kv_writes_only_its_slots"

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        super()._write_kv(problem, key, value, key_cache, value_cache, slot_mapping)
        for cache, x, scale in ((key_cache, key, problem.k_scale), (value_cache, value, problem.v_scale)):
            view = kv_ops.slot_view(cache, problem.kv_layout)
            for t, slot in enumerate(problem.slot_mapping):
                block, offset = divmod(int(slot), problem.block_size)
                if slot >= 0 and offset + 1 < problem.block_size:
                    view[block, offset + 1] = (np.asarray(x[t], np.float64) / scale).astype(cache.dtype)


class WriteKVRowsAssumedDense(SteppedKernelBackend):
    bug = ("write_kv reads key and value rows as dense [T, Hkv, D]: views of fused QKV rows are read, from "
           "the second token on, among other tokens' heads and the query's")
    models = ("vLLM's reshape_and_cache takes key.stride(0) and value.stride(0), keys and values being views of "
              "fused QKV rows (its launcher as quoted in ROCm/aiter PR 2772); the query side: "
              "ai-bond/flash-attention-v100 issue 41")
    killed_by = "test_write_kv_writes_only_its_slots"

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        super()._write_kv(problem, read_as_dense(np.asarray(key)), read_as_dense(np.asarray(value)),
                          key_cache, value_cache, slot_mapping)


class WriteKVScaleMultiplies(SteppedKernelBackend):
    bug = "write_kv stores x * scale into fp8 caches instead of x / scale"
    models = "fp8 cache quantisation scale inverted"
    killed_by = "test_write_kv_writes_only_its_slots"

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        kv_ops.write_kv(key, value, key_cache, value_cache, problem.slot_mapping, kv_layout=problem.kv_layout,
                        k_scale=1.0 / problem.k_scale, v_scale=1.0 / problem.v_scale)


def _write_converted(problem, key, value, key_cache, value_cache, convert) -> None:
    """write_kv with each ``x / scale`` (float64) stored in an fp8 cache as ``convert(quotient, dtype)``;
    16-bit caches as the spec writes them."""
    if problem.cache_dtype not in FP8_DTYPES:
        kv_ops.write_kv(key, value, key_cache, value_cache, problem.slot_mapping, kv_layout=problem.kv_layout)
        return
    tokens, blocks, offsets = kv_ops.written_slots(problem.slot_mapping, problem.block_size)
    for cache, x, scale in ((key_cache, key, problem.k_scale), (value_cache, value, problem.v_scale)):
        with np.errstate(over="ignore", invalid="ignore"):
            quotient = np.asarray(x, np.float64)[tokens] / scale
            kv_ops.slot_view(cache, problem.kv_layout)[blocks, offsets] = convert(quotient, cache.dtype)


def _toward_zero(quotient: np.ndarray, dtype: Any) -> np.ndarray:
    """``quotient`` rounded toward zero to the fp8 ``dtype`` (finite values past its range: the largest)."""
    nearest = quotient.astype(dtype)
    value = nearest.astype(np.float64)
    bits = nearest.view(np.uint8).copy()
    bits[np.isfinite(value) & (np.abs(value) > np.abs(quotient))] -= 1  # one code nearer zero, either sign
    largest = np.asarray(ml_dtypes.finfo(dtype).max, dtype=dtype)
    past = np.isfinite(quotient) & ~np.isfinite(value)
    bits[past] = np.where(np.signbit(quotient[past]), -largest, largest).astype(dtype).view(np.uint8)
    return bits.view(dtype)


class WriteKVTruncates(SteppedKernelBackend):
    bug = ("write_kv rounds x / scale toward zero into fp8 caches (a conversion that drops the mantissa's low "
           "bits): up to one step off where the spec rounds to nearest even")
    models = ("fp8 conversions by shifting a float's bits, without rounding; Triton's downcasts take "
              "fp_downcast_rounding='rtz' as an option")
    killed_by = "test_write_kv_writes_only_its_slots"

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        _write_converted(problem, key, value, key_cache, value_cache, _toward_zero)


def _clamped(quotient: np.ndarray, limit: float) -> np.ndarray:
    """``fmaxf(-limit, fminf(q, limit))``: C's fminf and fmaxf return the other operand for NaN."""
    return np.fmax(-limit, np.fmin(quotient, limit))


class WriteKVClampsToE4m3Max(SteppedKernelBackend):
    bug = ("write_kv clamps x / scale to +-448 (float8_e4m3fn's largest) before the conversion, whatever the fp8 "
           "dtype, with fminf and fmaxf: float8_e5m2 values past 448 are clipped, and NaN is stored as 448")
    models = ("flashinfer-ai/flashinfer PR 2639 (fp8 quantisation kernels, the paged-KV append of RoPE among them, "
              "clamped with a hard-coded fmaxf(-448.0f, fminf(x, 448.0f)) whatever the fp8 type)")
    killed_by = "test_write_kv_writes_only_its_slots"

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        _write_converted(problem, key, value, key_cache, value_cache,
                         lambda q, dtype: _clamped(q, 448.0).astype(dtype))


class WriteKVClampHidesNaN(SteppedKernelBackend):
    bug = ("write_kv saturates x / scale to the fp8 dtype's range with fminf and fmaxf before the conversion: "
           "a NaN key or value element is stored as the largest finite value, so the NaN never reaches attention")
    models = ("fp8 cache writes clamped as fmaxf(-max, fminf(x, max)) (flashinfer-ai/flashinfer PR 2639); "
              "AcademySoftwareFoundation/OpenImageIO PR 1617 (a clamp written so that NaN returns a bound)")
    killed_by = "test_write_kv_writes_only_its_slots"

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        _write_converted(problem, key, value, key_cache, value_cache,
                         lambda q, dtype: _clamped(q, float(ml_dtypes.finfo(dtype).max)).astype(dtype))


class WriteKVIgnoresSkip(SteppedKernelBackend):
    bug = "write_kv does not skip slot -1: padding tokens land in the pool's last slot"
    models = "padding slot -1 not skipped in reshape_and_cache"
    killed_by = "test_write_kv_writes_only_its_slots"

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        for cache, x, scale in ((key_cache, key, problem.k_scale), (value_cache, value, problem.v_scale)):
            view = kv_ops.slot_view(cache, problem.kv_layout)
            for t, slot in enumerate(problem.slot_mapping):  # -1 becomes block -1, offset block_size - 1
                block, offset = divmod(int(slot), problem.block_size)
                view[block, offset] = (np.asarray(x[t], np.float64) / scale).astype(numpy_dtype(problem.cache_dtype))


def _cache_before(cache: np.ndarray) -> np.ndarray | None:
    """The cache-sized array right before ``cache`` in memory when ``cache`` is ``pool[i]``, ``i > 0``, of a
    larger array ``pool`` (caches of one buffer, as an engine's layers are); None otherwise."""
    pool = cache.base
    if not isinstance(pool, np.ndarray) or pool.shape[1:] != cache.shape or not pool.flags.c_contiguous:
        return None
    index = (cache.__array_interface__["data"][0] - pool.__array_interface__["data"][0]) // max(cache.nbytes, 1)
    return pool[index - 1] if index > 0 else None


class WriteKVSkipLandsBeforeTheCache(SteppedKernelBackend):
    bug = ("write_kv addresses a slot as block * block_stride + offset * slot_stride without skipping -1: a "
           "padding token's slot -1 is block -1, offset block_size - 1, the last slot of the memory before the "
           "cache (another layer's cache in one buffer)")
    models = ("vllm-project/vllm PR 13922 (padding slots in reshape_and_cache), in a kernel addressing the cache "
              "linearly; KV caches of all layers allocated as views of one buffer")
    killed_by = "test_write_kv_writes_only_its_slots"

    def _write_kv(self, problem, key, value, key_cache, value_cache, slot_mapping):
        super()._write_kv(problem, key, value, key_cache, value_cache, slot_mapping)
        for cache, x, scale in ((key_cache, key, problem.k_scale), (value_cache, value, problem.v_scale)):
            before = _cache_before(np.asarray(cache))
            if before is None:
                continue
            view = kv_ops.slot_view(before, problem.kv_layout)
            for t in np.flatnonzero(problem.slot_mapping < 0):
                with np.errstate(over="ignore", invalid="ignore"):
                    view[-1, -1] = (np.asarray(x[t], np.float64) / scale).astype(before.dtype)


class CopyBlocksSequential(SteppedKernelBackend):
    bug = "copy_blocks copies pair by pair, so a chain a->b, b->c copies a's data into c"
    models = "copy-on-write block copies not reading all sources first"
    killed_by = "test_copy_blocks_reads_all_sources_first"

    def _copy_blocks(self, key_cache: Any, value_cache: Any, pairs: np.ndarray) -> None:
        for cache in (key_cache, value_cache):
            for src, dst in pairs:
                cache[dst] = cache[src]


class CopyBlocksFp8ByIndexing(SteppedKernelBackend):
    bug = ("copy_blocks gathers and scatters blocks by advanced indexing of the cache's own dtype, which torch "
           "does not implement for float8: copy-on-write of an fp8 cache raises NotImplementedError")
    models = ('pytorch/pytorch issue 169656 ("index_cpu" not implemented for Float8_e4m3fn, found copying blocks '
              'of an fp8 KV cache in vLLM); pytorch/pytorch issue 133605 ("index_cuda" not implemented for '
              "Float8_e4m3fn)")
    killed_by = "test_copy_blocks_of_fp8_caches"

    def _copy_blocks(self, key_cache: Any, value_cache: Any, pairs: np.ndarray) -> None:
        if np.asarray(key_cache).dtype.itemsize == 1:
            raise NotImplementedError(f'"index_cpu" not implemented for {np.asarray(key_cache).dtype}')
        super()._copy_blocks(key_cache, value_cache, pairs)


class MergeLseAssumedDense(SteppedKernelBackend):
    bug = ("merge_states reads each lse as dense [T, H]: an lse passed as the transposed view of an [H, T] "
           "array (FlashAttention's layout) is read with heads along the tokens")
    models = ("vllm-project/vllm PR 57012 (an lse of (tokens, heads) indexed as (heads, tokens) in chunked-context "
              "merges); vllm-project/vllm-xpu-kernels PR 479 (an lse layout other than merge_attn_states' "
              "[heads, tokens]: accuracy lost); Dao-AILab/flash-attention PR 2388 (lse strides hard-coded)")
    killed_by = "test_merge_states_matches_exact_merge"

    def _merge_states(self, out_a, lse_a, out_b, lse_b):
        return super()._merge_states(out_a, read_as_dense(np.asarray(lse_a)), out_b, read_as_dense(np.asarray(lse_b)))


class MergeZeroesNonFiniteOut(SteppedKernelBackend):
    bug = ("merge_states sanitises each part's out before the merge (nan_to_num): a NaN or inf that a "
           "non-empty part's out holds never reaches the row")
    models = ("sgl-project/sglang PR 34213 (context-parallel partial outputs sanitised in place with nan_to_num_ "
              "before their LSE merge)")
    killed_by = "test_merge_states_matches_exact_merge"

    def _merge_states(self, out_a, lse_a, out_b, lse_b):
        def sanitised(out):
            return np.nan_to_num(np.asarray(out), nan=0.0, posinf=0.0, neginf=0.0)

        return super()._merge_states(sanitised(out_a), lse_a, sanitised(out_b), lse_b)


class MergeSkipsNonFiniteLse(SteppedKernelBackend):
    bug = "merge_states weighs a part whose lse is not finite as an empty part: a NaN lse never reaches the row"
    models = ("NVIDIA/TensorRT-LLM PR 16940 (a merge over the pools of finite LSE only, each pool's output "
              "kept where isfinite(lse)); vllm-project/vllm PR 28181 (merge_attn_states branches on "
              "isinf(max_lse))")
    killed_by = "test_merge_states_matches_exact_merge"

    def _merge_states(self, out_a, lse_a, out_b, lse_b):
        def finite(lse):
            lse = np.asarray(lse, np.float32)
            return np.where(np.isfinite(lse), lse, np.float32(-np.inf))

        return super()._merge_states(out_a, finite(lse_a), out_b, finite(lse_b))


class MergeReadsPartsOfPositiveWeight(SteppedKernelBackend):
    bug = ("merge_states reads a part's out only where its float32 weight exp(lse - max) is positive, and "
           "returns lse -inf where the weights' sum is not: a NaN in a part more than 104 below the other "
           "never reaches the row, and a NaN lse gives -inf")
    models = ("merges that read a part only where its weight is positive, a guard for empty parts that also "
              "drops NaN once a float32 weight underflows (104 below the largest lse)")
    killed_by = "test_merge_states_matches_exact_merge"

    def _merge_states(self, out_a, lse_a, out_b, lse_b):
        lse_a, lse_b = np.asarray(lse_a, np.float32), np.asarray(lse_b, np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            m = np.maximum(lse_a, lse_b)
            shift = np.where(np.isneginf(m), np.float32(0), m)
            w_a, w_b = np.exp(lse_a - shift), np.exp(lse_b - shift)
            o_a = np.where((w_a > 0)[..., None], np.asarray(out_a, np.float32), np.float32(0))
            o_b = np.where((w_b > 0)[..., None], np.asarray(out_b, np.float32), np.float32(0))
            total = w_a + w_b
            safe = np.where(total > 0, total, np.float32(1))
            out = (w_a[..., None] * o_a + w_b[..., None] * o_b) / safe[..., None]
            lse = np.where(total > 0, shift + np.log(safe), np.float32(-np.inf))
        return out.astype(np.asarray(out_a).dtype), lse.astype(np.float32)


class MergeNaNOnEmpty(SteppedKernelBackend):
    bug = "merge_states weights exp(lse - max) without a guard: -inf on both sides or NaN out gives NaN"
    models = "merge of attention states with -inf lse"
    killed_by = "test_merge_states_matches_exact_merge"

    def _merge_states(self, out_a, lse_a, out_b, lse_b):
        with np.errstate(invalid="ignore"):
            m = np.maximum(lse_a, lse_b)
            w_a, w_b = np.exp(lse_a - m), np.exp(lse_b - m)
            out = (w_a[..., None] * out_a.astype(np.float32) + w_b[..., None] * out_b.astype(np.float32))
            out = out / (w_a + w_b)[..., None]
            lse = m + np.log(w_a + w_b)
        return out.astype(out_a.dtype), lse.astype(np.float32)

