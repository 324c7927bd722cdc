// Context-parallel layouts (context_parallel.hpp): the zigzag as a Layout is the chunk rule; the
// attention calls of every block (block_calls) cover each (query, key) pair that the mask leaves
// visible exactly once, at the right global positions, and skip every block and square in which no
// query sees a key (documents, windows, both, on the zigzag and on random granule layouts); the
// balanced layout evens out the attention work (rank_load) where the zigzag does not.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "parallel/context_parallel.hpp"

namespace parallel {
namespace {

// doc_start [b, S] of documents with the given lengths, row e rotated by e * 7 documents' worth.
Tensor doc_starts(const std::vector<int64_t>& lengths, int64_t b, int64_t S) {
  Tensor ds = Tensor::empty({b, S}, DType::I32);
  int32_t* out = ds.data<int32_t>();
  for (int64_t e = 0; e < b; ++e) {
    std::vector<int64_t> l = lengths;
    std::rotate(l.begin(), l.begin() + (e * 7) % static_cast<int64_t>(l.size()), l.end());
    int64_t p = 0;
    for (int64_t n : l)
      for (int64_t i = 0; i < n && p < S; ++i, ++p) out[e * S + p] = static_cast<int32_t>(p - i);
    for (; p < S; ++p) out[e * S + p] = out[e * S + p - 1];
  }
  return ds;
}

// The global position of local row r of `rank`.
int64_t position_of(const cp::Layout& layout, int rank, int64_t r) {
  for (const cp::Segment& run : layout.runs(rank))
    if (r >= run.row && r < run.row + run.rows) return run.position + (r - run.row);
  ADD_FAILURE() << "row " << r << " of rank " << rank << " in no run";
  return -1;
}

bool visible(const int32_t* ds, int64_t b, int64_t S, int64_t window, int64_t p, int64_t t) {
  if (t > p) return false;
  if (window > 0 && t <= p - window) return false;
  if (ds == nullptr) return true;
  for (int64_t e = 0; e < b; ++e)
    if (t >= ds[e * S + p]) return true;
  return false;
}

// Every block of `layout`: calls lie in runs at their stated positions, cover every visible pair
// exactly once, and none (nor any block with calls) is without a visible pair. Returns the blocks skipped.
int check_blocks(const cp::Layout& layout, int64_t window, const Tensor& doc_start) {
  const int c = layout.cp_size();
  const int64_t n = layout.local_length(), S = layout.seq();
  const int32_t* ds = doc_start.defined() ? doc_start.data<int32_t>() : nullptr;
  const int64_t b = doc_start.defined() ? doc_start.size(0) : 1;
  int skipped = 0;
  for (int i = 0; i < c; ++i)
    for (int j = 0; j < c; ++j) {
      std::vector<int> covered(static_cast<std::size_t>(n * n), 0);
      const std::vector<cp::BlockCall> calls = cp::block_calls(layout, i, j, window, doc_start);
      skipped += calls.empty();
      for (const cp::BlockCall& call : calls) {
        EXPECT_TRUE(call.causal);
        bool any = false;
        for (int64_t a = 0; a < call.n; ++a) {
          EXPECT_EQ(position_of(layout, i, call.q0 + a), call.q_pos + a) << "query row " << call.q0 + a;
          EXPECT_EQ(position_of(layout, j, call.k0 + a), call.k_pos + a) << "key row " << call.k0 + a;
          for (int64_t k = 0; k < call.n; ++k) {
            ++covered[static_cast<std::size_t>((call.q0 + a) * n + call.k0 + k)];
            any = any || visible(ds, b, S, window, call.q_pos + a, call.k_pos + k);
          }
        }
        EXPECT_TRUE(any) << "a call with no visible pair, block " << i << " " << j;
      }
      for (int64_t r = 0; r < n; ++r)
        for (int64_t k = 0; k < n; ++k) {
          const int count = covered[static_cast<std::size_t>(r * n + k)];
          const bool v = visible(ds, b, S, window, position_of(layout, i, r), position_of(layout, j, k));
          EXPECT_LE(count, 1) << "block " << i << " " << j << " pair " << r << " " << k << " computed twice";
          if (v)
            EXPECT_EQ(count, 1) << "block " << i << " " << j << " visible pair " << r << " " << k
                                << " missed";
        }
    }
  return skipped;
}

TEST(CpLayout, ZigzagIsTheChunkRule) {
  for (int c : {1, 2, 3, 4}) {
    const int64_t S = 24 * c;
    const cp::Layout layout = cp::Layout::zigzag(S, c);
    EXPECT_TRUE(layout.is_zigzag());
    std::vector<int32_t> values(static_cast<std::size_t>(2 * S));
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i * 3 + 1);
    const Tensor samples = Tensor::from_vector(values, {2, S});
    for (int r = 0; r < c; ++r) {
      EXPECT_EQ(layout.slice(samples, r).to_float_vector(),
                cp::slice_sequence(samples, r, c).to_float_vector());
      for (int64_t row0 : {int64_t{0}, int64_t{5}, S / c - 7})
        for (int64_t rows : {int64_t{0}, int64_t{3}, int64_t{7}}) {
          const auto a = layout.segments(r, row0, rows), b = cp::segments(S / c, r, c, row0, rows);
          // The zigzag layout joins rank c-1's two adjacent chunks into one run.
          std::vector<int64_t> pa, pb;
          for (const auto& s : a)
            for (int64_t k = 0; k < s.rows; ++k) pa.push_back(s.position + k);
          for (const auto& s : b)
            for (int64_t k = 0; k < s.rows; ++k) pb.push_back(s.position + k);
          EXPECT_EQ(pa, pb) << "cp " << c << " rank " << r << " rows " << row0 << " + " << rows;
        }
    }
  }
}

TEST(CpLayout, BlockCallsCoverEveryVisiblePairOnce) {
  std::mt19937 gen(5);
  const std::vector<int64_t> docs = {40, 3, 1, 70, 9, 17, 2, 33, 5, 12, 60, 4, 8};
  for (int c : {2, 3, 4}) {
    const int64_t S = 48 * c;
    const Tensor ds = doc_starts(docs, 2, S);
    std::vector<cp::Layout> layouts{cp::Layout::zigzag(S, c)};
    for (int trial = 0; trial < 3; ++trial) {  // random granules of 4, 8 and 12 tokens
      const int64_t granule = 4 * (trial + 1), n = S / granule;
      std::vector<int64_t> order(static_cast<std::size_t>(n));
      for (int64_t g = 0; g < n; ++g) order[static_cast<std::size_t>(g)] = g;
      std::shuffle(order.begin(), order.end(), gen);
      std::vector<std::vector<int64_t>> granules(static_cast<std::size_t>(c));
      for (int64_t g = 0; g < n; ++g) granules[static_cast<std::size_t>(g % c)].push_back(order[g]);
      layouts.emplace_back(S, c, granule, granules);
    }
    for (const cp::Layout& layout : layouts)
      for (int64_t window : {0, 5, 30})
        for (bool documents : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "cp " << c << " granule " << layout.granule() << " window "
                                            << window << " documents " << documents);
          if (layout.is_zigzag() && window == 0 && !documents)
            continue;  // local-row calls: test_context_parallel
          check_blocks(layout, window, documents ? ds : Tensor());
        }
  }
}

// A window shorter than a chunk: the ring skips the blocks outside it (zigzag, each exchange's
// blocks are the same), and the documents skip more.
TEST(CpLayout, WindowSkipsBlocks) {
  const cp::Layout layout = cp::Layout::zigzag(512, 4);  // chunks of 64
  // Chunks i, 7 - i against j, 7 - j: no two adjacent for (0, 2), (0, 3), (1, 3) and back.
  EXPECT_EQ(check_blocks(layout, 16, Tensor()), 6);
  EXPECT_GT(check_blocks(layout, 0, doc_starts({50, 30, 20}, 1, 512)), 0);
}

TEST(CpLayout, BalancedLayoutEvensOutOneLongDocument) {
  for (int c : {2, 4, 8}) {
    const int64_t S = 4096;
    std::vector<int64_t> docs;
    for (int k = 0; k < 64; ++k) docs.push_back(16 + (k * 37) % 48);  // 64 short ones, 2512 tokens
    int64_t sum = 0;
    for (int64_t d : docs) sum += d;
    docs.push_back(S - sum);  // then one long document
    const Tensor ds = doc_starts(docs, 1, S);
    const std::vector<cp::LayerMix> mix{{0, 1.0}};
    const auto ratio = [&](const cp::Layout& l) {
      const std::vector<double> load = cp::rank_load(l, ds, mix);
      double total = 0, top = 0;
      for (double x : load) total += x, top = std::max(top, x);
      return top * c / total;
    };
    const cp::Layout balanced = cp::balanced_layout(ds, S, c, mix);
    EXPECT_GT(ratio(cp::Layout::zigzag(S, c)), 1.3) << "cp " << c;
    EXPECT_LE(ratio(balanced), 1.02) << "cp " << c;
    EXPECT_GE(balanced.granule(), 32);
    for (int r = 0; r < c; ++r) {
      int64_t rows = 0;
      for (const cp::Segment& run : balanced.runs(r)) rows += run.rows;
      EXPECT_EQ(rows, S / c);
    }
    // Plain causal attention is balanced by the zigzag, which it keeps.
    EXPECT_TRUE(cp::balanced_layout(Tensor(), S, c, mix).is_zigzag());
  }
}

TEST(CpLayout, WhenTheBalancedLayoutApplies) {
  ParallelConfig p;
  ModelConfig m;
  p.context = 2;
  EXPECT_TRUE(cp::uses_balanced_layout(p, m, true));
  EXPECT_FALSE(cp::uses_balanced_layout(p, m, false));
  m.sliding_window = 64;
  EXPECT_TRUE(cp::uses_balanced_layout(p, m, false));
  p.context_comm = ContextComm::A2A;  // heads split: balanced whatever the layout
  EXPECT_FALSE(cp::uses_balanced_layout(p, m, true));
  p.context_layout = ContextLayout::Balanced;
  EXPECT_TRUE(cp::uses_balanced_layout(p, m, true));
  p.context_layout = ContextLayout::Zigzag;
  p.context_comm = ContextComm::P2P;
  EXPECT_FALSE(cp::uses_balanced_layout(p, m, true));
  p.context = 1;
  p.context_layout = ContextLayout::Balanced;
  EXPECT_FALSE(cp::uses_balanced_layout(p, m, true));
}

}  // namespace
}  // namespace parallel
