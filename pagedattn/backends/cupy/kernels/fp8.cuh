// fp8 cache storage (float8_e4m3fn, float8_e5m2) for the pagedattn CuPy kernels.
//
// The caches hold raw bytes; the attention kernels stage those bytes in shared memory with
// 16-byte cp.async and convert them there, exactly, to the query's 16-bit type for the
// tensor cores (every e4m3 and e5m2 value is a float16 and a bfloat16 value). The scales
// are applied outside the products: k_scale folded into the score scale, v_scale on O at
// the end. write_kv stores x / scale as ml_dtypes rounds it (pagedattn.spec.kv_ops, see
// fp8_from_quotient): e4m3fn has no infinity (overflow and inf give NaN), e5m2 does.
#pragma once
#include "common.cuh"

struct __align__(1) fp8_e4m3_t { unsigned char bits; };
struct __align__(1) fp8_e5m2_t { unsigned char bits; };

template <typename C> struct CacheKind { static constexpr bool FP8 = false, E4M3 = false; };
template <> struct CacheKind<fp8_e4m3_t> { static constexpr bool FP8 = true, E4M3 = true; };
template <> struct CacheKind<fp8_e5m2_t> { static constexpr bool FP8 = true, E4M3 = false; };

// Two fp8 values (low byte first) to a float16 pair (low half first), exact.
__device__ __forceinline__ unsigned fp8x2_to_f16x2(unsigned short pair, fp8_e4m3_t) {
  unsigned d;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(pair));
  return d;
}
__device__ __forceinline__ unsigned fp8x2_to_f16x2(unsigned short pair, fp8_e5m2_t) {
  unsigned d;
  asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(d) : "h"(pair));
  return d;
}
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

// One 16-byte chunk of 16 fp8 values to two 16-byte chunks of T (elements 0-7, 8-15).
template <typename C, typename T>
__device__ __forceinline__ void fp8_chunk_to(const uint4& raw, uint4& first, uint4& second) {
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
  unsigned h[8];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    h[2 * i] = f16x2_to(fp8x2_to_f16x2(static_cast<unsigned short>(w[i] & 0xffffu), C()), T());
    h[2 * i + 1] = f16x2_to(fp8x2_to_f16x2(static_cast<unsigned short>(w[i] >> 16), C()), T());
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
