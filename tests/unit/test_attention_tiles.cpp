// The CUDA attention kernels' mask arithmetic (kernels/attention/attention_tiles.hpp) on the CPU,
// against the contract of include/parallel/attention_mask.hpp evaluated pair by pair: each query
// row's visible keys are [first_key, end_key), keys_seen is exactly the keys some row of a query
// tile sees and queries_seeing exactly the rows that see some key of a key tile (the ranges the
// kernels loop over, so a range too small drops work and one too large skips nothing). doc_start
// lives in host memory here; the kernels read it from the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/attention/attention_tiles.hpp"

namespace parallel::kernels {
namespace {

// The contract, literally: position p of batch element b sees position t.
bool sees(const AttentionBounds& m, int64_t b, int64_t p, int64_t t) {
  if (!m.causal) return true;
  if (t > p) return false;
  if (m.window > 0 && t <= p - m.window) return false;
  if (m.doc_start != nullptr && t < m.doc_start[b * m.doc_stride + p]) return false;
  return true;
}

// doc_start [b, S] for documents of the given lengths (each row the same), row stride `stride`.
std::vector<int32_t> doc_starts(const std::vector<int64_t>& lengths, int64_t batch, int64_t stride) {
  std::vector<int32_t> out(static_cast<std::size_t>(batch * stride), 0);
  for (int64_t b = 0; b < batch; b++) {
    int64_t p = 0;
    for (int64_t len : lengths) {
      for (int64_t i = 0; i < len; i++)
        out[static_cast<std::size_t>(b * stride + p + i)] = static_cast<int32_t>(p);
      p += len;
    }
  }
  return out;
}

// Checks every row and every tile of a call of s rows at (q_pos0, k_pos0) against the contract.
void check(const AttentionBounds& m, int64_t batch, int64_t s) {
  SCOPED_TRACE(::testing::Message() << "causal " << m.causal << " window " << m.window << " docs "
                                    << (m.doc_start != nullptr) << " q_pos0 " << m.q_pos0 << " k_pos0 "
                                    << m.k_pos0 << " s " << s);
  for (int64_t b = 0; b < batch; b++) {
    for (int64_t i = 0; i < s; i++) {
      const int64_t lo = first_key(m, b, i), hi = end_key(m, i, s);
      for (int64_t j = 0; j < s; j++)
        ASSERT_EQ(j >= lo && j < hi, sees(m, b, m.q_pos0 + i, m.k_pos0 + j))
            << "b " << b << " i " << i << " j " << j;
    }
    for (int64_t tile : {1, 7, 16, 64}) {
      for (int64_t i0 = 0; i0 < s; i0 += tile) {
        const int64_t i1 = std::min(s, i0 + tile);
        int64_t lo = s, hi = 0;  // the keys some row of [i0, i1) sees
        for (int64_t i = i0; i < i1; i++)
          for (int64_t j = 0; j < s; j++)
            if (sees(m, b, m.q_pos0 + i, m.k_pos0 + j)) lo = std::min(lo, j), hi = std::max(hi, j + 1);
        const RowRange r = keys_seen(m, b, i0, i1, s);
        if (hi > lo) {
          EXPECT_EQ(r.begin, lo) << "keys of rows [" << i0 << ", " << i1 << ")";
          EXPECT_EQ(r.end, hi) << "keys of rows [" << i0 << ", " << i1 << ")";
        } else {
          EXPECT_TRUE(r.begin == 0 && r.end == 0) << "rows [" << i0 << ", " << i1 << ") see nothing";
        }
      }
      for (int64_t j0 = 0; j0 < s; j0 += tile) {
        const int64_t j1 = std::min(s, j0 + tile);
        int64_t lo = s, hi = 0;  // the rows that see some key of [j0, j1)
        for (int64_t i = 0; i < s; i++)
          for (int64_t j = j0; j < j1; j++)
            if (sees(m, b, m.q_pos0 + i, m.k_pos0 + j)) lo = std::min(lo, i), hi = std::max(hi, i + 1);
        const RowRange r = queries_seeing(m, b, j0, j1, s);
        if (hi > lo) {
          EXPECT_EQ(r.begin, lo) << "rows seeing keys [" << j0 << ", " << j1 << ")";
          EXPECT_EQ(r.end, hi) << "rows seeing keys [" << j0 << ", " << j1 << ")";
        } else {
          EXPECT_TRUE(r.begin == 0 && r.end == 0) << "no row sees keys [" << j0 << ", " << j1 << ")";
        }
      }
    }
  }
}

TEST(AttentionTiles, RangesMatchTheContract) {
  const int64_t S = 150, batch = 2, stride = S + 5;  // a row stride wider than S
  const std::vector<int32_t> docs = doc_starts({40, 1, 63, 30, 16}, batch, stride);
  const int64_t s = 50;  // a context-parallel block: rows at q_pos0, keys at k_pos0
  for (bool use_docs : {false, true})
    for (int64_t window : {int64_t{0}, int64_t{1}, int64_t{17}, int64_t{64}, int64_t{1000}})
      for (int64_t q_pos0 : {int64_t{0}, int64_t{50}, int64_t{100}})
        for (int64_t k_pos0 : {int64_t{0}, int64_t{50}, int64_t{100}}) {
          AttentionBounds m;
          m.window = window;
          m.q_pos0 = q_pos0;
          m.k_pos0 = k_pos0;
          if (use_docs) {
            m.doc_start = docs.data();
            m.doc_stride = stride;
          }
          check(m, batch, s);
        }
  // Whole sequences, causal or not.
  AttentionBounds full;
  full.causal = false;
  check(full, 1, 70);
  AttentionBounds causal;
  check(causal, 1, 70);
  AttentionBounds packed;
  packed.doc_start = docs.data();
  packed.doc_stride = stride;
  packed.window = 20;
  check(packed, batch, S);
}

TEST(AttentionTiles, RandomDocumentsAndWindows) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 40; trial++) {
    const int64_t S = 1 + static_cast<int64_t>(gen() % 120);
    std::vector<int64_t> lengths;
    for (int64_t left = S; left > 0;) {
      const int64_t len = std::min<int64_t>(left, 1 + gen() % 40);
      lengths.push_back(len);
      left -= len;
    }
    const std::vector<int32_t> docs = doc_starts(lengths, 1, S);
    AttentionBounds m;
    m.window = static_cast<int64_t>(gen() % 3 == 0 ? 0 : 1 + gen() % 50);
    m.doc_start = gen() % 4 == 0 ? nullptr : docs.data();
    m.doc_stride = S;
    check(m, 1, S);
  }
}

TEST(AttentionTiles, RowsThatSeeNothingGiveEmptyRanges) {
  // A key block after the query block under causal masking (context parallelism's upper blocks):
  // no row sees any key.
  AttentionBounds m;
  m.q_pos0 = 0;
  m.k_pos0 = 64;
  auto empty = [](RowRange r) { return r.begin == 0 && r.end == 0; };
  EXPECT_TRUE(empty(keys_seen(m, 0, 0, 64, 64)));
  EXPECT_TRUE(empty(queries_seeing(m, 0, 0, 64, 64)));
  // A window that ends before the key block, in a block of 70 rows (no multiple of a tile: an empty
  // range at row 70 would still name a tile).
  m.q_pos0 = 140;
  m.k_pos0 = 0;
  m.window = 32;
  EXPECT_TRUE(empty(keys_seen(m, 0, 0, 70, 70)));
  EXPECT_TRUE(empty(queries_seeing(m, 0, 0, 70, 70)));
}

TEST(AttentionTiles, RefusedMasks) {
  AttentionBounds m;
  EXPECT_EQ(attention_bounds_error(m), nullptr);
  m.window = -1;
  EXPECT_NE(attention_bounds_error(m), nullptr);
  m.window = 8;
  m.causal = false;
  ASSERT_NE(attention_bounds_error(m), nullptr);
  EXPECT_NE(std::string(attention_bounds_error(m)).find("need causal"), std::string::npos);
}

}  // namespace
}  // namespace parallel::kernels
