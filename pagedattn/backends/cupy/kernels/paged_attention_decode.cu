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
//   setup:      Q's copies (16 rows, zeros past num_rows) to shared memory; rows' p_q, ALiBi
//               slopes; each stream's first block-table entries and K/V copies; then Q to mma
//               A fragments in registers (Q, the table and the first K/V in flight together)
//   inner loop: per stream, for each sub-tile: look up its physical block (a sub-tile never
//               crosses a block; each lane holds the entry of one of the next 32 sub-tiles,
//               loaded 32 sub-tiles early, and the warp reads it by shuffle), issue its
//               16-byte copies (only p < L); per step of STEP_SUBS sub-tiles (fp8: two, else
//               one), attend_step: S = Q K^T (mma.sync), mask (replace, never add; skipped on
//               sub-tiles every row sees whole), update m, l, O (O = O * alpha + P V, mma.sync
//               with V through ldmatrix.trans)
//   epilogue:   merge the streams' states, O / l, lse, to out or a split-KV partial.
// fp8 caches (C = fp8_e4m3_t / fp8_e5m2_t, kernels/fp8.cuh): DEC_FP8_STAGES stages of the raw
// bytes (half the bytes of a 16-bit sub-tile; four load while a step attends two), DEC_FP8_STEP_SUBS
// sub-tiles attended a step (32 keys: one online-softmax update and one O rescale, and two
// independent chains of products), DEC_FP8_CTAS_PER_SM CTAs an SM, and every product in
// float16 whatever T is, so that each fp8 pair takes one exact cvt.rn.f16x2.e4m3x2 / e5m2x2
// (NaN, and e5m2's inf, kept) and nothing goes through shared memory twice. The keys sit on
// the MMA's M side and at most DEC_FP8_ROWS = 8 query rows (the host's fp8 items) on its n side:
// S^T = K Q^T and O^T += V^T P^T, one m16n8k16 a k-step for S^T and one per 16 head dims for
// O^T, half the products of a 16-row tile with Q on the M side, and O^T in HEAD_DIM / 4
// registers a thread. Lane (g, tig) holds keys g, g + 8 and rows 2 tig, 2 tig + 1 of S^T, so
// row maxima and sums run over the 8 lanes of a tig; P^T reaches its B fragments through
// movmatrix (transpose_8x8):
//   K: the q.k reduction order may be permuted if Q is permuted alike. Lane (g, tig) reads its
//      HEAD_DIM / 4 contiguous bytes HEAD_DIM / 4 * tig + 4 kk + i of keys g and g + 8 (one or
//      two 16-byte loads each) and takes them as k-positions 2 tig, 2 tig + 1 (a0, a1: bytes
//      0, 1) and 2 tig + 8, 2 tig + 9 (a2, a3: bytes 2, 3) of k-step kk; Q's B fragments are
//      read from shared memory in that order in the setup.
//   V: keys are P V's reduction dimension, head dims the M side of V^T, and they may be
//      permuted if the store undoes it. Lane (g, tig) reads bytes HEAD_DIM / 8 * g + i
//      (i < HEAD_DIM / 8) of keys 2 tig, 2 tig + 1, 2 tig + 8, 2 tig + 9 (one 16- or 8-byte load
//      each), pairs assembled with prmt: bytes 2 mt and 2 mt + 1 are rows g and g + 8 of
//      m-tile mt, and the epilogue stores them at their head dims.
//   The stages are XOR-swizzled by chunk (fp8_swizzle), which leaves both loads free of bank
//   conflicts at head_dim 128 (2-way for V at 64).
//   bfloat16 queries (RESCALE_Q): each Q row goes to float16 once, in the setup, as q * 2^shift
//   with shift from its largest finite |q| (q_row_shift): that element lands in [2^15, 2^16),
//   below float16's max (a bfloat16 there is at most 65,280), and every element down to 2^-32
//   of it is exact (8 significant bits stay above float16's 2^-24 subnormal step); smaller ones
//   are off by at most 2^-25 * 2^-shift <= max|q| * 2^-40 (2^-151 where the shift is capped at
//   126). S is multiplied by 2^-shift (exact) before the score scale, so the scores are those
//   of exact bfloat16 products but for a score error of at most |scale| max|q| 2^-40 sum_d |k_d|,
//   under the error model's absolute 8 u_acc = 2^-21 while |scale| max|q| sum_d |k_d| <= 2^19,
//   and nothing at all unless an element is below 2^-32 of its row's largest
//   (docs/backends/cupy.md). NaN and inf in q are left out of the max and pass through the
//   scaling and the cvt unchanged, so a row sees them as before.
//   P (in [0, 1]) goes to float16 as P * 2^15: relative error 2^-11 (u_p allows 2^-8 for
//   bfloat16 queries, 2^-11 for float16) down to P = 2^-29 and at most 2^-40 absolute below,
//   where unscaled P would lose precision from 2^-14 on; O is multiplied by 2^-15 (exact) at
//   the end. The score scale passed in holds k_scale, and O is multiplied by v_scale at the end.
//   O *= alpha is skipped where no row of the warp raised its max (alpha == 1: the same bits).
#include "common.cuh"
#include "fp8.cuh"
#include "mma.cuh"
#include "split_merge.cuh"
#include "work_item.cuh"

constexpr int DEC_WARPS = 4;
constexpr int DEC_THREADS = DEC_WARPS * 32;
constexpr int DEC_CTAS_PER_SM = 2;  // 2 x 103 KB of shared memory at d = 128, 2 x 104 KB at 256
constexpr int DEC_FP8_CTAS_PER_SM = 2;  // fp8: 2 x 101 KB at d = 128
constexpr int DEC_ROWS = 16;
constexpr int DEC_FP8_ROWS = 8;  // fp8: rows on the n side of the products (the host's DECODE_FP8_ROWS)
constexpr int DEC_SUB_N = 16;   // keys per sub-tile (two n-tiles of 8); never crosses a block
constexpr int DEC_STAGES = 3;   // sub-tiles per stream in shared memory: two load while one computes
constexpr int DEC_FP8_STAGES = 6;  // fp8: half the bytes a sub-tile; four load while a step attends two
// fp8: sub-tiles attended in one step (32 keys: one softmax update and O rescale, and twice the
// independent products, per step)
constexpr int DEC_FP8_STEP_SUBS = 2;
constexpr float DEC_P_SCALE = 32768.f;        // fp8: P * 2^15 to float16 for P V (see the header)
constexpr float DEC_P_UNSCALE = 1.f / 32768.f;
constexpr int DEC_TABLE_BATCH = 32;  // sub-tiles whose block-table entries a warp holds (one per lane)

// Warps of one stream (sharing its sub-tiles, each with 1 / split of O's columns): 2 at head_dim
// 256, where a warp's whole O (128 registers) and Q fragments (64) would not fit beside the rest.
__host__ __device__ constexpr int dec_split(int head_dim) { return head_dim > 128 ? 2 : 1; }
template <int HEAD_DIM> __host__ __device__ constexpr int decode_streams() {
  return DEC_WARPS / dec_split(HEAD_DIM);
}
// K/V stages of one stream: DEC_STAGES for 16-bit caches, DEC_FP8_STAGES for fp8.
template <int CACHE_BYTES> __host__ __device__ constexpr int decode_stages() {
  return CACHE_BYTES == 1 ? DEC_FP8_STAGES : DEC_STAGES;
}
// 16-byte chunks one stream owns in shared memory: its K and V stages of the cache's bytes.
template <int HEAD_DIM, int CACHE_BYTES> __host__ __device__ constexpr int decode_stream_chunks() {
  return decode_stages<CACHE_BYTES>() * 2 * DEC_SUB_N * HEAD_DIM * CACHE_BYTES / 16;
}
// Shared-memory bytes of paged_attention_decode (the host computes the same).
template <int HEAD_DIM, int CACHE_BYTES> __host__ __device__ constexpr int decode_smem_bytes() {
  return (DEC_ROWS * HEAD_DIM * 2 / 16 + decode_streams<HEAD_DIM>() * decode_stream_chunks<HEAD_DIM, CACHE_BYTES>()) *
             16 +
         3 * DEC_ROWS * 4 + 2 * decode_streams<HEAD_DIM>() * DEC_ROWS * 4;
}

template <typename T, int HEAD_DIM, int BLOCK_SIZE, typename C>
__global__ void __launch_bounds__(DEC_THREADS, CacheKind<C>::FP8 ? DEC_FP8_CTAS_PER_SM : DEC_CTAS_PER_SM)
    paged_attention_decode(
    PAGED_ATTENTION_PARAMS(T, C)) {
  constexpr bool FP8 = CacheKind<C>::FP8;
  constexpr bool RESCALE_Q = FP8 && IsBfloat16<T>::value;  // bfloat16 Q to float16, row by row
  constexpr int STAGES = decode_stages<(int)sizeof(C)>();
  static_assert(FP8 || sizeof(C) == sizeof(T), "a 16-bit cache holds the query's type");
  constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;  // 16-byte chunks of 8 elements of T
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
  // fp8: keys on the MMA's M side (S^T = K Q^T, O^T += V^T P^T), 8 query rows on its n side: one
  // m16n8 tile of S^T a sub-tile, and O^T in HEAD_DIM / 16 m-tiles of 16 head dims
  constexpr int O_FRAGS = FP8 ? HEAD_DIM / 16 : O_TILES;  // accumulator tiles of O (fp8: of O^T)
  constexpr int S_TILES = FP8 ? 1 : 2;                    // accumulator tiles of S (fp8: S^T) a sub-tile
  static_assert(CHUNKS_PER_ROW >= 8 && CHUNKS_PER_ROW % 8 == 0, "the swizzle needs 8 chunks per row");
  static_assert(STAGE_CHUNKS % STREAM_THREADS == 0, "sub-tile loads must divide among a stream");
  static_assert(BLOCK_SIZE % DEC_SUB_N == 0, "a sub-tile must lie in one block");
  static_assert(DEC_TABLE_BATCH == 32, "one block-table entry per lane");
  static_assert(!FP8 || SPLIT == 1, "fp8 caches: one warp a stream (head_dim 64, 128)");
  using Mma = MmaType<typename DecodeMmaType<T, C>::type>;  // float16 for fp8 caches
  constexpr int STEP_SUBS = FP8 ? DEC_FP8_STEP_SUBS : 1;  // sub-tiles a step attends together
  static_assert(STAGES > STEP_SUBS, "a step computes while the next is in flight");

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
  // fp8 stages: chunk c of key row n at n * CACHE_CHUNKS_PER_ROW + (c ^ (n % CACHE_CHUNKS_PER_ROW))
  // (the lanes' K and V loads of attend_step without bank conflicts at head_dim 128)
  auto fp8_swizzle = [](int n, int c) {
    return n * CACHE_CHUNKS_PER_ROW + (c ^ (n % CACHE_CHUNKS_PER_ROW));
  };


  // ---- setup
  PAGED_ATTENTION_ITEM();
  if (kv_begin % DEC_SUB_N) __trap();  // the host cuts ranges on tile boundaries
  PAGED_ATTENTION_SEQUENCE();
  if (FP8 && num_rows > DEC_FP8_ROWS) __trap();  // the host gives fp8 items at most 8 rows
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
  // Q's copies need only the work item: they go out before L and q_len are waited for
  for (int idx = threadIdx.x; idx < DEC_ROWS * CHUNKS_PER_ROW; idx += DEC_THREADS) {
    const int r = idx / CHUNKS_PER_ROW, c = idx % CHUNKS_PER_ROW;
    bool valid;
    const T* src = query_chunk<HEAD_DIM>(query, item_rows, num_q_heads, r, c, valid);
    cp_async_16(q_tile + swizzle(r, c), src, valid);
  }
  cp_async_commit();  // Q's group: waited for after this stream's first K/V copies are issued
  if (threadIdx.x < DEC_ROWS)
    set_row_state(item_rows, threadIdx.x, L, q_len, query_start_loc, seq, has_alibi, alibi_slopes, row_valid, p_q,
                  slope);

  // ---- this stream's sub-tiles: stream, stream + STREAMS, ... of [kv_begin, min(kv_end, L))
  const int kv_stop = kv_end < L ? kv_end : L;
  const int num_sub = kv_stop > kv_begin ? (kv_stop - kv_begin + DEC_SUB_N - 1) / DEC_SUB_N : 0;
  const int my_subs = num_sub > stream ? (num_sub - stream + STREAMS - 1) / STREAMS : 0;
  // sub-tiles loaded: my_subs, rounded up to whole steps (the absent ones zero-filled)
  const int loaded_subs = (my_subs + STEP_SUBS - 1) / STEP_SUBS * STEP_SUBS;
  uint4* k_stages = kv_region + stream * STREAM_CHUNKS;  // as stored in the cache
  uint4* v_stages = k_stages + STAGES * STAGE_CHUNKS;

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

  // -- this thread's copies of a sub-tile: chunk load_c of rows load_n0, load_n0 + LOAD_ROWS, ...
  // (the same chunk of every row it copies), from addresses fixed but for the block and slot:
  // per sub-tile a shuffle, two 64-bit bases and one 64-bit add and one compare a copy
  constexpr int LOAD_ROWS = STREAM_THREADS / CACHE_CHUNKS_PER_ROW;  // rows between one thread's copies
  static_assert(STREAM_THREADS % CACHE_CHUNKS_PER_ROW == 0, "a thread copies one chunk of its rows");
  const int load_c = stream_lane % CACHE_CHUNKS_PER_ROW, load_n0 = stream_lane / CACHE_CHUNKS_PER_ROW;
  const C* k_lane = key_cache + kv_head * k_stride_head + load_n0 * k_stride_slot + load_c * CACHE_ELEMS;
  const C* v_lane = value_cache + kv_head * v_stride_head + load_n0 * v_stride_slot + load_c * CACHE_ELEMS;
  const long long k_row_step = LOAD_ROWS * k_stride_slot, v_row_step = LOAD_ROWS * v_stride_slot;

  // -- issue this thread's share of the copies of sub-tile k (called for k = 0, 1, 2, ... in
  // order, stream-uniform). A row at p >= L is zero-filled and nothing is read for it (source
  // size 0); its address lies in the sub-tile's block, whose first position is < L.
  auto load_sub = [&](int stage, int k) {
    if (k % DEC_TABLE_BATCH == 0 && k > 0) {
      table_cur = table_next;
      table_next = table_batch(k / DEC_TABLE_BATCH + 1);
    }
    const long long block = __shfl_sync(0xffffffffu, table_cur, k % DEC_TABLE_BATCH);
    const int p0 = sub_p0(k);
    const long long slot0 = p0 % BLOCK_SIZE;
    const C* k_src = k_lane + block * k_stride_block + slot0 * k_stride_slot;
    const C* v_src = v_lane + block * v_stride_block + slot0 * v_stride_slot;
    const bool present = STEP_SUBS == 1 || k < my_subs;  // an absent sub-tile is zero-filled
#pragma unroll
    for (int i = 0; i < LOADS_PER_LANE; ++i) {
      const int n = load_n0 + LOAD_ROWS * i;
      const bool valid = present && p0 + n < L;  // nothing at p >= L is read
      const int at = FP8 ? fp8_swizzle(n, load_c) : swizzle(n, load_c);
      cp_async_16(k_stages + stage * STAGE_CHUNKS + at, k_src + i * k_row_step, valid);
      cp_async_16(v_stages + stage * STAGE_CHUNKS + at, v_src + i * v_row_step, valid);
    }
  };

  // the first STAGES - STEP_SUBS sub-tiles' copies go out before Q is waited for: the block-table
  // and K/V round trips overlap Q's instead of following it
#pragma unroll
  for (int i = 0; i < STAGES - STEP_SUBS; ++i) {
    if (i < loaded_subs) load_sub(i, i);
    cp_async_commit();
  }
  cp_async_wait<STAGES - STEP_SUBS>();  // Q's group, the oldest, has landed
  __syncthreads();
  // Q in registers: A fragments of rows g, g + 8 (16-bit caches); fp8: B fragments of row g
  unsigned q_frag[K_STEPS][FP8 ? 2 : 4];
  // this thread's two rows (half 0, 1) of the S and O fragments: g and g + 8; fp8: 2 tig, 2 tig + 1
  const int row_of[2] = {FP8 ? 2 * tig : g, FP8 ? 2 * tig + 1 : g + 8};
  float row_pow2[2] = {1.f, 1.f};  // RESCALE_Q: 2^-shift of rows row_of (Q was scaled by 2^shift)
  if constexpr (FP8) {
    // Q^T as B fragments (n = row g), in the permuted order of the reduction dimension: the
    // lane's HEAD_DIM / 4 elements HEAD_DIM / 4 * tig + 4 kk + i (i = 0..3) are mma k-positions
    // 2 tig, 2 tig + 1 (b0), 2 tig + 8, 2 tig + 9 (b1) of k-step kk (attend_step reads K alike)
    constexpr int Q_LANE_CHUNKS = HEAD_DIM / 32;  // a lane's chunks of 8 elements per row
    const int r = g;
    float up = 1.f;
    if constexpr (RESCALE_Q) {
      float amax = 0.f;  // largest finite |q| of the row (NaN and inf pass through unscaled)
#pragma unroll
      for (int i = 0; i < Q_LANE_CHUNKS; ++i) {
        const uint4 raw = q_tile[swizzle(r, tig * Q_LANE_CHUNKS + i)];
        float x[8];
        unpack_chunk(raw, x, bfloat16_t());
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float a = fabsf(x[e]);
          amax = a < PA_INF ? fmaxf(amax, a) : amax;
        }
      }
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
      const int shift = q_row_shift(amax);
      up = pow2_float(shift);
      const float down = pow2_float(-shift);  // row g's; rows 2 tig + half from lanes 4 (2 tig + half)
      row_pow2[0] = __shfl_sync(0xffffffffu, down, 4 * row_of[0]);
      row_pow2[1] = __shfl_sync(0xffffffffu, down, 4 * row_of[1]);
    }
#pragma unroll
    for (int i = 0; i < Q_LANE_CHUNKS; ++i) {
      const uint4 raw = q_tile[swizzle(r, tig * Q_LANE_CHUNKS + i)];
      const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int m = 0; m < 4; ++m) {  // elements 8 i + 2 m, + 1: k-step 2 i + m / 2
        unsigned pair = w[m];
        if constexpr (RESCALE_Q) {
          float lo, hi;
          unpack_word(w[m], lo, hi, bfloat16_t());
          pair = Mma::pack(lo * up, hi * up);  // exact unless below float16's subnormals
        }
        q_frag[2 * i + m / 2][m % 2] = pair;
      }
    }
  } else {
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk)
      ldmatrix_x4(q_frag[kk], q_tile + swizzle((lane % 8) + 8 * ((lane / 8) % 2), 2 * kk + lane / 16));
  }
  const int pq_row[2] = {p_q[row_of[0]], p_q[row_of[1]]};
  const float slope_row[2] = {slope[row_of[0]], slope[row_of[1]]};
  const bool valid_row[2] = {row_valid[row_of[0]] != 0, row_valid[row_of[1]] != 0};

  float m_i[2] = {PA_NEG_INF, PA_NEG_INF};
  float l_i[2] = {0.f, 0.f};  // this thread's share; summed over its row's lanes in the epilogue
  float o[O_FRAGS][4];
#pragma unroll
  for (int j = 0; j < O_FRAGS; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f;

  // -- one step: sub-tiles t < STEP_SUBS in k_tiles[t], v_tiles[t], their first positions p0[t];
  // an absent one (past this stream's last) is zero-filled and comes with p0 = L, so every score
  // of it is masked and its zero V adds nothing
  auto attend_step = [&](const uint4* const* k_tiles, const uint4* const* v_tiles, const int* p0) {
    // -- compute qk: per sub-tile two n-tiles of 8 keys of S (fp8: one m-tile of 16 keys of S^T)
    float s[S_TILES * STEP_SUBS][4];
#pragma unroll
    for (int j = 0; j < S_TILES * STEP_SUBS; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
    for (int t = 0; t < STEP_SUBS; ++t) {
      const uint4* k_tile = k_tiles[t];
      if constexpr (FP8) {
        // A = keys g and g + 8, the lane's HEAD_DIM / 4 bytes (k-step kk: bytes 4 kk .. 4 kk + 3,
        // a0 / a1 from the low pair, a2 / a3 from the high pair), converted in registers
        constexpr int K_LANE_CHUNKS = HEAD_DIM / 64;
        uint4 raw[2][K_LANE_CHUNKS];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
#pragma unroll
          for (int i = 0; i < K_LANE_CHUNKS; ++i) raw[h][i] = k_tile[fp8_swizzle(g + 8 * h, tig * K_LANE_CHUNKS + i)];
        }
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
          const unsigned w_lo = chunk_word(raw[0][kk / 4], kk % 4), w_hi = chunk_word(raw[1][kk / 4], kk % 4);
          const unsigned a[4] = {fp8_half_to_f16x2<C, 0>(w_lo), fp8_half_to_f16x2<C, 0>(w_hi),
                                 fp8_half_to_f16x2<C, 1>(w_lo), fp8_half_to_f16x2<C, 1>(w_hi)};
          Mma::mma(s[t], a, q_frag[kk][0], q_frag[kk][1]);
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < K_STEPS; ++kk) {
          unsigned b[4];
          ldmatrix_x4(b, k_tile + swizzle((lane % 8) + 8 * (lane / 16), 2 * kk + (lane / 8) % 2));
          Mma::mma(s[2 * t], q_frag[kk], b[0], b[1]);
          Mma::mma(s[2 * t + 1], q_frag[kk], b[2], b[3]);
        }
      }
    }
    // element e of S tile j (of sub-tile t = j / S_TILES): its row half, and its key's offset in
    // the sub-tile (S: rows g, g + 8 and keys 8 (j % 2) + 2 tig, + 1; fp8's S^T: keys g, g + 8
    // and rows 2 tig, 2 tig + 1)
    auto half_of = [](int e) { return FP8 ? e % 2 : e / 2; };
    auto key_of = [&](int j, int e) { return FP8 ? g + 8 * (e / 2) : 8 * (j % 2) + 2 * tig + (e & 1); };
    if constexpr (RESCALE_Q) {  // back to the query's scale: exact (a power of two)
#pragma unroll
      for (int j = 0; j < S_TILES * STEP_SUBS; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[j][e] *= row_pow2[half_of(e)];
      }
    }
    // -- scale, softcap, ALiBi, mask (replace, never add); row max over the fragment's lanes
    float m_ij[2] = {PA_NEG_INF, PA_NEG_INF};
#pragma unroll
    for (int t = 0; t < STEP_SUBS; ++t) {
      const bool whole = p0[t] + DEC_SUB_N <= L && (!causal || p0[t] + DEC_SUB_N - 1 <= pq_min) &&
                         (sliding_window <= 0 || p0[t] > pq_max - sliding_window);
      if (plain && whole) {  // every row sees every key: the same arithmetic, no mask
#pragma unroll
        for (int j = S_TILES * t; j < S_TILES * (t + 1); ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            s[j][e] = (s[j][e] * scale) * LOG2E;
            m_ij[half_of(e)] = fmaxf(m_ij[half_of(e)], s[j][e]);
          }
        }
      } else if (whole) {  // softcap or ALiBi, every row sees every key: score_log2 without the mask
#pragma unroll
        for (int j = S_TILES * t; j < S_TILES * (t + 1); ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int half = half_of(e);
            const int p = p0[t] + key_of(j, e);
            s[j][e] = score_log2(s[j][e], p - pq_row[half], slope_row[half], scale, softcap, has_alibi);
            m_ij[half] = fmaxf(m_ij[half], s[j][e]);
          }
        }
      } else {
#pragma unroll
        for (int j = S_TILES * t; j < S_TILES * (t + 1); ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int half = half_of(e);
            const int p = p0[t] + key_of(j, e);
            s[j][e] = masked_score_log2(s[j][e], p, pq_row[half], slope_row[half], valid_row[half], L,
                                        scale, softcap, has_alibi, causal, sliding_window);
            m_ij[half] = fmaxf(m_ij[half], s[j][e]);
          }
        }
      }
    }
    float alpha[2];
    online_softmax_step<S_TILES * STEP_SUBS, FP8>(s, m_ij, m_i, l_i, alpha);  // P = exp2(s - m), l += row sums of P
    // -- update output accumulator: O = O * alpha + P V (fp8: O^T = O^T * alpha + V^T P^T)
    if constexpr (FP8) {
      // P^T * 2^15 in float16 (exact scaling; undone in the epilogue) as B fragments: S^T's pairs
      // (key g or g + 8; rows 2 tig, 2 tig + 1) transposed to (row g; keys 2 tig, 2 tig + 1 of
      // each 8)
      unsigned p_frag[STEP_SUBS][2];
#pragma unroll
      for (int t = 0; t < STEP_SUBS; ++t) {
        p_frag[t][0] = transpose_8x8(Mma::pack(s[t][0] * DEC_P_SCALE, s[t][1] * DEC_P_SCALE));
        p_frag[t][1] = transpose_8x8(Mma::pack(s[t][2] * DEC_P_SCALE, s[t][3] * DEC_P_SCALE));
      }
      // O *= alpha, skipped where no row of the warp raised its max (alpha == 1 exactly: the
      // same bits), as after the first sub-tiles of a long range
      if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
        for (int j = 0; j < O_FRAGS; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) o[j][e] *= alpha[half_of(e)];
        }
      }
#pragma unroll
      for (int t = 0; t < STEP_SUBS; ++t) {
        // A = V^T: keys 2 tig, 2 tig + 1 (a0, a1) and 2 tig + 8, 2 tig + 9 (a2, a3), the lane's
        // HEAD_DIM / 8 bytes HEAD_DIM / 8 * g + i of each; bytes 2 mt and 2 mt + 1 serve m-tile mt
        // as its rows g and g + 8 (undone at the epilogue's store), pairs assembled with prmt
        const uint4* v_tile = v_tiles[t];
        constexpr int V_LANE_WORDS = HEAD_DIM / 32;
        unsigned vw[4][V_LANE_WORDS];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int n = 2 * tig + (q & 1) + 8 * (q >> 1);
          if constexpr (V_LANE_WORDS == 4) {
            const uint4 raw = v_tile[fp8_swizzle(n, g)];
            vw[q][0] = raw.x, vw[q][1] = raw.y, vw[q][2] = raw.z, vw[q][3] = raw.w;
          } else {
            static_assert(V_LANE_WORDS == 2, "head_dim 64 or 128");
            const uint2 raw = reinterpret_cast<const uint2*>(v_tile + fp8_swizzle(n, g / 2))[g % 2];
            vw[q][0] = raw.x, vw[q][1] = raw.y;
          }
        }
#pragma unroll
        for (int mt = 0; mt < O_FRAGS; ++mt) {  // bytes 2 (mt % 2), + 1 of word mt / 2
          const unsigned k01 = mt % 2 == 0 ? interleave_bytes<0x5140>(vw[0][mt / 2], vw[1][mt / 2])
                                           : interleave_bytes<0x7362>(vw[0][mt / 2], vw[1][mt / 2]);
          const unsigned k89 = mt % 2 == 0 ? interleave_bytes<0x5140>(vw[2][mt / 2], vw[3][mt / 2])
                                           : interleave_bytes<0x7362>(vw[2][mt / 2], vw[3][mt / 2]);
          const unsigned a[4] = {fp8_half_to_f16x2<C, 0>(k01), fp8_half_to_f16x2<C, 1>(k01),
                                 fp8_half_to_f16x2<C, 0>(k89), fp8_half_to_f16x2<C, 1>(k89)};
          Mma::mma(o[mt], a, p_frag[t][0], p_frag[t][1]);
        }
      }
    } else {
      static_assert(STEP_SUBS == 1, "16-bit caches: one sub-tile a step");
      unsigned a[4];
      a[0] = Mma::pack(s[0][0], s[0][1]);
      a[1] = Mma::pack(s[0][2], s[0][3]);
      a[2] = Mma::pack(s[1][0], s[1][1]);
      a[3] = Mma::pack(s[1][2], s[1][3]);
      const uint4* v_tile = v_tiles[0];
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
    }
  };

  // ---- inner loop over this stream's sub-tiles, STEP_SUBS a step, STAGES - STEP_SUBS ahead; the
  // stream's barriers only (a pair: named barrier 1 + stream over its two warps, 0 being
  // __syncthreads'; immediate ids, since a barrier id in a register makes ptxas reserve all 16)
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
  for (int i = 0; i < my_subs; i += STEP_SUBS) {
#pragma unroll
    for (int t = 0; t < STEP_SUBS; ++t) {
      const int next = i + STAGES - STEP_SUBS + t;  // into a stage computed in the step before
      if (next < loaded_subs) load_sub(next % STAGES, next);
      cp_async_commit();
    }
    cp_async_wait<STAGES - STEP_SUBS>();
    stream_sync();  // every thread's copies of this step's sub-tiles are visible to the stream
    const uint4* k_tiles[STEP_SUBS];
    const uint4* v_tiles[STEP_SUBS];
    int p0[STEP_SUBS];
#pragma unroll
    for (int t = 0; t < STEP_SUBS; ++t) {
      const int stage = (i + t) % STAGES;
      k_tiles[t] = k_stages + stage * STAGE_CHUNKS;
      v_tiles[t] = v_stages + stage * STAGE_CHUNKS;
      p0[t] = STEP_SUBS == 1 || i + t < my_subs ? sub_p0(i + t) : L;
    }
    attend_step(k_tiles, v_tiles, p0);
    stream_sync();  // the stages are read before they are refilled
  }
  cp_async_wait<0>();
  __syncthreads();  // all streams are done with their stages: the region becomes o_merge

  // ---- epilogue: each stream's (m, l, O) (a stream's warps hold the same m and l); merged in
  // stream order
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = row_of[half];
    l_i[half] = reduce_over_row_lanes<FP8>(l_i[half], [](float a, float b) { return a + b; });  // the row's shares
    if ((FP8 ? g : tig) == 0 && o_part == 0) {
      m_merge[stream * DEC_ROWS + r] = m_i[half];
      l_merge[stream * DEC_ROWS + r] = l_i[half];
    }
#pragma unroll
    for (int j = 0; j < O_FRAGS; ++j) {
      float* dst = o_merge + (stream * DEC_ROWS + r) * HEAD_DIM + o_part * O_DIM;
      if constexpr (FP8) {  // rows g, g + 8 of O^T's m-tile j are head dims HEAD_DIM / 8 * g + 2 j, + 1
        dst[HEAD_DIM / 8 * g + 2 * j] = o[j][half];
        dst[HEAD_DIM / 8 * g + 2 * j + 1] = o[j][2 + half];
      } else {
        dst += 8 * j + 2 * tig;
        dst[0] = o[j][2 * half];
        dst[1] = o[j][2 * half + 1];
      }
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
    if constexpr (FP8) o_final = (o_final * DEC_P_UNSCALE) * v_scale;  // P was * 2^15; V is cache * v_scale
    const float lse_final = l != 0.f ? m * LN2 + logf(l) : PA_NEG_INF;
    store_result<DEC_ROWS, HEAD_DIM>(o_final, lse_final, r, d, partial, token_start, num_groups, kv_head, group_size,
                                 group_start, num_q_heads, out, lse, partial_out, partial_lse);
  }
  PAGED_ATTENTION_MERGE_IF_LAST(DEC_ROWS, HEAD_DIM, DEC_THREADS);
}
