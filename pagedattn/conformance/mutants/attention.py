"""Mutants of paged attention: each overrides one step of the stepped kernel with one realistic bug.

Every class states its bug in ``bug`` and the kind of public report it models in ``models``
(docs/conformance.md's Mutants section lists them with the public reports found).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from pagedattn.conformance.mutants.kernel import F32, SteppedKernelBackend, read_as_dense, read_with_strides
from pagedattn.spec.arrays import AttentionProblem


def _where_set(problem: AttentionProblem, field: str, change: Callable[[Any], Any]) -> AttentionProblem:
    """``problem`` with its option ``field`` replaced by ``change(value)``; unchanged where the option is None."""
    value = getattr(problem, field)
    return problem if value is None else replace(problem, **{field: change(value)})


class UnmaskedTail(SteppedKernelBackend):
    bug = "slots p >= L of the last block are not masked (only the causal/window bounds are)"
    models = "tail of the last block read unmasked"
    killed_by = "test_non_finite_visible_data_propagates"

    def visible(self, p, p_q, length, problem):
        vis = np.ones((len(p_q), len(p)), dtype=bool)
        if problem.causal:
            vis &= p[None, :] <= p_q[:, None]
        if problem.sliding_window is not None:
            vis &= p[None, :] > p_q[:, None] - problem.sliding_window
        return vis


class DecodeTailUnmaskedWithoutCausal(SteppedKernelBackend):
    bug = ("decode with causal=False: slots p >= L of the last block not masked (the kernel's test of a tile "
           "seen whole bounds it by the causal diagonal alone, which in decode is L - 1)")
    models = ("this project's cupy decode kernel takes a sub-tile as seen whole when it ends by L and by the "
              "causal bound; the kernel edit DecodeWholeSubTilePastL drops the L bound, which only causal=False "
              "decode exposes")
    killed_by = "test_attention_matches_spec"

    def visible(self, p, p_q, length, problem):
        if problem.is_decode and not problem.causal:
            vis = np.ones((len(p_q), len(p)), dtype=bool)
            if problem.sliding_window is not None:
                vis &= p[None, :] > p_q[:, None] - problem.sliding_window
            return vis
        return super().visible(p, p_q, length, problem)


class BlockCountFloor(SteppedKernelBackend):
    bug = "number of blocks is L // block_size: the partial last block is dropped"
    models = "off-by-one block count"
    killed_by = "test_long_sequences_match_spec"

    def logical_blocks(self, length, block_size, p_q, problem):
        return list(range(length // block_size))


class ReadsPastTable(SteppedKernelBackend):
    bug = "visits one block-table column more than ceil(L / block_size)"
    models = "reads block-table entries past the sequence (padding -1 / garbage ids)"
    killed_by = "test_non_finite_visible_data_propagates"

    def logical_blocks(self, length, block_size, p_q, problem):
        return list(range(min(-(-length // block_size) + 1, problem.max_blocks_per_seq)))


class MissingRescale(SteppedKernelBackend):
    bug = "online softmax: O is not rescaled by exp(m_i - m_new) when the maximum grows"
    models = "missing rescale of the accumulator in the online softmax"
    killed_by = "test_long_sequences_with_a_window_match_spec"

    def update(self, m, l, O, s_ij, visible, v):
        m_new, l_new, _ = super().update(m, l, O, s_ij, visible, v)
        shift = np.where(np.isneginf(m_new), F32(0), m_new)
        p_ij = np.exp(s_ij - shift[..., None])
        v_clean = np.where(visible.any(axis=0)[:, None, None], v, F32(0))
        return m_new, l_new, (O + np.einsum("nhb,bhd->nhd", p_ij, v_clean)).astype(F32)


class FiniteMaskSentinel(SteppedKernelBackend):
    bug = "masked scores are set to -1e4 instead of -inf"
    models = "finite mask value (-1e4 / -FLT_MAX) leaking weight"
    killed_by = "test_long_rows_of_minus_inf_scores_are_empty"

    def mask(self, s_ij, visible):
        return np.where(visible[:, None, :], s_ij, F32(-1e4))


class NaNOnEmptyRow(SteppedKernelBackend):
    bug = "epilogue divides O by l without a guard: a query with no visible key gets 0/0 = NaN"
    models = "NaN output for fully masked rows / zero-length sequences"
    killed_by = "test_mixed_length_batches_match_spec"

    def finalize(self, m, l, O):
        with np.errstate(invalid="ignore", divide="ignore"):
            return (O / l[..., None]).astype(F32), (m + np.log(l)).astype(F32)


class NaNOnMaskedBlock(SteppedKernelBackend):
    bug = "visits blocks wholly outside the window and computes exp(m_i - m_new) with both -inf"
    models = "NaN from exp(-inf - -inf) in the online softmax"
    killed_by = "test_long_sequences_with_a_window_match_spec"

    def update(self, m, l, O, s_ij, visible, v):
        with np.errstate(invalid="ignore"):
            m_new = np.maximum(m, s_ij.max(axis=-1))
            alpha = np.exp(m - m_new)
            p_ij = np.exp(s_ij - m_new[..., None])
        v_clean = np.where(visible.any(axis=0)[:, None, None], v, F32(0))
        l_new = alpha * l + p_ij.sum(axis=-1)
        O_new = alpha[..., None] * O + np.einsum("nhb,bhd->nhd", p_ij, v_clean)
        return m_new.astype(F32), l_new.astype(F32), O_new.astype(F32)

    def finalize(self, m, l, O):
        with np.errstate(invalid="ignore"):
            return super().finalize(m, l, O)


class WrongGQAMapping(SteppedKernelBackend):
    bug = "query head h reads KV head h % num_kv_heads instead of h // group_size"
    models = "wrong GQA head mapping"
    killed_by = "test_attention_matches_spec"

    def kv_heads(self, problem):
        return np.arange(problem.num_q_heads) % problem.num_kv_heads


class Int16BlockIds(SteppedKernelBackend):
    bug = "block ids are kept in int16: ids >= 32768 wrap to negative"
    models = "block ids overflow a narrow integer type in large pools"
    killed_by = "test_far_pool_attention_matches_spec"

    def physical_block(self, row, j):
        return int(np.array(row[j]).astype(np.int16))


class HardcodedBlockSize(SteppedKernelBackend):
    bug = "assumes block_size 16 (the cache is addressed in 16-slot blocks)"
    models = "hard-coded block size"
    killed_by = "test_odd_sizes_match_spec"

    def block_size(self, problem):
        return 16

    def slots(self, cache, problem):
        nhd = super().slots(cache, problem)
        return nhd.reshape(-1, 16, *nhd.shape[2:]) if nhd.shape[1] % 16 == 0 else nhd


class LayoutMixup(SteppedKernelBackend):
    bug = "ignores kv_layout: HND caches are read as NHD"
    models = "NHD/HND layout mix-up"
    killed_by = "test_large_blocks_match_spec"

    def slots(self, cache, problem):
        array = np.asarray(cache)
        return array.reshape(array.shape[0], problem.block_size, problem.num_kv_heads, problem.head_dim)


class _SoftcapFormula(SteppedKernelBackend):
    """The soft cap computed by :meth:`capped` in float32 in place of ``softcap * tanh(s / softcap)``."""

    def capped(self, s_ij: np.ndarray, cap: np.float32) -> np.ndarray:
        raise NotImplementedError

    def transform(self, s_ij, p, p_q, visible, problem):
        if problem.softcap is None:
            return super().transform(s_ij, p, p_q, visible, problem)
        with np.errstate(over="ignore", invalid="ignore"):
            capped = self.capped(s_ij, F32(problem.softcap))
        return super().transform(capped.astype(F32), p, p_q, visible, replace(problem, softcap=None))


class SoftcapOverflow(_SoftcapFormula):
    bug = "softcap's tanh as (e^2x - 1) / (e^2x + 1) in float32: inf / inf = NaN for large scores"
    models = "softcap overflow"
    killed_by = "test_non_finite_visible_data_propagates"

    def capped(self, s_ij, cap):
        e = np.exp(F32(2) * s_ij / cap)
        return cap * (e - 1) / (e + 1)


class SoftcapCancels(_SoftcapFormula):
    bug = ("softcap as softcap - 2 softcap / (e^(2x / softcap) + 1) in float32: off by ulps of softcap for "
           "scores near 0, where tanh's own error is ulps of the score")
    models = "a one-exp soft cap traded for tanh's accuracy near 0 (this project's GPU kernels, caught on the H200)"
    killed_by = "test_attention_matches_spec"

    def capped(self, s_ij, cap):
        e = np.exp(F32(2) * s_ij / cap).astype(F32)
        return cap - (F32(2) * cap) / (e + F32(1))


class MaskBeforeSoftcap(SteppedKernelBackend):
    bug = "applies the -inf mask before softcap: tanh(-inf) = -1 gives masked keys the score -softcap"
    models = "mask applied before logit softcapping"
    killed_by = "test_non_finite_visible_data_propagates"

    def transform(self, s_ij, p, p_q, visible, problem):
        return super().transform(super().mask(s_ij, visible), p, p_q, visible, problem)

    def mask(self, s_ij, visible):
        return s_ij


class HalfPrecisionScores(SteppedKernelBackend):
    bug = "q . k is rounded to the query dtype (float16/bfloat16) before the softmax"
    models = "low-precision accumulation of scores"
    killed_by = "test_long_sequences_with_a_window_match_spec"

    def scores(self, q, k, problem):
        from pagedattn.spec.dtypes import numpy_dtype

        with np.errstate(over="ignore"):
            return super().scores(q, k, problem).astype(numpy_dtype(problem.dtype)).astype(F32)


class ScaleFromPaddedHeadDim(SteppedKernelBackend):
    bug = "default scale 1/sqrt(head_dim) uses head_dim padded to a power of two (80 -> 128)"
    models = "wrong default softmax scale"
    killed_by = "test_odd_sizes_match_spec"

    def scale(self, problem):
        if math.isclose(problem.scale, 1.0 / math.sqrt(problem.head_dim)):
            return 1.0 / math.sqrt(2 ** math.ceil(math.log2(problem.head_dim)))
        return problem.scale


class ExplicitScaleIgnored(SteppedKernelBackend):
    bug = "an explicit scale is ignored: always 1/sqrt(head_dim)"
    models = "scale argument not forwarded to the kernel"
    killed_by = "test_non_finite_visible_data_propagates"

    def scale(self, problem):
        return 1.0 / math.sqrt(problem.head_dim)


class LseInLog2(SteppedKernelBackend):
    bug = "returns lse in base 2 (m log2(e) + log2 l), as the exp2 kernels keep it"
    models = "lse in log2 units returned as natural log"
    killed_by = "test_long_sequences_match_spec"

    def finalize(self, m, l, O):
        out, lse = super().finalize(m, l, O)
        return out, (lse * F32(1 / math.log(2))).astype(F32)


class AlibiSign(SteppedKernelBackend):
    bug = "ALiBi bias slope * (p_q - p) instead of slope * (p - p_q)"
    models = "ALiBi bias sign"
    killed_by = "test_long_sequences_with_a_window_match_spec"

    def transform(self, s_ij, p, p_q, visible, problem):
        flipped = _where_set(problem, "alibi_slopes", lambda slopes: -slopes)
        return super().transform(s_ij, p, p_q, visible, flipped)


class SlidingWindowOffByOne(SteppedKernelBackend):
    bug = "window keeps p >= p_q - W (W + 1 keys) instead of p > p_q - W"
    models = "sliding-window off-by-one"
    killed_by = "test_large_blocks_match_spec"

    def visible(self, p, p_q, length, problem):
        wider = _where_set(problem, "sliding_window", lambda window: window + 1)
        return super().visible(p, p_q, length, wider)


class ChunkedPrefillPositions(SteppedKernelBackend):
    bug = "varlen queries are placed at positions 0..q_len-1 (ignores the cached context before them)"
    models = "chunked prefill / prefix caching query positions"
    killed_by = "test_long_speculative_batches_match_spec"

    def query_positions(self, problem):
        if problem.is_decode:
            return super().query_positions(problem)
        seq_of_token = np.repeat(np.arange(problem.num_seqs), problem.q_lens)
        return np.arange(problem.num_tokens) - problem.query_start_loc[seq_of_token]


class NonCausalIgnored(SteppedKernelBackend):
    bug = "causal=False is ignored: the causal mask is always applied"
    models = "causal flag not forwarded"
    killed_by = "test_non_finite_visible_data_propagates"

    def visible(self, p, p_q, length, problem):
        return super().visible(p, p_q, length, replace(problem, causal=True))


class FP8ScaleIgnored(SteppedKernelBackend):
    bug = "fp8 caches are used without multiplying by k_scale / v_scale"
    models = "fp8 KV-cache scales not applied"
    killed_by = "test_long_sequences_with_fp8_caches_match_spec"

    def _run(self, plan, query, key_cache, value_cache):
        pr = plan.problem
        unscaled = replace(pr, k_scale=1.0, v_scale=1.0)
        return super()._run(replace(plan, problem=unscaled), query, key_cache, value_cache)


class Fp8QueryRoundedToFloat16(SteppedKernelBackend):
    bug = ("fp8 caches are multiplied in float16 and a bfloat16 query is rounded to float16 as it is: "
           "elements beyond 65,504 become inf")
    models = "fp8 KV-cache products in float16 without scaling the query into float16's range"
    killed_by = "test_non_finite_visible_data_propagates"

    def scores(self, q, k, problem):
        from pagedattn.spec.dtypes import FP8_DTYPES

        if problem.cache_dtype not in FP8_DTYPES or problem.dtype != "bfloat16":
            return super().scores(q, k, problem)
        scale = F32(self.scale(problem))
        with np.errstate(over="ignore", invalid="ignore"):
            q16 = (q / scale).astype(np.float16).astype(F32) * scale
            return super().scores(q16, k, problem)


class Fp8NaNReadAsFinite(SteppedKernelBackend):
    bug = ("float8_e4m3fn caches dequantised by bit arithmetic (exponent and mantissa moved into a float16's "
           "and rebiased) with no case for NaN: the NaN code S.1111.111 is read as +-480, and a NaN key or value "
           "never reaches the row")
    models = ("fast fp8-to-16-bit conversions by shifts and one multiply (Marlin-style dequantisation); "
              "Triton's CPU interpreter casts float8_e4m3fn's NaN to float32 as 480")
    killed_by = "test_non_finite_visible_data_propagates"

    def read_block(self, slots, row, j, problem):
        block = super().read_block(slots, row, j, problem)
        if problem.cache_dtype != "float8_e4m3fn":
            return block
        bits = np.asarray(block).view(np.uint8)
        finite = np.where(bits & 0x80, -480.0, 480.0).astype(np.float32)
        return np.where((bits & 0x7F) == 0x7F, finite, block.astype(np.float32))


class StridedAssumedContiguous(SteppedKernelBackend):
    bug = "addresses blocks with contiguous strides even when the cache is a strided view of a pool"
    models = "non-contiguous (strided) KV cache read as contiguous"
    killed_by = "test_non_finite_visible_data_propagates"

    def slots(self, cache: Any, problem: AttentionProblem) -> np.ndarray:
        return super().slots(read_as_dense(np.asarray(cache)), problem)


class QueryRowsAssumedDense(SteppedKernelBackend):
    bug = ("reads the query's rows as dense [T, Hq, D]: a query that is a view of fused QKV rows is read "
           "from the second token on at token * Hq * D, among other tokens' and the keys' and values' heads")
    models = ("ai-bond/flash-attention-v100 issue 41 (varlen forward assumes dense Hq * D query rows: strided "
              "views of a fused QKV split silently misread); flashinfer-ai/flashinfer issue 311 and "
              "sgl-project/sglang PR 7462 (non-contiguous queries from a fused QKV projection)")
    killed_by = "test_non_finite_visible_data_propagates"

    def queries(self, query: Any, problem: AttentionProblem) -> np.ndarray:
        return read_as_dense(np.asarray(query))


class TableRowsAssumedDense(SteppedKernelBackend):
    bug = ("reads the block table's rows as dense [num_seqs, max_blocks_per_seq]: a view of a wider table is "
           "read at s * max_blocks_per_seq, among the columns of other rows")
    models = ("NVIDIA/TensorRT-LLM PR 17285 (a non-contiguous view of block indices read as a contiguous "
              "allocation: wrong KV pages, wrong or non-finite output); vLLM's paged_attention kernels step "
              "block_tables by block_tables.size(1)")
    killed_by = "test_non_finite_visible_data_propagates"

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        return read_as_dense(np.asarray(block_tables))

    def table_row(self, plan, s):
        return plan.state[s].astype(np.int64)


def int32_words(array: Any, shape: tuple[int, ...]) -> np.ndarray:
    """An index array's memory read as ``shape`` int32 words from its first element, as a kernel
    given an ``int*`` reads it whatever its dtype (int64: entry ``i`` from word ``i``)."""
    words = np.ascontiguousarray(np.asarray(array)).view(np.int32).reshape(-1)
    return words[:math.prod(shape)].reshape(shape).astype(np.int64)


class IndexArraysReadAsInt32(SteppedKernelBackend):
    bug = ("reads the block table and seq_lens as int32 words whatever their dtype: from an int64 seq_lens the "
           "second sequence's length is the high word of the first's (0), and an int64 table's entry j is word j")
    models = ("flashinfer-ai/flashinfer issue 1654 (an int64 last_page_len given to plan, which took int32: the "
              "second sequence came back all 0s, with no error)")
    killed_by = "test_non_finite_visible_data_propagates"

    def _plan(self, problem, block_tables, seq_lens, query_start_loc, alibi_slopes):
        return int32_words(block_tables, problem.block_tables.shape), int32_words(seq_lens, problem.seq_lens.shape)

    def _run(self, plan, query, key_cache, value_cache):
        tables, lens = plan.state
        read = replace(plan, problem=replace(plan.problem, block_tables=tables, seq_lens=lens))
        return super()._run(read, query, key_cache, value_cache)


class CacheRowsAsWords(SteppedKernelBackend):
    bug = "reads 16-bit and fp8 caches as 32-bit words of values, its strides rounded down to whole words"
    models = ("caches read as words of two or four values (an fp8 tile has no transposing ldmatrix of bytes, "
              "so a kernel takes it as 16-bit words): on a view with odd strides the rows read are not the "
              "rows asked; triton's fp8 value tiles here check the strides at run time for this")
    killed_by = "test_non_finite_visible_data_propagates"

    def slots(self, cache: Any, problem: AttentionProblem) -> np.ndarray:
        array = np.asarray(cache)
        word = 4  # bytes
        if array.itemsize < word:
            array = read_with_strides(array, (*(s // word * word for s in array.strides[:-1]), array.strides[-1]))
        return super().slots(array, problem)


class MaskByMultiply(SteppedKernelBackend):
    bug = "masks by multiplying weights by 0 and uses unmasked values: NaN/inf garbage gives NaN"
    models = "NaN/inf in unused cache slots leaking through a multiplicative mask"
    killed_by = "test_long_sequences_match_spec"

    def mask(self, s_ij, visible):
        return s_ij

    def update(self, m, l, O, s_ij, visible, v):
        vis = visible[:, None, :]
        with np.errstate(invalid="ignore", over="ignore"):
            m_new = np.maximum(m, np.where(vis, s_ij, F32(-np.inf)).max(axis=-1))
            shift = np.where(np.isneginf(m_new), F32(0), m_new)
            p_ij = np.exp(s_ij - shift[..., None]) * vis
            l_new = np.exp(m - shift) * l + p_ij.sum(axis=-1)
            O_new = np.exp(m - shift)[..., None] * O + np.einsum("nhb,bhd->nhd", p_ij, v)
        return m_new.astype(F32), l_new.astype(F32), O_new.astype(F32)


class NondeterministicBlockOrder(SteppedKernelBackend):
    bug = "blocks are accumulated in a run-dependent order (split-K partials added as they finish)"
    models = "non-deterministic output (atomics / split-K reduction order)"
    killed_by = "test_long_plans_serve_many_runs"

    def logical_blocks(self, length, block_size, p_q, problem):
        order = super().logical_blocks(length, block_size, p_q, problem)
        np.random.default_rng().shuffle(order)
        return order


class HalfPrecisionAccumulator(SteppedKernelBackend):
    bug = "the running O = sum p v is kept in the query dtype (float16/bfloat16): each p v is added in 16 bits"
    models = "16-bit attention accumulators that lose small terms at long context (llama.cpp, Paddle, tract)"
    killed_by = "test_long_sequences_match_spec"

    def update(self, m, l, O, s_ij, visible, v):
        half = self.query_dtype if self.query_dtype != np.float32 else F32
        with np.errstate(invalid="ignore", over="ignore"):
            m_new = np.maximum(m, s_ij.max(axis=-1))
            shift = np.where(np.isneginf(m_new), F32(0), m_new)
            alpha = np.exp(m - shift)
            p_ij = np.exp(s_ij - shift[..., None])
            l_new = alpha * l + p_ij.sum(axis=-1)
            seen = np.where(visible[:, None, :, None], v.transpose(1, 0, 2)[None], F32(0))  # [n, Hq, bs, D]
            acc = (alpha[..., None] * O).astype(half)
            for b in range(s_ij.shape[-1]):  # one key at a time, as a scalar loop over the block does
                acc = (acc.astype(F32) + p_ij[..., b, None] * seen[:, :, b]).astype(half)
        return m_new.astype(F32), l_new.astype(F32), acc.astype(F32)


class FiniteMaxSentinel(SteppedKernelBackend):
    bug = "the running max starts at -5e4 instead of -inf: a row whose scores all lie below it gets l = 0"
    models = "softmax max clamped to a finite floor (burn's SOFTMAX_MAX_FLOOR of -1e4)"
    killed_by = "test_non_finite_visible_data_propagates"

    def initial_max(self):
        return -5e4


class FusedScoreShift(SteppedKernelBackend):
    bug = ("scale and running-max shift in one fused multiply-add, the max taken over the rounded scores: the "
           "max key's weight is e to its score's rounding error, inf or 0 once scores pass about 1e9")
    models = ("exp2(s * scale - m) as one FFMA, the max scaled and rounded apart (Dao-AILab/flash-attention's "
              "softmax scale_apply_exp2; its UNFUSE_FMA option rounds the product first with __fmul_rn)")
    killed_by = "test_attention_matches_spec"

    def scores(self, q, k, problem):
        return np.einsum("nhd,bhd->nhb", q.astype(np.float64), k.astype(np.float64))  # not yet rounded

    def transform(self, s_ij, p, p_q, visible, problem):
        if problem.softcap is None and problem.alibi_slopes is None:
            return s_ij  # plain scores stay unrounded into the fused step
        return super().transform(s_ij.astype(F32), p, p_q, visible, problem)

    def update(self, m, l, O, s_ij, visible, v):
        if s_ij.dtype != np.float64:
            return super().update(m, l, O, s_ij, visible, v)
        with np.errstate(invalid="ignore", over="ignore"):
            m_new = np.maximum(m, s_ij.astype(F32).max(axis=-1))  # over the rounded scores
            shift = np.where(np.isneginf(m_new), F32(0), m_new)
            alpha = self.exp(m - shift)
            p_ij = self.exp((s_ij - shift[..., None]).astype(F32))  # the fused step's one rounding
            l_new = alpha * l + p_ij.sum(axis=-1)
            O_new = alpha[..., None] * O + self.weighted_values(p_ij, visible, v)
        return m_new.astype(F32), l_new.astype(F32), O_new.astype(F32)


class NaNMaskingKernel(SteppedKernelBackend):
    bug = "non-finite scores are masked like invisible keys and non-finite values read as 0: NaN input is hidden"
    models = ("NaN-safe attention that hides corrupted input as zeros (PyTorch's CPU flash SDPA returns 0 for a"
              " NaN query; cubecl's test let a NaN reference pass)")
    killed_by = "test_long_sequences_with_non_finite_scores_propagate"

    def mask(self, s_ij, visible):
        return np.where(visible[:, None, :] & np.isfinite(s_ij), s_ij, F32(-np.inf))

    def weighted_values(self, p_ij, visible, v):
        return super().weighted_values(p_ij, visible, np.where(np.isfinite(v), v, F32(0)))


class Exp2WithoutLog2e(SteppedKernelBackend):
    bug = "weights are exp2(s - m) without folding log2(e) into the scale: a base-2 softmax"
    models = "exp -> exp2 rewrite of the softmax (jax, vllm-metal) with the log2(e) factor lost"
    killed_by = "test_long_sequences_match_spec"

    def exp(self, x):
        return np.exp2(x)


class AlibiFromSequenceEnd(SteppedKernelBackend):
    bug = "ALiBi distance p - L instead of p - p_q: a per-row shift of the scores, so out is right and lse is off"
    models = "ALiBi distance measured from the context length (vLLM: token_idx - context_len, missing + 1)"
    killed_by = "test_long_sequences_with_a_window_match_spec"

    def transform(self, s_ij, p, p_q, visible, problem):
        return super().transform(s_ij, p, p_q + 1, visible, problem)


class AlibiSlopePerKVHead(SteppedKernelBackend):
    bug = "ALiBi slope indexed by the KV head (h // group_size) instead of the query head h"
    models = "ALiBi slopes and the GQA head mapping mixed up (vLLM's ALiBi head-mapping hotfix)"
    killed_by = "test_non_finite_visible_data_propagates"

    def transform(self, s_ij, p, p_q, visible, problem):
        by_kv_head = np.arange(problem.num_q_heads) // problem.group_size
        mixed = _where_set(problem, "alibi_slopes", lambda slopes: slopes[by_kv_head])
        return super().transform(s_ij, p, p_q, visible, mixed)


class RowMaxOfUnscaledProducts(SteppedKernelBackend):
    bug = ("the row max taken on the raw products q.k and then scaled (the exponent one FFMA): under a negative "
           "scale that is the row's least score, and exp(s - m) overflows once the scores spread past 88")
    models = "a fast path that assumes scale > 0 (max(q.k) * scale as the running max)"
    killed_by = "test_attention_matches_spec"

    def scale(self, problem):
        # the fast path of scores that are scale * q.k and nothing more
        self.negative_plain = problem.scale < 0 and problem.softcap is None and problem.alibi_slopes is None
        return super().scale(problem)

    def tile_max(self, s_ij, visible):
        if not self.negative_plain:
            return super().tile_max(s_ij, visible)
        least = np.where(visible[:, None, :], s_ij, F32(np.inf)).min(axis=-1)  # max(q.k) * scale
        return np.where(np.isposinf(least), F32(-np.inf), least)


class MinusInfRowUnguarded(SteppedKernelBackend):
    bug = ("online softmax without the m = -inf guard, safe for masked keys only because blocks a row cannot see "
           "are skipped: a row whose every visible score is -inf gets exp(-inf + inf) = NaN")
    models = ("flashinfer-ai/flashinfer PR 4401 (once masked logits are -inf, exp2(m_prev - m) of a row whose every "
              "logit is -inf is NaN, in a warp's slice and in the split-KV merge of empty chunks)")
    killed_by = "test_long_rows_of_minus_inf_scores_are_empty"

    def row_shift(self, m_new):
        return m_new

    def update(self, m, l, O, s_ij, visible, v):
        m_new, l_new, O_new = super().update(m, l, O, s_ij, visible, v)
        skipped = ~visible.any(axis=-1)[:, None]  # [n, 1]: a block no key of which the row sees
        return np.where(skipped, m, m_new), np.where(skipped, l, l_new), np.where(skipped[..., None], O, O_new)
