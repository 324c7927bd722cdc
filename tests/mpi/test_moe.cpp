// Mixture of experts (src/model/moe.cpp):
//   - one MoE layer against the float64 PyTorch reference (tests/reference/make_moe_fixture.py):
//     router, top-k, capacity drops, experts, combine, aux and z losses, forward and backward;
//   - expert parallelism with real processes: ep = world (2 or 4) equals one rank for 4 and 8
//     experts, top-1 and top-2, dropless, both dispatchers (losses and every gradient, fp32, 1e-5);
//   - memory from the allocator: at ep = p a rank holds 1/p of the expert weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "../../src/model/layers.hpp"
#include "compare.hpp"
#include "mpi_test.hpp"
#include "parallel/allocator.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/memory_plan.hpp"
#include "parallel/precision.hpp"
#include "parallel/safetensors.hpp"
#include "paths.hpp"

namespace parallel {
namespace {

using testing::world;

::testing::AssertionResult close(const std::string& what, const Tensor& actual, const Tensor& expected,
                                 double tol, double floor = 1e-6) {
  if (actual.numel() != expected.numel())
    return ::testing::AssertionFailure() << what << ": " << actual.str() << " vs " << expected.str();
  const double err = testing::rel_err(actual, expected, floor);
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": relative error " << err << " > " << tol;
}

// ---- one layer against PyTorch ---------------------------------------------------------------

void check_fixture(const std::string& name) {
  auto f = safetensors::load(testing::fixtures_dir() + "/" + name + ".safetensors");
  const auto meta = safetensors::load_metadata(testing::fixtures_dir() + "/" + name + ".safetensors");
  auto solo = world().split(world().rank(), 0);
  ModelConfig c;
  c.hidden_size = std::stoi(meta.at("hidden"));
  c.num_experts = std::stoi(meta.at("num_experts"));
  c.moe_router_topk = std::stoi(meta.at("topk"));
  c.moe_ffn_hidden_size = std::stoi(meta.at("ffn"));
  c.activation = meta.at("activation") == "swiglu" ? Activation::SwiGLU : Activation::GeLU;
  c.moe_aux_loss_coeff = std::stod(meta.at("aux_coeff"));
  c.moe_z_loss_coeff = std::stod(meta.at("z_coeff"));
  c.moe_capacity_factor = std::stod(meta.at("capacity_factor"));
  model::LayerEnv env;
  env.config = &c;
  env.tp = solo.get();
  env.hidden = c.hidden_size;
  env.ffn = c.moe_ffn_hidden_size;
  model::MoELayer layer(env, 0);
  layer.router.value.copy_(f.at("router"));
  const int64_t E = c.num_experts;
  for (int64_t e = 0; e < E; ++e) {
    layer.fc1[e].value.copy_(f.at("fc1").select(e));
    layer.fc2[e].value.copy_(f.at("fc2").select(e));
  }
  model::MoELayer::Context ctx;
  Tensor y = layer.forward(f.at("x"), ctx, /*record_stats=*/true);
  EXPECT_TRUE(close("y", y, f.at("y"), 1e-5));
  const model::MoEStats& s = layer.stats();
  EXPECT_NEAR(s.aux_loss, f.at("aux").to_float_vector()[0],
              1e-5 * std::abs(f.at("aux").to_float_vector()[0]));
  EXPECT_NEAR(s.z_loss, f.at("z").to_float_vector()[0], 1e-5 * std::abs(f.at("z").to_float_vector()[0]));
  const std::vector<float> counts = f.at("tokens_per_expert").to_float_vector();
  int64_t assigned = 0;
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(s.tokens_per_expert[e], static_cast<int64_t>(counts[e])) << "expert " << e;
    assigned += s.tokens_per_expert[e];
  }
  if (c.moe_capacity_factor > 0) {
    EXPECT_GT(s.dropped, 0) << "the capacity fixture should drop assignments";
  } else {
    EXPECT_EQ(s.dropped, 0);
  }
  EXPECT_EQ(assigned, f.at("x").numel() / c.hidden_size * c.moe_router_topk);
  Tensor dx = layer.backward(f.at("dy"), ctx);
  EXPECT_TRUE(close("dx", dx, f.at("dx"), 1e-5));
  EXPECT_TRUE(close("grad.router", layer.router.grad, f.at("grad.router"), 1e-5));
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_TRUE(close("grad.fc1 " + std::to_string(e), layer.fc1[e].grad, f.at("grad.fc1").select(e), 1e-5));
    EXPECT_TRUE(close("grad.fc2 " + std::to_string(e), layer.fc2[e].grad, f.at("grad.fc2").select(e), 1e-5));
  }
}

TEST(MoEPyTorchReference, GeluTop2Dropless) { check_fixture("moe_gelu_top2"); }
TEST(MoEPyTorchReference, SwigluTop1WithCapacity) { check_fixture("moe_swiglu_top1_capacity"); }

// ---- expert parallelism equals one rank ------------------------------------------------------

ModelConfig moe_config(int experts, int topk, MoeDispatcher dispatcher, bool llama) {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.vocab_size = 300;
  c.seq_length = 8;
  c.ffn_hidden_size = 64;
  c.num_experts = experts;
  c.moe_router_topk = topk;
  c.moe_ffn_hidden_size = 48;
  c.moe_aux_loss_coeff = 0.01;
  c.moe_z_loss_coeff = 0.001;
  c.moe_token_dispatcher = dispatcher;
  if (llama) {
    c.normalization = Normalization::RMSNorm;
    c.activation = Activation::SwiGLU;
    c.position_embedding = PositionEmbedding::Rope;
    c.add_bias = false;
    c.tie_embeddings = false;
    c.moe_layer_freq = 2;  // layer 0 MoE, layer 1 dense
    c.moe_shared_expert_ffn_hidden_size = 32;
  }
  return c;
}

// Micro-batch r's tokens and targets [b, s], the same on every rank.
std::pair<Tensor, Tensor> batch(int r, const ModelConfig& c, int64_t b) {
  std::vector<int32_t> tokens, targets;
  for (int64_t i = 0; i < b * c.seq_length; ++i) {
    tokens.push_back(static_cast<int32_t>((i * 37 + r * 101 + 7) % c.vocab_size));
    targets.push_back(static_cast<int32_t>((i * 53 + r * 29 + 3) % c.vocab_size));
  }
  return {Tensor::from_vector(tokens, {b, c.seq_length}), Tensor::from_vector(targets, {b, c.seq_length})};
}

void expert_parallel_parity(const ModelConfig& c) {
  const int p = world().size();
  const int r = world().rank();
  auto solo = world().split(r, 0);
  const int64_t b = 2;
  const Tensor seed = Tensor::full({1}, 1.0 / static_cast<double>(b * c.seq_length), DType::F32);
  // One rank: every rank's micro-batch, one after the other.
  GPTModel ref(c, {0, c.num_layers, true, true}, {}, *solo);
  std::vector<float> ref_loss;
  for (int q = 0; q < p; ++q) {
    auto [tokens, targets] = batch(q, c, b);
    auto act = ref.new_activations();
    ref_loss.push_back(ref.forward(tokens, targets, *act, q).to_float_vector()[0]);
    ref.backward(seed, *act);
  }
  // ep = p: rank r runs micro-batch r; the experts see every rank's tokens.
  GPTModel::Options o;
  o.expert = &world();
  GPTModel ep(c, {0, c.num_layers, true, true}, o, *solo);
  auto [tokens, targets] = batch(r, c, b);
  auto act = ep.new_activations();
  const float loss = ep.forward(tokens, targets, *act, r).to_float_vector()[0];
  ep.backward(seed, *act);
  EXPECT_NEAR(loss, ref_loss[r], 1e-5 * std::abs(ref_loss[r]));

  std::map<std::string, Parameter*> by_name;
  for (Parameter* q : ref.parameters()) by_name[q->name] = q;
  int experts_here = 0;
  for (Parameter* q : ep.parameters()) {
    ASSERT_TRUE(by_name.count(q->name)) << q->name;
    Tensor g = q->grad.clone();
    if (q->expert) {
      ++experts_here;
    } else {
      static_cast<Communicator&>(world()).all_reduce(g);  // dense: each rank holds its micro-batch's share
    }
    EXPECT_TRUE(close(q->name + " (rank " + std::to_string(r) + ")", g, by_name[q->name]->grad, 1e-5));
  }
  int moe_layers = 0;
  for (int l = 0; l < c.num_layers; ++l) moe_layers += c.is_moe_layer(l);
  EXPECT_EQ(experts_here, 2 * moe_layers * c.num_experts / p);
  // The statistics: this rank's assignments, summed over ranks, are the one-rank model's.
  const auto mine = ep.moe_statistics(), all = ref.moe_statistics();
  Tensor counts = Tensor::from_vector(mine.tokens_per_expert, {c.num_experts});
  static_cast<Communicator&>(world()).all_reduce(counts);
  EXPECT_EQ(counts.to_float_vector(),
            Tensor::from_vector(all.tokens_per_expert, {c.num_experts}).to_float_vector());
}

struct EpCase {
  int experts, topk;
  MoeDispatcher dispatcher;
  bool llama;
};

class ExpertParallel : public ::testing::TestWithParam<EpCase> {};

TEST_P(ExpertParallel, EqualsOneRank) {
  const EpCase k = GetParam();
  if (world().size() == 1) GTEST_SKIP() << "needs ep > 1";
  if (k.experts % world().size() != 0) GTEST_SKIP() << "experts do not divide over the ranks";
  expert_parallel_parity(moe_config(k.experts, k.topk, k.dispatcher, k.llama));
}

INSTANTIATE_TEST_SUITE_P(Cases, ExpertParallel,
                         ::testing::Values(EpCase{4, 1, MoeDispatcher::AllToAll, false},
                                           EpCase{4, 2, MoeDispatcher::AllToAll, false},
                                           EpCase{8, 1, MoeDispatcher::AllToAll, true},
                                           EpCase{8, 2, MoeDispatcher::AllToAll, false},
                                           EpCase{8, 2, MoeDispatcher::AllGather, true},
                                           EpCase{4, 1, MoeDispatcher::AllGather, false}));

// bf16 follows the precision policy (16-bit activations and parameter copy, fp32 router logits and
// gradients): the loss stays within bf16 rounding of the fp32 model's, gradients are finite.
TEST(MoEPrecision, Bf16IsCloseToFp32) {
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = moe_config(4, 2, MoeDispatcher::AllToAll, true);
  // Named copies, not a structured binding: Clang 14 cannot capture those in a lambda.
  const auto data = batch(0, c, 2);
  const Tensor tokens = data.first, targets = data.second;
  auto run = [&](Precision precision) {
    GPTModel::Options o;
    o.precision = precision;
    GPTModel m(c, {0, c.num_layers, true, true}, o, *solo);
    auto act = m.new_activations();
    const float loss = m.forward(tokens, targets, *act).to_float_vector()[0];
    m.backward(Tensor::full({1}, 1.0 / 16, DType::F32), *act);
    for (Parameter* q : m.parameters()) {
      EXPECT_EQ(q->value.dtype(), compute_dtype(precision)) << q->name;
      for (float g : q->grad.to_float_vector()) EXPECT_TRUE(std::isfinite(g)) << q->name;
    }
    return loss;
  };
  const float fp32 = run(Precision::FP32), bf16 = run(Precision::BF16);
  EXPECT_NEAR(bf16, fp32, 1e-2 * std::abs(fp32));
}

TEST(ExpertParallelMemory, RankHoldsItsShareOfTheExperts) {
  const int p = world().size();
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = moe_config(8, 2, MoeDispatcher::AllToAll, false);
  model::LayerEnv env;
  env.config = &c;
  env.tp = solo.get();
  env.hidden = c.hidden_size;
  env.ffn = c.ffn_hidden_size;
  auto bytes_of_layer = [&](Communicator* ep) {
    env.ep = ep;
    const std::size_t before = memory_stats(Device::cpu()).allocated;
    model::MoELayer layer(env, 0);
    const std::size_t router = layer.router.value.nbytes() + layer.router.grad.nbytes();
    return memory_stats(Device::cpu()).allocated - before - router;
  };
  const std::size_t all = bytes_of_layer(nullptr), mine = bytes_of_layer(&world());
  // fc1 [48, 32] and fc2 [32, 48] fp32, value and gradient, per expert.
  EXPECT_EQ(all, 8u * 2 * 2 * 48 * 32 * 4);
  EXPECT_EQ(mine * static_cast<std::size_t>(p), all);
}

// The memory plan counts this rank's experts only: at ep = 4 the parameter, gradient and optimizer
// terms drop by 3/4 of the expert bytes (8 experts x 2 MoE layers x fc1 + fc2, fp32, AdamW's 8 bytes).
TEST(ExpertParallelMemory, PlanCountsThisRanksExperts) {
  auto term = [](const RankMemoryPlan& r, const std::string& name) {
    for (const MemoryTerm& t : r.terms)
      if (t.name == name) return t.bytes;
    return int64_t{-1};
  };
  const std::vector<std::string> moe{"model.num_experts=8", "model.moe_router_topk=2",
                                     "model.moe_ffn_hidden_size=48", "model.hidden_size=32",
                                     "model.num_layers=2"};
  auto plan = [&](int ep) {
    std::vector<std::string> o = moe;
    o.push_back("parallel.expert=" + std::to_string(ep));
    return plan_memory(parse_config("", o, 4), 4).ranks.at(0);
  };
  const RankMemoryPlan one = plan(1), four = plan(4);
  const int64_t expert_elements = 2 * 8 * (48 + 48) * 32;
  const int64_t moved = expert_elements * 3 / 4;
  EXPECT_EQ(term(one, "parameters") - term(four, "parameters"), moved * 4);
  EXPECT_EQ(term(one, "gradients") - term(four, "gradients"), moved * 4);
  EXPECT_EQ(term(one, "optimizer") - term(four, "optimizer"), moved * 8);
}

}  // namespace
}  // namespace parallel
