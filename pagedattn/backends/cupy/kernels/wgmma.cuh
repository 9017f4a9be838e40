// Hopper warpgroup MMA (wgmma.mma_async, sm_90a) for the pagedattn CuPy kernels: the A operand
// from registers (the m16n8k16 A fragment of each of the warpgroup's 4 warps, rows 16 * warp ..),
// B from shared memory through a matrix descriptor, float32 accumulators (per warp the m16n8
// C fragments of its 16 rows, n-tile j in d[4j .. 4j + 3]). PTX ISA: "Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate" (9.7.15); the wrappers below differ only in the
// shape and operand lists, and are written once for both 16-bit input types.
//
// Shared-memory operands use the 128-byte swizzle: a tile of rows of 64 16-bit elements
// (128 bytes), 8 rows (1,024 bytes, aligned to 1,024) per swizzle atom, 16-byte chunk c of row
// n stored at chunk c ^ (n % 8); a row of HEAD_DIM elements is split into HEAD_DIM / 64 panels,
// panel after panel (wgmma_tile_offset).
#pragma once
#include "common.cuh"

// Byte offset of 16-byte chunk `c` (of HEAD_DIM / 8) of row `n` in a ROWS-row tile.
template <int ROWS_IN_TILE>
__device__ __forceinline__ unsigned wgmma_tile_offset(int n, int c) {
  return (c / 8) * (ROWS_IN_TILE * 128) + n * 128 + (((c % 8) ^ (n % 8)) << 4);
}

// Shared-memory matrix descriptor (PTX ISA 9.7.15.5.1): start address, leading and stride
// byte offsets (all >> 4, 14 bits each), bits 62-63 = 1: 128-byte swizzle, base offset 0
// (every atom starts 1,024-aligned).
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned smem_addr, unsigned lbo, unsigned sbo) {
  return (unsigned long long)((smem_addr & 0x3ffffu) >> 4) | ((unsigned long long)((lbo >> 4) & 0x3fffu) << 16) |
         ((unsigned long long)((sbo >> 4) & 0x3fffu) << 32) | (1ull << 62);
}

// `desc` with its start address advanced by `bytes` (a multiple of 16): one 32-bit add to the
// start-address field (address >> 4 in bits 0-13), which cannot carry out of it while the
// address stays below 256 KB, as every shared-memory address on sm_90 does.
__device__ __forceinline__ unsigned long long wgmma_desc_plus(unsigned long long desc, unsigned bytes) {
  const unsigned lo = (unsigned)desc + (bytes >> 4);
  return (desc & 0xffffffff00000000ull) | lo;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across a wgmma fence/wait.
__device__ __forceinline__ void wgmma_touch(float& x) { asm volatile("" : "+f"(x)::"memory"); }
template <int N> __device__ __forceinline__ void wgmma_touch(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) wgmma_touch(x[i]);
}
// Keeps A-fragment registers alive (unchanged) until here: the tensor cores read them until
// the wgmma that takes them has completed, so they may not be reused before its wait.
template <int N> __device__ __forceinline__ void wgmma_keep(const unsigned (&a)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" ::"r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]) : "memory");
}
// Shared memory written through the generic proxy (cp.async, st.shared) made visible to the
// async proxy (wgmma operand reads); each writing thread, before the barrier.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// The 32 and 64 float accumulators of an m64n64 and an m64n128 product, as asm operands.
#define PA_WGMMA_D32                                                                                          \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),   \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),  \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define PA_WGMMA_D64                                                                                              \
  PA_WGMMA_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]),         \
      "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]),      \
      "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),      \
      "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),      \
      "+f"(d[63])
#define PA_WGMMA_D32_LIST \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}"
#define PA_WGMMA_D64_LIST                                                                                        \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30," \
  "%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,"   \
  "%59,%60,%61,%62,%63}"

// One wrapper of S = A B with A from registers (K-major) and B from shared memory: m64nNk16, D of
// DN floats; AREGS, B, P and TB are the asm operand numbers of a, b_desc, scale_d and TRANS_B.
#define PA_WGMMA_RS(AB, N, DN, DLIST, DOPS, AREGS, B, P, TB)                                                        \
  template <int TRANS_B>                                                                                            \
  static __device__ __forceinline__ void m64n##N(float (&d)[DN], const unsigned (&a)[4], unsigned long long b_desc, \
                                                int scale_d) {                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" P ", 0;\n"                                                    \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." AB "." AB " " DLIST ", "                         \
                 "{" AREGS "}, %" B ", p, 1, 1, %" TB ";\n}\n"                                                      \
                 : DOPS                                                                                             \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(scale_d), "n"(TRANS_B)              \
                 : "memory");                                                                                       \
  }

// The wrappers of one input type; AB is its PTX name ("f16", "bf16"), the only difference.
#define PA_WGMMA_WRAPPERS(AB)                                                                                       \
  /* S = A B with A from shared memory too (both K-major, 128-byte swizzle): no A registers */                     \
  static __device__ __forceinline__ void m64n64_ss(float (&d)[32], unsigned long long a_desc,                       \
                                                   unsigned long long b_desc, int scale_d) {                        \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." AB "." AB " " PA_WGMMA_D32_LIST ", "                  \
                 "%32, %33, p, 1, 1, 0, 0;\n}\n"                                                                    \
                 : PA_WGMMA_D32                                                                                     \
                 : "l"(a_desc), "l"(b_desc), "r"(scale_d)                                                           \
                 : "memory");                                                                                       \
  }                                                                                                                 \
  PA_WGMMA_RS(AB, 64, 32, PA_WGMMA_D32_LIST, PA_WGMMA_D32, "%32,%33,%34,%35", "36", "37", "38")                     \
  PA_WGMMA_RS(AB, 128, 64, PA_WGMMA_D64_LIST, PA_WGMMA_D64, "%64,%65,%66,%67", "68", "69", "70")

template <typename T> struct Wgmma;
template <> struct Wgmma<half_t> {
  PA_WGMMA_WRAPPERS("f16")
};
template <> struct Wgmma<bfloat16_t> {
  PA_WGMMA_WRAPPERS("bf16")
};
