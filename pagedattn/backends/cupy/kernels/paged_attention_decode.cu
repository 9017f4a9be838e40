// Decode on tensor cores: up to DEC_ROWS = 16 query rows (the query heads of one KV head, for
// one or a few tokens) per CTA, the KV range split among DEC_WARPS warps.
//
// Must match pagedattn.spec.exact.exact_attention within the error model. Same work items,
// skeleton and names as the other kernels and the NumPy reference, with one difference: each
// warp runs its own online softmax over the 16-key sub-tiles warp, warp + DEC_WARPS, ... of
// the range, with its own K/V stages (DEC_STAGES deep, cp.async, zero-filled beyond L), so no
// CTA-wide barrier sits in the inner loop; the epilogue merges the warps' (m, l, O) exactly,
// in a fixed order, then writes O / l and lse = m + log l (0 and -inf for an empty row).
//   setup:      rows' p_q, ALiBi slopes; Q (16 rows, zeros past num_rows) to shared memory,
//               then to mma A fragments in registers
//   inner loop: per warp, for each sub-tile (attend_tile): look up physical blocks (only
//               p < L), S = Q K^T (mma.sync), mask (replace, never add), update m, l, O
//               (O = O * alpha + P V, mma.sync with V through ldmatrix.trans)
//   epilogue:   merge the warps' states, O / l, lse, to out or a split-KV partial.
#include "common.cuh"
#include "mma.cuh"

constexpr int DEC_WARPS = 8;
constexpr int DEC_THREADS = DEC_WARPS * 32;
constexpr int DEC_ROWS = 16;
constexpr int DEC_SUB_N = 16;   // keys per warp sub-tile (two n-tiles of 8)
constexpr int DEC_STAGES = 3;   // sub-tiles per warp in shared memory: two load while one computes
constexpr int DEC_ITEM_FIELDS = 9;

// Shared-memory bytes of paged_attention_decode (the host computes the same).
template <int HEAD_DIM> __host__ __device__ constexpr int decode_smem_bytes() {
  return (DEC_ROWS + DEC_WARPS * DEC_STAGES * 2 * DEC_SUB_N) * HEAD_DIM * 2 + 3 * DEC_ROWS * 4 +
         2 * DEC_WARPS * DEC_ROWS * 4;
}

template <typename T, int HEAD_DIM, int BLOCK_SIZE>
__global__ void __launch_bounds__(DEC_THREADS, 1) paged_attention_decode(
    const T* __restrict__ query, const T* __restrict__ key_cache, const T* __restrict__ value_cache,  //
    T* __restrict__ out, float* __restrict__ lse, float* __restrict__ partial_out,
    float* __restrict__ partial_lse,  //
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int* __restrict__ query_start_loc, const float* __restrict__ alibi_slopes,
    const int* __restrict__ items,  //
    long long k_stride_block, long long k_stride_slot, long long k_stride_head,
    long long v_stride_block, long long v_stride_slot, long long v_stride_head,  //
    int max_blocks_per_seq, int num_q_heads, int group_size,                      //
    float scale, float softcap, int sliding_window, int causal, int has_alibi) {
  constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;  // 16-byte chunks of 8 elements
  constexpr int SUB_CHUNKS = DEC_SUB_N * CHUNKS_PER_ROW;
  constexpr int LOADS_PER_LANE = SUB_CHUNKS / 32;
  constexpr int K_STEPS = HEAD_DIM / 16;
  constexpr int O_TILES = HEAD_DIM / 8;
  static_assert(CHUNKS_PER_ROW >= 8 && CHUNKS_PER_ROW % 8 == 0, "the swizzle needs 8 chunks per row");
  static_assert(SUB_CHUNKS % 32 == 0, "sub-tile loads must divide among a warp");
  using Mma = MmaType<T>;

  // ---- shared memory: Q | per warp: K stages, V stages | row state | the warps' m, l
  // chunk c of row n sits at n * CHUNKS_PER_ROW + (c ^ (n % 8)) (no ldmatrix bank conflicts)
  extern __shared__ uint4 smem[];
  if (dynamic_smem_size() < (unsigned)decode_smem_bytes<HEAD_DIM>()) __trap();
  uint4* q_tile = smem;
  uint4* kv_region = q_tile + DEC_ROWS * CHUNKS_PER_ROW;
  float* o_merge = reinterpret_cast<float*>(kv_region);  // epilogue: [DEC_WARPS][DEC_ROWS][HEAD_DIM]
  int* p_q = reinterpret_cast<int*>(kv_region + DEC_WARPS * DEC_STAGES * 2 * SUB_CHUNKS);
  float* slope = reinterpret_cast<float*>(p_q + DEC_ROWS);
  int* row_valid = reinterpret_cast<int*>(slope + DEC_ROWS);
  float* m_merge = reinterpret_cast<float*>(row_valid + DEC_ROWS);  // [DEC_WARPS][DEC_ROWS]
  float* l_merge = m_merge + DEC_WARPS * DEC_ROWS;
  static_assert(DEC_WARPS * DEC_ROWS * HEAD_DIM * 4 <= DEC_WARPS * DEC_STAGES * 2 * DEC_SUB_N * HEAD_DIM * 2,
                "the epilogue's O must fit in the K/V stages");
  auto swizzle = [](int n, int c) { return n * CHUNKS_PER_ROW + (c ^ (n % 8)); };

  // ---- setup
  const int* item = items + (long long)blockIdx.x * DEC_ITEM_FIELDS;
  const int seq = item[0], kv_head = item[1], token_start = item[2], num_tokens = item[3];
  const int group_start = item[4], num_groups = item[5], kv_begin = item[6], kv_end = item[7];
  const int partial = item[8];
  const int num_rows = num_tokens * num_groups;
  const int L = seq_lens[seq];
  const int q_len = query_start_loc[seq + 1] - query_start_loc[seq];
  const int* table_row = block_tables + (long long)seq * max_blocks_per_seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tig = lane % 4;

  if (threadIdx.x < DEC_ROWS) {
    const int r = threadIdx.x;
    const int t = token_start + r / num_groups;
    const int h = kv_head * group_size + group_start + r % num_groups;
    row_valid[r] = r < num_rows;
    p_q[r] = L - q_len + (t - query_start_loc[seq]);
    slope[r] = (has_alibi && r < num_rows) ? alibi_slopes[h] : 0.f;
  }
  for (int idx = threadIdx.x; idx < DEC_ROWS * CHUNKS_PER_ROW; idx += DEC_THREADS) {
    const int r = idx / CHUNKS_PER_ROW, c = idx % CHUNKS_PER_ROW;
    const bool valid = r < num_rows;
    const T* src = query;
    if (valid) {
      const long long t = token_start + r / num_groups;
      const int h = kv_head * group_size + group_start + r % num_groups;
      src = query + (t * num_q_heads + h) * HEAD_DIM + c * 8;
    }
    cp_async_16(q_tile + swizzle(r, c), src, valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  unsigned q_frag[K_STEPS][4];  // Q as mma A fragments, kept in registers
#pragma unroll
  for (int kk = 0; kk < K_STEPS; ++kk)
    ldmatrix_x4(q_frag[kk], q_tile + swizzle((lane % 8) + 8 * ((lane / 8) % 2), 2 * kk + lane / 16));

  // ---- this warp's sub-tiles: warp, warp + DEC_WARPS, ... of [kv_begin, min(kv_end, L))
  const int kv_stop = kv_end < L ? kv_end : L;
  const int num_sub = kv_stop > kv_begin ? (kv_stop - kv_begin + DEC_SUB_N - 1) / DEC_SUB_N : 0;
  const int my_subs = num_sub > warp ? (num_sub - warp + DEC_WARPS - 1) / DEC_WARPS : 0;
  uint4* k_stages = kv_region + warp * DEC_STAGES * 2 * SUB_CHUNKS;
  uint4* v_stages = k_stages + DEC_STAGES * SUB_CHUNKS;

  auto load_sub = [&](int stage, int p0) {
#pragma unroll
    for (int i = 0; i < LOADS_PER_LANE; ++i) {
      const int idx = lane + 32 * i;
      const int n = idx / CHUNKS_PER_ROW, c = idx % CHUNKS_PER_ROW;
      const int p = p0 + n;
      const bool valid = p < L;  // nothing at p >= L is read, not even the table
      const T* k_src = key_cache;
      const T* v_src = value_cache;
      if (valid) {
        const long long block = table_row[p / BLOCK_SIZE];
        const long long slot = p % BLOCK_SIZE;
        k_src = key_cache + block * k_stride_block + slot * k_stride_slot + kv_head * k_stride_head + c * 8;
        v_src = value_cache + block * v_stride_block + slot * v_stride_slot + kv_head * v_stride_head + c * 8;
      }
      cp_async_16(k_stages + stage * SUB_CHUNKS + swizzle(n, c), k_src, valid);
      cp_async_16(v_stages + stage * SUB_CHUNKS + swizzle(n, c), v_src, valid);
    }
  };

  const int row_lo = g, row_hi = g + 8;
  float m_i[2] = {PA_NEG_INF, PA_NEG_INF};
  float l_i[2] = {0.f, 0.f};  // this thread's share; summed over the quad in the epilogue
  float o[O_TILES][4];
#pragma unroll
  for (int j = 0; j < O_TILES; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

  auto attend_tile = [&](int stage, int p0) {
    const uint4* k_tile = k_stages + stage * SUB_CHUNKS;
    const uint4* v_tile = v_stages + stage * SUB_CHUNKS;
    // -- compute qk: two n-tiles of 8 keys
    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk) {
      unsigned b[4];
      ldmatrix_x4(b, k_tile + swizzle((lane % 8) + 8 * (lane / 16), 2 * kk + (lane / 8) % 2));
      Mma::mma(s[0], q_frag[kk], b[0], b[1]);
      Mma::mma(s[1], q_frag[kk], b[2], b[3]);
    }
    // -- scale, softcap, ALiBi, mask (replace, never add); row max over the quad
    float m_ij[2] = {PA_NEG_INF, PA_NEG_INF};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e < 2 ? row_lo : row_hi;
        const int p = p0 + 8 * j + 2 * tig + (e & 1);
        float x = s[j][e] * scale;
        if (softcap > 0.f) x = softcap * tanhf(x / softcap);
        const int distance = p - p_q[r];
        x += slope[r] * (float)distance;
        bool visible = row_valid[r] && p < L;
        if (causal) visible = visible && distance <= 0;
        if (sliding_window > 0) visible = visible && distance > -sliding_window;
        s[j][e] = visible ? x * LOG2E : PA_NEG_INF;
        m_ij[e / 2] = fmaxf(m_ij[e / 2], s[j][e]);
      }
    }
    float alpha[2], m_safe[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      m_ij[half] = fmaxf(m_ij[half], __shfl_xor_sync(0xffffffffu, m_ij[half], 1));
      m_ij[half] = fmaxf(m_ij[half], __shfl_xor_sync(0xffffffffu, m_ij[half], 2));
      const float m_new = fmaxf(m_i[half], m_ij[half]);
      m_safe[half] = m_new == PA_NEG_INF ? 0.f : m_new;  // an all-masked row keeps p = 0
      alpha[half] = exp2f(m_i[half] - m_safe[half]);
      m_i[half] = m_new;
      l_i[half] *= alpha[half];
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[j][e] = exp2f(s[j][e] - m_safe[e / 2]);
        l_i[e / 2] += s[j][e];
      }
    }
    // -- update output accumulator: O = O * alpha + P V
    unsigned a[4];
    a[0] = Mma::pack(s[0][0], s[0][1]);
    a[1] = Mma::pack(s[0][2], s[0][3]);
    a[2] = Mma::pack(s[1][0], s[1][1]);
    a[3] = Mma::pack(s[1][2], s[1][3]);
#pragma unroll
    for (int dj = 0; dj < O_TILES / 2; ++dj) {
      unsigned b[4];
      ldmatrix_x4_trans(b, v_tile + swizzle((lane % 8) + 8 * ((lane / 8) % 2), 2 * dj + lane / 16));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        o[2 * dj][e] *= alpha[e / 2];
        o[2 * dj + 1][e] *= alpha[e / 2];
      }
      Mma::mma(o[2 * dj], a, b[0], b[1]);
      Mma::mma(o[2 * dj + 1], a, b[2], b[3]);
    }
  };

  // ---- inner loop over this warp's sub-tiles, DEC_STAGES - 1 ahead; warp-local barriers only
#pragma unroll
  for (int i = 0; i < DEC_STAGES - 1; ++i) {
    if (i < my_subs) load_sub(i, kv_begin + (warp + DEC_WARPS * i) * DEC_SUB_N);
    cp_async_commit();
  }
  for (int i = 0; i < my_subs; ++i) {
    const int next = i + DEC_STAGES - 1;  // into the stage computed in iteration i - 1
    if (next < my_subs) load_sub(next % DEC_STAGES, kv_begin + (warp + DEC_WARPS * next) * DEC_SUB_N);
    cp_async_commit();
    cp_async_wait<DEC_STAGES - 1>();
    __syncwarp();  // every lane's copies of sub-tile i are visible to the warp
    attend_tile(i % DEC_STAGES, kv_begin + (warp + DEC_WARPS * i) * DEC_SUB_N);
    __syncwarp();  // the stage is read before it is refilled
  }
  cp_async_wait<0>();
  __syncthreads();  // all warps are done with their stages: the region becomes o_merge

  // ---- epilogue: each warp's (m, l, O); merged in warp order
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l_i[half] += __shfl_xor_sync(0xffffffffu, l_i[half], 1);
    l_i[half] += __shfl_xor_sync(0xffffffffu, l_i[half], 2);
    const int r = half == 0 ? row_lo : row_hi;
    if (tig == 0) {
      m_merge[warp * DEC_ROWS + r] = m_i[half];
      l_merge[warp * DEC_ROWS + r] = l_i[half];
    }
#pragma unroll
    for (int j = 0; j < O_TILES; ++j) {
      float* dst = o_merge + (warp * DEC_ROWS + r) * HEAD_DIM + 8 * j + 2 * tig;
      dst[0] = o[j][2 * half];
      dst[1] = o[j][2 * half + 1];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < num_rows * HEAD_DIM; idx += DEC_THREADS) {
    const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
    float m = PA_NEG_INF;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; ++w) m = fmaxf(m, m_merge[w * DEC_ROWS + r]);
    float l = 0.f, acc = 0.f;
    if (m != PA_NEG_INF) {
#pragma unroll
      for (int w = 0; w < DEC_WARPS; ++w) {
        const float m_w = m_merge[w * DEC_ROWS + r];
        if (m_w == PA_NEG_INF) continue;  // a warp that saw no visible key
        const float weight = exp2f(m_w - m);
        l = fmaf(weight, l_merge[w * DEC_ROWS + r], l);
        acc = fmaf(weight, o_merge[(w * DEC_ROWS + r) * HEAD_DIM + d], acc);
      }
    }
    const float o_final = l > 0.f ? acc / l : 0.f;
    const float lse_final = l > 0.f ? m * LN2 + logf(l) : PA_NEG_INF;
    if (partial >= 0) {
      partial_out[((long long)partial * DEC_ROWS + r) * HEAD_DIM + d] = o_final;
      if (d == 0) partial_lse[(long long)partial * DEC_ROWS + r] = lse_final;
    } else {
      const long long t = token_start + r / num_groups;
      const int h = kv_head * group_size + group_start + r % num_groups;
      out[(t * num_q_heads + h) * HEAD_DIM + d] = from_float<T>(o_final);
      if (d == 0) lse[t * num_q_heads + h] = lse_final;
    }
  }
}
