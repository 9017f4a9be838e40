// The query rows of a work item, as the tensor-core attention kernels set them up.
//
// A work item (planning.build_work) holds num_tokens consecutive query tokens from token_start
// times num_groups consecutive query heads of KV head kv_head from group_start: row r is token
// token_start + r / num_groups and head kv_head * group_size + group_start + r % num_groups.
// Rows from num_rows = num_tokens * num_groups on pad the tile: they read no query
// (zero-filled), see no key and write nothing.
#pragma once

struct ItemRows {
  int token_start, num_groups, num_rows;  // first token, query heads per token, rows not padding
  int kv_head, group_size, group_start;   // the query heads: kv_head * group_size + group_start ...

  __device__ __forceinline__ int token(int r) const { return token_start + r / num_groups; }
  __device__ __forceinline__ int head(int r) const { return kv_head * group_size + group_start + r % num_groups; }
};

// The shared row state of row r: row_valid (not padding), p_q (the row's query position in
// sequence seq: L - q_len + its token's offset from the sequence's first, query_start_loc[seq])
// and slope (its ALiBi slope; 0 without ALiBi and for padding). Each kernel keeps its own
// loop over its rows (mma, wgmma: strided over the CTA; decode: `if (threadIdx.x < DEC_ROWS)`):
// one shared form of that loop changed ptxas' register counts (up to +11 on mma kernels).
__device__ __forceinline__ void set_row_state(const ItemRows& rows, int r, int L, int q_len,
                                              const int* __restrict__ query_start_loc, int seq, int has_alibi,
                                              const float* __restrict__ alibi_slopes, int* row_valid, int* p_q,
                                              float* slope) {
  const int t = rows.token(r);
  const int h = rows.head(r);
  row_valid[r] = r < rows.num_rows;
  p_q[r] = L - q_len + (t - query_start_loc[seq]);
  slope[r] = (has_alibi && r < rows.num_rows) ? alibi_slopes[h] : 0.f;
}

// Chunk c (elements 8c .. 8c + 7 of 16 bits) of row r of query [num_tokens, num_q_heads, HEAD_DIM]
// for cp.async: valid == false for padding rows, whose src stays at the query's base (a cp.async
// with valid == false zero-fills without reading).
template <int HEAD_DIM, typename T>
__device__ __forceinline__ const T* query_chunk(const T* query, const ItemRows& rows, int num_q_heads, int r, int c,
                                                bool& valid) {
  valid = r < rows.num_rows;
  const T* src = query;
  if (valid) {
    const long long t = rows.token(r);
    const int h = rows.head(r);
    src = query + (t * num_q_heads + h) * HEAD_DIM + c * 8;
  }
  return src;
}
