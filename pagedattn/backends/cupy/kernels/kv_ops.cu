// The cache operations and merge_states of the contract (pagedattn.spec.kv_ops,
// pagedattn.spec.online_softmax.merge_states). Strides are in elements and 64-bit; the
// caches' own strides are honoured, so strided views of a larger pool work.
#include "common.cuh"
#include "fp8.cuh"

// write_kv: token t's key/value [num_kv_heads, head_dim] go to slot slot_mapping[t] =
// block * block_size + offset (-1 = skip). dims: the cache's 4 strides as (block, slot, head, dim).
// The parameters of write_kv and write_kv_fp8 (C: the cache's element type), and their names.
#define PA_WRITE_KV_PARAMS(C)                                                                                 \
  const T* __restrict__ key, const T* __restrict__ value, C* __restrict__ key_cache,                          \
      C* __restrict__ value_cache, const long long* __restrict__ slot_mapping, int num_kv_heads,              \
      int head_dim, int block_size, long long k_stride_block, long long k_stride_slot,                        \
      long long k_stride_head, long long k_stride_dim, long long v_stride_block, long long v_stride_slot,     \
      long long v_stride_head, long long v_stride_dim
#define PA_WRITE_KV_ARGS                                                                                      \
  key, value, key_cache, value_cache, slot_mapping, num_kv_heads, head_dim, block_size, k_stride_block,       \
      k_stride_slot, k_stride_head, k_stride_dim, v_stride_block, v_stride_slot, v_stride_head, v_stride_dim

// The body of write_kv and write_kv_fp8: one CTA per token; threads over num_kv_heads * head_dim.
// QUOTIENT: the cache holds x / scale rounded once to C (fp8_from_quotient), else x itself.
template <bool QUOTIENT, typename T, typename C>
__device__ __forceinline__ void write_kv_token(PA_WRITE_KV_PARAMS(C), double k_scale, double v_scale) {
  const long long t = blockIdx.x;
  const long long slot_id = slot_mapping[t];
  if (slot_id < 0) return;
  const long long block = slot_id / block_size, slot = slot_id % block_size;
  const int per_token = num_kv_heads * head_dim;
  for (int idx = threadIdx.x; idx < per_token; idx += blockDim.x) {
    const long long h = idx / head_dim, d = idx % head_dim;
    if constexpr (QUOTIENT) {
      key_cache[block * k_stride_block + slot * k_stride_slot + h * k_stride_head + d * k_stride_dim] =
          fp8_from_quotient<C>(to_float(key[t * per_token + idx]), k_scale);
      value_cache[block * v_stride_block + slot * v_stride_slot + h * v_stride_head + d * v_stride_dim] =
          fp8_from_quotient<C>(to_float(value[t * per_token + idx]), v_scale);
    } else {
      key_cache[block * k_stride_block + slot * k_stride_slot + h * k_stride_head + d * k_stride_dim] =
          key[t * per_token + idx];
      value_cache[block * v_stride_block + slot * v_stride_slot + h * v_stride_head + d * v_stride_dim] =
          value[t * per_token + idx];
    }
  }
}

template <typename T>
__global__ void write_kv(PA_WRITE_KV_PARAMS(T)) {
  write_kv_token<false, T, T>(PA_WRITE_KV_ARGS, 1.0, 1.0);
}

// write_kv into fp8 caches (C = fp8_e4m3_t / fp8_e5m2_t): stores key / k_scale and
// value / v_scale rounded once to C (fp8_from_quotient); otherwise as write_kv.
template <typename T, typename C>
__global__ void write_kv_fp8(PA_WRITE_KV_PARAMS(C), double k_scale, double v_scale) {
  write_kv_token<true, T, C>(PA_WRITE_KV_ARGS, k_scale, v_scale);
}

// copy_blocks in two launches so every source is read before any destination is written:
// gather copies blocks[i] of cache into buffer[i] (contiguous), scatter copies buffer[i] to
// blocks[i]. shape: the cache's dims 1..3, strides: its 4 strides (elements). One CTA per block.
// Both copy between cache block blocks[blockIdx.x] and buffer[blockIdx.x]; TO_BUFFER: which way.
template <bool TO_BUFFER, typename T>
__device__ __forceinline__ void copy_block(const T* __restrict__ from, T* __restrict__ to,
                                           const long long* __restrict__ blocks, int dim1, int dim2, int dim3,
                                           long long stride0, long long stride1, long long stride2,
                                           long long stride3) {
  const long long per_block = (long long)dim1 * dim2 * dim3;
  const long long base = blocks[blockIdx.x] * stride0;
  for (long long idx = threadIdx.x; idx < per_block; idx += blockDim.x) {
    const long long i1 = idx / ((long long)dim2 * dim3), i2 = (idx / dim3) % dim2, i3 = idx % dim3;
    if (TO_BUFFER) {
      to[blockIdx.x * per_block + idx] = from[base + i1 * stride1 + i2 * stride2 + i3 * stride3];
    } else {
      to[base + i1 * stride1 + i2 * stride2 + i3 * stride3] = from[blockIdx.x * per_block + idx];
    }
  }
}

template <typename T>
__global__ void copy_blocks_gather(const T* __restrict__ cache, T* __restrict__ buffer,
                                   const long long* __restrict__ blocks, int dim1, int dim2, int dim3,
                                   long long stride0, long long stride1, long long stride2, long long stride3) {
  copy_block<true>(cache, buffer, blocks, dim1, dim2, dim3, stride0, stride1, stride2, stride3);
}

template <typename T>
__global__ void copy_blocks_scatter(T* __restrict__ cache, const T* __restrict__ buffer,
                                    const long long* __restrict__ blocks, int dim1, int dim2, int dim3,
                                    long long stride0, long long stride1, long long stride2, long long stride3) {
  copy_block<false>(buffer, cache, blocks, dim1, dim2, dim3, stride0, stride1, stride2, stride3);
}

// merge_states: the exact merge of two partial results over disjoint keys; a -inf lse is an
// empty part whose out is ignored (even NaN); both empty gives out = 0, lse = -inf.
// Contiguous out [rows, head_dim], lse [rows]; one thread per element.
template <typename T>
__global__ void merge_states(const T* __restrict__ out_a, const float* __restrict__ lse_a,
                             const T* __restrict__ out_b, const float* __restrict__ lse_b,
                             T* __restrict__ out, float* __restrict__ lse, long long rows, int head_dim) {
  const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= rows * head_dim) return;
  const long long row = idx / head_dim;
  const float a = lse_a[row], b = lse_b[row];
  const bool has_a = a != PA_NEG_INF, has_b = b != PA_NEG_INF;
  float o = 0.f, l = PA_NEG_INF;
  if (has_a && has_b) {
    const float m = fmaxf(a, b);
    const float w_a = expf(a - m), w_b = expf(b - m);
    o = (w_a * to_float(out_a[idx]) + w_b * to_float(out_b[idx])) / (w_a + w_b);
    l = m + logf(w_a + w_b);
  } else if (has_a) {
    o = to_float(out_a[idx]);
    l = a;
  } else if (has_b) {
    o = to_float(out_b[idx]);
    l = b;
  }
  out[idx] = from_float<T>(o);
  if (idx % head_dim == 0) lse[row] = l;
}
