// Storage types and conversions shared by the pagedattn CuPy kernels.
//
// The kernels are compiled by NVRTC without the CUDA toolkit's headers (CI has none), so the
// 16-bit types are defined here as raw 16-bit storage: half_t holds IEEE binary16 bits (the
// layout of __half) and bfloat16_t holds bfloat16 bits (the layout of __nv_bfloat16). The
// host passes uint16 views of the arrays; conversions use PTX cvt instructions.
#pragma once

struct __align__(2) half_t { unsigned short bits; };
struct __align__(2) bfloat16_t { unsigned short bits; };

#define PA_INF __int_as_float(0x7f800000)
#define PA_NEG_INF __int_as_float(0xff800000)

constexpr float LOG2E = 1.4426950408889634f;  // scores are kept in log2 units: exp(x) = exp2(x * LOG2E)
constexpr float LN2 = 0.6931471805599453f;    // back to natural log for lse

// exp2 on the MUFU unit, one instruction: subnormal results flushed to zero (they weigh nothing
// beside a row maximum's 1; exp2f spends three more instructions on them); exp2(-inf) = 0
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(half_t x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}
__device__ __forceinline__ float to_float(bfloat16_t x) {
  return __uint_as_float(static_cast<unsigned>(x.bits) << 16);
}

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ half_t from_float<half_t>(float x) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
  return h;
}
template <> __device__ __forceinline__ bfloat16_t from_float<bfloat16_t>(float x) {
  bfloat16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(x));
  return h;
}

// Unpack one 16-byte chunk (16 / sizeof(T) elements) into floats.
__device__ __forceinline__ void unpack_chunk(const uint4& raw, float (&x)[4], float) {
  x[0] = __uint_as_float(raw.x); x[1] = __uint_as_float(raw.y);
  x[2] = __uint_as_float(raw.z); x[3] = __uint_as_float(raw.w);
}
__device__ __forceinline__ void unpack_word(unsigned w, float& lo, float& hi, bfloat16_t) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
__device__ __forceinline__ void unpack_word(unsigned w, float& lo, float& hi, half_t) {
  half_t a, b;
  a.bits = static_cast<unsigned short>(w & 0xffffu);
  b.bits = static_cast<unsigned short>(w >> 16);
  lo = to_float(a);
  hi = to_float(b);
}
template <typename T>
__device__ __forceinline__ void unpack_chunk(const uint4& raw, float (&x)[8], T tag) {
  unpack_word(raw.x, x[0], x[1], tag); unpack_word(raw.y, x[2], x[3], tag);
  unpack_word(raw.z, x[4], x[5], tag); unpack_word(raw.w, x[6], x[7], tag);
}

// 16-byte asynchronous copy global -> shared; valid == false fills 16 zero bytes and reads nothing.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(src_size));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ unsigned dynamic_smem_size() {
  unsigned size;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(size));
  return size;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

// softcap * tanh(x / softcap) to a few ulp of the result: with y = x / softcap, near 0 (|y| < 0.5)
// tanh's odd Taylor series (terms to y^15; the first left out is below 1e-8 of the value),
// elsewhere 1 - 2 / (2^(2 |y| log2 e) + 1), whose exponential is at least e, so nothing cancels.
// Its error is a few units of float32 rounding of the result (about 4 u_acc |x| at most with exact
// exp2 and division, measured in float32 against float64; where |y| >= 0.5, ex2.approx and the
// fast division add at most about 8 u_acc |x|), within the error model's sqrt(head_dim) u_acc S;
// the form softcap - 2 softcap / (e + 1) alone is off by ulps of softcap even at x near 0. One
// ex2 and one fast division in place of tanhf and an IEEE division, which took most of the issue
// slots of head_dim-256 decode. +-inf gives +-softcap, and NaN stays NaN.
__device__ __forceinline__ float soft_cap(float x, float softcap) {
  const float y = x * __frcp_rn(softcap);
  const float a = fabsf(y);
  const float a2 = a * a;
  float poly = -0.0014558343870513183f;          // -929569 / 638512875
  poly = fmaf(poly, a2, 0.003592128036572481f);   // 21844 / 6081075
  poly = fmaf(poly, a2, -0.008863235529902197f);  // -1382 / 155925
  poly = fmaf(poly, a2, 0.021869488536155203f);   // 62 / 2835
  poly = fmaf(poly, a2, -0.05396825396825397f);   // -17 / 315
  poly = fmaf(poly, a2, 0.13333333333333333f);    // 2 / 15
  poly = fmaf(poly, a2, -0.3333333333333333f);    // -1 / 3
  const float near = fmaf(a, a2 * poly, a);
  const float far = 1.f - __fdividef(2.f, exp2_ftz(a * (2.f * LOG2E)) + 1.f);
  return copysignf(softcap * (a < 0.5f ? near : far), y);
}

// The score s * scale of a query row against a key it sees, soft-capped and plus the ALiBi bias
// slope * distance (distance = p - p_q), in log2 units. FAST_SOFTCAP: soft_cap, else the IEEE
// division and tanhf (the 2-CTA wgmma kernel: with soft_cap ptxas spilled 44-532 bytes under its
// 128-register cap).
template <bool FAST_SOFTCAP = true>
__device__ __forceinline__ float score_log2(float s, int distance, float slope, float scale, float softcap,
                                            int has_alibi) {
  float x = s * scale;
  if (softcap > 0.f) x = FAST_SOFTCAP ? soft_cap(x, softcap) : softcap * tanhf(x / softcap);
  if (has_alibi) x += slope * (float)distance;
  return x * LOG2E;
}

// The score s * scale of a query row at position p_q against key position p, soft-capped and
// plus the ALiBi bias slope * (p - p_q), in log2 units; -inf (replacing it, never added to) where
// the row cannot see p: padding (!valid), p >= L, causal, outside the sliding window. The row
// state is taken by reference, read where the arithmetic needs it.
template <bool FAST_SOFTCAP = true, typename Valid>
__device__ __forceinline__ float masked_score_log2(float s, int p, const int& p_q, const float& slope,
                                                   const Valid& valid, int L, float scale, float softcap,
                                                   int has_alibi, int causal, int sliding_window) {
  // score_log2's arithmetic, written out: ptxas spilled the 2-CTA wgmma kernel (52-272 bytes under
  // its 128-register cap) when the visibility came first and score_log2 was called
  float x = s * scale;
  if (softcap > 0.f) x = FAST_SOFTCAP ? soft_cap(x, softcap) : softcap * tanhf(x / softcap);
  const int distance = p - p_q;
  if (has_alibi) x += slope * (float)distance;
  bool visible = valid && p < L;
  if (causal) visible = visible && distance <= 0;
  if (sliding_window > 0) visible = visible && distance > -sliding_window;
  return visible ? x * LOG2E : PA_NEG_INF;
}

// The parameters every paged-attention kernel takes, in the launch order of the host
// (backend.py): query [T, Hq, D] of T, caches of C read through their element strides, the
// outputs, split-KV partials and merge counters (nullptr: merge_partials merges after the
// kernel), the index arrays and work items, then the call's scalars.
#define PAGED_ATTENTION_PARAMS(T, C)                                                              \
  const T *__restrict__ query, const C *__restrict__ key_cache, const C *__restrict__ value_cache, \
      T *__restrict__ out, float *__restrict__ lse, float *__restrict__ partial_out,              \
      float *__restrict__ partial_lse, int *__restrict__ merge_counters,                          \
      const int *__restrict__ block_tables,                                                       \
      const int *__restrict__ seq_lens, const int *__restrict__ query_start_loc,                  \
      const float *__restrict__ alibi_slopes, const int *__restrict__ items,                      \
      long long k_stride_block, long long k_stride_slot, long long k_stride_head,                 \
      long long v_stride_block, long long v_stride_slot, long long v_stride_head,                 \
      int max_blocks_per_seq, int num_q_heads, int group_size, float scale, float softcap,        \
      int sliding_window, int causal, int has_alibi, float v_scale

// This CTA's work item (planning.build_work: a row of 11 ints of `items`: seq, kv_head,
// token_start, num_tokens, group_start, num_groups, kv_begin, kv_end, partial (-1: write out
// directly), then for a split range's part its range's first partial and its number of parts:
// read by PAGED_ATTENTION_MERGE_IF_LAST, split_merge.cuh) as const locals, in a kernel of PAGED_ATTENTION_PARAMS.
#define PAGED_ATTENTION_ITEM()                                                                    \
  const int* item = items + (long long)blockIdx.x * 11;                                           \
  const int seq = item[0], kv_head = item[1], token_start = item[2], num_tokens = item[3];        \
  const int group_start = item[4], num_groups = item[5], kv_begin = item[6], kv_end = item[7];    \
  const int partial = item[8]

// What every paged-attention kernel derives from its work item, as const locals: num_rows, the
// sequence's L and q_len, and its block-table row (after PAGED_ATTENTION_ITEM).
#define PAGED_ATTENTION_SEQUENCE()                                                                \
  const int num_rows = num_tokens * num_groups;                                                   \
  const int L = seq_lens[seq];                                                                    \
  const int q_len = query_start_loc[seq + 1] - query_start_loc[seq];                              \
  const int* table_row = block_tables + (long long)seq * max_blocks_per_seq

// Element d of row r of the work item's result: o_final (and lse_final at d == 0) to split-KV
// partial `partial` (ROWS x HEAD_DIM per partial) when partial >= 0, else to out and lse at the
// row's token token_start + r / num_groups and query head kv_head * group_size + group_start +
// r % num_groups.
template <int ROWS, int HEAD_DIM, typename T>
__device__ __forceinline__ void store_result(float o_final, float lse_final, int r, int d, int partial,
                                             int token_start, int num_groups, int kv_head, int group_size,
                                             int group_start, int num_q_heads, T* __restrict__ out,
                                             float* __restrict__ lse, float* __restrict__ partial_out,
                                             float* __restrict__ partial_lse) {
  if (partial >= 0) {
    partial_out[((long long)partial * ROWS + r) * HEAD_DIM + d] = o_final;
    if (d == 0) partial_lse[(long long)partial * ROWS + r] = lse_final;
  } else {
    const long long t = token_start + r / num_groups;
    const int h = kv_head * group_size + group_start + r % num_groups;
    out[(t * num_q_heads + h) * HEAD_DIM + d] = from_float<T>(o_final);
    if (d == 0) lse[t * num_q_heads + h] = lse_final;
  }
}
