// choose_elastic_layout (elastic_layout.hpp): the layout a supervisor relaunches on when ranks are
// gone. Data parallelism shrinks first and the global batch is kept by more micro-batches per rank;
// model-parallel sizes shrink only when no data-parallel size fits; validate_config and the memory
// plan decide what fits, and say why a layout was refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/elastic_layout.hpp"
#include "parallel/memory_plan.hpp"

namespace parallel {
namespace {

// configs/tiny.yaml's model: 2 layers, hidden 64, 4 heads, global batch 8 of micro-batches of 2.
Config tiny(const std::vector<std::string>& overrides, int world) {
  const std::string yaml = R"(
model: {num_layers: 2, hidden_size: 64, num_attention_heads: 4, vocab_size: 512, seq_length: 32}
train: {micro_batch_size: 2, global_batch_size: 8}
)";
  return parse_config(yaml, overrides, world);
}

bool mentions(const std::vector<std::string>& refused, const std::string& what) {
  for (const std::string& r : refused)
    if (r.find(what) != std::string::npos) return true;
  return false;
}

TEST(ElasticLayout, LayoutOfTheConfiguredJob) {
  const ElasticLayout l = layout_of(tiny({"parallel.tensor=2"}, 4), 4);
  EXPECT_EQ(l.world_size, 4);
  EXPECT_EQ(l.tensor, 2);
  EXPECT_EQ(l.data, 2);
  EXPECT_EQ(l.micro_batches, 2);  // 8 / (2 * 2)
  EXPECT_EQ(l.describe(), "tp2 cp1 pp1 dp2 ep1: 4 ranks, 2 micro-batches of 2 per rank");
  EXPECT_EQ(l.overrides(), (std::vector<std::string>{"parallel.tensor=2", "parallel.context=1",
                                                     "parallel.pipeline=1", "parallel.expert=1"}));
}

TEST(ElasticLayout, DataParallelismShrinksFirstAndKeepsTheGlobalBatch) {
  const Config c = tiny({}, 4);
  const ElasticChoice all = choose_elastic_layout(c, 4, {.max_ranks = 4});
  ASSERT_TRUE(all.layout);
  EXPECT_EQ(all.layout->data, 4);
  EXPECT_EQ(all.layout->micro_batches, 1);

  const ElasticChoice half = choose_elastic_layout(c, 2, {.max_ranks = 4});
  ASSERT_TRUE(half.layout);
  EXPECT_EQ(half.layout->world_size, 2);
  EXPECT_EQ(half.layout->data, 2);
  EXPECT_EQ(half.layout->micro_batches, 2);  // twice the micro-batches: the global batch stays 8
  EXPECT_EQ(half.layout->config.train.global_batch_size, 8);
  EXPECT_TRUE(half.refused.empty());

  // 3 ranks: dp 3 does not divide 8 / 2 micro-batches, so 2 of the 3 ranks are used, and the
  // refusal names the rule.
  const ElasticChoice three = choose_elastic_layout(c, 3, {.max_ranks = 4});
  ASSERT_TRUE(three.layout);
  EXPECT_EQ(three.layout->world_size, 2);
  ASSERT_EQ(three.refused.size(), 1u);
  EXPECT_NE(three.refused[0].find("tp1 cp1 pp1 dp3 ep1: config: train.global_batch_size"), std::string::npos)
      << three.refused[0];

  // More ranks than the first launch: never more than max_ranks.
  const ElasticChoice more = choose_elastic_layout(c, 16, {.max_ranks = 4});
  ASSERT_TRUE(more.layout);
  EXPECT_EQ(more.layout->world_size, 4);
}

TEST(ElasticLayout, ModelParallelismShrinksOnlyWhenDataParallelismCannot) {
  const Config c = tiny({"parallel.tensor=2", "parallel.pipeline=2"}, 8);
  // 6 ranks: tp2 x pp2 keeps its sizes on 4 of them (dp 1) rather than change to tp2 dp3.
  const ElasticChoice six = choose_elastic_layout(c, 6, {.max_ranks = 8});
  ASSERT_TRUE(six.layout);
  EXPECT_EQ(six.layout->describe(), "tp2 cp1 pp2 dp1 ep1: 4 ranks, 4 micro-batches of 2 per rank");
  // 3 ranks: tp2 x pp2 needs 4; the pipeline gives way before the tensor size.
  const ElasticChoice three = choose_elastic_layout(c, 3, {.max_ranks = 8});
  ASSERT_TRUE(three.layout);
  EXPECT_EQ(three.layout->tensor, 2);
  EXPECT_EQ(three.layout->pipeline, 1);
  EXPECT_EQ(three.layout->world_size, 2);
  // One rank: everything on it.
  const ElasticChoice one = choose_elastic_layout(c, 1, {.max_ranks = 8});
  ASSERT_TRUE(one.layout);
  EXPECT_EQ(one.layout->describe(), "tp1 cp1 pp1 dp1 ep1: 1 rank, 4 micro-batches of 2 per rank");
}

TEST(ElasticLayout, TheMemoryPlanDecidesWhatFits) {
  const Config c = tiny({"parallel.tensor=2"}, 4);
  const int64_t tp2_peak = plan_memory(layout_of(c, 2).config, 2).largest().peak_bytes;
  const int64_t tp1_peak = plan_memory(layout_of(tiny({}, 1), 1).config, 1).largest().peak_bytes;
  ASSERT_LT(tp2_peak, tp1_peak);
  // Room for a tp2 rank but not for a whole model on one: 3 ranks give tp2 dp1, 1 rank nothing.
  const ElasticOptions room{
      .max_ranks = 4, .rank_memory_bytes = (tp2_peak + tp1_peak) / 2, .memory_source = "test"};
  const ElasticChoice three = choose_elastic_layout(c, 3, room);
  ASSERT_TRUE(three.layout);
  EXPECT_EQ(three.layout->tensor, 2);
  EXPECT_EQ(three.layout->world_size, 2);
  EXPECT_GT(three.layout->peak_bytes, 0);
  const ElasticChoice one = choose_elastic_layout(c, 1, room);
  EXPECT_FALSE(one.layout);
  EXPECT_TRUE(mentions(one.refused, "tp1 cp1 pp1 dp1 ep1: memory plan: rank 0 needs")) << one.refused.back();
  // A node's memory is shared by the ranks placed on it: 2 ranks on one node get half each, too
  // little for tp2 (or tp1 dp2), so the whole model goes on one rank, which has it all.
  ASSERT_LT(tp1_peak, 2 * tp2_peak - 1);
  const ElasticOptions node{
      .max_ranks = 4, .node_memory_bytes = 2 * tp2_peak - 1, .nodes = 1, .memory_source = "node"};
  const ElasticChoice shared = choose_elastic_layout(c, 2, node);
  ASSERT_TRUE(shared.layout);
  EXPECT_EQ(shared.layout->describe(), "tp1 cp1 pp1 dp1 ep1: 1 rank, 4 micro-batches of 2 per rank");
  EXPECT_TRUE(mentions(shared.refused, "tp2 cp1 pp1 dp1 ep1: memory plan: rank")) << shared.refused[0];
  EXPECT_TRUE(mentions(shared.refused, "(node shared by 2 ranks)")) << shared.refused[0];
  // On two nodes each rank has a node to itself: tp2 on 2 ranks.
  const ElasticChoice two_nodes = choose_elastic_layout(
      c, 2, {.max_ranks = 4, .node_memory_bytes = 2 * tp2_peak - 1, .nodes = 2, .memory_source = "node"});
  ASSERT_TRUE(two_nodes.layout);
  EXPECT_EQ(two_nodes.layout->world_size, 2);
  EXPECT_EQ(two_nodes.layout->tensor, 2);
}

TEST(ElasticLayout, FewerRanksThanTheMinimum) {
  const ElasticChoice none = choose_elastic_layout(tiny({}, 4), 1, {.min_ranks = 2, .max_ranks = 4});
  EXPECT_FALSE(none.layout);
  ASSERT_EQ(none.refused.size(), 1u);
  EXPECT_EQ(none.refused[0], "1 rank available, fewer than the minimum 2");
}

TEST(ElasticLayout, ExpertParallelismHalvesWhenTheLayoutRefusesIt) {
  // 4 experts over ep 4 on dp 4; on 2 ranks ep 4 no longer divides tensor * context * data.
  const Config c = tiny({"model.num_experts=4", "parallel.expert=4"}, 4);
  const ElasticChoice two = choose_elastic_layout(c, 2, {.max_ranks = 4});
  ASSERT_TRUE(two.layout);
  EXPECT_EQ(two.layout->expert, 2);
  EXPECT_EQ(two.layout->data, 2);
  EXPECT_TRUE(mentions(two.refused, "tp1 cp1 pp1 dp2 ep4: config: parallel.expert")) << two.refused[0];
}

}  // namespace
}  // namespace parallel
