#pragma once
// What the CPU attention kernels share (attention.cpp: fp32 tiles; attention_bf16.cpp: bf16 tiles
// on AVX512-BF16 dot products): the tile sizes, the shape bookkeeping and the fp32 row operations
// of the online softmax and its backward. Both kernels keep the scores and probabilities of a tile
// in fp32; they differ only in the products around them.
#include <algorithm>
#include <cstdint>

#include "parallel/attention_mask.hpp"
#include "parallel/tensor.hpp"

namespace parallel::cpu::attention_tiles {

// 64 x 64 tiles: a score tile is 16 KiB, so the tile, the packed key block and a 64-row
// accumulator stay in L2 together for d up to 128.
constexpr int64_t kBr = 64;  // query rows per tile
constexpr int64_t kBc = 64;  // keys per tile

// Layouts: q, dq [s, b, hq, d]; k, dk [s, b, hkv, d]; v, dv [s, b, hkv, dv]; out, dout
// [s, b, hq, dv]; lse [b, hq, s]. d is the query/key head size, dv the value (and output) head size
// (equal in most models; MLA's differ).
struct Dims {
  int64_t sq, sk, B, hq, hkv, d, group, dv;
};
Dims attention_dims(const Tensor& q, const Tensor& k, const Tensor& v);

// Where the heads of position i, batch element b of an [s, b, heads, e] operand start, in
// elements from its first one: the heads of one (i, b) lie side by side (strides e and 1, checked
// by ops.cpp), while the position and batch strides are the tensor's own. q, k, v, dq, dk and dv
// may thus be views into the fused qkv projection's output [s, b, (hq + 2 hkv) d] (and its
// gradient), read and written in place; out, dout and lse are contiguous.
struct Rows {
  int64_t s = 0, b = 0;  // the position and batch strides
  int64_t at(int64_t i, int64_t bb) const { return i * s + bb * b; }
};
inline Rows rows_of(const Tensor& t) { return {t.strides()[0], t.strides()[1]}; }

// What one call allocates besides its outputs, in 4-byte words: `shared` once (packed operands,
// the backward's row sums) and `per_thread` for each OpenMP thread (tiles, accumulators). The
// kernels size their buffers from these, and the memory plan asks for them (attention_workspace_bytes).
struct Workspace {
  int64_t shared = 0, per_thread = 0;
  int64_t bytes(int threads) const { return 4 * (shared + threads * per_thread); }
};
Workspace fp32_workspace(const Dims& x, bool backward);  // attention.cpp
Workspace bf16_workspace(const Dims& x, bool backward);  // attention_bf16.cpp

// Key rows [lo, hi) that query row i of batch element b sees (attention_mask.hpp): one
// contiguous range, empty (lo == hi) for a row that sees no key of this call.
struct KeyRange {
  int64_t lo = 0, hi = 0;
};
inline KeyRange visible_range(const AttentionBounds& m, int64_t b, int64_t i, int64_t sk) {
  if (!m.causal) return {0, sk};
  const int64_t p = m.q_pos0 + i;
  const int64_t hi = std::clamp<int64_t>(p - m.k_pos0 + 1, 0, sk);
  const int64_t lo = m.plain() ? 0 : std::clamp<int64_t>(m.lo(b, p) - m.k_pos0, 0, hi);
  return {lo, hi};
}

// The ranges of the rows of one query block [i0, i0 + rows) and their union [lo, hi) (empty when
// no row sees a key): the kernels visit only the key tiles that meet the union and, within a
// tile, compute each row over its own range.
struct BlockRanges {
  KeyRange row[kBr];
  int64_t lo = 0, hi = 0;
  bool empty() const { return lo >= hi; }
  // Tile [j0, j0 + cols) as [start, end) in tile columns for row i (end <= start: nothing).
  int64_t start(int64_t i, int64_t j0) const { return std::max<int64_t>(row[i].lo - j0, 0); }
  int64_t end(int64_t i, int64_t j0, int64_t cols) const { return std::min<int64_t>(row[i].hi - j0, cols); }
};
// The backward's per-thread table of every query block's ranges, in 4-byte words, placed at word
// `at` (even, for the 8-byte fields) of a thread's scratch: `ranges_offset(words)` rounds up.
inline int64_t ranges_words(const Dims& x) {
  return (x.sq + kBr - 1) / kBr * static_cast<int64_t>(sizeof(BlockRanges) / 4);
}
inline int64_t ranges_offset(int64_t words) { return (words + 1) / 2 * 2; }

inline void block_ranges(const AttentionBounds& m, int64_t b, int64_t i0, int64_t rows, int64_t sk,
                         BlockRanges& out) {
  out.lo = sk;
  out.hi = 0;
  for (int64_t i = 0; i < rows; i++) {
    out.row[i] = visible_range(m, b, i0 + i, sk);
    if (out.row[i].lo < out.row[i].hi) {
      out.lo = std::min(out.lo, out.row[i].lo);
      out.hi = std::max(out.hi, out.row[i].hi);
    }
  }
}

// s[j] = exp(scale * s[j] - shift) for start <= j < end, 0 for the other j < cols; returns the sum.
// Forward: shift is the running max (unnormalised probabilities); backward: shift is the row's
// lse (the probabilities themselves).
float exp_tile_row(float* __restrict s, int64_t start, int64_t end, int64_t cols, float scale, float shift);

// Max of scale * s[j] over start <= j < end (-inf when the range is empty).
float scaled_row_max(const float* __restrict s, int64_t start, int64_t end, float scale);

// The forward's online softmax over one [rows, cols] score tile S (row stride kBc) of query rows
// i0.. against keys j0..: S becomes the unnormalised probabilities exp(scale * S - m_new), and what
// acc ([rows, d]) and the running sums l accumulated under the old running maxima m is rescaled to
// the new ones (FlashAttention-2's update; the caller then adds P V to acc).
// Row i computes over its own visible range (r), rows that see none of the tile are left as they were.
void online_softmax_tile(float* S, int64_t rows, int64_t cols, const BlockRanges& r, int64_t j0, float scale,
                         float* m, float* l, float* acc, int64_t d);

// Backward: dS = scale * P * (dP - D), in place in dp, for start <= j < end; 0 for the other
// j < cols (the row's masked entries, where P = 0 and dP need not have been computed). The softmax
// scale is folded in here once instead of into both dK and dQ.
void dscores_tile_row(const float* __restrict p, float* __restrict dp, int64_t start, int64_t end,
                      int64_t cols, float scale, float D);

}  // namespace parallel::cpu::attention_tiles
