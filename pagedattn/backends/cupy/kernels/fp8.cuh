// fp8 cache storage (float8_e4m3fn, float8_e5m2) for the pagedattn CuPy kernels.
//
// The caches hold raw bytes; the attention kernels stage those bytes in shared memory with
// 16-byte cp.async. The prefill kernel (paged_attention_mma.cu) converts each landed tile
// there, exactly, to the query's 16-bit type (every e4m3 and e5m2 value is a float16 and a
// bfloat16 value); the decode kernel (paged_attention_decode.cu) converts in registers to
// float16 and multiplies in float16 for either query type. The scales are applied outside
// the products: k_scale folded into the score scale, v_scale on O at the end. write_kv stores x / scale as ml_dtypes rounds it (pagedattn.spec.kv_ops, see
// fp8_from_quotient): e4m3fn has no infinity (overflow and inf give NaN), e5m2 does.
#pragma once
#include "common.cuh"

struct __align__(1) fp8_e4m3_t { unsigned char bits; };
struct __align__(1) fp8_e5m2_t { unsigned char bits; };

template <typename C> struct CacheKind { static constexpr bool FP8 = false, E4M3 = false; };
template <> struct CacheKind<fp8_e4m3_t> { static constexpr bool FP8 = true, E4M3 = true; };
template <> struct CacheKind<fp8_e5m2_t> { static constexpr bool FP8 = true, E4M3 = false; };

// A float16 pair to the query type's pair (both exact for values that came from fp8).
__device__ __forceinline__ unsigned f16x2_to(unsigned h2, half_t) { return h2; }
__device__ __forceinline__ unsigned f16x2_to(unsigned h2, bfloat16_t) {
  float lo, hi;
  asm("cvt.f32.f16 %0, %1;" : "=f"(lo) : "h"(static_cast<unsigned short>(h2 & 0xffffu)));
  asm("cvt.f32.f16 %0, %1;" : "=f"(hi) : "h"(static_cast<unsigned short>(h2 >> 16)));
  unsigned d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

// The 16-bit type the tensor-core decode kernel multiplies fp8 caches in: float16 for either
// query type (kernels/paged_attention_decode.cu), so each fp8 pair takes one exact cvt; a
// 16-bit cache is multiplied in its own type.
template <typename T, typename C> struct DecodeMmaType { using type = T; };
template <typename T> struct DecodeMmaType<T, fp8_e4m3_t> { using type = half_t; };
template <typename T> struct DecodeMmaType<T, fp8_e5m2_t> { using type = half_t; };

// The bfloat16 route of the decode kernel: a query row q is multiplied in float16 as q * 2^shift,
// shift = 15 - floor(log2(amax)) for its largest finite |q| amax (0 for amax == 0), at most 126,
// so the row's largest element lands in [2^15, 2^16) and below float16's 65,504 (a bfloat16 there
// is at most 65,280) and 2^-shift stays a normal float.
__device__ __forceinline__ int q_row_shift(float amax) {
  if (amax == 0.f) return 0;
  const int shift = 15 - ((__float_as_int(amax) >> 23) - 127);  // a subnormal amax reads as 2^-127
  return shift < 126 ? shift : 126;
}
// 2^k as a float, for -126 <= k <= 127.
__device__ __forceinline__ float pow2_float(int k) { return __int_as_float((127 + k) << 23); }
// Word i (0-3, known at compile time) of a 16-byte chunk.
__device__ __forceinline__ unsigned chunk_word(const uint4& c, int i) {
  return i == 0 ? c.x : i == 1 ? c.y : i == 2 ? c.z : c.w;
}

template <typename T> struct IsBfloat16 { static constexpr bool value = false; };
template <> struct IsBfloat16<bfloat16_t> { static constexpr bool value = true; };

// Half HALF (0: bytes 0-1, 1: bytes 2-3) of a 32-bit word of fp8 values to a float16 pair,
// exact. The word's halves are taken with mov.b32 {lo, hi}, which ptxas folds into the
// conversion's operand (F2FP on R.H1), where a shift by 16 costs an instruction of its own.
template <typename C, int HALF> __device__ __forceinline__ unsigned fp8_half_to_f16x2(unsigned w) {
  unsigned short lo, hi;
  asm("mov.b32 {%0, %1}, %2;" : "=h"(lo), "=h"(hi) : "r"(w));
  const unsigned short half = HALF ? hi : lo;
  unsigned d;
  if constexpr (CacheKind<C>::E4M3)
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(half));
  else
    asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(d) : "h"(half));
  return d;
}
// Bytes of two words interleaved: {a.b[i], b.b[i], a.b[i + 1], b.b[i + 1]} for SELECTOR
// 0x5140 (i = 0) or 0x7362 (i = 2), low byte first (prmt.b32).
template <unsigned SELECTOR> __device__ __forceinline__ unsigned interleave_bytes(unsigned a, unsigned b) {
  unsigned d;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "n"(SELECTOR));
  return d;
}

// One 16-byte chunk of 16 fp8 values to two 16-byte chunks of T (elements 0-7, 8-15).
template <typename C, typename T>
__device__ __forceinline__ void fp8_chunk_to(const uint4& raw, uint4& first, uint4& second) {
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
  unsigned h[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    h[2 * i] = f16x2_to(fp8_half_to_f16x2<C, 0>(w[i]), T());
    h[2 * i + 1] = f16x2_to(fp8_half_to_f16x2<C, 1>(w[i]), T());
  }
  first = make_uint4(h[0], h[1], h[2], h[3]);
  second = make_uint4(h[4], h[5], h[6], h[7]);
}

// x / scale to the fp8 type as ml_dtypes casts the float64 quotient (pagedattn.spec.kv_ops):
// ml_dtypes goes through float32, rounding to nearest even at both steps, so the kernel does
// the same: the quotient in float64, rounded to float32, then converted with satfinite;
// overflow is decided on the float32 value (e4m3fn: beyond 464 is NaN; e5m2: from 61440 on
// is inf), NaN keeps the input's sign.
__device__ __forceinline__ unsigned char satfinite_fp8(float f, fp8_e4m3_t) {
  unsigned short d;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(d) : "f"(f));
  return static_cast<unsigned char>(d & 0xffu);
}
__device__ __forceinline__ unsigned char satfinite_fp8(float f, fp8_e5m2_t) {
  unsigned short d;
  asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %1;" : "=h"(d) : "f"(f));
  return static_cast<unsigned char>(d & 0xffu);
}
template <typename C> __device__ __forceinline__ C fp8_from_quotient(float x, double scale) {
  constexpr bool E4M3 = CacheKind<C>::E4M3;
  const unsigned char sign = (__float_as_uint(x) >> 31) ? 0x80 : 0x00;  // scale > 0 (host-checked)
  C c;
  if (x != x) {
    c.bits = sign | (E4M3 ? 0x7f : 0x7e);
    return c;
  }
  const float f = static_cast<float>(static_cast<double>(x) / scale);  // round to nearest even
  const float magnitude = fabsf(f);
  if (E4M3 ? magnitude > 464.f : magnitude >= 61440.f) {  // past the last rounding boundary
    c.bits = sign | (E4M3 ? 0x7f : 0x7c);                 // NaN (e4m3fn) or inf (e5m2)
    return c;
  }
  c.bits = satfinite_fp8(f, C());
  return c;
}
