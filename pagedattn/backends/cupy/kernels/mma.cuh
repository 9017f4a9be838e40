// Tensor-core helpers shared by the mma.sync kernels: m16n8k16 with float32 accumulation
// (fragment layouts as in the PTX ISA), ldmatrix loads and float pairs packed to 16-bit pairs.
#pragma once
#include "common.cuh"

template <typename T> struct MmaType;
// MmaType<T> of a 16-bit type whose PTX name is AB ("f16", "bf16"): mma (c += a b) and pack.
#define PA_MMA_TYPE(T, AB)                                                                                   \
  template <> struct MmaType<T> {                                                                            \
    static __device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) { \
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." AB "." AB ".f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "   \
                   "{%8,%9}, {%0,%1,%2,%3};\n"                                                               \
                   : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                           \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                           \
    }                                                                                                        \
    static __device__ __forceinline__ unsigned pack(float lo, float hi) {                                    \
      unsigned d;                                                                                            \
      asm("cvt.rn." AB "x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));                                   \
      return d;                                                                                              \
    }                                                                                                        \
  }
PA_MMA_TYPE(half_t, "f16");
PA_MMA_TYPE(bfloat16_t, "bf16");
#undef PA_MMA_TYPE

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* smem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* smem) {
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}


// The same loads from a 32-bit shared-memory address (one register instead of a generic pointer's two).
__device__ __forceinline__ unsigned smem_address(const void* smem) {
  return static_cast<unsigned>(__cvta_generic_to_shared(smem));
}
__device__ __forceinline__ void ldmatrix_x4_at(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans_at(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// x combined by op over the lanes that hold the same two fragment rows: the quad (rows on the M
// side, S = Q K^T) or the 8 lanes of a tig (keys on the M side, S^T = K Q^T).
template <bool KEYS_ON_M, typename Op>
__device__ __forceinline__ float reduce_over_row_lanes(float x, Op op) {
  if constexpr (KEYS_ON_M) {
    x = op(x, __shfl_xor_sync(0xffffffffu, x, 4));
    x = op(x, __shfl_xor_sync(0xffffffffu, x, 8));
    return op(x, __shfl_xor_sync(0xffffffffu, x, 16));
  } else {
    x = op(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return op(x, __shfl_xor_sync(0xffffffffu, x, 2));
  }
}

// The online-softmax step of a thread's two fragment rows (half 0, 1) of the m16n8 tiles s.
// Rows on the M side (KEYS_ON_M false, S = Q K^T): rows g and g + 8, elements e / 2, the row max
// reduced over the quad. Keys on the M side (KEYS_ON_M true, S^T = K Q^T): rows 2 tig and
// 2 tig + 1 (the n side), elements e % 2, the row max reduced over the 8 lanes of the same tig.
// m_i is raised to the tile row max m_ij, l_i scaled by alpha = exp2(m_old - m_new), then
// P = exp2(s - m) in place with this thread's share of its sum added to l_i. An all-masked row
// subtracts 0 from its -inf scores and keeps p = 0.
template <int TILES, bool KEYS_ON_M = false>
__device__ __forceinline__ void online_softmax_step(float (&s)[TILES][4], float (&m_ij)[2], float (&m_i)[2],
                                                    float (&l_i)[2], float (&alpha)[2]) {
  float m_safe[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    m_ij[half] = reduce_over_row_lanes<KEYS_ON_M>(m_ij[half], [](float a, float b) { return fmaxf(a, b); });
    const float m_new = fmaxf(m_i[half], m_ij[half]);
    m_safe[half] = m_new == PA_NEG_INF ? 0.f : m_new;
    alpha[half] = exp2_ftz(m_i[half] - m_safe[half]);
    m_i[half] = m_new;
    l_i[half] *= alpha[half];
  }
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int half = KEYS_ON_M ? e % 2 : e / 2;
      s[j][e] = exp2_ftz(s[j][e] - m_safe[half]);
      l_i[half] += s[j][e];
    }
  }
}

// An 8 x 8 matrix of 16-bit pairs transposed across the warp: lane (g, tig) gives row g,
// columns 2 tig and 2 tig + 1, and gets those of the transpose (movmatrix, sm_75 on).
__device__ __forceinline__ unsigned transpose_8x8(unsigned x) {
  unsigned d;
  asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(x));
  return d;
}
