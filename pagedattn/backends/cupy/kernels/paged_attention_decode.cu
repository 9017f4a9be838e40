// Decode on tensor cores: up to DEC_ROWS = 16 query rows (the query heads of one KV head, for
// one or a few tokens) per CTA, the KV range split among the CTA's streams (groups of
// dec_split(HEAD_DIM) warps); DEC_CTAS_PER_SM CTAs share an SM, so one CTA's setup and
// epilogue overlap the other's streaming.
//
// Must match pagedattn.spec.exact.exact_attention within the error model. Same work items,
// skeleton and names as the other kernels and the NumPy reference, with one difference: each
// stream runs its own online softmax over the 16-key sub-tiles stream, stream + streams, ...
// of the range, with its own K/V stages (DEC_STAGES deep, cp.async, zero-filled beyond L), so
// no CTA-wide barrier sits in the inner loop; the epilogue merges the streams' (m, l, O)
// exactly, in a fixed order, then writes O / l and lse = m + log l (0 and -inf for an empty row).
// At head_dim 64 and 128 a stream is one warp. At 256 it is a pair of warps that load each
// sub-tile together and both compute the whole S = Q K^T (the same bits, so the same m and l),
// each then accumulating half of O's columns: O stays at 64 registers a thread and Q at 64 in
// A fragments, and two pairs' stages fit two CTAs per SM, as at 128.
//   setup:      rows' p_q, ALiBi slopes; Q (16 rows, zeros past num_rows) to shared memory,
//               then to mma A fragments in registers
//   inner loop: per stream, for each sub-tile: look up its physical block (a sub-tile never
//               crosses a block; each lane holds the entry of one of the next 32 sub-tiles,
//               loaded 32 sub-tiles early, and the warp reads it by shuffle), issue its
//               16-byte copies (only p < L), then attend_tile: S = Q K^T (mma.sync), mask
//               (replace, never add; skipped on sub-tiles every row sees whole), update m, l,
//               O (O = O * alpha + P V, mma.sync with V through ldmatrix.trans)
//   epilogue:   merge the streams' states, O / l, lse, to out or a split-KV partial.
// fp8 caches (C = fp8_e4m3_t / fp8_e5m2_t, kernels/fp8.cuh): the stages hold the raw bytes;
// before attend_tile the stream converts its sub-tile to T in one more buffer (exact), the
// score scale passed in already holds k_scale, and O is multiplied by v_scale at the end.
#include "common.cuh"
#include "fp8.cuh"
#include "mma.cuh"
#include "work_item.cuh"

constexpr int DEC_WARPS = 4;
constexpr int DEC_THREADS = DEC_WARPS * 32;
constexpr int DEC_CTAS_PER_SM = 2;  // 2 x 103 KB of shared memory at d = 128, 2 x 104 KB at 256
constexpr int DEC_ROWS = 16;
constexpr int DEC_SUB_N = 16;   // keys per sub-tile (two n-tiles of 8); never crosses a block
constexpr int DEC_STAGES = 3;   // sub-tiles per stream in shared memory: two load while one computes
constexpr int DEC_TABLE_BATCH = 32;  // sub-tiles whose block-table entries a warp holds (one per lane)

// Warps of one stream (sharing its sub-tiles, each with 1 / split of O's columns): 2 at head_dim
// 256, where a warp's whole O (128 registers) and Q fragments (64) would not fit beside the rest.
__host__ __device__ constexpr int dec_split(int head_dim) { return head_dim > 128 ? 2 : 1; }
template <int HEAD_DIM> __host__ __device__ constexpr int decode_streams() {
  return DEC_WARPS / dec_split(HEAD_DIM);
}
// 16-byte chunks one stream owns in shared memory: DEC_STAGES K and V sub-tiles of the cache's
// bytes, plus (fp8) the converted K and V sub-tile.
template <int HEAD_DIM, int CACHE_BYTES> __host__ __device__ constexpr int decode_stream_chunks() {
  return DEC_STAGES * 2 * DEC_SUB_N * HEAD_DIM * CACHE_BYTES / 16 +
         (CACHE_BYTES == 1 ? 2 * DEC_SUB_N * HEAD_DIM * 2 / 16 : 0);
}
// Shared-memory bytes of paged_attention_decode (the host computes the same).
template <int HEAD_DIM, int CACHE_BYTES> __host__ __device__ constexpr int decode_smem_bytes() {
  return (DEC_ROWS * HEAD_DIM * 2 / 16 + decode_streams<HEAD_DIM>() * decode_stream_chunks<HEAD_DIM, CACHE_BYTES>()) *
             16 +
         3 * DEC_ROWS * 4 + 2 * decode_streams<HEAD_DIM>() * DEC_ROWS * 4;
}

template <typename T, int HEAD_DIM, int BLOCK_SIZE, typename C>
__global__ void __launch_bounds__(DEC_THREADS, DEC_CTAS_PER_SM) paged_attention_decode(
    PAGED_ATTENTION_PARAMS(T, C)) {
  constexpr bool FP8 = CacheKind<C>::FP8;
  static_assert(FP8 || sizeof(C) == sizeof(T), "a 16-bit cache holds the query's type");
  constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;  // 16-byte chunks of 8 elements of T
  constexpr int SUB_CHUNKS = DEC_SUB_N * CHUNKS_PER_ROW;
  constexpr int CACHE_ELEMS = 16 / (int)sizeof(C);            // cache elements per 16-byte chunk
  constexpr int CACHE_CHUNKS_PER_ROW = HEAD_DIM / CACHE_ELEMS;  // chunks of one key row in the cache
  constexpr int STAGE_CHUNKS = DEC_SUB_N * CACHE_CHUNKS_PER_ROW;  // one K (or V) sub-tile as stored
  constexpr int SPLIT = dec_split(HEAD_DIM);       // warps of a stream
  constexpr int STREAMS = decode_streams<HEAD_DIM>();
  constexpr int STREAM_THREADS = 32 * SPLIT;
  constexpr int LOADS_PER_LANE = STAGE_CHUNKS / STREAM_THREADS;
  constexpr int STREAM_CHUNKS = decode_stream_chunks<HEAD_DIM, (int)sizeof(C)>();
  constexpr int K_STEPS = HEAD_DIM / 16;
  constexpr int O_DIM = HEAD_DIM / SPLIT;  // O's columns one warp accumulates
  constexpr int O_TILES = O_DIM / 8;
  static_assert(CHUNKS_PER_ROW >= 8 && CHUNKS_PER_ROW % 8 == 0, "the swizzle needs 8 chunks per row");
  static_assert(STAGE_CHUNKS % STREAM_THREADS == 0, "sub-tile loads must divide among a stream");
  static_assert(BLOCK_SIZE % DEC_SUB_N == 0, "a sub-tile must lie in one block");
  static_assert(DEC_TABLE_BATCH == 32, "one block-table entry per lane");
  using Mma = MmaType<T>;

  // ---- shared memory: Q | per stream: K stages, V stages | row state | the streams' m, l
  // chunk c of row n sits at n * CHUNKS_PER_ROW + (c ^ (n % 8)) (no ldmatrix bank conflicts)
  extern __shared__ uint4 smem[];
  if (dynamic_smem_size() < (unsigned)decode_smem_bytes<HEAD_DIM, (int)sizeof(C)>()) __trap();
  uint4* q_tile = smem;
  uint4* kv_region = q_tile + DEC_ROWS * CHUNKS_PER_ROW;
  float* o_merge = reinterpret_cast<float*>(kv_region);  // epilogue: [STREAMS][DEC_ROWS][HEAD_DIM]
  int* p_q = reinterpret_cast<int*>(kv_region + STREAMS * STREAM_CHUNKS);
  float* slope = reinterpret_cast<float*>(p_q + DEC_ROWS);
  int* row_valid = reinterpret_cast<int*>(slope + DEC_ROWS);
  float* m_merge = reinterpret_cast<float*>(row_valid + DEC_ROWS);  // [STREAMS][DEC_ROWS]
  float* l_merge = m_merge + STREAMS * DEC_ROWS;
  static_assert(STREAMS * DEC_ROWS * HEAD_DIM * 4 <= STREAMS * STREAM_CHUNKS * 16,
                "the epilogue's O must fit in the K/V stages");
  auto swizzle = [](int n, int c) { return n * CHUNKS_PER_ROW + (c ^ (n % 8)); };

  // ---- setup
  PAGED_ATTENTION_ITEM();
  if (kv_begin % DEC_SUB_N) __trap();  // the host cuts ranges on tile boundaries
  PAGED_ATTENTION_SEQUENCE();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tig = lane % 4;
  // this warp's stream, its place in it (its O columns: O_DIM from o_part * O_DIM), its thread there
  const int stream = warp / SPLIT, o_part = warp % SPLIT, stream_lane = threadIdx.x % STREAM_THREADS;
  // p_q of this CTA's first and last token: a sub-tile in [pq_max - W + 1, pq_min] (and < L)
  // is seen whole by every row
  const int pq_min = L - q_len + (token_start - query_start_loc[seq]);
  const int pq_max = pq_min + num_tokens - 1;
  const bool plain = softcap <= 0.f && !has_alibi;  // scores are scale * q.k, nothing added

  const ItemRows item_rows{token_start, num_groups, num_rows, kv_head, group_size, group_start};
  if (threadIdx.x < DEC_ROWS)
    set_row_state(item_rows, threadIdx.x, L, q_len, query_start_loc, seq, has_alibi, alibi_slopes, row_valid, p_q,
                  slope);
  for (int idx = threadIdx.x; idx < DEC_ROWS * CHUNKS_PER_ROW; idx += DEC_THREADS) {
    const int r = idx / CHUNKS_PER_ROW, c = idx % CHUNKS_PER_ROW;
    bool valid;
    const T* src = query_chunk<HEAD_DIM>(query, item_rows, num_q_heads, r, c, valid);
    cp_async_16(q_tile + swizzle(r, c), src, valid);
  }
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();
  unsigned q_frag[K_STEPS][4];  // Q as mma A fragments, kept in registers
#pragma unroll
  for (int kk = 0; kk < K_STEPS; ++kk)
    ldmatrix_x4(q_frag[kk], q_tile + swizzle((lane % 8) + 8 * ((lane / 8) % 2), 2 * kk + lane / 16));
  const int row_lo = g, row_hi = g + 8;
  const int pq_row[2] = {p_q[row_lo], p_q[row_hi]};
  const float slope_row[2] = {slope[row_lo], slope[row_hi]};
  const bool valid_row[2] = {row_valid[row_lo] != 0, row_valid[row_hi] != 0};

  // ---- this stream's sub-tiles: stream, stream + STREAMS, ... of [kv_begin, min(kv_end, L))
  const int kv_stop = kv_end < L ? kv_end : L;
  const int num_sub = kv_stop > kv_begin ? (kv_stop - kv_begin + DEC_SUB_N - 1) / DEC_SUB_N : 0;
  const int my_subs = num_sub > stream ? (num_sub - stream + STREAMS - 1) / STREAMS : 0;
  uint4* k_stages = kv_region + stream * STREAM_CHUNKS;  // as stored in the cache
  uint4* v_stages = k_stages + DEC_STAGES * STAGE_CHUNKS;
  uint4* k_converted = v_stages + DEC_STAGES * STAGE_CHUNKS;  // fp8 only: the sub-tile as T
  uint4* v_converted = k_converted + SUB_CHUNKS;

  // -- block-table entries: lane j holds the entry of sub-tile 32 * batch + j of this stream
  // (only sub-tiles below my_subs, whose first position is < L), the next batch loaded a
  // whole batch ahead of its use (by each warp of the stream)
  auto sub_p0 = [&](int k) { return kv_begin + (stream + STREAMS * k) * DEC_SUB_N; };
  auto table_batch = [&](int batch) {
    const int k = batch * DEC_TABLE_BATCH + lane;
    return k < my_subs ? table_row[sub_p0(k) / BLOCK_SIZE] : 0;
  };
  int table_cur = table_batch(0);
  int table_next = table_batch(1);

  // -- issue this thread's share of the copies of sub-tile k (called for k = 0, 1, 2, ... in
  // order, stream-uniform)
  auto load_sub = [&](int stage, int k) {
    if (k % DEC_TABLE_BATCH == 0 && k > 0) {
      table_cur = table_next;
      table_next = table_batch(k / DEC_TABLE_BATCH + 1);
    }
    const long long block = __shfl_sync(0xffffffffu, table_cur, k % DEC_TABLE_BATCH);
    const int p0 = sub_p0(k);
    const long long slot0 = p0 % BLOCK_SIZE;
    const C* k_base = key_cache + block * k_stride_block + slot0 * k_stride_slot + kv_head * k_stride_head;
    const C* v_base = value_cache + block * v_stride_block + slot0 * v_stride_slot + kv_head * v_stride_head;
#pragma unroll
    for (int i = 0; i < LOADS_PER_LANE; ++i) {
      const int idx = stream_lane + STREAM_THREADS * i;
      const int n = idx / CACHE_CHUNKS_PER_ROW, c = idx % CACHE_CHUNKS_PER_ROW;
      const bool valid = p0 + n < L;  // nothing at p >= L is read
      const C* k_src = valid ? k_base + n * k_stride_slot + c * CACHE_ELEMS : key_cache;
      const C* v_src = valid ? v_base + n * v_stride_slot + c * CACHE_ELEMS : value_cache;
      const int at = FP8 ? idx : swizzle(n, c);  // fp8 bytes in order; T swizzled for ldmatrix
      cp_async_16(k_stages + stage * STAGE_CHUNKS + at, k_src, valid);
      cp_async_16(v_stages + stage * STAGE_CHUNKS + at, v_src, valid);
    }
  };

  // -- fp8: this thread's share of the landed sub-tile in `stage` to T in k_converted /
  // v_converted (exact)
  auto convert_sub = [&](int stage) {
    if constexpr (FP8) {  // (a 16-bit cache is read in place)
#pragma unroll
      for (int i = 0; i < LOADS_PER_LANE; ++i) {
        const int idx = stream_lane + STREAM_THREADS * i;
        const int n = idx / CACHE_CHUNKS_PER_ROW, c = idx % CACHE_CHUNKS_PER_ROW;
        uint4 first, second;
        fp8_chunk_to<C, T>(k_stages[stage * STAGE_CHUNKS + idx], first, second);
        k_converted[swizzle(n, 2 * c)] = first;
        k_converted[swizzle(n, 2 * c + 1)] = second;
        fp8_chunk_to<C, T>(v_stages[stage * STAGE_CHUNKS + idx], first, second);
        v_converted[swizzle(n, 2 * c)] = first;
        v_converted[swizzle(n, 2 * c + 1)] = second;
      }
    }
  };

  float m_i[2] = {PA_NEG_INF, PA_NEG_INF};
  float l_i[2] = {0.f, 0.f};  // this thread's share; summed over the quad in the epilogue
  float o[O_TILES][4];
#pragma unroll
  for (int j = 0; j < O_TILES; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

  auto attend_tile = [&](const uint4* k_tile, const uint4* v_tile, int p0) {
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
    const bool whole = p0 + DEC_SUB_N <= L && (!causal || p0 + DEC_SUB_N - 1 <= pq_min) &&
                       (sliding_window <= 0 || p0 > pq_max - sliding_window);
    if (plain && whole) {  // every row sees every key: the same arithmetic, no mask
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[j][e] = (s[j][e] * scale) * LOG2E;
          m_ij[e / 2] = fmaxf(m_ij[e / 2], s[j][e]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int half = e / 2;
          const int p = p0 + 8 * j + 2 * tig + (e & 1);
          s[j][e] = masked_score_log2(s[j][e], p, pq_row[half], slope_row[half], valid_row[half], L,
                                      scale, softcap, has_alibi, causal, sliding_window);
          m_ij[half] = fmaxf(m_ij[half], s[j][e]);
        }
      }
    }
    float alpha[2];
    online_softmax_step(s, m_ij, m_i, l_i, alpha);  // P = exp2(s - m), l += row sums of P
    // -- update output accumulator: O = O * alpha + P V
    unsigned a[4];
    a[0] = Mma::pack(s[0][0], s[0][1]);
    a[1] = Mma::pack(s[0][2], s[0][3]);
    a[2] = Mma::pack(s[1][0], s[1][1]);
    a[3] = Mma::pack(s[1][2], s[1][3]);
#pragma unroll
    for (int dj = 0; dj < O_TILES / 2; ++dj) {
      unsigned b[4];
      ldmatrix_x4_trans(b, v_tile + swizzle((lane % 8) + 8 * ((lane / 8) % 2),
                                            o_part * (O_DIM / 8) + 2 * dj + lane / 16));
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        o[2 * dj][e] *= alpha[e / 2];
        o[2 * dj + 1][e] *= alpha[e / 2];
      }
      Mma::mma(o[2 * dj], a, b[0], b[1]);
      Mma::mma(o[2 * dj + 1], a, b[2], b[3]);
    }
  };

  // ---- inner loop over this stream's sub-tiles, DEC_STAGES - 1 ahead; the stream's barriers only
  // (a pair: named barrier 1 + stream over its two warps, 0 being __syncthreads'; immediate ids,
  // since a barrier id in a register makes ptxas reserve all 16)
  static_assert(SPLIT == 1 || STREAMS == 2, "named barriers 1 and 2");
  auto stream_sync = [&]() {
    if constexpr (SPLIT == 1) {
      __syncwarp();
    } else if (stream == 0) {
      asm volatile("bar.sync 1, %0;\n" ::"n"(STREAM_THREADS) : "memory");
    } else {
      asm volatile("bar.sync 2, %0;\n" ::"n"(STREAM_THREADS) : "memory");
    }
  };
#pragma unroll
  for (int i = 0; i < DEC_STAGES - 1; ++i) {
    if (i < my_subs) load_sub(i, i);
    cp_async_commit();
  }
  for (int i = 0; i < my_subs; ++i) {
    const int next = i + DEC_STAGES - 1;  // into the stage computed in iteration i - 1
    if (next < my_subs) load_sub(next % DEC_STAGES, next);
    cp_async_commit();
    cp_async_wait<DEC_STAGES - 1>();
    stream_sync();  // every thread's copies of sub-tile i are visible to the stream
    if constexpr (FP8) {
      convert_sub(i % DEC_STAGES);
      stream_sync();  // the converted sub-tile is visible to the stream
      attend_tile(k_converted, v_converted, sub_p0(i));
    } else {
      attend_tile(k_stages + (i % DEC_STAGES) * STAGE_CHUNKS, v_stages + (i % DEC_STAGES) * STAGE_CHUNKS,
                  sub_p0(i));
    }
    stream_sync();  // the stage (and the converted buffer) are read before they are refilled
  }
  cp_async_wait<0>();
  __syncthreads();  // all streams are done with their stages: the region becomes o_merge

  // ---- epilogue: each stream's (m, l, O) (a stream's warps hold the same m and l); merged in
  // stream order
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    l_i[half] += __shfl_xor_sync(0xffffffffu, l_i[half], 1);
    l_i[half] += __shfl_xor_sync(0xffffffffu, l_i[half], 2);
    const int r = half == 0 ? row_lo : row_hi;
    if (tig == 0 && o_part == 0) {
      m_merge[stream * DEC_ROWS + r] = m_i[half];
      l_merge[stream * DEC_ROWS + r] = l_i[half];
    }
#pragma unroll
    for (int j = 0; j < O_TILES; ++j) {
      float* dst = o_merge + (stream * DEC_ROWS + r) * HEAD_DIM + o_part * O_DIM + 8 * j + 2 * tig;
      dst[0] = o[j][2 * half];
      dst[1] = o[j][2 * half + 1];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < num_rows * HEAD_DIM; idx += DEC_THREADS) {
    const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
    float m = PA_NEG_INF;
#pragma unroll
    for (int w = 0; w < STREAMS; ++w) m = fmaxf(m, m_merge[w * DEC_ROWS + r]);
    float l = 0.f, acc = 0.f;
#pragma unroll
    for (int w = 0; w < STREAMS; ++w) {
      const float l_w = l_merge[w * DEC_ROWS + r];
      if (l_w == 0.f) continue;  // a stream that saw no visible key; a NaN l_w (fmaxf skipped its NaN scores) is kept
      const float weight = exp2f(m_merge[w * DEC_ROWS + r] - m);
      l = fmaf(weight, l_w, l);
      acc = fmaf(weight, o_merge[(w * DEC_ROWS + r) * HEAD_DIM + d], acc);
    }
    float o_final = l != 0.f ? acc / l : 0.f;
    if constexpr (FP8) o_final *= v_scale;  // the value used is cache * v_scale
    const float lse_final = l != 0.f ? m * LN2 + logf(l) : PA_NEG_INF;
    store_result<DEC_ROWS, HEAD_DIM>(o_final, lse_final, r, d, partial, token_start, num_groups, kv_head, group_size,
                                 group_start, num_q_heads, out, lse, partial_out, partial_lse);
  }
}
