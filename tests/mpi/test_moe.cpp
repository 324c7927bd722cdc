// Mixture of experts (src/model/moe.cpp):
//   - one MoE layer against the float64 PyTorch reference (tests/reference/make_moe_fixture.py):
//     router, top-k, capacity drops, experts, combine, aux and z losses, forward and backward
//     (and the same on a GPU when one is present);
//   - expert parallelism with real processes: ep = world (2 or 4) equals one rank for 4 and 8
//     experts, top-1 and top-2, dropless, both dispatchers (losses and every gradient, fp32, 1e-5);
//   - tensor parallelism inside experts: etp 2 (np 2) and etp 2 x ep 2 (np 4) equal one rank for
//     the same cases, each rank's slices of the experts' gradients against the one-rank ones, and
//     a layer whose experts on one etp pair receive no rows at all;
//   - memory from the allocator: at ep x etp = p a rank holds 1/p of the expert weights;
//   - LoRA on the experts (docs/lora.md, "Experts"): one layer with adapters on gate, up and fc2
//     (SwiGLU) or fc1 (GeLU) and a frozen base against the PyTorch reference on 1 rank, ep 2
//     (np 2), etp 2 (np 2) and ep 2 x etp 2 (np 4), and the whole GPT with adapters at ep and
//     ep x etp against one rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../../src/model/moe_layer.hpp"
#include "compare.hpp"
#include "mpi_test.hpp"
#include "parallel/allocator.hpp"
#include "parallel/device.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/init.hpp"
#include "parallel/memory_plan.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/precision.hpp"
#include "parallel/safetensors.hpp"
#include "parity.hpp"
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

// device: where the layer runs (its parameters moved there as the model moves them, so SwiGLU's
// gate|up parts stay one operand); tol: relative to the float64 reference.
void check_fixture(const std::string& name, Device device = Device::cpu(), double tol = 1e-5) {
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
  // The fixture's fc1 is [E, F | 2F, h] (SwiGLU: gate then up), which the parts' rows tile.
  auto fc1_part = [&](const std::string& key, int64_t e, std::size_t part) {
    const int64_t rows = c.moe_ffn_hidden_size;
    return f.at(key).select(e).narrow(0, static_cast<int64_t>(part) * rows, rows);
  };
  for (int64_t e = 0; e < E; ++e) {
    for (std::size_t j = 0; j < layer.fc1[e].size(); ++j) layer.fc1[e][j].value.copy_(fc1_part("fc1", e, j));
    layer.fc2[e].value.copy_(f.at("fc2").select(e));
  }
  move_parameters(layer.parameters(), device);
  model::MoELayer::Context ctx;
  Tensor y = layer.forward(f.at("x").to(device), ctx, /*record_stats=*/true);
  EXPECT_EQ(y.device(), device);
  EXPECT_TRUE(close("y", y, f.at("y"), tol));
  const model::MoEStats& s = layer.stats();
  EXPECT_NEAR(s.aux_loss, f.at("aux").to_float_vector()[0], tol * std::abs(f.at("aux").to_float_vector()[0]));
  EXPECT_NEAR(s.z_loss, f.at("z").to_float_vector()[0], tol * std::abs(f.at("z").to_float_vector()[0]));
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
  Tensor dx = layer.backward(f.at("dy").to(device), ctx);
  EXPECT_TRUE(close("dx", dx, f.at("dx"), tol));
  EXPECT_TRUE(close("grad.router", layer.router.grad, f.at("grad.router"), tol));
  for (int64_t e = 0; e < E; ++e) {
    for (std::size_t j = 0; j < layer.fc1[e].size(); ++j)
      EXPECT_TRUE(close(layer.fc1[e][j].name, layer.fc1[e][j].grad, fc1_part("grad.fc1", e, j), tol));
    EXPECT_TRUE(close("grad.fc2 " + std::to_string(e), layer.fc2[e].grad, f.at("grad.fc2").select(e), tol));
  }
}

TEST(MoEPyTorchReference, GeluTop2Dropless) { check_fixture("moe_gelu_top2"); }
TEST(MoEPyTorchReference, SwigluTop1WithCapacity) { check_fixture("moe_swiglu_top1_capacity"); }
// The same layer on a GPU: routing on the logits read back, the row passes as the CUDA kernels of
// kernels/cuda/rows.cu, the experts as cuBLASLt GEMMs on row ranges. 1e-4: cuBLASLt and the CUDA
// reductions sum in other orders than the CPU (as trainer_gpu.sh's fp32 bound). Skipped without a GPU
// (scripts/gpu_check.sh runs it).
TEST(MoEPyTorchReference, OnCuda) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: the MoE layer on CUDA is not checked here";
  check_fixture("moe_gelu_top2", Device::cuda(), 1e-4);
  check_fixture("moe_swiglu_top1_capacity", Device::cuda(), 1e-4);
}

// ---- the routing options against PyTorch and Hugging Face -----------------------------------

// tests/reference/make_ds_moe_fixture.py: a SwiGLU MoE layer with router.hpp's options. `hf`: the
// loss coefficients zeroed and the layer checked against Hugging Face's own block instead (its
// router runs in float32, hence 1e-5).
void check_routing_fixture(const std::string& name, bool hf) {
  const std::string path = testing::fixtures_dir() + "/" + name + ".safetensors";
  auto f = safetensors::load(path);
  const auto meta = safetensors::load_metadata(path);
  auto solo = world().split(world().rank(), 0);
  ModelConfig c;
  c.hidden_size = std::stoi(meta.at("hidden"));
  c.num_experts = std::stoi(meta.at("num_experts"));
  c.moe_router_topk = std::stoi(meta.at("topk"));
  c.moe_ffn_hidden_size = std::stoi(meta.at("ffn"));
  c.activation = Activation::SwiGLU;
  c.moe_router_score_function =
      meta.at("score_function") == "sigmoid" ? MoeScoreFunction::Sigmoid : MoeScoreFunction::Softmax;
  c.moe_norm_topk_prob = meta.at("norm_topk_prob") == "1";
  c.moe_routed_scaling_factor = std::stod(meta.at("routed_scaling_factor"));
  c.moe_n_group = std::stoi(meta.at("n_group"));
  c.moe_topk_group = std::stoi(meta.at("topk_group"));
  c.moe_router_expert_bias = meta.at("expert_bias") == "1";
  c.moe_bias_update_speed = std::stod(meta.at("bias_update_speed"));
  if (!hf) {
    c.moe_aux_loss_coeff = std::stod(meta.at("aux_coeff"));
    c.moe_seq_aux_loss_coeff = std::stod(meta.at("seq_aux_coeff"));
    c.moe_z_loss_coeff = std::stod(meta.at("z_coeff"));
  }
  const std::string pre = hf ? "hf." : "";
  const double tol = hf ? 1e-5 : 1e-6;
  model::LayerEnv env;
  env.config = &c;
  env.tp = solo.get();
  env.hidden = c.hidden_size;
  env.ffn = c.moe_ffn_hidden_size;
  model::MoELayer layer(env, 0);
  layer.router.value.copy_(f.at("router"));
  if (c.moe_router_expert_bias) layer.gate.bias.value.copy_(f.at("bias"));
  const int64_t E = c.num_experts, F = c.moe_ffn_hidden_size;
  for (int64_t e = 0; e < E; ++e) {
    for (std::size_t j = 0; j < 2; ++j)
      layer.fc1[e][j].value.copy_(f.at("fc1").select(e).narrow(0, static_cast<int64_t>(j) * F, F));
    layer.fc2[e].value.copy_(f.at("fc2").select(e));
  }
  model::MoELayer::Context ctx;
  Tensor y = layer.forward(f.at("x"), ctx, /*record_stats=*/true);
  EXPECT_TRUE(close(name + " y", y, f.at(pre + "y"), tol));
  const model::MoEStats& s = layer.stats();
  const std::vector<float> counts = f.at("tokens_per_expert").to_float_vector();
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(s.tokens_per_expert[e], static_cast<int64_t>(counts[e])) << name << " expert " << e;
    EXPECT_EQ(layer.gate.load()[e], static_cast<int64_t>(counts[e])) << name << " load of expert " << e;
  }
  if (!hf) {
    for (const auto& [key, value] :
         {std::pair<std::string, double>{"aux", s.aux_loss}, {"seq_aux", s.seq_aux_loss}, {"z", s.z_loss}}) {
      const double expected = f.at(key).to_float_vector()[0];
      EXPECT_NEAR(value, expected, 1e-6 * std::abs(expected)) << name << " " << key;
    }
  }
  Tensor dx = layer.backward(f.at("dy"), ctx);
  EXPECT_TRUE(close(name + " dx", dx, f.at(pre + "dx"), tol));
  EXPECT_TRUE(close(name + " grad.router", layer.router.grad, f.at(pre + "grad.router"), tol));
  for (int64_t e = 0; e < E; ++e) {
    for (std::size_t j = 0; j < 2; ++j)
      EXPECT_TRUE(close(layer.fc1[e][j].name, layer.fc1[e][j].grad,
                        f.at(pre + "grad.fc1").select(e).narrow(0, static_cast<int64_t>(j) * F, F), tol));
    EXPECT_TRUE(close(layer.fc2[e].name, layer.fc2[e].grad, f.at(pre + "grad.fc2").select(e), tol));
  }
  // The bias has no gradient and moves only by the load: bias + speed * sign(mean - load).
  if (c.moe_router_expert_bias) {
    EXPECT_FALSE(layer.gate.bias.grad.defined());
    EXPECT_TRUE(close(name + " bias before the update", layer.gate.bias.value, f.at("bias"), 0.0, 1e-30));
    layer.gate.update_bias(layer.gate.load());
    EXPECT_TRUE(close(name + " bias_after", layer.gate.bias.value, f.at("bias_after"), 1e-6));
    for (int64_t n : layer.gate.load()) EXPECT_EQ(n, 0) << "the load restarts after an update";
  }
}

TEST(MoERouting, DeepSeekV3SigmoidGroupLimitedBiasSeqAux) {
  check_routing_fixture("moe_route_deepseek_v3", false);
}
TEST(MoERouting, DeepSeekV3AgainstHuggingFace) { check_routing_fixture("moe_route_deepseek_v3", true); }
TEST(MoERouting, Qwen3MoeNormTopkWithAux) { check_routing_fixture("moe_route_qwen3_moe", false); }
TEST(MoERouting, Qwen3MoeAgainstHuggingFace) { check_routing_fixture("moe_route_qwen3_moe", true); }
TEST(MoERouting, MixtralTop2Renormalised) { check_routing_fixture("moe_route_mixtral", false); }
TEST(MoERouting, MixtralAgainstHuggingFace) { check_routing_fixture("moe_route_mixtral", true); }

// The routing options on the meta device (memory plan): balanced routing whatever the options, and
// the backward runs.
TEST(MoERouting, RunsOnMeta) {
  auto solo = world().split(world().rank(), 0);
  ModelConfig c;
  c.hidden_size = 16;
  c.num_experts = 8;
  c.moe_router_topk = 3;
  c.moe_ffn_hidden_size = 12;
  c.activation = Activation::SwiGLU;
  c.moe_router_score_function = MoeScoreFunction::Sigmoid;
  c.moe_norm_topk_prob = true;
  c.moe_routed_scaling_factor = 2.5;
  c.moe_n_group = 4;
  c.moe_topk_group = 2;
  c.moe_router_expert_bias = true;
  c.moe_seq_aux_loss_coeff = 0.1;
  model::LayerEnv env;
  env.config = &c;
  env.tp = solo.get();
  env.hidden = c.hidden_size;
  env.ffn = c.moe_ffn_hidden_size;
  ParameterDeviceScope on_meta(Device::meta());
  model::MoELayer layer(env, 0);
  model::MoELayer::Context ctx;
  Tensor y = layer.forward(Tensor::empty({8, 2, 16}, DType::F32, Device::meta()), ctx, true);
  EXPECT_TRUE(y.device().is_meta());
  for (int64_t n : layer.stats().tokens_per_expert) EXPECT_EQ(n, 8 * 2 * 3 / 8) << "balanced";
  Tensor dx = layer.backward(Tensor::empty({8, 2, 16}, DType::F32, Device::meta()), ctx);
  EXPECT_TRUE(dx.device().is_meta());
}

// ---- LoRA on the experts against PyTorch --------------------------------------------------------

// One MoE layer with LoRA on its experts (make_moe_fixture.py's moe_*_lora), its base frozen as
// GPTModel freezes it, at ep = world / etp and etp. Every rank feeds the fixture's x, so y and dx
// are the fixture's on every rank, and each expert sees its rows from all `world` ranks (edp 1):
// its adapters' gradients are world times the fixture's (this rank's slice of them).
void check_lora_fixture(const std::string& name, int etp) {
  const std::string path = testing::fixtures_dir() + "/" + name + ".safetensors";
  auto f = safetensors::load(path);
  const auto meta = safetensors::load_metadata(path);
  const int p = world().size();
  auto solo = world().split(world().rank(), 0);
  ParallelState state(world(), RankGrid::from_world(p, 1, 1, 1, p / etp, etp));
  ModelConfig c;
  c.hidden_size = std::stoi(meta.at("hidden"));
  c.num_experts = std::stoi(meta.at("num_experts"));
  c.moe_router_topk = std::stoi(meta.at("topk"));
  c.moe_ffn_hidden_size = std::stoi(meta.at("ffn"));
  c.activation = meta.at("activation") == "swiglu" ? Activation::SwiGLU : Activation::GeLU;
  c.moe_aux_loss_coeff = std::stod(meta.at("aux_coeff"));
  c.moe_z_loss_coeff = std::stod(meta.at("z_coeff"));
  c.lora.rank = std::stoi(meta.at("lora_rank"));
  c.lora.alpha = std::stod(meta.at("lora_alpha"));
  c.lora.target_modules = meta.at("lora_targets");
  model::LayerEnv env;
  env.config = &c;
  env.tp = solo.get();
  env.ep = &state.ep();
  env.etp = &state.etp();
  env.hidden = c.hidden_size;
  env.ffn = c.moe_ffn_hidden_size;
  std::unique_ptr<model::MoELayer> layer;
  {
    FrozenParameterScope frozen(true);  // as GPTModel builds a LoRA model's layers
    layer = std::make_unique<model::MoELayer>(env, 0);
  }
  const int64_t F = c.moe_ffn_hidden_size, fl = F / etp;
  const int64_t local = c.num_experts / (p / etp), first = state.ep().rank() * local;
  const int64_t cut = state.etp().rank() * fl;
  layer->router.value.copy_(f.at("router"));
  // This rank's box of a fixture tensor stacked over the experts [E, ...].
  auto box = [](const Tensor& stacked, int64_t expert, const Parameter& q) {
    const Tensor t = stacked.select(expert);
    return q.partition_dim < 0
               ? t.contiguous()
               : t.narrow(q.partition_dim, q.partition_offset, q.value.size(q.partition_dim)).contiguous();
  };
  for (int64_t i = 0; i < local; ++i) {
    for (std::size_t j = 0; j < layer->fc1[i].size(); ++j)
      layer->fc1[i][j].value.copy_(
          f.at("fc1").select(first + i).narrow(0, static_cast<int64_t>(j) * F + cut, fl));
    layer->fc2[i].value.copy_(box(f.at("fc2"), first + i, layer->fc2[i]));
  }
  // "layers.0.mlp.experts.<g>.<part>.lora_<A|B>.weight" <- the fixture's lora_<A|B>.<part> [E, ...].
  int adapters = 0;
  std::vector<std::pair<Parameter*, Tensor>> expected;
  for (Parameter* q : layer->parameters()) {
    const std::size_t at = q->name.find(".lora_");
    if (at == std::string::npos) {
      q->frozen = true;
      EXPECT_FALSE(q->grad.defined()) << q->name << ": a frozen weight was given a gradient";
      continue;
    }
    ++adapters;
    const std::string head = q->name.substr(0, at), prefix = "layers.0.mlp.experts.";
    ASSERT_TRUE(head.starts_with(prefix)) << q->name;
    const std::size_t dot = head.find('.', prefix.size());
    const int64_t g = std::stoll(head.substr(prefix.size(), dot - prefix.size()));
    const std::string key = std::string("lora_") + q->name[at + 6] + "." + head.substr(dot + 1);
    q->value.copy_(box(f.at(key), g, *q));
    Tensor want = box(f.at("grad." + key), g, *q);
    ops::scale_(want, static_cast<float>(p));
    expected.emplace_back(q, want);
  }
  const int64_t targets = static_cast<int64_t>(lora_target_modules(c.lora.target_modules).size());
  EXPECT_EQ(adapters, 2 * targets * local);
  zero_grads(layer->parameters());
  model::MoELayer::Context ctx;
  Tensor y = layer->forward(f.at("x"), ctx, /*record_stats=*/true);
  EXPECT_TRUE(close("y", y, f.at("y"), 1e-5));
  Tensor dx = layer->backward(f.at("dy"), ctx);
  EXPECT_TRUE(close("dx", dx, f.at("dx"), 1e-5));
  for (auto& [q, want] : expected) {
    EXPECT_TRUE(close(q->name + " (rank " + std::to_string(world().rank()) + ")", q->grad, want, 1e-5));
    EXPECT_GT(testing::max_abs(want), 0.0) << q->name << ": the comparison needs a non-zero gradient";
  }
}

TEST(MoELoraPyTorchReference, SwigluGateUpFc2) {
  check_lora_fixture("moe_swiglu_top2_lora", 1);
  if (world().size() > 1) check_lora_fixture("moe_swiglu_top2_lora", 2);
}
TEST(MoELoraPyTorchReference, GeluFc1) {
  check_lora_fixture("moe_gelu_top1_lora", 1);
  if (world().size() > 1) check_lora_fixture("moe_gelu_top1_lora", 2);
}

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

// The trainer's grid at tp 1 and dp = world with ep x etp = world (edp 1): rank r runs micro-batch r.
// lora: every model's B's drawn non-zero (init_normal, the same values on every layout) so that
// every adapter gradient carries signal; the frozen base has none to compare.
void expert_parallel_parity(const ModelConfig& c, int etp) {
  auto nonzero_b = [&](GPTModel& m) {
    for (Parameter* q : m.parameters())
      if (q->name.ends_with(".lora_B.weight")) init_normal(*q, 77, 0.2f);
  };
  const int p = world().size();
  const int r = world().rank();
  auto solo = world().split(r, 0);
  ParallelState state(world(), RankGrid::from_world(p, 1, 1, 1, p / etp, etp));
  const int64_t b = 2;
  const Tensor seed = Tensor::full({1}, 1.0 / static_cast<double>(b * c.seq_length), DType::F32);
  // One rank: every rank's micro-batch, one after the other.
  GPTModel ref(c, {0, c.num_layers, true, true}, {}, *solo);
  if (c.lora.enabled()) nonzero_b(ref);
  std::vector<float> ref_loss;
  for (int q = 0; q < p; ++q) {
    auto [tokens, targets] = batch(q, c, b);
    auto act = ref.new_activations();
    ref_loss.push_back(ref.forward(tokens, targets, *act, q).to_float_vector()[0]);
    ref.backward(seed, *act);
  }
  // ep x etp = p: rank r runs micro-batch r; the experts see every rank's tokens.
  GPTModel::Options o;
  o.expert = &state.ep();
  o.expert_tensor = &state.etp();
  GPTModel ep(c, {0, c.num_layers, true, true}, o, *solo);
  if (c.lora.enabled()) nonzero_b(ep);
  auto [tokens, targets] = batch(r, c, b);
  auto act = ep.new_activations();
  const float loss = ep.forward(tokens, targets, *act, r).to_float_vector()[0];
  ep.backward(seed, *act);
  EXPECT_NEAR(loss, ref_loss[r], 1e-5 * std::abs(ref_loss[r]));

  std::map<std::string, Parameter*> by_name;
  for (Parameter* q : ref.parameters()) by_name[q->name] = q;
  int experts_here = 0, adapters_here = 0;
  for (Parameter* q : ep.parameters()) {
    ASSERT_TRUE(by_name.count(q->name)) << q->name;
    if (q->frozen) {  // LoRA's base
      EXPECT_FALSE(q->grad.defined()) << q->name;
      continue;
    }
    const bool adapter = q->name.find(".lora_") != std::string::npos;
    Parameter mine = *q;  // experts: this etp rank's slice (rows of fc1 / gate / up, columns of fc2)
    mine.grad = q->grad.clone();
    if (q->expert && adapter) {
      ++adapters_here;
    } else if (q->expert) {
      ++experts_here;
      EXPECT_GE(q->partition_dim, 0) << q->name;
    } else {
      static_cast<Communicator&>(world()).all_reduce(mine.grad);  // dense: each rank's micro-batch's share
    }
    // Without rope the key bias shifts each query's scores equally: its gradient is rounding noise.
    const bool inert =
        c.position_embedding != PositionEmbedding::Rope && q->name.ends_with("attention.key.bias");
    testing::expect_grad_matches(mine, *by_name[q->name], c.vocab_size, inert,
                                 q->name + " (rank " + std::to_string(r) + ")", 1e-5);
  }
  int moe_layers = 0;
  for (int l = 0; l < c.num_layers; ++l) moe_layers += c.is_moe_layer(l);
  const int per_expert = c.activation == Activation::SwiGLU ? 3 : 2;  // gate, up, fc2 or fc1, fc2
  if (c.lora.enabled()) {  // every expert linear adapted: an A and a B each, no base gradient
    EXPECT_EQ(experts_here, 0);
    EXPECT_EQ(adapters_here, 2 * per_expert * moe_layers * c.num_experts / (p / etp));
  } else {
    EXPECT_EQ(experts_here, per_expert * moe_layers * c.num_experts / (p / etp));
  }
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
  expert_parallel_parity(moe_config(k.experts, k.topk, k.dispatcher, k.llama), 1);
}

// etp 2 and ep = world / 2: the experts' inner width split over rank pairs (np 2: etp alone).
class ExpertTensorParallel : public ::testing::TestWithParam<EpCase> {};

TEST_P(ExpertTensorParallel, EqualsOneRank) {
  const EpCase k = GetParam();
  if (world().size() == 1) GTEST_SKIP() << "needs etp 2";
  if (k.experts % (world().size() / 2) != 0) GTEST_SKIP() << "experts do not divide over ep";
  expert_parallel_parity(moe_config(k.experts, k.topk, k.dispatcher, k.llama), 2);
}

const auto kCases = ::testing::Values(
    EpCase{4, 1, MoeDispatcher::AllToAll, false}, EpCase{4, 2, MoeDispatcher::AllToAll, false},
    EpCase{8, 1, MoeDispatcher::AllToAll, true}, EpCase{8, 2, MoeDispatcher::AllToAll, false},
    EpCase{8, 2, MoeDispatcher::AllGather, true}, EpCase{4, 1, MoeDispatcher::AllGather, false});
INSTANTIATE_TEST_SUITE_P(Cases, ExpertParallel, kCases);
INSTANTIATE_TEST_SUITE_P(Cases, ExpertTensorParallel, kCases);

// LoRA on every linear of a MoE GPT (attention, the dense layer's MLP, the shared expert and the
// experts), base frozen: ep = world and ep x etp 2 equal one rank (losses, every adapter gradient).
ModelConfig lora_moe_config(bool llama) {
  ModelConfig c = moe_config(4, 2, MoeDispatcher::AllToAll, llama);  // every expert gets tokens
  c.lora.rank = 2;
  c.lora.alpha = 4.0;
  c.lora.target_modules = llama ? "q,k,v,o,gate,up,fc2" : "q,v,o,fc1,fc2";
  return c;
}
TEST(ExpertParallelLora, EqualsOneRank) {
  if (world().size() == 1) GTEST_SKIP() << "needs ep > 1";
  for (bool llama : {false, true}) expert_parallel_parity(lora_moe_config(llama), 1);
}
TEST(ExpertTensorParallelLora, EqualsOneRank) {
  if (world().size() == 1) GTEST_SKIP() << "needs etp 2";
  for (bool llama : {false, true}) expert_parallel_parity(lora_moe_config(llama), 2);
}

// Every token routed to expert 0: at etp 2 x ep 2 the etp pair holding experts 2 and 3 gathers no
// rows at all (an empty all-gather and reduce-scatter), and the layer still equals one rank's.
TEST(ExpertTensorParallel, IdleExpertsGatherNoRows) {
  if (world().size() != 4) GTEST_SKIP() << "needs etp 2 x ep 2";
  const int r = world().rank();
  auto solo = world().split(r, 0);
  ParallelState state(world(), RankGrid::from_world(4, 1, 1, 1, 2, 2));
  ModelConfig c = moe_config(4, 1, MoeDispatcher::AllToAll, false);
  c.moe_aux_loss_coeff = 0.01;
  auto make = [&](Communicator* ep, Communicator* etp) {
    auto env = std::make_unique<model::LayerEnv>();
    env->config = &c;
    env->tp = solo.get();
    env->hidden = c.hidden_size;
    env->ffn = c.ffn_hidden_size;
    env->ep = ep;
    env->etp = etp;
    return env;
  };
  auto env_one = make(nullptr, nullptr), env_split = make(&state.ep(), &state.etp());
  model::MoELayer one(*env_one, 0), split(*env_split, 0);
  for (model::MoELayer* l : {&one, &split}) {
    for (Parameter* p : l->parameters()) init_normal(*p, 7, 0.05f);
    // Positive inputs and a router row of +1 for expert 0, -1 for the rest: expert 0 always wins.
    std::vector<float> router(static_cast<std::size_t>(c.num_experts * c.hidden_size), -1.0f);
    std::fill(router.begin(), router.begin() + c.hidden_size, 1.0f);
    l->router.value.copy_(Tensor::from_vector(router, {c.num_experts, c.hidden_size}));
  }
  // Rank q's tokens [4, 2, h]; one rank runs all four ranks' tokens in turn.
  auto tokens = [&](int q) {
    std::vector<float> x(static_cast<std::size_t>(8 * c.hidden_size));
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = 0.1f + 0.01f * static_cast<float>((i * 7 + q * 13) % 17);
    return Tensor::from_vector(x, {4, 2, c.hidden_size});
  };
  const Tensor dy = Tensor::full({4, 2, c.hidden_size}, 0.5, DType::F32);
  Tensor y_one, dx_one;
  for (int q = 0; q < 4; ++q) {
    model::MoELayer::Context ctx;
    Tensor y = one.forward(tokens(q), ctx, false);
    Tensor dx = one.backward(dy, ctx);
    if (q == r) {
      y_one = y;
      dx_one = dx;
    }
  }
  model::MoELayer::Context ctx;
  Tensor y = split.forward(tokens(r), ctx, false);
  EXPECT_EQ(ctx.local_offsets.back(), state.coord().ep == 0 ? 4 * 8 : 0) << "rows at this etp pair's experts";
  Tensor dx = split.backward(dy, ctx);
  EXPECT_TRUE(close("y", y, y_one, 1e-5));
  EXPECT_TRUE(close("dx", dx, dx_one, 1e-5));
  // Expert 0's gradient slice holds every rank's tokens; the idle experts' stay zero.
  for (std::size_t e = 0; e < split.fc2.size(); ++e) {
    const Parameter& p = split.fc2[e];
    const std::size_t g = static_cast<std::size_t>(state.coord().ep) * split.fc2.size() + e;
    Tensor expected = one.fc2[g].grad.narrow(1, p.partition_offset, p.value.size(1)).contiguous();
    EXPECT_TRUE(close(p.name, p.grad, expected, 1e-5, 1e-30));
    EXPECT_EQ(testing::max_abs(p.grad) > 0, g == 0) << p.name;
  }
}

// model.moe_router_force_load_balancing (benchmarking): with a router whose expert 0 always wins,
// the forced router still gives every expert its exact share - token t's j-th choice is expert
// (t k + j) mod E, the meta run's assumption - and the combine weights are the softmax scores of the
// experts so chosen; off, the same layer sends every assignment to expert 0 (the knob is what
// balances).
TEST(MoERouting, ForceLoadBalancingGivesEveryExpertItsShare) {
  auto solo = world().split(world().rank(), 0);
  for (const bool force : {false, true}) {
    ModelConfig c = moe_config(4, 2, MoeDispatcher::AllToAll, false);
    c.moe_router_force_load_balancing = force;
    model::LayerEnv env;
    env.config = &c;
    env.tp = solo.get();
    env.hidden = c.hidden_size;
    env.ffn = c.moe_ffn_hidden_size;
    model::MoELayer layer(env, 0);
    for (Parameter* p : layer.parameters()) init_normal(*p, 7, 0.05f);
    std::vector<float> router(static_cast<std::size_t>(c.num_experts * c.hidden_size), -0.1f);
    std::fill(router.begin(), router.begin() + c.hidden_size, 0.1f);
    layer.router.value.copy_(Tensor::from_vector(router, {c.num_experts, c.hidden_size}));
    const int64_t S = 6, B = 2, T = S * B, k = c.moe_router_topk, E = c.num_experts;
    std::vector<float> x(static_cast<std::size_t>(T * c.hidden_size));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f + 0.01f * static_cast<float>((i * 7) % 17);
    model::MoELayer::Context ctx;
    Tensor y = layer.forward(Tensor::from_vector(x, {S, B, c.hidden_size}), ctx, true);
    const auto& counts = layer.stats().tokens_per_expert;
    ASSERT_EQ(static_cast<int64_t>(counts.size()), E);
    // Off: expert 0 first for every token, then the tie among the rest to the lowest index, 1.
    const std::vector<int64_t> expected = force ? std::vector<int64_t>(static_cast<std::size_t>(E), T * k / E)
                                                : std::vector<int64_t>{T, T, 0, 0};
    EXPECT_EQ(counts, expected) << "force " << force;
    if (!force) continue;
    const model::Router::Routing& r = ctx.routing;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const auto a = static_cast<std::size_t>(t * k + j);
        ASSERT_EQ(r.choice[a], (t * k + j) % E) << "token " << t << " choice " << j;
        EXPECT_FLOAT_EQ(r.weight[a], r.scores[static_cast<std::size_t>(t * E + r.choice[a])]);
      }
    }
    // The backward runs on the forced choice (the router's gradient through the chosen scores).
    Tensor dx = layer.backward(Tensor::full({S, B, c.hidden_size}, 0.5, DType::F32), ctx);
    EXPECT_GT(testing::max_abs(layer.router.grad), 0.0);
    EXPECT_TRUE(dx.defined());
  }
}

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
  auto bytes_of_layer = [&](const ModelConfig& c, Communicator* ep, Communicator* etp) {
    model::LayerEnv env;
    env.config = &c;
    env.tp = solo.get();
    env.hidden = c.hidden_size;
    env.ffn = c.ffn_hidden_size;
    env.ep = ep;
    env.etp = etp;
    const std::size_t before = memory_stats(Device::cpu()).allocated;
    model::MoELayer layer(env, 0);
    const std::size_t router = layer.router.value.nbytes() + layer.router.grad.nbytes();
    return memory_stats(Device::cpu()).allocated - before - router;
  };
  for (const bool swiglu : {false, true}) {
    ModelConfig c = moe_config(8, 2, MoeDispatcher::AllToAll, swiglu);
    c.moe_shared_expert_ffn_hidden_size = 0;  // dense, on every rank
    const std::size_t all = bytes_of_layer(c, nullptr, nullptr);
    // fc1 [48, 32] (swiglu: gate and up) and fc2 [32, 48] fp32, value and gradient, per expert.
    EXPECT_EQ(all, 8u * (swiglu ? 3 : 2) * 2 * 48 * 32 * 4);
    // ep = p, and (p > 1) etp 2 x ep p / 2: either way 1/p of the experts' bytes.
    EXPECT_EQ(bytes_of_layer(c, &world(), nullptr) * static_cast<std::size_t>(p), all);
    if (p > 1) {
      ParallelState state(world(), RankGrid::from_world(p, 1, 1, 1, p / 2, 2));
      EXPECT_EQ(bytes_of_layer(c, &state.ep(), &state.etp()) * static_cast<std::size_t>(p), all);
    }
  }
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
  auto plan = [&](int ep, int etp) {
    std::vector<std::string> o = moe;
    o.push_back("parallel.expert=" + std::to_string(ep));
    o.push_back("parallel.expert_tensor=" + std::to_string(etp));
    return plan_memory(parse_config("", o, 4), 4).ranks.at(0);
  };
  const RankMemoryPlan one = plan(1, 1);
  const int64_t expert_elements = 2 * 8 * (48 + 48) * 32;
  const int64_t moved = expert_elements * 3 / 4;
  // ep 4, ep 2 x etp 2 and etp 4: a quarter of the experts' elements each.
  for (const auto& [ep, etp] : std::vector<std::pair<int, int>>{{4, 1}, {2, 2}, {1, 4}}) {
    const RankMemoryPlan four = plan(ep, etp);
    EXPECT_EQ(term(one, "parameters") - term(four, "parameters"), moved * 4) << ep << " x " << etp;
    EXPECT_EQ(term(one, "gradients") - term(four, "gradients"), moved * 4) << ep << " x " << etp;
    EXPECT_EQ(term(one, "optimizer") - term(four, "optimizer"), moved * 8) << ep << " x " << etp;
  }
}

}  // namespace
}  // namespace parallel
