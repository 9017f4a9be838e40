// Paged attention on Hopper warpgroup MMA (wgmma.mma_async, sm_90a; float32 accumulation) for
// float16 and bfloat16 queries and caches: long prefill. One CTA of two warpgroups
// takes WGMMA_ROWS = 128 query rows (query tokens x the query heads of one KV head: a work
// item of planning.build_work at 128 rows); each warpgroup owns 64 rows, and both read every
// K/V tile staged in shared memory.
//
// Must match pagedattn.spec.exact.exact_attention within the error model (P is rounded to the
// input dtype before P V, which the model allows). Same work items, skeleton and names as the
// mma.sync kernels (paged_attention_mma.cu) and the NumPy reference:
//   setup:      rows' p_q and ALiBi slopes; the Q tile staged in its own shared memory, read
//               into registers (ldmatrix, the wgmma A fragments) afresh for each tile's S
//   inner loop: for each tile of WGMMA_TILE_N logical positions: look up physical blocks (only
//               p < L), stage K and V (16-byte cp.async into the 128-byte-swizzled layout wgmma
//               reads, zero-filled beyond L so no garbage reaches P V, WGMMA_STAGES deep),
//               S = Q K^T (wgmma, K as a K-major shared-memory operand), mask (replace, never
//               add; no mask on tiles every row of the warpgroup sees whole), update m, l in
//               registers,
//               O = O * alpha + P V (wgmma, P from the S registers, V as an MN-major operand)
//   epilogue:   O / l, lse = m + log l (0 and -inf for an empty row), to out or a partial.
// A thread holds rows g and g + 8 of its warp's 16 (g = lane / 4), as in the mma.sync kernels.
// 16-bit caches only (fp8 caches stay on the mma.sync kernels: planning never picks this one).
#include "common.cuh"
#include "mma.cuh"
#include "split_merge.cuh"
#include "wgmma.cuh"
#include "work_item.cuh"

constexpr int WGMMA_THREADS = 256;  // 2 warpgroups
constexpr int WGMMA_ROWS = 128;     // 64 rows per warpgroup
constexpr int WGMMA_TILE_N = 64;    // keys per tile
constexpr int WGMMA_STAGES = 4;     // K/V tiles in shared memory at 1 CTA/SM: three load while one is computed
// |m| (log2 units) below which a whole tile's P is one FFMA from the raw products (softmax_tile)
constexpr float FAST_SCORE_LIMIT = 524288.f;  // 2^19

// K/V stages for CTAS CTAs per SM (the host computes the same): 4 at one CTA; at two, as many
// as fit two CTAs' shared memory (Q tile + stages + rows under ~113 KB each): 2 at head_dim
// 128 (98.5 KB), 3 at 64.
template <int HEAD_DIM, int CTAS> __host__ __device__ constexpr int wgmma_stages() {
  return CTAS == 1 ? WGMMA_STAGES : (HEAD_DIM == 128 ? 2 : 3);
}

// Shared-memory bytes of paged_attention_wgmma (the host computes the same): 1,024 for
// aligning the swizzle atoms, wgmma_stages stages of K and V, the Q tile, three ints/floats
// per row.
template <int HEAD_DIM, int CTAS = 1> __host__ __device__ constexpr int wgmma_smem_bytes() {
  return 1024 + wgmma_stages<HEAD_DIM, CTAS>() * 2 * WGMMA_TILE_N * HEAD_DIM * 2 + WGMMA_ROWS * HEAD_DIM * 2 +
         3 * WGMMA_ROWS * 4;
}

// 16-byte asynchronous copy global -> shared at a 32-bit shared address; valid == false fills
// 16 zero bytes and reads nothing
__device__ __forceinline__ void cp_async_16_at(unsigned dst, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}

// The max (MAX) or sum of the 16 values of a 64-key S tile a thread holds in row half `half`
// (accumulators 4k + 2 half and 4k + 2 half + 1), as a tree: 4 dependent steps, not 15.
// (A file-scope template: NVRTC treats a generic lambda as a host function.)
template <bool MAX> __device__ __forceinline__ float row_reduce(const float (&s)[32], int half) {
  float v[16];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    v[2 * k] = s[4 * k + 2 * half];
    v[2 * k + 1] = s[4 * k + 2 * half + 1];
  }
  auto op = [](float a, float b) { return MAX ? fmaxf(a, b) : a + b; };
#pragma unroll
  for (int k = 0; k < 8; ++k) v[k] = op(v[k], v[k + 8]);
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = op(v[k], v[k + 4]);
  v[0] = op(v[0], v[2]);
  v[1] = op(v[1], v[3]);
  return op(v[0], v[1]);
}

// CTAS: CTAs per SM the launch bounds ask for (1: up to 255 registers a thread; 2: at most
// 128, so that two CTAs fit an SM's register file, with wgmma_stages<HEAD_DIM, 2> stages).
template <typename T, int HEAD_DIM, int BLOCK_SIZE, bool OVERLAP, int CTAS = 1>
__global__ void __launch_bounds__(WGMMA_THREADS, CTAS) paged_attention_wgmma(
    PAGED_ATTENTION_PARAMS(T, T)) {
  static_assert(HEAD_DIM == 64 || HEAD_DIM == 128, "wgmma kernel: head_dim 64 or 128");
  static_assert(CTAS == 1 || CTAS == 2, "wgmma kernel: 1 or 2 CTAs per SM");
  constexpr int STAGES = wgmma_stages<HEAD_DIM, CTAS>();
  constexpr int TILE_N = WGMMA_TILE_N;
  constexpr int ROWS = WGMMA_ROWS;
  constexpr int THREADS = WGMMA_THREADS;
  constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;               // 16-byte chunks of 8 elements
  constexpr int TILE_BYTES = TILE_N * HEAD_DIM * 2;          // one K (or V) tile
  constexpr int PANEL_BYTES = TILE_N * 128;                  // 64 columns of a tile
  constexpr int LOADS_PER_THREAD = TILE_N * CHUNKS_PER_ROW / THREADS;
  static_assert(TILE_N * CHUNKS_PER_ROW % THREADS == 0, "tile loads must divide among the threads");
  constexpr int BLOCKS_PER_TILE = TILE_N > BLOCK_SIZE ? TILE_N / BLOCK_SIZE : 1;
  constexpr int ROWS_PER_PASS = THREADS / CHUNKS_PER_ROW;
  static_assert(TILE_N % BLOCK_SIZE == 0, "a tile holds whole blocks (the copies' slot arithmetic)");
  constexpr int Q_LOADS_PER_THREAD = ROWS * CHUNKS_PER_ROW / THREADS;
  constexpr int K_STEPS = HEAD_DIM / 16;  // k-steps of S = Q K^T
  constexpr int S_REGS = TILE_N / 2;      // accumulators of a 64 x TILE_N S per thread
  static_assert(S_REGS == 32, "row_reduce takes a 64-key tile");
  constexpr int O_REGS = HEAD_DIM / 2;    // accumulators of a 64 x HEAD_DIM O per thread
  constexpr int PV_STEPS = TILE_N / 16;   // k-steps of O += P V
  // tiles loaded ahead: into the stage read one iteration before, or (OVERLAP: P V still
  // running into the next iteration) two iterations before
  constexpr int AHEAD = OVERLAP ? STAGES - 2 : STAGES - 1;
  static_assert(AHEAD >= 1, "at least one tile in flight");
  // Q read by the S wgmma straight from shared memory (a descriptor, 128-byte-swizzled panels
  // like K's) at 2 CTAs/SM: the ldmatrix'd A fragments (4 K_STEPS registers) do not fit 128
  // registers beside S and O (ptxas serialised the wgmmas, C7512); at 1 CTA/SM as before
  constexpr bool Q_SHARED = CTAS == 2;
  using Mma = MmaType<T>;
  using Wg = Wgmma<T>;
  (void)v_scale;  // 16-bit caches: the value used is the cache

  // ---- shared memory: [pad to 1,024] STAGES x (K tile | V tile) | Q tile | p_q | slope |
  // row_valid. Q: chunk c of row r at r * CHUNKS_PER_ROW + (c ^ (r % 8)), read by ldmatrix.
  extern __shared__ uint4 smem[];
  if (dynamic_smem_size() < (unsigned)wgmma_smem_bytes<HEAD_DIM, CTAS>()) __trap();
  const unsigned smem_base = smem_address(smem);
  const unsigned pad = (1024u - (smem_base & 1023u)) & 1023u;
  unsigned char* tiles = reinterpret_cast<unsigned char*>(smem) + pad;
  const unsigned tiles_addr = smem_base + pad;  // 1,024-aligned
  uint4* q_tile = reinterpret_cast<uint4*>(tiles + STAGES * 2 * TILE_BYTES);
  int* p_q = reinterpret_cast<int*>(reinterpret_cast<unsigned char*>(smem) + 1024 + STAGES * 2 * TILE_BYTES +
                                    ROWS * HEAD_DIM * 2);
  float* slope = reinterpret_cast<float*>(p_q + ROWS);
  int* row_valid = reinterpret_cast<int*>(slope + ROWS);
  auto q_swizzle = [](int r, int c) { return r * CHUNKS_PER_ROW + (c ^ (r % 8)); };

  // ---- setup
  PAGED_ATTENTION_ITEM();
  PAGED_ATTENTION_SEQUENCE();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, tig = lane % 4;  // row group and thread in group of the fragments
  const int wg = warp / 4;                 // warpgroup: rows 64 * wg .. 64 * wg + 63

  const ItemRows item_rows{token_start, num_groups, num_rows, kv_head, group_size, group_start};
  for (int r = threadIdx.x; r < ROWS; r += THREADS)
    set_row_state(item_rows, r, L, q_len, query_start_loc, seq, has_alibi, alibi_slopes, row_valid, p_q, slope);
  // Q rows (zeros for rows past num_rows)
#pragma unroll
  for (int i = 0; i < Q_LOADS_PER_THREAD; ++i) {
    const int idx = threadIdx.x + i * THREADS;
    const int r = idx / CHUNKS_PER_ROW, c = idx % CHUNKS_PER_ROW;
    bool valid;
    const T* src = query_chunk<HEAD_DIM>(query, item_rows, num_q_heads, r, c, valid);
    if constexpr (Q_SHARED) cp_async_16_at(smem_address(q_tile) + wgmma_tile_offset<ROWS>(r, c), src, valid);
    else cp_async_16(q_tile + q_swizzle(r, c), src, valid);
  }
  cp_async_commit();

  // The physical blocks of tile `tile` (entries only below ceil(L / BLOCK_SIZE); 0, a block
  // of the pool, past them, so every copy address below stays inside the pool), loaded a tile
  // before the copies that use them.
  // (kv_begin is a multiple of TILE_N, so of BLOCK_SIZE: tile t's entries are the
  // BLOCKS_PER_TILE columns from kv_begin / BLOCK_SIZE + t * BLOCKS_PER_TILE, no division per
  // entry; ptxas predicates each load on p < L)
  const int* item_table = table_row + kv_begin / BLOCK_SIZE;
  auto fetch_blocks = [&](int tile, int (&blocks)[BLOCKS_PER_TILE]) {
    const int p0 = kv_begin + tile * TILE_N;
    const int* entries = item_table + tile * BLOCKS_PER_TILE;
#pragma unroll
    for (int b = 0; b < BLOCKS_PER_TILE; ++b) blocks[b] = p0 + b * BLOCK_SIZE < L ? entries[b] : 0;
  };
  // K and V rows p0 .. p0 + TILE_N - 1 into `stage`, 128-byte swizzled (wgmma_tile_offset);
  // rows at p >= L are zero-filled and never read. A thread copies chunk copy_c of rows
  // n_i = copy_n + i * ROWS_PER_PASS. Every tile starts at a multiple of TILE_N and block sizes
  // and ROWS_PER_PASS are powers of two, so row n_i sits in the tile's block
  // copy_block + (i * ROWS_PER_PASS) / BLOCK_SIZE at slot copy_slot + (i * ROWS_PER_PASS) %
  // BLOCK_SIZE (copy_block = 0 where ROWS_PER_PASS <= BLOCK_SIZE): one 64-bit base per
  // thread, one block offset per block and tile, and per copy a constant slot offset.
  const int copy_c = threadIdx.x % CHUNKS_PER_ROW, copy_n = threadIdx.x / CHUNKS_PER_ROW;
  static_assert(ROWS_PER_PASS % 8 == 0, "a pass is whole swizzle atoms");
  static_assert((BLOCK_SIZE & (BLOCK_SIZE - 1)) == 0 && (ROWS_PER_PASS & (ROWS_PER_PASS - 1)) == 0,
                "block sizes and rows per pass are powers of two");
  const int copy_slot = copy_n % BLOCK_SIZE, copy_block = copy_n / BLOCK_SIZE;
  const T* k_thread = key_cache + copy_slot * k_stride_slot + kv_head * k_stride_head + copy_c * 8;
  const T* v_thread = value_cache + copy_slot * v_stride_slot + kv_head * v_stride_head + copy_c * 8;
  // row copy_n + step (step a multiple of 8) keeps copy_n's swizzle: its offset is step * 128 on
  const unsigned copy_dst = wgmma_tile_offset<TILE_N>(copy_n, copy_c);
  auto pick = [](const int (&blocks)[BLOCKS_PER_TILE], int j) {
    int block = blocks[0];
#pragma unroll
    for (int b = 1; b < BLOCKS_PER_TILE; ++b) block = j == b ? blocks[b] : block;
    return block;
  };
  auto load_tile = [&](int stage, int p0, const int (&blocks)[BLOCKS_PER_TILE]) {
    const unsigned k_dst = tiles_addr + stage * 2 * TILE_BYTES, v_dst = k_dst + TILE_BYTES;
    const int rows_left = L - p0 - copy_n;  // copy i is valid when i * ROWS_PER_PASS < rows_left
#pragma unroll
    for (int i = 0; i < LOADS_PER_THREAD; ++i) {
      const int step = i * ROWS_PER_PASS;
      const long long block =
          ROWS_PER_PASS <= BLOCK_SIZE ? blocks[step / BLOCK_SIZE] : pick(blocks, copy_block + step / BLOCK_SIZE);
      const int slot_step = ROWS_PER_PASS <= BLOCK_SIZE ? step % BLOCK_SIZE : 0;
      const bool valid = step < rows_left;
      const unsigned dst = copy_dst + step * 128;
      cp_async_16_at(k_dst + dst, k_thread + block * k_stride_block + slot_step * k_stride_slot, valid);
      cp_async_16_at(v_dst + dst, v_thread + block * v_stride_block + slot_step * v_stride_slot, valid);
    }
  };

  // rows of this thread, and of its warpgroup (for whole-tile and skip tests)
  const int row_lo = warp * 16 + g, row_hi = row_lo + 8;
  const int pq_min = L - q_len + (token_start - query_start_loc[seq]);  // p_q of the CTA's first token
  const int wg_first_row = 64 * wg, wg_last_row = min(64 * wg + 63, num_rows - 1);
  const int wg_pq_lo = pq_min + wg_first_row / num_groups;                    // first row's p_q
  const int wg_pq_hi = pq_min + max(wg_last_row, 0) / num_groups;  // last valid row's p_q
  const bool plain = softcap <= 0.f && !has_alibi;  // scores are scale * q.k, nothing added
  float m_i[2] = {PA_NEG_INF, PA_NEG_INF};
  float l_i[2] = {0.f, 0.f};  // this thread's share of l; summed over the quad in the epilogue
  float o[O_REGS];
#pragma unroll
  for (int j = 0; j < O_REGS; ++j) o[j] = 0.f;
  const int num_tiles = kv_end > kv_begin ? (kv_end - kv_begin + TILE_N - 1) / TILE_N : 0;
  int blocks[BLOCKS_PER_TILE];             // of the next tile to load
  int blocks_after[BLOCKS_PER_TILE] = {};  // of the tile after it

  // -- scale, softcap, ALiBi, mask (replace, never add); update m_i, l_i; P = exp2(s - m) as
  //    16-bit A fragments of P V; alpha rescales O (the caller applies it)
  auto softmax_tile = [&](float (&s)[S_REGS], int p0, unsigned (&p_frag)[PV_STEPS][4], float (&alpha)[2]) {
    float m_ij[2] = {PA_NEG_INF, PA_NEG_INF};
    const bool whole = p0 + TILE_N <= L && (!causal || p0 + TILE_N - 1 <= wg_pq_lo) &&
                       (sliding_window <= 0 || p0 > wg_pq_hi - sliding_window);
    // every row of the warpgroup sees every key of the tile, and the scores are scale * q.k
    // with scale > 0: no mask, the row max taken on the raw products (scaling keeps the order),
    // and P = exp2(s * scale * log2 e - m) one FFMA and one ex2 below. The FFMA leaves the max
    // key's own weight exp2 of its product's rounding error (half an ulp of m): kept while that
    // is at most 2^-5 (|m| < 2^19 in log2 units); a warp holding larger scores (beyond float32's
    // exp range at 2^32: inf or 0) takes the masked path's rounded scores instead
    const float score_log2 = scale * LOG2E;  // raw product -> log2 units (fast path)
    bool fast = plain && whole && scale > 0.f;
    if (fast) {
      m_ij[0] = row_reduce<true>(s, 0);
      m_ij[1] = row_reduce<true>(s, 1);
      fast = __all_sync(0xffffffffu, fabsf(m_ij[0] * score_log2) < FAST_SCORE_LIMIT &&
                                         fabsf(m_ij[1] * score_log2) < FAST_SCORE_LIMIT);
    }
    if (!fast) {
      m_ij[0] = m_ij[1] = PA_NEG_INF;
#pragma unroll
      for (int e = 0; e < S_REGS; ++e) {
        const int half = (e / 2) % 2;
        const int r = half == 0 ? row_lo : row_hi;
        const int p = p0 + 8 * (e / 4) + 2 * tig + (e & 1);
        s[e] = masked_score_log2<false>(s[e], p, p_q[r], slope[r], row_valid[r], L,
                                        scale, softcap, has_alibi, causal, sliding_window);
        m_ij[half] = fmaxf(m_ij[half], s[e]);
      }
    }
    float m_safe[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      m_ij[half] = fmaxf(m_ij[half], __shfl_xor_sync(0xffffffffu, m_ij[half], 1));
      m_ij[half] = fmaxf(m_ij[half], __shfl_xor_sync(0xffffffffu, m_ij[half], 2));
      if (fast) m_ij[half] *= score_log2;
      const float m_new = fmaxf(m_i[half], m_ij[half]);
      m_safe[half] = m_new == PA_NEG_INF ? 0.f : m_new;  // an all-masked row keeps p = 0
      alpha[half] = exp2_ftz(m_i[half] - m_safe[half]);
      m_i[half] = m_new;
      l_i[half] *= alpha[half];
    }
    if (fast) {
#pragma unroll
      for (int e = 0; e < S_REGS; ++e) s[e] = exp2_ftz(fmaf(s[e], score_log2, -m_safe[(e / 2) % 2]));
    } else {
#pragma unroll
      for (int e = 0; e < S_REGS; ++e) s[e] = exp2_ftz(s[e] - m_safe[(e / 2) % 2]);
    }
    l_i[0] += row_reduce<false>(s, 0);
    l_i[1] += row_reduce<false>(s, 1);
#pragma unroll
    for (int kk = 0; kk < PV_STEPS; ++kk) {
#pragma unroll
      for (int a = 0; a < 4; ++a) p_frag[kk][a] = Mma::pack(s[8 * kk + 2 * a], s[8 * kk + 2 * a + 1]);
    }
  };
  // -- issue S = Q K^T on the K tile `stage_bytes` past stage 0's (K-major B: panel kk / 4,
  //    32 bytes per k-step inside it). Every warpgroup
  //    computes every tile (a branch around wgmma makes ptxas serialise them, warning C7518);
  //    rows that see none of it are masked. The A fragments (Q rows 16 * warp ..) are read from
  //    shared memory for every tile: held in registers across the loop, ptxas 13.0 gave them
  //    to other values inside the loop at head_dim 64 (the SASS read P of the previous tile as
  //    Q from the second tile on), which the H200 check caught as wrong output.
  const unsigned q_ld_row = smem_address(q_tile) + (warp * 16 + (lane % 8) + 8 * ((lane / 8) % 2)) * CHUNKS_PER_ROW * 16;
  // descriptors of stage 0's K tile and of this warpgroup's 64 Q rows (8 swizzle atoms into
  // each panel of ROWS * 128 bytes), made once: each wgmma's is one of them plus a constant
  const unsigned long long k_desc0 = wgmma_desc(tiles_addr, 16, 1024);
  const unsigned long long q_desc0 = wgmma_desc(smem_address(q_tile) + wg * 64 * 128, 16, 1024);
  auto issue_qk = [&](float (&s)[S_REGS], unsigned stage_bytes) {
    if constexpr (Q_SHARED) {
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < K_STEPS; ++kk) {
        Wg::m64n64_ss(s, wgmma_desc_plus(q_desc0, (kk / 4) * (ROWS * 128) + (kk % 4) * 32),
                      wgmma_desc_plus(k_desc0, stage_bytes + (kk / 4) * PANEL_BYTES + (kk % 4) * 32), kk > 0);
      }
      return;
    }
    unsigned q_frag[K_STEPS][4];
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk) ldmatrix_x4_at(q_frag[kk], q_ld_row + (((2 * kk + lane / 16) ^ (lane % 8)) << 4));
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < K_STEPS; ++kk)
      Wg::template m64n64<0>(s, q_frag[kk], wgmma_desc_plus(k_desc0, stage_bytes + (kk / 4) * PANEL_BYTES + (kk % 4) * 32),
                             kk > 0);
  };
  // -- O += P V on the V tile `stage_bytes` past stage 0's (MN-major B: 8-key groups 1,024
  //    bytes apart, 64-column panels PANEL_BYTES apart; 16 keys = 2,048 bytes per k-step).
  const unsigned long long v_desc0 = wgmma_desc(tiles_addr + TILE_BYTES, PANEL_BYTES, 1024);
  auto issue_pv = [&](const unsigned (&p_frag)[PV_STEPS][4], unsigned stage_bytes) {
#pragma unroll
    for (int kk = 0; kk < PV_STEPS; ++kk) {
      const unsigned long long desc = wgmma_desc_plus(v_desc0, stage_bytes + kk * 2048);
      if constexpr (HEAD_DIM == 128) Wg::template m64n128<1>(o, p_frag[kk], desc, 1);
      else Wg::template m64n64<1>(o, p_frag[kk], desc, 1);
    }
  };
  // -- copies of tile `next` into its stage (an empty group past the last tile)
  auto load_next = [&](int next) {
    if (next + 1 < num_tiles) fetch_blocks(next + 1, blocks_after);
    if (next < num_tiles) load_tile(next % STAGES, kv_begin + next * TILE_N, blocks);
    cp_async_commit();
#pragma unroll
    for (int b = 0; b < BLOCKS_PER_TILE; ++b) blocks[b] = blocks_after[b];
  };
  auto stage_bytes = [&](int tile) { return (unsigned)((tile % STAGES) * 2 * TILE_BYTES); };
  // -- O *= alpha, skipped when no row of the warp has a new maximum (alpha == 1 exactly: most
  //    tiles of a long row)
  auto rescale_o = [&](const float (&alpha)[2]) {
    if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
      for (int j = 0; j < O_REGS; ++j) o[j] *= alpha[(j / 2) % 2];
    }
  };

  // ---- K/V tiles 0 .. AHEAD - 1 in flight (Q's copies went first: the first iteration's wait
  //      covers them)
  if (num_tiles > 0) fetch_blocks(0, blocks);
#pragma unroll
  for (int i = 0; i < AHEAD; ++i) load_next(i);

  // ---- inner loop over tiles. Serial schedule (!OVERLAP): S_i, softmax, P_i V_i, one after the
  //      other in each warpgroup (the other warpgroup's products fill the gaps); tile i + AHEAD
  //      loads meanwhile into the stage read in iteration i - 1. OVERLAP: P_i V_i is left
  //      running, so it runs while the warpgroup passes the next barrier, issues the next
  //      tile's copies and S_{i+1} = Q K_{i+1} (the tensor cores take them in order; the other
  //      warpgroup's softmax fills the gap); tile i + AHEAD loads into the stage of tile i - 2,
  //      whose P V both warpgroups waited for in step i - 1. (Issuing S_{i+1} before P_i V_i,
  //      FlashAttention-3's order, made ptxas serialise the wgmmas: the moves into O's tied
  //      registers land between the two, warning C7513.)
  unsigned p_frag[PV_STEPS][4];  // P of tile i (OVERLAP: read by its P V until the next wait)
  for (int i = 0; i < num_tiles; ++i) {
    cp_async_wait<AHEAD - 1>();  // tile i has landed (this thread's copies)
    fence_proxy_async();         // ... and is visible to the tensor cores' reads
    __syncthreads();             // every thread's copies; the stage tile i + AHEAD loads into is free
    float s[S_REGS];
    issue_qk(s, stage_bytes(i));
    wgmma_commit();
    load_next(i + AHEAD);
    wgmma_wait<0>();  // S_i (OVERLAP: and P_{i-1} V_{i-1} before it)
    if constexpr (OVERLAP) {
      wgmma_keep(p_frag);
      wgmma_touch(o);
    }
    wgmma_touch(s);
    float alpha[2];
    softmax_tile(s, kv_begin + i * TILE_N, p_frag, alpha);
    rescale_o(alpha);
    wgmma_touch(o);
    wgmma_fence();
    issue_pv(p_frag, stage_bytes(i));
    wgmma_commit();
    if constexpr (!OVERLAP) {
      wgmma_wait<0>();
      wgmma_touch(o);
    }
  }
  if constexpr (OVERLAP) {
    wgmma_wait<0>();
    wgmma_keep(p_frag);
    wgmma_touch(o);
  }
  cp_async_wait<0>();

  // ---- epilogue: l over the quad, O / l, lse = m + log l
  float inv_l[2], lse_final[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float l = l_i[half];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    inv_l[half] = l != 0.f ? 1.f / l : 0.f;
    lse_final[half] = l != 0.f ? m_i[half] * LN2 + logf(l) : PA_NEG_INF;
  }
  if (partial >= 0) {  // (the same for every thread of the CTA) a split range: float32 partials
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = half == 0 ? row_lo : row_hi;
      if (r >= num_rows) continue;
#pragma unroll
      for (int j = 0; j < HEAD_DIM / 8; ++j) {
        float* dst = partial_out + ((long long)partial * ROWS + r) * HEAD_DIM + 8 * j + 2 * tig;
        dst[0] = o[4 * j + 2 * half] * inv_l[half];
        dst[1] = o[4 * j + 2 * half + 1] * inv_l[half];
      }
      if (tig == 0) partial_lse[(long long)partial * ROWS + r] = lse_final[half];
    }
    PAGED_ATTENTION_MERGE_IF_LAST(ROWS, HEAD_DIM, WGMMA_THREADS);
    return;
  }
  // O / l rounded to T, staged in shared memory (the K/V stages, free once both warpgroups'
  // last P V has read them) in rows of OUT_STRIDE elements (the pad puts a warp's 4-byte writes
  // on 32 distinct banks), then written to out 16 bytes a thread: whole rows, coalesced.
  constexpr int OUT_STRIDE = HEAD_DIM + 8;
  static_assert(ROWS * OUT_STRIDE * 2 <= STAGES * 2 * TILE_BYTES, "the output tile fits the K/V stages");
  T* staged = reinterpret_cast<T*>(tiles);
  __syncthreads();
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = half == 0 ? row_lo : row_hi;
#pragma unroll
    for (int j = 0; j < HEAD_DIM / 8; ++j) {
      *reinterpret_cast<unsigned*>(staged + r * OUT_STRIDE + 8 * j + 2 * tig) =
          Mma::pack(o[4 * j + 2 * half] * inv_l[half], o[4 * j + 2 * half + 1] * inv_l[half]);
    }
    if (tig == 0 && r < num_rows) {
      const long long t = token_start + r / num_groups;
      lse[t * num_q_heads + kv_head * group_size + group_start + r % num_groups] = lse_final[half];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < ROWS * CHUNKS_PER_ROW; idx += THREADS) {
    const int r = idx / CHUNKS_PER_ROW, c = idx % CHUNKS_PER_ROW;
    if (r >= num_rows) break;  // rows grow with idx
    const long long t = token_start + r / num_groups;
    const int h = kv_head * group_size + group_start + r % num_groups;
    *reinterpret_cast<uint4*>(out + (t * num_q_heads + h) * HEAD_DIM + c * 8) =
        *reinterpret_cast<const uint4*>(staged + r * OUT_STRIDE + c * 8);
  }
}

// Layout check of one warpgroup's wgmma products against the host (the Hopper kernel's gpu tests run it first):
// S = Q K^T (64 x 64, K-major K) and O = P V (64 x HEAD_DIM, MN-major V) for one 64-row Q,
// 64-key K and V and a 64 x 64 P, all of T; K and V staged exactly as paged_attention_wgmma
// stages them, the A fragments of Q and P read straight from global memory (the m16n8k16 A
// layout: registers 0..3 = rows g, g + 8, g, g + 8 at columns 2 * tig (+ 8 for 2 and 3)).
// 128 threads; s_out float32 [64, 64], o_out float32 [64, HEAD_DIM].
template <typename T, int HEAD_DIM>
__global__ void __launch_bounds__(128) wgmma_layout_check(const T* __restrict__ q, const T* __restrict__ k,
                                                          const T* __restrict__ p, const T* __restrict__ v,
                                                          float* __restrict__ s_out, float* __restrict__ o_out) {
  constexpr int CHUNKS_PER_ROW = HEAD_DIM / 8;
  constexpr int TILE_BYTES = 64 * HEAD_DIM * 2;
  __shared__ __align__(1024) unsigned char buffer[1024 + 2 * TILE_BYTES];
  const unsigned base = smem_address(buffer);
  const unsigned pad = (1024u - (base & 1023u)) & 1023u;
  unsigned char* k_tile = buffer + pad;
  unsigned char* v_tile = k_tile + TILE_BYTES;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tig = lane % 4;
  for (int idx = threadIdx.x; idx < 64 * CHUNKS_PER_ROW; idx += 128) {
    const int n = idx / CHUNKS_PER_ROW, c = idx % CHUNKS_PER_ROW;
    cp_async_16(k_tile + wgmma_tile_offset<64>(n, c), k + n * HEAD_DIM + c * 8, true);
    cp_async_16(v_tile + wgmma_tile_offset<64>(n, c), v + n * HEAD_DIM + c * 8, true);
  }
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  // A fragment of rows 16 * warp .. of a row-major matrix with `cols` columns, k-step kk
  auto fragment = [&](const T* m, int cols, int kk, unsigned (&a)[4]) {
    const unsigned* words = reinterpret_cast<const unsigned*>(m);
    const int r0 = warp * 16 + g, c0 = 16 * kk + 2 * tig;
    a[0] = words[(r0 * cols + c0) / 2];
    a[1] = words[((r0 + 8) * cols + c0) / 2];
    a[2] = words[(r0 * cols + c0 + 8) / 2];
    a[3] = words[((r0 + 8) * cols + c0 + 8) / 2];
  };
  const unsigned k_addr = base + pad, v_addr = k_addr + TILE_BYTES;
  float s[32];
  float o[HEAD_DIM / 2];
  for (int j = 0; j < 32; ++j) s[j] = 0.f;
  for (int j = 0; j < HEAD_DIM / 2; ++j) o[j] = 0.f;
  unsigned a[HEAD_DIM / 16][4];
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk) fragment(q, HEAD_DIM, kk, a[kk]);
  wgmma_touch(s);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < HEAD_DIM / 16; ++kk)
    Wgmma<T>::template m64n64<0>(s, a[kk], wgmma_desc(k_addr + (kk / 4) * 64 * 128 + (kk % 4) * 32, 16, 1024), 1);
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_touch(s);
  unsigned b[4][4];
  for (int kk = 0; kk < 4; ++kk) fragment(p, 64, kk, b[kk]);
  wgmma_touch(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const unsigned long long desc = wgmma_desc(v_addr + kk * 2048, 64 * 128, 1024);
    if constexpr (HEAD_DIM == 128) Wgmma<T>::template m64n128<1>(o, b[kk], desc, 1);
    else Wgmma<T>::template m64n64<1>(o, b[kk], desc, 1);
  }
  wgmma_commit();
  wgmma_wait<0>();
  wgmma_touch(o);
  for (int e = 0; e < 32; ++e) {
    const int row = warp * 16 + g + 8 * ((e / 2) % 2), col = 8 * (e / 4) + 2 * tig + (e & 1);
    s_out[row * 64 + col] = s[e];
  }
  for (int e = 0; e < HEAD_DIM / 2; ++e) {
    const int row = warp * 16 + g + 8 * ((e / 2) % 2), col = 8 * (e / 4) + 2 * tig + (e & 1);
    o_out[row * HEAD_DIM + col] = o[e];
  }
}
