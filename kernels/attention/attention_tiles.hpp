#pragma once
// The mask of include/parallel/attention_mask.hpp in a kernel's own row indices, and the ranges of
// rows a tile of the other side can see: what every CUDA attention kernel (flash_attention.cu,
// flash_attention_mma.cu, attention_plain.cu) uses to apply the mask and to skip empty tiles.
// Host and device functions without CUDA headers, so that they are unit-tested on the CPU
// (tests/unit/test_attention_launch.cpp, with doc_start in host memory).
//
// Query row i of a call (position q_pos0 + i) sees key row j (position k_pos0 + j) iff
// first_key(i) <= j < end_key(i). The ranges below assume what the contract implies: lo(b, p) is
// non-decreasing in p (a window's start moves with p; documents are contiguous, so the first
// position of p's document never decreases). Hence the keys any row of [i0, i1) sees lie in
// [first_key(i0), end_key(i1 - 1)), and the rows that see a key of [j0, j1) are one range too.
#include <cstdint>

#include "parallel/attention_mask.hpp"

#if defined(__CUDACC__)
#define PARALLEL_TILE_HD __host__ __device__ __forceinline__
#else
#define PARALLEL_TILE_HD inline
#endif

namespace parallel::kernels {

// [begin, end). An empty range is {0, 0}, so that a loop over the tiles of [begin / tile * tile, end)
// visits none (an empty {70, 70} would still cover the tile holding row 70).
struct RowRange {
  int64_t begin = 0, end = 0;
};

// The first key row query row i of batch element b sees (0 when nothing masks from below).
PARALLEL_TILE_HD int64_t first_key(const AttentionBounds& m, int64_t b, int64_t i) {
  if (!m.causal) return 0;
  const int64_t l = m.lo(b, m.q_pos0 + i) - m.k_pos0;
  return l > 0 ? l : 0;
}

// One past the last key row query row i sees, within [0, s].
PARALLEL_TILE_HD int64_t end_key(const AttentionBounds& m, int64_t i, int64_t s) {
  if (!m.causal) return s;
  const int64_t e = m.q_pos0 + i - m.k_pos0 + 1;
  return e < 0 ? 0 : (e > s ? s : e);
}

// The causal diagonal as an offset: key j is past query i's diagonal iff j > i + diagonal. Clamped
// to [-(s + 1), s + 1], which keeps every comparison for 0 <= i, j < s and fits an int.
PARALLEL_TILE_HD int64_t causal_diagonal(const AttentionBounds& m, int64_t s) {
  const int64_t off = m.q_pos0 - m.k_pos0;
  return off < -(s + 1) ? -(s + 1) : (off > s + 1 ? s + 1 : off);
}

// Key rows seen by any of query rows [i0, i1) (0 <= i0 < i1 <= s).
PARALLEL_TILE_HD RowRange keys_seen(const AttentionBounds& m, int64_t b, int64_t i0, int64_t i1, int64_t s) {
  const RowRange r{first_key(m, b, i0), end_key(m, i1 - 1, s)};
  return r.end > r.begin ? r : RowRange{};
}

// Query rows that see any of key rows [j0, j1) (0 <= j0 < j1 <= s): from the first row whose
// diagonal reaches j0 to the last whose first key is at most j1 - 1 (found by bisection: a prefix
// of the rows from there on, first_key being non-decreasing).
PARALLEL_TILE_HD RowRange queries_seeing(const AttentionBounds& m, int64_t b, int64_t j0, int64_t j1,
                                         int64_t s) {
  if (!m.causal) return {0, s};
  int64_t begin = j0 + m.k_pos0 - m.q_pos0;
  begin = begin < 0 ? 0 : (begin > s ? s : begin);
  int64_t lo = begin, hi = s;  // the first row in [begin, s) with first_key > j1 - 1, else s
  if (!m.plain()) {
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (first_key(m, b, mid) > j1 - 1)
        hi = mid;
      else
        lo = mid + 1;
    }
  }
  return hi > begin ? RowRange{begin, hi} : RowRange{};
}

// Why a mask is refused, or nullptr: documents and windows are defined on top of causal masking
// (attention_mask.hpp), and a negative window means nothing.
inline const char* attention_bounds_error(const AttentionBounds& m) {
  if (m.window < 0) return "attention mask: window must be >= 0 (0: no window)";
  if (!m.causal && !m.plain()) return "attention mask: documents and windows need causal masking";
  if (m.doc_start != nullptr && m.doc_stride < 0) return "attention mask: doc_stride must be >= 0";
  return nullptr;
}

}  // namespace parallel::kernels

#undef PARALLEL_TILE_HD
