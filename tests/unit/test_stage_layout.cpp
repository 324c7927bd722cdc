// Layer assignment of pipeline stages against hand-derived tables, and one-line errors for layouts
// that cannot work.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/pipeline.hpp"

namespace parallel::pipeline {
namespace {

// (first_layer, num_layers, pre, post) of each chunk, as a compact string for readable failures.
std::string describe(const std::vector<ChunkSpec>& chunks) {
  std::string out;
  for (const ChunkSpec& c : chunks) {
    out += "[" + std::to_string(c.first_layer) + "," + std::to_string(c.first_layer + c.num_layers) + ")";
    if (c.pre_process) out += "E";
    if (c.post_process) out += "L";
    out += " ";
  }
  return out;
}

std::string layout(int layers, int p, int v, int rank, int first = 0, int last = 0) {
  return describe(stage_layout({layers, p, v, first, last}, rank));
}

TEST(StageLayout, NoPipeline) { EXPECT_EQ(layout(6, 1, 1, 0), "[0,6)EL "); }

TEST(StageLayout, EvenSplit) {
  EXPECT_EQ(layout(8, 2, 1, 0), "[0,4)E ");
  EXPECT_EQ(layout(8, 2, 1, 1), "[4,8)L ");
  EXPECT_EQ(layout(12, 4, 1, 0), "[0,3)E ");
  EXPECT_EQ(layout(12, 4, 1, 1), "[3,6) ");
  EXPECT_EQ(layout(12, 4, 1, 2), "[6,9) ");
  EXPECT_EQ(layout(12, 4, 1, 3), "[9,12)L ");
}

// Chunk c of rank r is global stage c*p + r: rank 0 of 8 layers, p=2, v=2 holds stages 0 and 2.
TEST(StageLayout, Interleaved) {
  EXPECT_EQ(layout(8, 2, 2, 0), "[0,2)E [4,6) ");
  EXPECT_EQ(layout(8, 2, 2, 1), "[2,4) [6,8)L ");
  EXPECT_EQ(layout(8, 4, 2, 0), "[0,1)E [4,5) ");
  EXPECT_EQ(layout(8, 4, 2, 1), "[1,2) [5,6) ");
  EXPECT_EQ(layout(8, 4, 2, 3), "[3,4) [7,8)L ");
  EXPECT_EQ(layout(12, 2, 3, 1), "[2,4) [6,8) [10,12)L ");
}

// V placement (zb-v, dualpipe-v): chunk 0 of rank r is stage r, chunk 1 stage 2p - 1 - r. Rank 0
// holds the first layers with the embedding and the last ones with the loss; rank p - 1 the two
// middle stages.
TEST(StageLayout, VPlacement) {
  const auto v_layout = [](int layers, int p, int rank) {
    return describe(stage_layout({layers, p, 2, 0, 0, Placement::V}, rank));
  };
  EXPECT_EQ(v_layout(8, 2, 0), "[0,2)E [6,8)L ");
  EXPECT_EQ(v_layout(8, 2, 1), "[2,4) [4,6) ");
  EXPECT_EQ(v_layout(8, 4, 0), "[0,1)E [7,8)L ");
  EXPECT_EQ(v_layout(8, 4, 1), "[1,2) [6,7) ");
  EXPECT_EQ(v_layout(8, 4, 3), "[3,4) [4,5) ");
  EXPECT_EQ(v_layout(2, 1, 0), "[0,1)E [1,2)L ");
  for (int p = 1; p <= 8; ++p) {
    std::vector<int> owner(static_cast<std::size_t>(4 * p), -1);
    for (int r = 0; r < p; ++r)
      for (const ChunkSpec& c : stage_layout({4 * p, p, 2, 0, 0, Placement::V}, r))
        for (int l = c.first_layer; l < c.first_layer + c.num_layers; ++l) {
          ASSERT_EQ(owner[static_cast<std::size_t>(l)], -1) << "layer " << l << " twice";
          owner[static_cast<std::size_t>(l)] = r;
        }
    for (int l = 0; l < 4 * p; ++l) EXPECT_NE(owner[static_cast<std::size_t>(l)], -1) << "layer " << l;
  }
}

TEST(StageLayout, ExplicitFirstAndLast) {
  EXPECT_EQ(layers_per_stage({10, 4, 1, 1, 3}), (std::vector<int>{1, 3, 3, 3}));
  EXPECT_EQ(layers_per_stage({10, 4, 1, 4, 0}), (std::vector<int>{4, 2, 2, 2}));
  EXPECT_EQ(layers_per_stage({7, 3, 1, 0, 1}), (std::vector<int>{3, 3, 1}));
  EXPECT_EQ(layers_per_stage({8, 2, 1, 3, 5}), (std::vector<int>{3, 5}));
  EXPECT_EQ(layers_per_stage({8, 2, 1, 3, 0}), (std::vector<int>{3, 5}));
  EXPECT_EQ(layout(10, 4, 1, 0, 1, 3), "[0,1)E ");
  EXPECT_EQ(layout(10, 4, 1, 1, 1, 3), "[1,4) ");
  EXPECT_EQ(layout(10, 4, 1, 3, 1, 3), "[7,10)L ");
}

// Every layer exactly once, in order, for many shapes.
TEST(StageLayout, CoversEveryLayerOnce) {
  for (int p = 1; p <= 8; ++p)
    for (int v = 1; v <= 4; ++v)
      for (int n = p * v; n <= 4 * p * v; n += p * v) {
        std::vector<int> owner(static_cast<std::size_t>(n), -1);
        int pre = 0, post = 0;
        for (int r = 0; r < p; ++r)
          for (const ChunkSpec& c : stage_layout({n, p, v}, r)) {
            pre += c.pre_process;
            post += c.post_process;
            for (int l = c.first_layer; l < c.first_layer + c.num_layers; ++l) {
              ASSERT_EQ(owner[static_cast<std::size_t>(l)], -1) << "layer " << l << " twice";
              owner[static_cast<std::size_t>(l)] = r;
            }
          }
        for (int l = 0; l < n; ++l)
          ASSERT_NE(owner[static_cast<std::size_t>(l)], -1) << "layer " << l << " lost";
        EXPECT_EQ(pre, 1);
        EXPECT_EQ(post, 1);
      }
}

// The message of the Error a layout throws, which must be a single line.
std::string error_of(const LayoutParams& params, int rank = 0) {
  try {
    stage_layout(params, rank);
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    return what;
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(StageLayout, BadLayoutsNameTheRule) {
  EXPECT_THAT(error_of({8, 2, 4, 0, 0, Placement::V}),
              ::testing::HasSubstr("the V placement needs virtual_stages = 2 (got 4)"));
  using ::testing::HasSubstr;
  EXPECT_THAT(error_of({10, 4, 1}),
              HasSubstr("num_layers (10) must be divisible by pipeline (4) x virtual_stages (1) = 4; or set "
                        "parallel.first_stage_layers/last_stage_layers"));
  EXPECT_THAT(error_of({8, 2, 3}),
              HasSubstr("num_layers (8) must be divisible by pipeline (2) x virtual_stages (3) = 6"));
  EXPECT_THAT(error_of({8, 2, 2, 1, 0}),
              HasSubstr("parallel.first_stage_layers/last_stage_layers need virtual_stages = 1 (got 2)"));
  EXPECT_THAT(error_of({8, 1, 1, 2, 0}),
              HasSubstr("parallel.first_stage_layers/last_stage_layers need pipeline > 1 (got 1)"));
  EXPECT_THAT(error_of({8, 4, 1, 5, 4}),
              HasSubstr("first_stage_layers (5) + last_stage_layers (4) must be less than num_layers (8)"));
  EXPECT_THAT(
      error_of({8, 2, 1, 3, 4}),
      HasSubstr(
          "first_stage_layers (3) + last_stage_layers (4) must equal num_layers (8) with pipeline (2)"));
  EXPECT_THAT(error_of({10, 4, 1, 2, 3}),
              HasSubstr("leaves 5 layers, which must split evenly (>= 1 each) over the other 2 stages"));
  EXPECT_THAT(error_of({4, 4, 1, 2, 2}), HasSubstr("leaves 0 layers"));
  EXPECT_THAT(error_of({8, 2, 1, -1, 0}), HasSubstr("must be >= 0"));
  EXPECT_THAT(error_of({0, 2, 1}), HasSubstr("num_layers (0) must be >= 1"));
  EXPECT_THAT(error_of({8, 2, 1}, 2), HasSubstr("pipeline rank (2) must be in [0, pipeline (2))"));
}

}  // namespace
}  // namespace parallel::pipeline
