// Paged attention on tensor cores (mma.sync m16n8k16, float32 accumulation) for float16 and
// bfloat16 queries with taller query tiles than paged_attention_mma.cu: long prefill.
// Written for issue #5. gpu_check passed it on an H200, but it was not faster than the 64-row
// kernel at block sizes 16 and 32 (PERF_NOTES.md, version 6), so planning takes it only behind
// the switch PAGEDATTN_CUPY_MMA_ROWS (planning.prefill_rows). One CTA takes ROWS = WARPS * 16 * M_TILES
// query rows (query tokens x the query heads of one KV head); each warp owns 16 * M_TILES of
// them, so every K and V fragment a warp loads from shared memory serves M_TILES m-tiles, and
// every K/V tile staged in shared memory serves all ROWS rows.
//
// Must match pagedattn.spec.exact.exact_attention within the error model (P is rounded to
// the input dtype before P V, which the model allows). Same work items, skeleton and names as
// the CUDA-core kernel in paged_attention.cu and the NumPy reference:
//   setup:      rows' p_q and ALiBi slopes; the Q tile staged in shared memory
//   inner loop: for each tile of MMA_TILE_N logical positions (attend_tile): look up physical
//               blocks (only p < L), stage K and V (16-byte cp.async, zero-filled beyond L,
//               STAGES deep, 16-byte chunks XOR-swizzled against bank conflicts),
//               S = Q K^T on tensor cores (ldmatrix), mask (replace, never add; no mask on
//               tiles every row of the warp sees whole; a warp skips a tile none of its rows
//               sees), update m, l in registers (exp2, the score scale folded into one FFMA),
//               O = O * alpha + P V on tensor cores (P from the S registers, V by ldmatrix.trans)
//   epilogue:   O / l, lse = m + log l (0 and -inf for an empty row), to out or a partial.
// A thread holds rows g and g + 8 of each of its warp's m-tiles (g = lane / 4).
// fp8 caches (C = fp8_e4m3_t / fp8_e5m2_t, kernels/fp8.cuh): the stages hold the raw bytes;
// each landed tile is converted (exact) to T in one more K/V buffer before attend_tile, the
// score scale passed in already holds k_scale, and O is multiplied by v_scale at the end.
#include "common.cuh"
#include "fp8.cuh"
#include "mma.cuh"

constexpr int MMA_TILE_N = 64;  // keys per tile
constexpr int MMA_ITEM_FIELDS = 9;
constexpr int MMA_SMEM_PER_SM = 228 * 1024;  // H100/H200 shared memory per SM (1 KB per CTA reserved)

// Shared-memory bytes of paged_attention_mma_wide (the host computes the same): Q, STAGES stages
// of K and V as stored, (fp8) the converted K and V tile, and three ints/floats per row.
template <int HEAD_DIM, int CACHE_BYTES, int ROWS, int STAGES>
__host__ __device__ constexpr int wide_smem_bytes() {
  return ROWS * HEAD_DIM * 2 + STAGES * 2 * MMA_TILE_N * HEAD_DIM * CACHE_BYTES +
         (CACHE_BYTES == 1 ? 2 * MMA_TILE_N * HEAD_DIM * 2 : 0) + 3 * ROWS * 4;
}
// CTAs per SM the shared memory allows, capped at 2: the launch bound's minimum, which also
// caps registers (65,536 / (threads * CTAs))
template <int HEAD_DIM, int CACHE_BYTES, int ROWS, int STAGES>
__host__ __device__ constexpr int wide_ctas_per_sm() {
  return 2 * (wide_smem_bytes<HEAD_DIM, CACHE_BYTES, ROWS, STAGES>() + 1024) <= MMA_SMEM_PER_SM ? 2 : 1;
}

// exp2 on the MUFU unit, subnormal results flushed to zero (they weigh nothing beside the
// row maximum's 1)
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <typename T, int HEAD_DIM, int BLOCK_SIZE, typename C, int WARPS, int M_TILES, int STAGES>
__global__ void __launch_bounds__(WARPS * 32, (wide_ctas_per_sm<HEAD_DIM, (int)sizeof(C), WARPS * 16 * M_TILES, STAGES>()))
paged_attention_mma_wide(
    const T* __restrict__ query, const C* __restrict__ key_cache, const C* __restrict__ value_cache,  //
    T* __restrict__ out, float* __restrict__ lse, float* __restrict__ partial_out,
    float* __restrict__ partial_lse,  //
    const int* __restrict__ block_tables, const int* __restrict__ seq_lens,
    const int* __restrict__ query_start_loc, const float* __restrict__ alibi_slopes,
    const int* __restrict__ items,  //
    long long k_stride_block, long long k_stride_slot, long long k_stride_head,
    long long v_stride_block, long long v_stride_slot, long long v_stride_head,  //
    int max_blocks_per_seq, int num_q_heads, int group_size,                      //
    float scale, float softcap, int sliding_window, int causal, int has_alibi, float v_scale) {
  constexpr bool FP8 = CacheKind<C>::FP8;
  static_assert(FP8 || sizeof(C) == sizeof(T), "a 16-bit cache holds the query's type");
  constexpr int THREADS = WARPS * 32;
  constexpr int WARP_ROWS = 16 * M_TILES;  // rows of one warp
  constexpr int ROWS = WARPS * WARP_ROWS;  // rows of the CTA
  constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;  // 16-byte chunks of 8 elements of T
  constexpr int TILE_CHUNKS = MMA_TILE_N * CHUNKS_PER_ROW;
  constexpr int CACHE_ELEMS = 16 / (int)sizeof(C);            // cache elements per 16-byte chunk
  constexpr int CACHE_CHUNKS_PER_ROW = HEAD_DIM / CACHE_ELEMS;  // chunks of one key row in the cache
  constexpr int STAGE_CHUNKS = MMA_TILE_N * CACHE_CHUNKS_PER_ROW;  // one K (or V) tile as stored
  constexpr int LOADS_PER_THREAD = STAGE_CHUNKS / THREADS;
  static_assert(STAGE_CHUNKS % THREADS == 0, "tile loads must divide among the threads");
  // block-table entries of a tile (it starts on a multiple of MMA_TILE_N): thread rows are
  // n = threadIdx.x / CACHE_CHUNKS_PER_ROW + ROWS_PER_PASS * i
  constexpr int BLOCKS_PER_TILE = MMA_TILE_N > BLOCK_SIZE ? MMA_TILE_N / BLOCK_SIZE : 1;
  constexpr int ROWS_PER_PASS = THREADS / CACHE_CHUNKS_PER_ROW;
  static_assert(MMA_TILE_N % BLOCK_SIZE == 0 || BLOCK_SIZE % MMA_TILE_N == 0, "tiles and blocks nest");
  constexpr int Q_LOADS_PER_THREAD = ROWS * CHUNKS_PER_ROW / THREADS;
  static_assert(ROWS * CHUNKS_PER_ROW % THREADS == 0, "Q loads must divide among the threads");
  constexpr int K_STEPS = HEAD_DIM / 16;   // k-steps of S = Q K^T
  // keys per sub-tile of attend_tile: 32 where registers are short (two m-tiles of O per warp,
  // or a launch bound capping them at 128 per thread), else the whole tile
  constexpr int SUB_N =
      M_TILES > 1 || THREADS * wide_ctas_per_sm<HEAD_DIM, (int)sizeof(C), ROWS, STAGES>() >= 512 ? 32 : MMA_TILE_N;
  constexpr int S_TILES = SUB_N / 8;  // n-tiles of S (8 keys each)
  constexpr int O_TILES = HEAD_DIM / 8;    // n-tiles of O (8 dims each)
  static_assert(CHUNKS_PER_ROW >= 8 && CHUNKS_PER_ROW % 8 == 0, "the swizzle needs 8 chunks per row");
  using Mma = MmaType<T>;

  // ---- shared memory: Q tile | K stages | V stages | row state; chunk c of row n sits at
  // n * CHUNKS_PER_ROW + (c ^ (n % 8)), so 8 consecutive rows of one chunk column hit 8 bank groups
  extern __shared__ uint4 smem[];
  if (dynamic_smem_size() < (unsigned)wide_smem_bytes<HEAD_DIM, (int)sizeof(C), ROWS, STAGES>()) __trap();
  uint4* q_tile = smem;
  uint4* k_tiles = q_tile + ROWS * CHUNKS_PER_ROW;  // as stored in the cache
  uint4* v_tiles = k_tiles + STAGES * STAGE_CHUNKS;
  uint4* k_converted = v_tiles + STAGES * STAGE_CHUNKS;  // fp8 only: the tile as T
  uint4* v_converted = k_converted + (FP8 ? TILE_CHUNKS : 0);
  int* p_q = reinterpret_cast<int*>(v_converted + (FP8 ? TILE_CHUNKS : 0));
  float* slope = reinterpret_cast<float*>(p_q + ROWS);
  int* row_valid = reinterpret_cast<int*>(slope + ROWS);
  auto swizzle = [](int n, int c) { return n * CHUNKS_PER_ROW + (c ^ (n % 8)); };

  // ---- setup
  const int* item = items + (long long)blockIdx.x * MMA_ITEM_FIELDS;
  const int seq = item[0], kv_head = item[1], token_start = item[2], num_tokens = item[3];
  const int group_start = item[4], num_groups = item[5], kv_begin = item[6], kv_end = item[7];
  const int partial = item[8];
  const int num_rows = num_tokens * num_groups;
  const int L = seq_lens[seq];
  const int q_len = query_start_loc[seq + 1] - query_start_loc[seq];
  const int* table_row = block_tables + (long long)seq * max_blocks_per_seq;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tig = lane % 4;  // row group and thread in group of the mma fragments

  for (int r = threadIdx.x; r < ROWS; r += THREADS) {
    const int t = token_start + r / num_groups;
    const int h = kv_head * group_size + group_start + r % num_groups;
    row_valid[r] = r < num_rows;
    p_q[r] = L - q_len + (t - query_start_loc[seq]);
    slope[r] = (has_alibi && r < num_rows) ? alibi_slopes[h] : 0.f;
  }
  // Q rows (zeros for rows past num_rows)
#pragma unroll
  for (int i = 0; i < Q_LOADS_PER_THREAD; ++i) {
    const int idx = threadIdx.x + i * THREADS;
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

  // The physical blocks of tile `tile` (entries only below ceil(L / BLOCK_SIZE)): loaded a
  // tile before the copies that use them, so the table's latency hides behind a tile.
  auto fetch_blocks = [&](int tile, int (&blocks)[BLOCKS_PER_TILE]) {
    const int p0 = kv_begin + tile * MMA_TILE_N;
#pragma unroll
    for (int b = 0; b < BLOCKS_PER_TILE; ++b) {
      const int p = p0 + b * BLOCK_SIZE;
      blocks[b] = p < L ? table_row[p / BLOCK_SIZE] : 0;
    }
  };
  // blocks[j] with j in registers: a select chain (j is a constant wherever the unrolled
  // loop lets the compiler see that n / BLOCK_SIZE is)
  auto pick = [](const int (&blocks)[BLOCKS_PER_TILE], int j) {
    int block = blocks[0];
#pragma unroll
    for (int b = 1; b < BLOCKS_PER_TILE; ++b) block = j == b ? blocks[b] : block;
    return block;
  };

  auto load_tile = [&](int stage, int p0, const int (&blocks)[BLOCKS_PER_TILE]) {
    uint4* k_dst = k_tiles + stage * STAGE_CHUNKS;
    uint4* v_dst = v_tiles + stage * STAGE_CHUNKS;
#pragma unroll
    for (int i = 0; i < LOADS_PER_THREAD; ++i) {
      const int idx = threadIdx.x + i * THREADS;
      const int n = idx / CACHE_CHUNKS_PER_ROW, c = idx % CACHE_CHUNKS_PER_ROW;
      const int p = p0 + n;
      const bool valid = p < L;  // nothing at p >= L is read
      const C* k_src = key_cache;
      const C* v_src = value_cache;
      if (valid) {
        // n / BLOCK_SIZE: a constant when a pass of rows stays inside one block
        const int j = ROWS_PER_PASS <= BLOCK_SIZE ? (ROWS_PER_PASS * i) / BLOCK_SIZE : n / BLOCK_SIZE;
        const long long block = pick(blocks, BLOCKS_PER_TILE == 1 ? 0 : j);
        const long long slot = p % BLOCK_SIZE;
        k_src = key_cache + block * k_stride_block + slot * k_stride_slot + kv_head * k_stride_head + c * CACHE_ELEMS;
        v_src = value_cache + block * v_stride_block + slot * v_stride_slot + kv_head * v_stride_head + c * CACHE_ELEMS;
      }
      const int at = FP8 ? idx : swizzle(n, c);  // fp8 bytes in order; T swizzled for ldmatrix
      cp_async_16(k_dst + at, k_src, valid);
      cp_async_16(v_dst + at, v_src, valid);
    }
  };

  // -- fp8: the landed tile in `stage` to T in k_converted / v_converted (exact)
  auto convert_tile = [&](int stage) {
    if constexpr (FP8) {  // (a 16-bit cache is read in place)
#pragma unroll
      for (int i = 0; i < LOADS_PER_THREAD; ++i) {
        const int idx = threadIdx.x + i * THREADS;
        const int n = idx / CACHE_CHUNKS_PER_ROW, c = idx % CACHE_CHUNKS_PER_ROW;
        uint4 first, second;
        fp8_chunk_to<C, T>(k_tiles[stage * STAGE_CHUNKS + idx], first, second);
        k_converted[swizzle(n, 2 * c)] = first;
        k_converted[swizzle(n, 2 * c + 1)] = second;
        fp8_chunk_to<C, T>(v_tiles[stage * STAGE_CHUNKS + idx], first, second);
        v_converted[swizzle(n, 2 * c)] = first;
        v_converted[swizzle(n, 2 * c + 1)] = second;
      }
    }
  };

  // ---- this warp's rows: p_q of its first and last valid row; a tile in
  // [warp_pq_max - W + 1, warp_pq_min] (and < L) is seen whole by all of them, a tile past
  // warp_pq_max (causal) or before warp_pq_min - W + 1 (window) by none
  const int first_row = warp * WARP_ROWS;
  const int last_row = max(first_row, min(first_row + WARP_ROWS, num_rows) - 1);
  const int pq_first = L - q_len + (token_start - query_start_loc[seq]);
  const int warp_pq_min = pq_first + first_row / num_groups;
  const int warp_pq_max = pq_first + last_row / num_groups;
  const bool warp_has_rows = first_row < num_rows;
  // scores in log2 units: x = s * scale_log2; with nothing added and scale > 0 the row max of
  // s gives the row max of x, and p = exp2(s * scale_log2 - m) is one FFMA and one MUFU
  const float scale_log2 = scale * LOG2E;
  const bool plain = softcap <= 0.f && !has_alibi && scale > 0.f;

  // running state of rows g and g + 8 of each m-tile, log2 units
  float m_i[M_TILES][2], l_i[M_TILES][2];  // l_i: this thread's share; summed over the quad at the end
  float o[M_TILES][O_TILES][4];
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) {
    m_i[mt][0] = m_i[mt][1] = PA_NEG_INF;
    l_i[mt][0] = l_i[mt][1] = 0.f;
#pragma unroll
    for (int j = 0; j < O_TILES; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
  }

  // ldmatrix addresses (bytes in shared memory). A fragment's 16-byte chunk c = 8 * hi + lo8
  // (lo8 < 8) of row n (n % 8 == lane % 8 for every load below) sits at chunk n * CHUNKS_PER_ROW
  // + 8 * hi + (lo8 ^ (lane % 8)): so each load is one of four per-thread offsets plus a constant.
  //   K (B operand of S, n-tile pair jp, k-step kk): row 16 jp + lane % 8 + 8 (lane / 16),
  //     chunk 2 kk + (lane / 8) % 2
  //   Q (A operand, m-tile mt, k-step kk) and V (B operand of P V through .trans, key step kk,
  //     dim pair dj): row (16 mt | 16 kk) + lane % 8 + 8 ((lane / 8) % 2), chunk (2 kk | 2 dj) + lane / 16
  constexpr int ROW_BYTES = CHUNKS_PER_ROW * 16;
  unsigned k_off[4], a_off[4];
#pragma unroll
  for (int lo = 0; lo < 4; ++lo) {
    k_off[lo] = ((lane % 8 + 8 * (lane / 16)) * CHUNKS_PER_ROW + ((2 * lo + (lane / 8) % 2) ^ (lane % 8))) * 16;
    a_off[lo] = ((lane % 8 + 8 * ((lane / 8) % 2)) * CHUNKS_PER_ROW + ((2 * lo + lane / 16) ^ (lane % 8))) * 16;
  }
  const unsigned q_addr = smem_address(q_tile) + first_row * ROW_BYTES;

  // One sub-tile of SUB_N keys from p0 (K and V rows at k_addr, v_addr): S, softmax, P V.
  auto attend_sub = [&](unsigned k_addr, unsigned v_addr, int p0) {
    // a sub-tile none of this warp's rows sees leaves (m, l, O) as they are: skipped
    const bool none = !warp_has_rows || p0 >= L || (causal && p0 > warp_pq_max) ||
                      (sliding_window > 0 && p0 + SUB_N - 1 <= warp_pq_min - sliding_window);
    if (none) return;
    const bool whole = plain && p0 + SUB_N <= L && (!causal || p0 + SUB_N - 1 <= warp_pq_min) &&
                       (sliding_window <= 0 || p0 > warp_pq_max - sliding_window);
    // -- compute qk on tensor cores: each K fragment serves the warp's M_TILES m-tiles
    float s[M_TILES][S_TILES][4];
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt)
#pragma unroll
      for (int j = 0; j < S_TILES; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk) {
      unsigned a[M_TILES][4];
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt)
        ldmatrix_x4_at(a[mt], q_addr + a_off[kk % 4] + (kk / 4) * 128 + mt * 16 * ROW_BYTES);
#pragma unroll
      for (int jp = 0; jp < S_TILES / 2; ++jp) {
        unsigned b[4];
        ldmatrix_x4_at(b, k_addr + k_off[kk % 4] + (kk / 4) * 128 + jp * 16 * ROW_BYTES);
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
          Mma::mma(s[mt][2 * jp], a[mt], b[0], b[1]);
          Mma::mma(s[mt][2 * jp + 1], a[mt], b[2], b[3]);
        }
      }
    }
    unsigned p_t[M_TILES][S_TILES][2];  // P as T pairs
#pragma unroll
    for (int mt = 0; mt < M_TILES; ++mt) {
      // -- row max over the quad: of raw s on whole tiles (the scale applied in the exp2),
      // else of x in log2 units after softcap, ALiBi and the mask (replace, never add)
      float m_ij[2] = {PA_NEG_INF, PA_NEG_INF};
      if (whole) {
#pragma unroll
        for (int j = 0; j < S_TILES; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) m_ij[e / 2] = fmaxf(m_ij[e / 2], s[mt][j][e]);
      } else {
#pragma unroll
        for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int half = e / 2;
            const int r = first_row + 16 * mt + g + 8 * half;
            const int p = p0 + 8 * j + 2 * tig + (e & 1);
            float x = s[mt][j][e] * scale;
            if (softcap > 0.f) x = softcap * tanhf(x / softcap);
            const int distance = p - p_q[r];
            if (has_alibi) x += slope[r] * (float)distance;
            bool visible = row_valid[r] && p < L;
            if (causal) visible = visible && distance <= 0;
            if (sliding_window > 0) visible = visible && distance > -sliding_window;
            s[mt][j][e] = visible ? x * LOG2E : PA_NEG_INF;
            m_ij[half] = fmaxf(m_ij[half], s[mt][j][e]);
          }
        }
      }
      const float to_log2 = whole ? scale_log2 : 1.f;  // s * to_log2: the score in log2 units
      float alpha[2], m_safe[2];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        m_ij[half] = fmaxf(m_ij[half], __shfl_xor_sync(0xffffffffu, m_ij[half], 1));
        m_ij[half] = fmaxf(m_ij[half], __shfl_xor_sync(0xffffffffu, m_ij[half], 2));
        const float m_new = fmaxf(m_i[mt][half], m_ij[half] * to_log2);
        m_safe[half] = m_new == PA_NEG_INF ? 0.f : m_new;  // an all-masked row keeps p = 0
        alpha[half] = fast_exp2(m_i[mt][half] - m_safe[half]);
        m_i[mt][half] = m_new;
        l_i[mt][half] *= alpha[half];
      }
      // -- P = exp2(s * to_log2 - m), update l_i, P packed to T pairs (the A operand of P V,
      // in the S fragments' layout); rescale O
#pragma unroll
      for (int j = 0; j < S_TILES; ++j) {
        float p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          p[e] = fast_exp2(fmaf(s[mt][j][e], to_log2, -m_safe[e / 2]));
          l_i[mt][e / 2] += p[e];
        }
        p_t[mt][j][0] = Mma::pack(p[0], p[1]);
        p_t[mt][j][1] = Mma::pack(p[2], p[3]);
      }
#pragma unroll
      for (int j = 0; j < O_TILES; ++j) {
        o[mt][j][0] *= alpha[0]; o[mt][j][1] *= alpha[0];
        o[mt][j][2] *= alpha[1]; o[mt][j][3] *= alpha[1];
      }
    }
    // -- update output accumulator: O += P V (P from the S fragments, V through ldmatrix.trans;
    // each V fragment serves the warp's M_TILES m-tiles)
#pragma unroll
    for (int kk = 0; kk < SUB_N / 16; ++kk) {
      unsigned a[M_TILES][4];
#pragma unroll
      for (int mt = 0; mt < M_TILES; ++mt) {
        a[mt][0] = p_t[mt][2 * kk][0];
        a[mt][1] = p_t[mt][2 * kk][1];
        a[mt][2] = p_t[mt][2 * kk + 1][0];
        a[mt][3] = p_t[mt][2 * kk + 1][1];
      }
#pragma unroll
      for (int dj = 0; dj < O_TILES / 2; ++dj) {
        unsigned b[4];
        ldmatrix_x4_trans_at(b, v_addr + a_off[dj % 4] + (dj / 4) * 128 + kk * 16 * ROW_BYTES);
#pragma unroll
        for (int mt = 0; mt < M_TILES; ++mt) {
          Mma::mma(o[mt][2 * dj], a[mt], b[0], b[1]);
          Mma::mma(o[mt][2 * dj + 1], a[mt], b[2], b[3]);
        }
      }
    }
  };

  // A tile of MMA_TILE_N keys as MMA_TILE_N / SUB_N sub-tiles, one after the other (a
  // 32-key sub-tile holds half the S registers, what lets 2 CTAs of 8 warps fit 128 registers).
  auto attend_tile = [&](unsigned k_addr, unsigned v_addr, int p0) {
#pragma unroll
    for (int sub = 0; sub < MMA_TILE_N / SUB_N; ++sub)
      attend_sub(k_addr + sub * SUB_N * ROW_BYTES, v_addr + sub * SUB_N * ROW_BYTES, p0 + sub * SUB_N);
  };

  // ---- inner loop over tiles, loading STAGES - 1 tiles ahead; `blocks` holds the physical
  // blocks of the next tile to load, fetched right after the previous tile's copies were issued
  const int num_tiles = kv_end > kv_begin ? (kv_end - kv_begin + MMA_TILE_N - 1) / MMA_TILE_N : 0;
  int blocks[BLOCKS_PER_TILE] = {};
  if (num_tiles > 0) fetch_blocks(0, blocks);
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {  // tiles 0 .. STAGES - 2, after Q's group
    if (i < num_tiles) load_tile(i, kv_begin + i * MMA_TILE_N, blocks);
    cp_async_commit();
    if (i + 1 < num_tiles) fetch_blocks(i + 1, blocks);
  }
  for (int i = 0; i < num_tiles; ++i) {
    const int next = i + STAGES - 1;  // into the stage computed in iteration i - 1
    if (next < num_tiles) load_tile(next % STAGES, kv_begin + next * MMA_TILE_N, blocks);
    cp_async_commit();
    if (next + 1 < num_tiles) fetch_blocks(next + 1, blocks);  // lands while tile i is computed
    cp_async_wait<STAGES - 1>();  // Q and tile i have landed
    __syncthreads();
    if constexpr (FP8) {
      convert_tile(i % STAGES);
      __syncthreads();  // the converted tile is visible to every warp
      attend_tile(smem_address(k_converted), smem_address(v_converted), kv_begin + i * MMA_TILE_N);
    } else {
      attend_tile(smem_address(k_tiles + (i % STAGES) * STAGE_CHUNKS),
                  smem_address(v_tiles + (i % STAGES) * STAGE_CHUNKS), kv_begin + i * MMA_TILE_N);
    }
    __syncthreads();  // stage i % STAGES (and the converted tile) may be refilled
  }
  cp_async_wait<0>();

  // ---- epilogue: l over the quad, O / l, lse = m + log l
#pragma unroll
  for (int mt = 0; mt < M_TILES; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float l = l_i[mt][half];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      const int r = first_row + 16 * mt + g + 8 * half;
      if (r >= num_rows) continue;
      float inv_l = l > 0.f ? 1.f / l : 0.f;
      if constexpr (FP8) inv_l *= v_scale;  // the value used is cache * v_scale
      const float lse_final = l > 0.f ? m_i[mt][half] * LN2 + logf(l) : PA_NEG_INF;
      const long long t = token_start + r / num_groups;
      const int h = kv_head * group_size + group_start + r % num_groups;
#pragma unroll
      for (int j = 0; j < O_TILES; ++j) {
        const int d = 8 * j + 2 * tig;
        const float o0 = o[mt][j][2 * half] * inv_l, o1 = o[mt][j][2 * half + 1] * inv_l;
        if (partial >= 0) {
          float* dst = partial_out + ((long long)partial * ROWS + r) * HEAD_DIM + d;
          dst[0] = o0;
          dst[1] = o1;
        } else {
          T* dst = out + (t * num_q_heads + h) * HEAD_DIM + d;
          dst[0] = from_float<T>(o0);
          dst[1] = from_float<T>(o1);
        }
      }
      if (tig == 0) {
        if (partial >= 0) partial_lse[(long long)partial * ROWS + r] = lse_final;
        else lse[t * num_q_heads + h] = lse_final;
      }
    }
  }
}
