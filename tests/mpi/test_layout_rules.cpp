// The layout rules (layout_rules.hpp) are one function: a model chunk built directly, without
// validate_config, over communicators of a bad layout refuses it with exactly the one-line message
// validate_config gives for the same model and sizes. Two ranks, so that tp, cp, ep and etp of 2
// are real communicators.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "mpi_test.hpp"
#include "parallel/config.hpp"
#include "parallel/error.hpp"
#include "parallel/gpt_model.hpp"

namespace parallel {
namespace {

using testing::world;

struct Case {
  const char* name;
  std::function<void(ModelConfig&, ParallelConfig&)> set;
  const char* message;  // what both must say (a part of the line)
};

void small_model(ModelConfig& m) {
  m.num_layers = 2;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.vocab_size = 256;
  m.seq_length = 16;
}

std::string config_message(const Case& k) {
  Config c;
  small_model(c.model);
  k.set(c.model, c.parallel);
  try {
    validate_config(c, world().size());
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "validate_config accepted it";
}

std::string model_message(const Case& k) {
  ModelConfig m;
  small_model(m);
  ParallelConfig p;
  k.set(m, p);
  auto solo = world().split(world().rank(), 0);
  auto sized = [&](int n) -> Communicator* {
    return n == 1 ? solo.get() : n == world().size() ? &world() : nullptr;
  };
  Communicator* tp = sized(p.tensor);
  Communicator* cp = sized(p.context);
  Communicator* ep = sized(p.expert);
  Communicator* etp = sized(p.expert_tensor);
  if (tp == nullptr || cp == nullptr || ep == nullptr || etp == nullptr)
    return "a size this world cannot give";
  GPTModel::Options o{.sequence_parallel = p.sequence_parallel,
                      .expert = p.expert > 1 ? ep : nullptr,
                      .expert_tensor = p.expert_tensor > 1 ? etp : nullptr,
                      .cp = p.context > 1 ? cp : nullptr,
                      .context_comm = p.context_comm};
  try {
    GPTModel model(m, ChunkSpec{.num_layers = m.num_layers}, o, *tp);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "GPTModel accepted it";
}

class LayoutRule : public ::testing::TestWithParam<Case> {};

TEST_P(LayoutRule, ModelAndConfigRefuseWithOneMessage) {
  ASSERT_EQ(world().size(), 2);
  const Case& k = GetParam();
  const std::string from_config = config_message(k), from_model = model_message(k);
  EXPECT_NE(from_config.find(k.message), std::string::npos) << from_config;
  EXPECT_EQ(from_model, from_config);
}

const Case kCases[] = {
    {"HiddenByHeads", [](ModelConfig& m, ParallelConfig&) { m.hidden_size = 66; },
     "config: model.hidden_size = 66: must be divisible by model.num_attention_heads (4)"},
    {"HeadsByTensor",
     [](ModelConfig& m, ParallelConfig& p) {
       m.num_attention_heads = 3;
       m.hidden_size = 48;
       p.tensor = 2;
     },
     "config: model.num_attention_heads = 3: must be divisible by parallel.tensor (2)"},
    {"FfnByTensor",
     [](ModelConfig& m, ParallelConfig& p) {
       m.ffn_hidden_size = 101;
       p.tensor = 2;
     },
     "config: model.ffn_hidden_size = 101: must be divisible by parallel.tensor (2)"},
    {"SequenceParallelSequence",
     [](ModelConfig& m, ParallelConfig& p) {
       m.seq_length = 15;
       p.tensor = 2;
       p.sequence_parallel = true;
     },
     "config: model.seq_length = 15: must be divisible by parallel.tensor (2) when "
     "parallel.sequence_parallel is true"},
    {"ContextChunks",
     [](ModelConfig& m, ParallelConfig& p) {
       m.seq_length = 6;
       p.context = 2;
     },
     "config: model.seq_length = 6: must be divisible by 2 * parallel.context (2 * 2 = 4) when "
     "parallel.context > 1"},
    {"ContextA2aGroups",
     [](ModelConfig& m, ParallelConfig& p) {
       m.num_query_groups = 1;
       p.context = 2;
       p.context_comm = ContextComm::A2A;
     },
     "config: model.num_query_groups = 1: must be divisible by parallel.tensor * parallel.context (1 * 2 = "
     "2) when parallel.context_comm is a2a"},
    {"ExpertsByExpertParallel",
     [](ModelConfig& m, ParallelConfig& p) {
       m.num_experts = 3;
       m.moe_router_topk = 1;
       p.expert = 2;
     },
     "config: model.num_experts = 3: must be divisible by parallel.expert (2)"},
    {"ExpertWidthByExpertTensor",
     [](ModelConfig& m, ParallelConfig& p) {
       m.num_experts = 4;
       m.moe_router_topk = 1;
       m.moe_ffn_hidden_size = 33;
       p.expert_tensor = 2;
     },
     "config: model.moe_ffn_hidden_size = 33: must be divisible by parallel.expert_tensor (2)"},
    {"TopkWithinExperts",
     [](ModelConfig& m, ParallelConfig&) {
       m.num_experts = 2;
       m.moe_router_topk = 3;
     },
     "config: model.moe_router_topk = 3: must be <= model.num_experts (2)"},
    {"MoeTensorNeedsSequenceParallel",
     [](ModelConfig& m, ParallelConfig& p) {
       m.num_experts = 4;
       p.tensor = 2;
     },
     "config: parallel.tensor = 2: MoE layers with tensor parallelism need parallel.sequence_parallel = "
     "true"},
};

INSTANTIATE_TEST_SUITE_P(Rules, LayoutRule, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace parallel
