// Paged attention on CUDA cores, one CTA per work item, with an online softmax.
//
// Must match pagedattn.spec.exact.exact_attention within the error model; same skeleton and
// names as the NumPy reference (pagedattn/reference/paged.py). A work item (built on the host
// by pagedattn.backends.cupy.planning) is one sequence s, one KV head, up to ROWS query rows
// (row r = query token token_start + r / num_groups, query head kv_head * group_size +
// group_start + r % num_groups) and a range [kv_begin, kv_end) of logical positions cut on
// TILE_N boundaries. K/V of the KV head are read once for all rows (GQA/MQA).
//
//   setup:      rows' p_q, ALiBi slopes, m = -inf, l = 0, O = 0; q in registers (times scale)
//   inner loop: for each tile of TILE_N logical positions (attend_tile):
//                 look up physical blocks (only p < L), stage K and V in shared memory
//                 (16-byte cp.async, zero-filled beyond L, double-buffered), score, update m, l, O
//   epilogue:   O / l and lse = m + log l (0 and -inf for an empty row), to out or to a
//               split-KV partial merged later by merge_partials.
#include "common.cuh"
#include "split_merge.cuh"

constexpr int NUM_THREADS = 128;  // 4 warps
constexpr int NUM_WARPS = NUM_THREADS / 32;

template <typename T> struct Tile {
  static constexpr int ELEMS_PER_CHUNK = 16 / sizeof(T);  // elements in one 16-byte load
  static constexpr int TILE_N = 32;                       // keys per tile (the softmax step needs >= 32)
  static constexpr int STAGES = sizeof(T) == 4 ? 2 : 4;   // tiles in shared memory: STAGES - 1 load
                                                          // while one is computed (64 KiB at d=128)
};

// Shared-memory bytes the kernel needs; the host computes the same (planning.shared_bytes).
template <typename T, int HEAD_DIM, int ROWS> __host__ __device__ constexpr int attention_smem_bytes() {
  return (2 * Tile<T>::STAGES * Tile<T>::TILE_N * HEAD_DIM * (int)sizeof(T) >
                  (NUM_THREADS / (HEAD_DIM / Tile<T>::ELEMS_PER_CHUNK)) * ROWS * HEAD_DIM * 4
              ? 2 * Tile<T>::STAGES * Tile<T>::TILE_N * HEAD_DIM * (int)sizeof(T)
              : (NUM_THREADS / (HEAD_DIM / Tile<T>::ELEMS_PER_CHUNK)) * ROWS * HEAD_DIM * 4) +
         ROWS * Tile<T>::TILE_N * 4 + 5 * ROWS * 4;
}

template <typename T, int HEAD_DIM, int BLOCK_SIZE, int ROWS>
__global__ void __launch_bounds__(NUM_THREADS, ROWS == 4 ? 3 : 2) paged_attention(
    PAGED_ATTENTION_PARAMS(T, T)) {  // v_scale 1: this kernel never sees fp8 caches (the host routes them elsewhere)
  constexpr int ELEMS_PER_CHUNK = Tile<T>::ELEMS_PER_CHUNK;
  constexpr int TILE_N = Tile<T>::TILE_N;
  constexpr int STAGES = Tile<T>::STAGES;
  constexpr int CHUNKS_PER_ROW = HEAD_DIM / ELEMS_PER_CHUNK;   // 16-byte chunks in one key row
  constexpr int TILE_CHUNKS = TILE_N * CHUNKS_PER_ROW;
  constexpr int LOADS_PER_THREAD = TILE_CHUNKS / NUM_THREADS;
  // q . k: QK_PARTS lanes share one key, each holding EPL q elements of every row in registers;
  // at most 64 q registers per lane, at most a warp per key.
  constexpr int CPP_REGS = (64 / ROWS) / ELEMS_PER_CHUNK > 0 ? (64 / ROWS) / ELEMS_PER_CHUNK : 1;
  constexpr int CPP_WARP = CHUNKS_PER_ROW / 32 > 0 ? CHUNKS_PER_ROW / 32 : 1;
  constexpr int CHUNKS_PER_PART = CPP_REGS > CPP_WARP ? CPP_REGS : CPP_WARP;  // chunks of q . k per lane
  constexpr int QK_PARTS = CHUNKS_PER_ROW / CHUNKS_PER_PART;    // lanes per key
  constexpr int KEYS_PER_WARP = 32 / QK_PARTS;                  // keys scored by a warp at a time
  constexpr int EPL = CHUNKS_PER_PART * ELEMS_PER_CHUNK;       // q elements per lane
  constexpr int PV_GROUPS = NUM_THREADS / CHUNKS_PER_ROW;      // thread groups splitting keys in P V
  static_assert(CHUNKS_PER_ROW % CHUNKS_PER_PART == 0 && 32 % QK_PARTS == 0, "lanes per key must divide a warp");
  static_assert(TILE_CHUNKS % NUM_THREADS == 0, "tile loads must divide among threads");
  static_assert(NUM_THREADS % CHUNKS_PER_ROW == 0, "P V groups must tile the CTA");
  static_assert(TILE_N % (NUM_WARPS * KEYS_PER_WARP) == 0, "keys per tile must divide among warps");

  // ---- shared memory: [K tiles | V tiles] (reused for the epilogue's reduction), S, row state
  extern __shared__ uint4 smem[];
  constexpr int TILE_REGION = 2 * STAGES * TILE_CHUNKS * 16;
  constexpr int RED_REGION = PV_GROUPS * ROWS * HEAD_DIM * 4;
  constexpr int REGION = TILE_REGION > RED_REGION ? TILE_REGION : RED_REGION;
  if (dynamic_smem_size() < (unsigned)attention_smem_bytes<T, HEAD_DIM, ROWS>()) __trap();
  uint4* k_tiles = smem;
  uint4* v_tiles = smem + STAGES * TILE_CHUNKS;
  float* reduction = reinterpret_cast<float*>(smem);
  float* s_tile = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + REGION);  // [ROWS][TILE_N]
  float* m_i = s_tile + ROWS * TILE_N;  // running max, log2 units
  float* l_i = m_i + ROWS;              // running sum of exp2(s - m_i)
  float* alpha = l_i + ROWS;            // rescale factor of the current tile
  float* slope = alpha + ROWS;          // ALiBi slope of the row
  int* p_q = reinterpret_cast<int*>(slope + ROWS);  // query position of the row

  // ---- setup
  PAGED_ATTENTION_ITEM();
  PAGED_ATTENTION_SEQUENCE();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x < ROWS) {
    const int r = threadIdx.x;
    const int t = token_start + r / num_groups;
    const int h = kv_head * group_size + group_start + r % num_groups;
    p_q[r] = L - q_len + (t - query_start_loc[seq]);
    slope[r] = (has_alibi && r < num_rows) ? alibi_slopes[h] : 0.f;
    m_i[r] = PA_NEG_INF;
    l_i[r] = 0.f;
  }

  // q . k: lane (key_sub, part) holds q elements of chunks part, part + QK_PARTS, ... of every row
  const int key_sub = lane / QK_PARTS, part = lane % QK_PARTS;
  float q[ROWS][EPL];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const bool valid = r < num_rows;
    const int t = token_start + (valid ? r / num_groups : 0);
    const int h = kv_head * group_size + group_start + (valid ? r % num_groups : 0);
    const uint4* q_row = reinterpret_cast<const uint4*>(query + ((long long)t * num_q_heads + h) * HEAD_DIM);
#pragma unroll
    for (int c = 0; c < CHUNKS_PER_PART; ++c) {
      float x[ELEMS_PER_CHUNK];
      uint4 raw = valid ? q_row[part + c * QK_PARTS] : make_uint4(0, 0, 0, 0);
      unpack_chunk(raw, x, T());
#pragma unroll
      for (int e = 0; e < ELEMS_PER_CHUNK; ++e) q[r][c * ELEMS_PER_CHUNK + e] = x[e] * scale;
    }
  }

  // P V: thread owns one chunk of the head dim, for keys pv_group, pv_group + PV_GROUPS, ...
  const int pv_group = threadIdx.x / CHUNKS_PER_ROW, pv_chunk = threadIdx.x % CHUNKS_PER_ROW;
  float o[ROWS][ELEMS_PER_CHUNK];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int e = 0; e < ELEMS_PER_CHUNK; ++e) o[r][e] = 0.f;

  // Stage K/V of logical positions [p0, p0 + TILE_N): physical block block_tables[s, p / BLOCK_SIZE],
  // slot p % BLOCK_SIZE. Positions p >= L read nothing (not even the table) and stage zeros.
  auto load_tile = [&](int stage, int p0) {
    uint4* k_dst = k_tiles + stage * TILE_CHUNKS;
    uint4* v_dst = v_tiles + stage * TILE_CHUNKS;
#pragma unroll
    for (int i = 0; i < LOADS_PER_THREAD; ++i) {
      const int idx = threadIdx.x + i * NUM_THREADS;
      const int n = idx / CHUNKS_PER_ROW, c = idx % CHUNKS_PER_ROW;
      const int p = p0 + n;
      const bool valid = p < L;
      const T* k_src = key_cache;
      const T* v_src = value_cache;
      if (valid) {
        const long long block = table_row[p / BLOCK_SIZE];
        const long long slot = p % BLOCK_SIZE;
        k_src = key_cache + block * k_stride_block + slot * k_stride_slot + kv_head * k_stride_head + c * ELEMS_PER_CHUNK;
        v_src = value_cache + block * v_stride_block + slot * v_stride_slot + kv_head * v_stride_head + c * ELEMS_PER_CHUNK;
      }
      cp_async_16(k_dst + idx, k_src, valid);
      cp_async_16(v_dst + idx, v_src, valid);
    }
  };

  // The score of row r at position p, in log2 units; invisible keys are replaced by -inf
  // (never added to), so garbage never leaks.
  auto masked_score = [&](float dot, int r, int p) -> float {
    float s = dot;  // q was scaled already
    if (softcap > 0.f) s = softcap * tanhf(s / softcap);
    const int distance = p - p_q[r];
    s += slope[r] * (float)distance;
    bool visible = r < num_rows && p < L;
    if (causal) visible = visible && distance <= 0;
    if (sliding_window > 0) visible = visible && distance > -sliding_window;
    return visible ? s * LOG2E : PA_NEG_INF;
  };

  // One tile of the inner loop: score, update m, l, O.
  auto attend_tile = [&](int stage, int p0) {
    const uint4* k_tile = k_tiles + stage * TILE_CHUNKS;
    const uint4* v_tile = v_tiles + stage * TILE_CHUNKS;
    // -- compute qk: QK_PARTS lanes per key, KEYS_PER_WARP keys per warp per step
#pragma unroll
    for (int step = 0; step < TILE_N / (NUM_WARPS * KEYS_PER_WARP); ++step) {
      const int n = (step * NUM_WARPS + warp) * KEYS_PER_WARP + key_sub;
      const uint4* k_row = k_tile + n * CHUNKS_PER_ROW;
      float dot[ROWS];
#pragma unroll
      for (int r = 0; r < ROWS; ++r) dot[r] = 0.f;
#pragma unroll
      for (int c = 0; c < CHUNKS_PER_PART; ++c) {
        float k[ELEMS_PER_CHUNK];
        unpack_chunk(k_row[part + c * QK_PARTS], k, T());
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
          for (int e = 0; e < ELEMS_PER_CHUNK; ++e) dot[r] = fmaf(q[r][c * ELEMS_PER_CHUNK + e], k[e], dot[r]);
      }
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
#pragma unroll
        for (int offset = QK_PARTS / 2; offset > 0; offset >>= 1)
          dot[r] += __shfl_xor_sync(0xffffffffu, dot[r], offset);
        if (part == r % QK_PARTS) s_tile[r * TILE_N + n] = masked_score(dot[r], r, p0 + n);
      }
    }
    __syncthreads();
    // -- update m_i and l_i: one warp per row; s_tile becomes P = exp2(s - m_new)
    for (int r = warp; r < ROWS; r += NUM_WARPS) {
      float s[TILE_N / 32];
      float m_ij = PA_NEG_INF;
#pragma unroll
      for (int i = 0; i < TILE_N / 32; ++i) {
        s[i] = s_tile[r * TILE_N + lane + 32 * i];
        m_ij = fmaxf(m_ij, s[i]);
      }
      m_ij = warp_max(m_ij);
      const float m_old = m_i[r];
      const float m_new = fmaxf(m_old, m_ij);
      const float m_safe = m_new == PA_NEG_INF ? 0.f : m_new;  // an all-masked row stays at p = 0
      float l_ij = 0.f;
#pragma unroll
      for (int i = 0; i < TILE_N / 32; ++i) {
        const float p = exp2f(s[i] - m_safe);
        s_tile[r * TILE_N + lane + 32 * i] = p;
        l_ij += p;
      }
      l_ij = warp_sum(l_ij);
      __syncwarp();  // every lane has read m_i[r] before lane 0 overwrites it
      if (lane == 0) {
        const float a = exp2f(m_old - m_safe);
        alpha[r] = a;
        l_i[r] = l_i[r] * a + l_ij;
        m_i[r] = m_new;
      }
    }
    __syncthreads();
    // -- update output accumulator: O = O * alpha + P V
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float a = alpha[r];
#pragma unroll
      for (int e = 0; e < ELEMS_PER_CHUNK; ++e) o[r][e] *= a;
    }
#pragma unroll 4
    for (int n = pv_group; n < TILE_N; n += PV_GROUPS) {
      float v[ELEMS_PER_CHUNK];
      unpack_chunk(v_tile[n * CHUNKS_PER_ROW + pv_chunk], v, T());
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        const float p = s_tile[r * TILE_N + n];
#pragma unroll
        for (int e = 0; e < ELEMS_PER_CHUNK; ++e) o[r][e] = fmaf(p, v[e], o[r][e]);
      }
    }
  };

  // ---- inner loop over tiles of logical positions, loading STAGES - 1 tiles ahead
  const int num_tiles = kv_end > kv_begin ? (kv_end - kv_begin + TILE_N - 1) / TILE_N : 0;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < num_tiles) load_tile(i, kv_begin + i * TILE_N);
    cp_async_commit();  // one group per tile, empty ones included, so the wait count below holds
  }
  for (int i = 0; i < num_tiles; ++i) {
    const int next = i + STAGES - 1;  // goes to the stage computed in iteration i - 1
    if (next < num_tiles) load_tile(next % STAGES, kv_begin + next * TILE_N);
    cp_async_commit();
    cp_async_wait<STAGES - 1>();  // tile i has landed
    __syncthreads();
    attend_tile(i % STAGES, kv_begin + i * TILE_N);
    __syncthreads();
  }
  cp_async_wait<0>();
  __syncthreads();

  // ---- epilogue: reduce the P V groups in a fixed order, O / l, lse = m + log l
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int e = 0; e < ELEMS_PER_CHUNK; ++e)
      reduction[(pv_group * ROWS + r) * HEAD_DIM + pv_chunk * ELEMS_PER_CHUNK + e] = o[r][e];
  __syncthreads();
  for (int idx = threadIdx.x; idx < num_rows * HEAD_DIM; idx += NUM_THREADS) {
    const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
    float acc = 0.f;
    for (int g = 0; g < PV_GROUPS; ++g) acc += reduction[(g * ROWS + r) * HEAD_DIM + d];
    const float l = l_i[r];
    const float o_final = l != 0.f ? acc / l : 0.f;
    const float lse_final = l != 0.f ? m_i[r] * LN2 + logf(l) : PA_NEG_INF;
    store_result<ROWS, HEAD_DIM>(o_final, lse_final, r, d, partial, token_start, num_groups, kv_head, group_size,
                                 group_start, num_q_heads, out, lse, partial_out, partial_lse);
  }
  PAGED_ATTENTION_MERGE_IF_LAST(ROWS, HEAD_DIM, NUM_THREADS);
}

// Split-KV merge after the attention kernel (the backend's merge="kernel"): the merge of
// split_merge.cuh over the num_splits partials of one split range. merges: [n, 7] of
// token_start, num_tokens, kv_head, group_start, num_groups, first_partial, num_splits.
// Grid: (merges, ROWS); rows past num_tokens * num_groups return at once.
template <typename T, int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(NUM_THREADS) merge_partials(
    const float* __restrict__ partial_out, const float* __restrict__ partial_lse,
    const int* __restrict__ merges, T* __restrict__ out, float* __restrict__ lse, int num_q_heads,
    int group_size) {
  // one CTA per (merge, row): blockIdx.x the merge, blockIdx.y the row, four elements a thread
  const int* merge = merges + (long long)blockIdx.x * 7;
  const int token_start = merge[0], num_tokens = merge[1], kv_head = merge[2];
  const int group_start = merge[3], num_groups = merge[4], first = merge[5], num_splits = merge[6];
  const int r = blockIdx.y;
  if (r >= num_tokens * num_groups) return;
  const float m = parts_max_lse<ROWS>(partial_lse, first, num_splits, r);
  const long long t = token_start + r / num_groups;
  const int h = kv_head * group_size + group_start + r % num_groups;
  for (int d0 = 4 * threadIdx.x; d0 < HEAD_DIM; d0 += 4 * NUM_THREADS)
    merge_parts_quad<ROWS, HEAD_DIM>(partial_out, partial_lse, first, num_splits, r, d0, m, t, h, num_q_heads, out,
                                     lse);
}
