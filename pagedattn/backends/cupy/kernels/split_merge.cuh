// The split-KV merge: the exact online-softmax merge of the partials of a split range's parts
// (pagedattn.spec.online_softmax.merge_states), in part order, the same arithmetic wherever it
// runs: in its own kernel (merge_partials, paged_attention.cu) or, fused, in the attention
// kernel's CTA of the range's part that finishes last (merge_if_last_part).
//
// A range's parts are partials first .. first + num_parts - 1, each ROWS rows of HEAD_DIM
// float32 (partial_out) and ROWS lse (partial_lse). Loads are ld.global.cg: partials written
// by other CTAs of the same kernel are read from L2, never from a stale L1 line.
#pragma once

#include "common.cuh"

// The largest lse of row r over the range's parts (a NaN lse is skipped, as fmaxf does).
template <int ROWS>
__device__ __forceinline__ float parts_max_lse(const float* __restrict__ partial_lse, int first, int num_parts,
                                               int r) {
  const float* lse_r = partial_lse + (long long)first * ROWS + r;  // part k at k * ROWS
  float m = PA_NEG_INF;
#pragma unroll 8
  for (int k = 0; k < num_parts; ++k) m = fmaxf(m, __ldcg(lse_r + (long long)k * ROWS));
  return m;
}

// Elements d0 .. d0 + 3 of row r merged over the range's parts, whose largest lse is m:
// out[t, h, d] rounded to T and, at d0 == 0, lse[t, h]. An empty part (lse -inf) weighs 0 and
// its out is never taken into the sum; a NaN lse (fmaxf skipped it in m) makes the weights
// NaN: kept. Each element's sum runs over the parts in order, whichever thread holds it.
template <int ROWS, int HEAD_DIM, typename T>
__device__ __forceinline__ void merge_parts_quad(const float* __restrict__ partial_out,
                                                 const float* __restrict__ partial_lse, int first, int num_parts,
                                                 int r, int d0, float m, long long t, int h, int num_q_heads,
                                                 T* __restrict__ out, float* __restrict__ lse) {
  static_assert(HEAD_DIM % 4 == 0, "rows are merged four elements at a time");
  const float* lse_r = partial_lse + (long long)first * ROWS + r;               // part k at k * ROWS
  const float* out_r = partial_out + ((long long)first * ROWS + r) * HEAD_DIM;  // at k * ROWS * HEAD_DIM
  float weight_sum = 0.f, acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
  for (int k = 0; k < num_parts; ++k) {
    const float lse_k = __ldcg(lse_r + (long long)k * ROWS);
    const float w = lse_k == PA_NEG_INF ? 0.f : expf(lse_k - m);  // an empty part: out ignored
    const float4 o_k = __ldcg(reinterpret_cast<const float4*>(out_r + (long long)k * ROWS * HEAD_DIM + d0));
    const float o[4] = {o_k.x, o_k.y, o_k.z, o_k.w};
    weight_sum += w;
#pragma unroll
    for (int e = 0; e < 4; ++e)
      acc[e] = lse_k == PA_NEG_INF ? acc[e] : fmaf(w, o[e], acc[e]);  // 0 * NaN stays NaN for a part with keys
  }
  T* out_row = out + (t * num_q_heads + h) * HEAD_DIM + d0;
#pragma unroll
  for (int e = 0; e < 4; ++e) out_row[e] = from_float<T>(weight_sum != 0.f ? acc[e] / weight_sum : 0.f);
  if (d0 == 0) lse[t * num_q_heads + h] = weight_sum != 0.f ? m + logf(weight_sum) : PA_NEG_INF;
}

// Called by every thread of a split part's CTA once its partial is stored: the part that
// finishes last among its range's num_parts merges them all into out and lse. Each part counts
// itself in merge_counters[first] (release: the CTA barrier, then a fence, then the atomic);
// the one that counts num_parts sets the count back to 0 for the next run and merges (acquire:
// the atomic, a fence, then the barrier before the loads). The rows are the work item's
// (work_item.cuh): row r is token token_start + r / num_groups, head kv_head * group_size +
// group_start + r % num_groups. A thread takes four elements of a row at a time, so that a
// CTA of 128 threads merges four rows of 128 in one pass of loads.
template <int ROWS, int HEAD_DIM, int THREADS, typename T>
__device__ __forceinline__ void merge_if_last_part(int* __restrict__ merge_counters, int first, int num_parts,
                                                   const float* __restrict__ partial_out,
                                                   const float* __restrict__ partial_lse, int num_rows,
                                                   int token_start, int num_groups, int kv_head, int group_size,
                                                   int group_start, int num_q_heads, T* __restrict__ out,
                                                   float* __restrict__ lse) {
  __syncthreads();  // every thread's partial stores happen before the count
  int last = 0;
  if (threadIdx.x == 0) {
    __threadfence();
    last = atomicAdd(merge_counters + first, 1) == num_parts - 1;
    if (last) {
      merge_counters[first] = 0;  // every part has counted: the next run starts from 0
      __threadfence();
    }
  }
  if (!__syncthreads_or(last)) return;
  constexpr int QUADS = HEAD_DIM / 4;
  for (int idx = threadIdx.x; idx < num_rows * QUADS; idx += THREADS) {
    const int r = idx / QUADS, d0 = 4 * (idx % QUADS);
    const float m = parts_max_lse<ROWS>(partial_lse, first, num_parts, r);
    merge_parts_quad<ROWS, HEAD_DIM>(partial_out, partial_lse, first, num_parts, r, d0, m,
                                     token_start + r / num_groups,
                                     kv_head * group_size + group_start + r % num_groups, num_q_heads, out, lse);
  }
}

// The end of every paged-attention kernel, after its result is stored, in every thread: a split
// range's part merges its range's partials if it finished last, unless the
// host merges them after the kernel (merge_counters nullptr). The part's range is read here, at
// the end, so that it holds no register through the kernel.
#define PAGED_ATTENTION_MERGE_IF_LAST(ROWS, HEAD_DIM, THREADS)                                    \
  if (partial >= 0 && merge_counters != nullptr) {                                                \
    const int* range = items + (long long)blockIdx.x * 11 + 9;                                    \
    merge_if_last_part<ROWS, HEAD_DIM, THREADS>(merge_counters, range[0], range[1], partial_out,   \
                                                partial_lse, num_rows, token_start, num_groups,   \
                                                kv_head, group_size, group_start, num_q_heads,    \
                                                out, lse);                                        \
  }
