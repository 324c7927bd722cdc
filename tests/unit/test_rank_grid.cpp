// RankGrid against tables worked out by hand from Megatron-Core's order tp-cp-dp-pp:
//     rank = tp + TP * (cp + CP * (dp + DP * pp))
// and the expert grid folded onto it: tp + TP * (cp + CP * dp) = etp + ETP * (ep + EP * edp).
#include <gtest/gtest.h>

#include <functional>
#include <set>
#include <string>
#include <vector>

#include "parallel/error.hpp"
#include "parallel/parallel_state.hpp"

namespace parallel {
namespace {

using Groups = std::vector<std::vector<int>>;
using GroupFn = std::vector<int> (RankGrid::*)(int) const;

RankGrid grid(int tp, int pp, int dp, int cp = 1, int ep = 1, int etp = 1) {
  return RankGrid(ParallelSizes{
      .tensor = tp, .context = cp, .pipeline = pp, .data = dp, .expert = ep, .expert_tensor = etp});
}

// `groups` must partition the world, and every member's group must be exactly its row.
void expect_groups(const RankGrid& g, GroupFn fn, const Groups& groups, const char* name) {
  SCOPED_TRACE(name);
  std::multiset<int> seen;
  for (const auto& group : groups)
    for (int r : group) {
      seen.insert(r);
      EXPECT_EQ((g.*fn)(r), group) << name << " group of rank " << r;
    }
  std::multiset<int> all;
  for (int r = 0; r < g.world_size(); ++r) all.insert(r);
  EXPECT_EQ(seen, all) << "the expected " << name << " table does not cover every rank exactly once";
}

// Embedding groups need not cover the world: `outside` lists the middle-stage ranks.
void expect_embedding(const RankGrid& g, const Groups& groups, const std::vector<int>& outside) {
  std::multiset<int> seen(outside.begin(), outside.end());
  for (int r : outside) EXPECT_TRUE(g.embedding_group(r).empty()) << "rank " << r;
  for (const auto& group : groups)
    for (int r : group) {
      seen.insert(r);
      EXPECT_EQ(g.embedding_group(r), group) << "embedding group of rank " << r;
    }
  EXPECT_EQ(static_cast<int>(seen.size()), g.world_size());
}

Groups singletons(int n) {
  Groups out;
  for (int r = 0; r < n; ++r) out.push_back({r});
  return out;
}

TEST(RankGrid, Tp2Pp2Dp2) {
  auto g = grid(2, 2, 2);
  ASSERT_EQ(g.world_size(), 8);
  expect_groups(g, &RankGrid::tensor_group, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, "tensor");
  expect_groups(g, &RankGrid::data_group, {{0, 2}, {1, 3}, {4, 6}, {5, 7}}, "data");
  expect_groups(g, &RankGrid::pipeline_group, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}, "pipeline");
  expect_groups(g, &RankGrid::context_group, singletons(8), "context");
  expect_groups(g, &RankGrid::model_group, {{0, 1, 4, 5}, {2, 3, 6, 7}}, "model");
  expect_embedding(g, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}, {});
  // ep 1: the expert-dp index is the position within the stage (experts replicated over tp x dp).
  EXPECT_EQ(g.coord(5), (Coord{.tp = 1, .cp = 0, .dp = 0, .pp = 1, .edp = 1}));
  EXPECT_EQ(g.coord(6), (Coord{.tp = 0, .cp = 0, .dp = 1, .pp = 1, .edp = 2}));
}

TEST(RankGrid, Tp4Pp2Dp1) {
  auto g = grid(4, 2, 1);
  expect_groups(g, &RankGrid::tensor_group, {{0, 1, 2, 3}, {4, 5, 6, 7}}, "tensor");
  expect_groups(g, &RankGrid::data_group, singletons(8), "data");
  expect_groups(g, &RankGrid::pipeline_group, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}, "pipeline");
  expect_groups(g, &RankGrid::context_group, singletons(8), "context");
  expect_groups(g, &RankGrid::model_group, {{0, 1, 2, 3, 4, 5, 6, 7}}, "model");
  expect_embedding(g, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}, {});
}

TEST(RankGrid, Tp1Pp4Dp2) {
  auto g = grid(1, 4, 2);
  expect_groups(g, &RankGrid::tensor_group, singletons(8), "tensor");
  expect_groups(g, &RankGrid::data_group, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, "data");
  expect_groups(g, &RankGrid::pipeline_group, {{0, 2, 4, 6}, {1, 3, 5, 7}}, "pipeline");
  expect_groups(g, &RankGrid::model_group, {{0, 2, 4, 6}, {1, 3, 5, 7}}, "model");
  expect_embedding(g, {{0, 6}, {1, 7}}, {2, 3, 4, 5});
}

TEST(RankGrid, Tp2Pp1Dp4) {
  auto g = grid(2, 1, 4);
  expect_groups(g, &RankGrid::tensor_group, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, "tensor");
  expect_groups(g, &RankGrid::data_group, {{0, 2, 4, 6}, {1, 3, 5, 7}}, "data");
  expect_groups(g, &RankGrid::pipeline_group, singletons(8), "pipeline");
  expect_groups(g, &RankGrid::model_group, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, "model");
  // One stage is both first and last: the group is the rank alone.
  expect_embedding(g, singletons(8), {});
}

TEST(RankGrid, SingleRank) {
  auto g = grid(1, 1, 1);
  ASSERT_EQ(g.world_size(), 1);
  EXPECT_EQ(g.coord(0), Coord{});
  EXPECT_EQ(g.rank(Coord{}), 0);
  for (GroupFn fn : {&RankGrid::tensor_group, &RankGrid::context_group, &RankGrid::data_group,
                     &RankGrid::data_context_group, &RankGrid::pipeline_group, &RankGrid::model_group,
                     &RankGrid::embedding_group})
    EXPECT_EQ((g.*fn)(0), std::vector<int>{0});
}

TEST(RankGrid, Tp2Pp4Dp2Sixteen) {
  auto g = grid(2, 4, 2);
  ASSERT_EQ(g.world_size(), 16);
  expect_groups(g, &RankGrid::tensor_group,
                {{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}, "tensor");
  expect_groups(g, &RankGrid::data_group,
                {{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}, "data");
  expect_groups(g, &RankGrid::pipeline_group, {{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}},
                "pipeline");
  expect_groups(g, &RankGrid::model_group, {{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}},
                "model");
  expect_embedding(g, {{0, 12}, {1, 13}, {2, 14}, {3, 15}}, {4, 5, 6, 7, 8, 9, 10, 11});
  EXPECT_EQ(g.coord(13), (Coord{.tp = 1, .cp = 0, .dp = 0, .pp = 3, .edp = 1}));
  EXPECT_EQ(g.coord(10), (Coord{.tp = 0, .cp = 0, .dp = 1, .pp = 2, .edp = 2}));
}

// Context sits between tensor and expert: rank = tp + 2 * (cp + 2 * pp).
TEST(RankGrid, ContextBetweenTensorAndData) {
  auto g = grid(/*tp=*/2, /*pp=*/2, /*dp=*/1, /*cp=*/2);
  expect_groups(g, &RankGrid::tensor_group, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, "tensor");
  expect_groups(g, &RankGrid::context_group, {{0, 2}, {1, 3}, {4, 6}, {5, 7}}, "context");
  expect_groups(g, &RankGrid::pipeline_group, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}, "pipeline");
  expect_groups(g, &RankGrid::data_group, singletons(8), "data");
  expect_groups(g, &RankGrid::data_context_group, {{0, 2}, {1, 3}, {4, 6}, {5, 7}}, "data x context");
  // The model group leaves cp out: cp ranks hold the same dense gradients.
  expect_groups(g, &RankGrid::model_group, {{0, 1, 4, 5}, {2, 3, 6, 7}}, "model");
}

// dp x cp varies cp fastest: rank = tp + 2 * (cp + 2 * dp).
TEST(RankGrid, DataContextGroupVariesBoth) {
  auto g = grid(/*tp=*/2, /*pp=*/1, /*dp=*/2, /*cp=*/2);
  expect_groups(g, &RankGrid::data_context_group, {{0, 2, 4, 6}, {1, 3, 5, 7}}, "data x context");
  expect_groups(g, &RankGrid::data_group, {{0, 4}, {1, 5}, {2, 6}, {3, 7}}, "data");
  expect_groups(g, &RankGrid::model_group, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, "model");
}

// Experts fold onto the dense ranks: 4 ranks at dp 4 and ep 2 are ep pairs {0, 1}, {2, 3} (dense
// data parallelism still spans all four), each expert replicated over edp {0, 2}, {1, 3}.
TEST(RankGrid, ExpertsFoldOntoData) {
  auto g = grid(/*tp=*/1, /*pp=*/1, /*dp=*/4, /*cp=*/1, /*ep=*/2);
  EXPECT_EQ(g.world_size(), 4);
  expect_groups(g, &RankGrid::data_group, {{0, 1, 2, 3}}, "data");
  expect_groups(g, &RankGrid::expert_group, {{0, 1}, {2, 3}}, "expert");
  expect_groups(g, &RankGrid::expert_data_group, {{0, 2}, {1, 3}}, "expert data");
  expect_groups(g, &RankGrid::expert_tensor_group, singletons(4), "expert tensor");
  expect_groups(g, &RankGrid::expert_model_group, {{0, 1}, {2, 3}}, "expert model");
  EXPECT_EQ(g.coord(3), (Coord{.tp = 0, .cp = 0, .dp = 3, .pp = 0, .etp = 0, .ep = 1, .edp = 1}));
}

// ep 2 x tp 2 x pp 2 on 8 ranks (dp 2): within a stage the four ranks tp + 2 dp are ep + 2 edp, so
// the ep pairs are the tp pairs and edp crosses dp; the expert model group spans ep and pp.
TEST(RankGrid, ExpertsFoldOverTensorAndPipeline) {
  auto g = grid(/*tp=*/2, /*pp=*/2, /*dp=*/2, /*cp=*/1, /*ep=*/2);
  expect_groups(g, &RankGrid::expert_group, {{0, 1}, {2, 3}, {4, 5}, {6, 7}}, "expert");
  expect_groups(g, &RankGrid::expert_data_group, {{0, 2}, {1, 3}, {4, 6}, {5, 7}}, "expert data");
  expect_groups(g, &RankGrid::expert_model_group, {{0, 1, 4, 5}, {2, 3, 6, 7}}, "expert model");
  // ep 4 with etp 1 spans tp and dp: one expert group per stage, no replicas.
  auto h = grid(2, 2, 2, 1, 4);
  expect_groups(h, &RankGrid::expert_group, {{0, 1, 2, 3}, {4, 5, 6, 7}}, "expert 4");
  expect_groups(h, &RankGrid::expert_data_group, singletons(8), "expert data 4");
  // etp 2 x ep 2: etp pairs are the tp pairs, ep crosses dp.
  auto e = grid(2, 1, 2, 1, 2, 2);
  expect_groups(e, &RankGrid::expert_tensor_group, {{0, 1}, {2, 3}}, "expert tensor");
  expect_groups(e, &RankGrid::expert_group, {{0, 2}, {1, 3}}, "expert etp2");
  EXPECT_THROW(grid(2, 1, 1, 1, 4), Error);  // ep 4 does not divide tp x cp x dp = 2
}

TEST(RankGrid, CoordRoundTrip) {
  for (auto g :
       {grid(2, 2, 2), grid(4, 2, 1), grid(1, 4, 2), grid(2, 4, 2), grid(3, 5, 2), grid(2, 3, 2, 2, 2)}) {
    const auto& s = g.sizes();
    for (int r = 0; r < g.world_size(); ++r) {
      Coord c = g.coord(r);
      EXPECT_EQ(g.rank(c), r);
      EXPECT_EQ(r, c.tp + s.tensor * (c.cp + s.context * (c.dp + s.data * c.pp)));
      EXPECT_EQ(c.tp + s.tensor * (c.cp + s.context * c.dp),
                c.etp + s.expert_tensor * (c.ep + s.expert * c.edp));
      EXPECT_TRUE(c.tp < s.tensor && c.cp < s.context && c.ep < s.expert && c.dp < s.data &&
                  c.pp < s.pipeline && c.edp < s.expert_data());
    }
  }
}

TEST(RankGrid, FromWorldDerivesData) {
  auto g = RankGrid::from_world(16, /*tensor=*/2, /*pipeline=*/4);
  EXPECT_EQ(g.sizes().data, 2);
  EXPECT_EQ(g.sizes().tensor, 2);
  EXPECT_EQ(g.sizes().pipeline, 4);
  EXPECT_EQ(RankGrid::from_world(8, 1, 1).sizes().data, 8);
  EXPECT_EQ(RankGrid::from_world(24, 2, 1, 2, 3).sizes().data, 6);  // ep folds: not a factor of the world
}

TEST(RankGrid, FromWorldErrors) {
  try {
    RankGrid::from_world(6, /*tensor=*/4, /*pipeline=*/1);
    FAIL() << "expected parallel::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "world size 6 is not divisible by tensor(4) x pipeline(1) x context(1) = 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(RankGrid::from_world(8, 3, 1), Error);
  EXPECT_THROW(RankGrid::from_world(8, 2, 8), Error);
  EXPECT_THROW(RankGrid::from_world(8, 0, 1), Error);
  EXPECT_THROW(RankGrid::from_world(8, 1, -2), Error);
  EXPECT_THROW(RankGrid::from_world(0, 1, 1), Error);
}

TEST(RankGrid, RejectsBadSizesAndRanks) {
  EXPECT_THROW(grid(0, 1, 1), Error);
  EXPECT_THROW(grid(1, 1, 1, /*cp=*/0), Error);
  auto g = grid(2, 2, 2);
  EXPECT_THROW(g.coord(8), Error);
  EXPECT_THROW(g.coord(-1), Error);
  EXPECT_THROW(g.rank(Coord{.tp = 2}), Error);
  EXPECT_THROW(g.tensor_group(8), Error);
}

}  // namespace
}  // namespace parallel
