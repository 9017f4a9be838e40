// Paged attention on tensor cores (mma.sync m16n8k16, float32 accumulation) for float16 and
// bfloat16 queries with query tiles of MMA_ROWS = 64 rows: prefill and chunked prefill.
//
// Must match pagedattn.spec.exact.exact_attention within the error model (P is rounded to
// the input dtype before P V, which the model allows). Same work items, skeleton and names as
// the CUDA-core kernel in paged_attention.cu and the NumPy reference:
//   setup:      rows' p_q and ALiBi slopes; the Q tile staged in shared memory
//   inner loop: for each tile of MMA_TILE_N logical positions (attend_tile): look up physical
//               blocks (only p < L), stage K and V (16-byte cp.async, zero-filled beyond L,
//               MMA_STAGES deep, 16-byte chunks XOR-swizzled against bank conflicts; no mask
//               on tiles every row sees whole),
//               S = Q K^T on tensor cores, mask (replace, never add), update m, l in registers,
//               O = O * alpha + P V on tensor cores
//   epilogue:   O / l, lse = m + log l (0 and -inf for an empty row), to out or a partial.
// Each warp owns 16 rows; a thread holds rows g and g + 8 of its warp (g = lane / 4).
// fp8 caches (C = fp8_e4m3_t / fp8_e5m2_t, kernels/fp8.cuh): the stages hold the raw bytes;
// each landed tile is converted (exact) to T in one more K/V buffer before attend_tile, the
// score scale passed in already holds k_scale, and O is multiplied by v_scale at the end.
#include "common.cuh"
#include "fp8.cuh"
#include "mma.cuh"
#include "split_merge.cuh"
#include "work_item.cuh"

constexpr int MMA_THREADS = 128;  // 4 warps x 16 rows
constexpr int MMA_ROWS = 64;
constexpr int MMA_TILE_N = 64;    // keys per tile
constexpr int MMA_STAGES = 3;     // K/V tiles in shared memory: two load while one is computed

// Shared-memory bytes of paged_attention_mma (the host computes the same): Q, MMA_STAGES
// stages of K and V as stored, and (fp8) the converted K and V tile.
template <int HEAD_DIM, int CACHE_BYTES> __host__ __device__ constexpr int mma_smem_bytes() {
  return MMA_ROWS * HEAD_DIM * 2 + MMA_STAGES * 2 * MMA_TILE_N * HEAD_DIM * CACHE_BYTES +
         (CACHE_BYTES == 1 ? 2 * MMA_TILE_N * HEAD_DIM * 2 : 0) + 3 * MMA_ROWS * 4;
}

template <typename T, int HEAD_DIM, int BLOCK_SIZE, typename C>
__global__ void __launch_bounds__(MMA_THREADS, 2) paged_attention_mma(
    PAGED_ATTENTION_PARAMS(T, C)) {
  constexpr bool FP8 = CacheKind<C>::FP8;
  static_assert(FP8 || sizeof(C) == sizeof(T), "a 16-bit cache holds the query's type");
  constexpr int STAGES = MMA_STAGES;
  constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;  // 16-byte chunks of 8 elements of T
  constexpr int TILE_CHUNKS = MMA_TILE_N * CHUNKS_PER_ROW;
  constexpr int CACHE_ELEMS = 16 / (int)sizeof(C);            // cache elements per 16-byte chunk
  constexpr int CACHE_CHUNKS_PER_ROW = HEAD_DIM / CACHE_ELEMS;  // chunks of one key row in the cache
  constexpr int STAGE_CHUNKS = MMA_TILE_N * CACHE_CHUNKS_PER_ROW;  // one K (or V) tile as stored
  constexpr int LOADS_PER_THREAD = STAGE_CHUNKS / MMA_THREADS;
  static_assert(STAGE_CHUNKS % MMA_THREADS == 0, "tile loads must divide among the threads");
  // block-table entries of a tile (it starts on a multiple of MMA_TILE_N): thread rows are
  // n = threadIdx.x / CACHE_CHUNKS_PER_ROW + ROWS_PER_PASS * i
  constexpr int BLOCKS_PER_TILE = MMA_TILE_N > BLOCK_SIZE ? MMA_TILE_N / BLOCK_SIZE : 1;
  constexpr int ROWS_PER_PASS = MMA_THREADS / CACHE_CHUNKS_PER_ROW;
  static_assert(MMA_TILE_N % BLOCK_SIZE == 0 || BLOCK_SIZE % MMA_TILE_N == 0, "tiles and blocks nest");
  constexpr int Q_LOADS_PER_THREAD = MMA_ROWS * CHUNKS_PER_ROW / MMA_THREADS;
  constexpr int K_STEPS = HEAD_DIM / 16;   // k-steps of S = Q K^T
  constexpr int S_TILES = MMA_TILE_N / 8;  // n-tiles of S (8 keys each)
  constexpr int O_TILES = HEAD_DIM / 8;    // n-tiles of O (8 dims each)
  static_assert(CHUNKS_PER_ROW >= 8 && CHUNKS_PER_ROW % 8 == 0, "the swizzle needs 8 chunks per row");
  using Mma = MmaType<T>;

  // ---- shared memory: Q tile | K stages | V stages | row state; chunk c of row n sits at
  // n * CHUNKS_PER_ROW + (c ^ (n % 8)), so 8 consecutive rows of one chunk column hit 8 bank groups
  extern __shared__ uint4 smem[];
  if (dynamic_smem_size() < (unsigned)mma_smem_bytes<HEAD_DIM, (int)sizeof(C)>()) __trap();
  uint4* q_tile = smem;
  uint4* k_tiles = q_tile + MMA_ROWS * CHUNKS_PER_ROW;  // as stored in the cache
  uint4* v_tiles = k_tiles + STAGES * STAGE_CHUNKS;
  uint4* k_converted = v_tiles + STAGES * STAGE_CHUNKS;  // fp8 only: the tile as T
  uint4* v_converted = k_converted + (FP8 ? TILE_CHUNKS : 0);
  int* p_q = reinterpret_cast<int*>(v_converted + (FP8 ? TILE_CHUNKS : 0));
  float* slope = reinterpret_cast<float*>(p_q + MMA_ROWS);
  int* row_valid = reinterpret_cast<int*>(slope + MMA_ROWS);
  auto swizzle = [](int n, int c) { return n * CHUNKS_PER_ROW + (c ^ (n % 8)); };

  // ---- setup
  PAGED_ATTENTION_ITEM();
  PAGED_ATTENTION_SEQUENCE();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tig = lane % 4;  // row group and thread in group of the mma fragments

  const ItemRows item_rows{token_start, num_groups, num_rows, kv_head, group_size, group_start};
  for (int r = threadIdx.x; r < MMA_ROWS; r += MMA_THREADS)
    set_row_state(item_rows, r, L, q_len, query_start_loc, seq, has_alibi, alibi_slopes, row_valid, p_q, slope);
  // Q rows (zeros for rows past num_rows)
#pragma unroll
  for (int i = 0; i < Q_LOADS_PER_THREAD; ++i) {
    const int idx = threadIdx.x + i * MMA_THREADS;
    const int r = idx / CHUNKS_PER_ROW, c = idx % CHUNKS_PER_ROW;
    bool valid;
    const T* src = query_chunk<HEAD_DIM>(query, item_rows, num_q_heads, r, c, valid);
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
      const int idx = threadIdx.x + i * MMA_THREADS;
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
        const int idx = threadIdx.x + i * MMA_THREADS;
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

  // running state of rows g and g + 8 of this warp, log2 units
  const int row_lo = warp * 16 + g, row_hi = row_lo + 8;
  // p_q of this CTA's first and last token: a tile in [pq_max - W + 1, pq_min] (and < L) is
  // seen whole by every row
  const int pq_min = L - q_len + (token_start - query_start_loc[seq]);
  const int pq_max = pq_min + num_tokens - 1;
  const bool plain = softcap <= 0.f && !has_alibi;  // scores are scale * q.k, nothing added
  float m_i[2] = {PA_NEG_INF, PA_NEG_INF};
  float l_i[2] = {0.f, 0.f};  // this thread's share of l; summed over the quad in the epilogue
  float o[O_TILES][4];
#pragma unroll
  for (int j = 0; j < O_TILES; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

  auto attend_tile = [&](const uint4* k_tile, const uint4* v_tile, int p0) {
    // -- compute qk on tensor cores
    float s[S_TILES][4];
#pragma unroll
    for (int j = 0; j < S_TILES; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk) {
      unsigned a[4];
      ldmatrix_x4(a, q_tile + swizzle(warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2), 2 * kk + lane / 16));
#pragma unroll
      for (int jp = 0; jp < S_TILES / 2; ++jp) {
        unsigned b[4];
        ldmatrix_x4(b, k_tile + swizzle(16 * jp + (lane % 8) + 8 * (lane / 16), 2 * kk + (lane / 8) % 2));
        Mma::mma(s[2 * jp], a, b[0], b[1]);
        Mma::mma(s[2 * jp + 1], a, b[2], b[3]);
      }
    }
    // -- scale, softcap, ALiBi, mask (replace, never add); row max over the quad
    float m_ij[2] = {PA_NEG_INF, PA_NEG_INF};
    const bool whole = p0 + MMA_TILE_N <= L && (!causal || p0 + MMA_TILE_N - 1 <= pq_min) &&
                       (sliding_window <= 0 || p0 > pq_max - sliding_window);
    if (plain && whole) {  // every row sees every key of the tile: the same arithmetic, no mask
#pragma unroll
      for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[j][e] = (s[j][e] * scale) * LOG2E;
          m_ij[e / 2] = fmaxf(m_ij[e / 2], s[j][e]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < S_TILES; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e / 2;
          const int r = half == 0 ? row_lo : row_hi;
          const int p = p0 + 8 * j + 2 * tig + (e & 1);
          s[j][e] = masked_score_log2(s[j][e], p, p_q[r], slope[r], row_valid[r], L,
                                      scale, softcap, has_alibi, causal, sliding_window);
          m_ij[half] = fmaxf(m_ij[half], s[j][e]);
        }
      }
    }
    float alpha[2];
    online_softmax_step(s, m_ij, m_i, l_i, alpha);  // P = exp2(s - m), l += row sums of P
    // -- rescale O
#pragma unroll
    for (int j = 0; j < O_TILES; ++j) {
      o[j][0] *= alpha[0]; o[j][1] *= alpha[0];
      o[j][2] *= alpha[1]; o[j][3] *= alpha[1];
    }
    // -- update output accumulator: O += P V (P from the S fragments, V through ldmatrix.trans)
#pragma unroll
    for (int kk = 0; kk < MMA_TILE_N / 16; ++kk) {
      unsigned a[4];
      a[0] = Mma::pack(s[2 * kk][0], s[2 * kk][1]);
      a[1] = Mma::pack(s[2 * kk][2], s[2 * kk][3]);
      a[2] = Mma::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = Mma::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dj = 0; dj < O_TILES / 2; ++dj) {
        unsigned b[4];
        ldmatrix_x4_trans(b, v_tile + swizzle(16 * kk + (lane % 8) + 8 * ((lane / 8) % 2), 2 * dj + lane / 16));
        Mma::mma(o[2 * dj], a, b[0], b[1]);
        Mma::mma(o[2 * dj + 1], a, b[2], b[3]);
      }
    }
  };

  // ---- inner loop over tiles, loading STAGES - 1 tiles ahead (their table entries one more)
  const int num_tiles = kv_end > kv_begin ? (kv_end - kv_begin + MMA_TILE_N - 1) / MMA_TILE_N : 0;
  int blocks[BLOCKS_PER_TILE];       // of the next tile to load
  int blocks_after[BLOCKS_PER_TILE] = {};  // of the tile after it
  if (num_tiles > 0) fetch_blocks(0, blocks);
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {  // tiles 0 .. STAGES - 2, after Q's group
    if (i + 1 < num_tiles) fetch_blocks(i + 1, blocks_after);
    if (i < num_tiles) load_tile(i, kv_begin + i * MMA_TILE_N, blocks);
    cp_async_commit();
#pragma unroll
    for (int b = 0; b < BLOCKS_PER_TILE; ++b) blocks[b] = blocks_after[b];
  }
  for (int i = 0; i < num_tiles; ++i) {
    const int next = i + STAGES - 1;  // into the stage computed in iteration i - 1
    if (next + 1 < num_tiles) fetch_blocks(next + 1, blocks_after);
    if (next < num_tiles) load_tile(next % STAGES, kv_begin + next * MMA_TILE_N, blocks);
    cp_async_commit();
#pragma unroll
    for (int b = 0; b < BLOCKS_PER_TILE; ++b) blocks[b] = blocks_after[b];
    cp_async_wait<STAGES - 1>();  // Q and tile i have landed
    __syncthreads();
    if constexpr (FP8) {
      convert_tile(i % STAGES);
      __syncthreads();  // the converted tile is visible to every warp
      attend_tile(k_converted, v_converted, kv_begin + i * MMA_TILE_N);
    } else {
      attend_tile(k_tiles + (i % STAGES) * STAGE_CHUNKS, v_tiles + (i % STAGES) * STAGE_CHUNKS,
                  kv_begin + i * MMA_TILE_N);
    }
    __syncthreads();  // stage i % STAGES (and the converted tile) may be refilled
  }
  cp_async_wait<0>();

  // ---- epilogue: l over the quad, O / l, lse = m + log l
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l_i[half] += __shfl_xor_sync(0xffffffffu, l_i[half], 1);
    l_i[half] += __shfl_xor_sync(0xffffffffu, l_i[half], 2);
  }
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half == 0 ? row_lo : row_hi;
    if (r >= num_rows) continue;
    const float l = l_i[half];
    float inv_l = l != 0.f ? 1.f / l : 0.f;
    if constexpr (FP8) inv_l *= v_scale;  // the value used is cache * v_scale
    const float lse_final = l != 0.f ? m_i[half] * LN2 + logf(l) : PA_NEG_INF;
    const long long t = token_start + r / num_groups;
    const int h = kv_head * group_size + group_start + r % num_groups;
#pragma unroll
    for (int j = 0; j < O_TILES; ++j) {
      const int d = 8 * j + 2 * tig;
      const float o0 = o[j][2 * half] * inv_l, o1 = o[j][2 * half + 1] * inv_l;
      if (partial >= 0) {
        float* dst = partial_out + ((long long)partial * MMA_ROWS + r) * HEAD_DIM + d;
        dst[0] = o0;
        dst[1] = o1;
      } else {
        T* dst = out + (t * num_q_heads + h) * HEAD_DIM + d;
        dst[0] = from_float<T>(o0);
        dst[1] = from_float<T>(o1);
      }
    }
    if (tig == 0) {
      if (partial >= 0) partial_lse[(long long)partial * MMA_ROWS + r] = lse_final;
      else lse[t * num_q_heads + h] = lse_final;
    }
  }
  PAGED_ATTENTION_MERGE_IF_LAST(MMA_ROWS, HEAD_DIM, MMA_THREADS);
}
