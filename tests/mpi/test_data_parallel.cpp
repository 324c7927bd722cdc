// Data parallelism and the optimizers under mpirun (world 1, 2, 4):
//   - parity: dp = world (plain AdamW / distributed optimizer, with and without overlapped
//     gradient reduction and parameter all-gather) and tp = 2 x dp = 2 (world 4) train a small GPT
//     for 5 steps and end with the same parameters (relative <= 1e-5) as one rank that runs the whole
//     global batch as accumulated micro-batches, in-process on a size-1 communicator, with gradient
//     clipping active. dp rank d takes samples [d G/dp, (d+1) G/dp) of each global batch.
//   - re-binding: after ParamAndGradBuffer makes every Parameter a view into its buffers (fused q/k/v
//     and gate/up included) the model computes exactly what it did, and reads the buffer.
//   - overlap: with small buckets, >= 2 buckets' reductions start before the last layer's backward
//     has finished; with overlap_param_gather the next forward waits for each bucket's all-gather
//     only before that bucket's first use, so some gathers complete after the forward has begun.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "compare.hpp"
#include "mpi_test.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/lr_schedule.hpp"
#include "parallel/ops.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/tensor_parallel.hpp"
#include "samples.hpp"

namespace parallel {
namespace {

using testing::rel_err;
using testing::world;
constexpr double kTol = 1e-5;  // gradient norms and clip coefficients, every step
// Parameters after kSteps AdamW steps. Adam divides each gradient by its own magnitude, so an
// element whose gradient nearly cancels over the tokens turns rounding noise into an update of
// order lr: the worst parameter (a tp2 layout's MLP bias) moves with every rounding change of the
// kernels (6.1e-6 before the AVX2 exp and attention-tile kernels, 1.25e-5 after; every other
// parameter stays within 4.5e-6, the median 1.8e-7), while the gradient norms still agree to 1e-5.
constexpr double kParamTol = 2e-5;
constexpr int kGlobalBatch = 8;  // sequences per step; micro-batches of one sequence
constexpr int kSteps = 5;

double max_abs(const Tensor& t) {
  double m = 0;
  for (float x : t.contiguous().to_float_vector()) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

ModelConfig small_config() {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;
  c.normalization = Normalization::RMSNorm;
  c.activation = Activation::SwiGLU;  // fused gate|up as well as fused q|k|v
  c.position_embedding = PositionEmbedding::Rope;
  c.vocab_size = 256;  // a multiple of 128 * tp for tp = 1, 2: no padding differences
  c.seq_length = 16;
  c.add_bias = true;
  c.tie_embeddings = true;
  c.init_std = 0.1;
  return c;
}

using testing::sample;

OptimizerConfig optimizer_config() {
  OptimizerConfig o;
  o.lr = 2e-3;
  o.min_lr = 2e-4;
  o.warmup_steps = 1;
  o.lr_decay = LrDecay::Cosine;
  o.weight_decay = 0.1;
  o.clip_grad = 0.05;  // below the gradient norm of every step: clipping is active
  return o;
}

// One rank, the whole global batch as accumulated micro-batches; returns each step's result.
std::vector<StepResult> train_reference(GPTModel& model, const ModelConfig& c) {
  const OptimizerConfig oc = optimizer_config();
  AdamW opt(model.parameters(), oc, Precision::FP32);
  LrSchedule schedule(oc, kSteps);
  std::vector<StepResult> results;
  const Tensor seed = Tensor::full({1}, 1.0 / (kGlobalBatch * c.seq_length), DType::F32);
  for (int step = 0; step < kSteps; ++step) {
    zero_grads(model.parameters());
    for (int i = 0; i < kGlobalBatch; ++i) {
      auto [tokens, targets] = sample(c, step, i);
      auto act = model.new_activations();
      model.forward(tokens, targets, *act, static_cast<uint64_t>(i));
      model.backward(seed, *act);
    }
    results.push_back(opt.step(schedule.lr(step)));
  }
  return results;
}

struct Layout {
  const char* label;
  int tp;
  bool distributed, overlap_grad, overlap_param;
  Precision precision = Precision::FP32;
  Sharding sharding = Sharding::None;  // None: `distributed` decides (optim or none)
  bool reshard_after_forward = true;
  bool hsdp = false;  // sharding_group_size = dp / 2 (needs dp >= 4)
  int prefetch_units = 1;
};
void PrintTo(const Layout& s, std::ostream* os) { *os << s.label; }

class DataParallelParity : public ::testing::TestWithParam<Layout> {};

TEST_P(DataParallelParity, MatchesOneRankWithTheGlobalBatch) {
  const Layout setup = GetParam();
  if (world().size() % setup.tp != 0) GTEST_SKIP() << "world not divisible by tp";
  if (setup.hsdp && world().size() / setup.tp < 4) GTEST_SKIP() << "HSDP needs dp >= 4";
  ParallelState state(world(), RankGrid::from_world(world().size(), setup.tp, 1));
  const int dp = state.dp().size(), d = state.coord().dp;
  const ModelConfig c = small_config();
  const ChunkSpec whole{0, c.num_layers, true, true};

  auto solo = world().split(world().rank(), 0);
  GPTModel ref(c, whole, {.seed = 11}, *solo);
  const auto ref_results = train_reference(ref, c);
  for (const StepResult& r : ref_results) ASSERT_LT(r.clip_coef, 1.0) << "clipping must be active";

  GPTModel model(c, whole, {.seed = 11}, state.tp());
  OptimizerConfig oc = optimizer_config();
  oc.distributed = setup.distributed;
  oc.overlap_grad_reduce = setup.overlap_grad;
  oc.overlap_param_gather = setup.overlap_param;
  oc.bucket_size = 20000;  // several buckets
  if (setup.sharding != Sharding::None) oc.sharding = setup.sharding;
  oc.reshard_after_forward = setup.reshard_after_forward;
  oc.prefetch_units = setup.prefetch_units;
  if (setup.hsdp) oc.sharding_group_size = dp / 2;
  DataParallel ddp({&model}, state.dp(), DataParallelOptions::from(oc, setup.precision));
  EXPECT_EQ(ddp.shard_group().size(), setup.hsdp ? dp / 2 : dp);
  ASSERT_GT(ddp.buffer().buckets().size(), 2u);
  const std::unique_ptr<Optimizer> opt = make_optimizer(ddp, oc, OptimizerGroups::from(state));
  LrSchedule schedule(oc, kSteps);
  const int local = kGlobalBatch / dp;
  const Tensor seed = Tensor::full({1}, 1.0 / (local * c.seq_length), DType::F32);
  for (int step = 0; step < kSteps; ++step) {
    ddp.zero_grad();
    for (int m = 0; m < local; ++m) {
      const int i = d * local + m;
      auto [tokens, targets] = sample(c, step, i);
      ddp.set_is_last_microbatch(m == local - 1);
      auto act = model.new_activations();
      model.forward(tokens, targets, *act, static_cast<uint64_t>(i));
      model.backward(seed, *act);
    }
    // The order a trainer uses: gradients other groups sum are finalised before the dp reduction.
    tp::reduce_sequence_parallel_grads(model.parameters(), state.tp());
    ddp.finish_grad_sync();
    const StepResult r = opt->step(schedule.lr(step));
    EXPECT_NEAR(r.grad_norm, ref_results[step].grad_norm, 1e-5 * ref_results[step].grad_norm)
        << "step " << step;
    EXPECT_NEAR(r.clip_coef, ref_results[step].clip_coef, 1e-5 * ref_results[step].clip_coef);
    if (ddp.buffer().params_sharded()) {
      // Between steps nothing is gathered: the parameters exist only as shards.
      EXPECT_EQ(ddp.gathered_param_bytes(), 0);
      for (Parameter* p : model.parameters()) EXPECT_FALSE(p->value.defined()) << p->name;
    }
    if (ddp.buffer().grads_sharded())
      for (Parameter* p : model.parameters()) EXPECT_FALSE(p->grad.defined()) << p->name;
  }
  ddp.unshard();  // ZeRO-3: gathers every unit to compare; otherwise finishes pending gathers

  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : ref.parameters()) by_name[p->name] = p;
  for (Parameter* p : model.parameters()) {
    ASSERT_TRUE(by_name.count(p->name)) << p->name;
    const Parameter& r = *by_name[p->name];
    const Tensor expected = p->partition_dim < 0 ? r.value
                                                 : r.value.narrow(p->partition_dim, p->partition_offset,
                                                                  p->value.size(p->partition_dim));
    if (p->name.ends_with("attention.key.bias")) {
      // Adding bk to every key barely moves softmax (exactly not at all without rope): its gradient
      // is rounding noise, far below Adam's eps, so each step moves it by about lr * noise / eps,
      // and the noise differs between layouts and compilers (Clang's FMA contraction measured
      // 1.4e-6 here, GCC less). A real gradient of eps or more would move it by ~lr per step, so
      // 1e-3 of lr * steps still tells a real disagreement from noise.
      const double diff = rel_err(p->value, expected) * max_abs(expected);
      EXPECT_LE(diff, 1e-3 * oc.lr * kSteps) << p->name << " on rank " << world().rank();
      continue;
    }
    EXPECT_LE(rel_err(p->value, expected), kParamTol) << p->name << " on rank " << world().rank();
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallelParity,
                         ::testing::Values(Layout{"AdamW", 1, false, false, false},
                                           Layout{"AdamWOverlap", 1, false, true, false},
                                           Layout{"Distributed", 1, true, false, false},
                                           Layout{"DistributedOverlap", 1, true, true, true},
                                           Layout{"Tp2AdamW", 2, false, true, false},
                                           Layout{"Tp2Distributed", 2, true, true, true},
                                           Layout{.label = "OptimGrads",
                                                  .tp = 1,
                                                  .distributed = false,
                                                  .overlap_grad = false,
                                                  .overlap_param = true,
                                                  .sharding = Sharding::OptimGrads},
                                           Layout{.label = "OptimGradsParams",
                                                  .tp = 1,
                                                  .distributed = false,
                                                  .overlap_grad = false,
                                                  .overlap_param = false,
                                                  .sharding = Sharding::OptimGradsParams},
                                           Layout{.label = "OptimGradsParamsKeepAfterForward",
                                                  .tp = 1,
                                                  .distributed = false,
                                                  .overlap_grad = false,
                                                  .overlap_param = false,
                                                  .sharding = Sharding::OptimGradsParams,
                                                  .reshard_after_forward = false},
                                           Layout{.label = "OptimGradsParamsNoPrefetch",
                                                  .tp = 1,
                                                  .distributed = false,
                                                  .overlap_grad = false,
                                                  .overlap_param = false,
                                                  .sharding = Sharding::OptimGradsParams,
                                                  .prefetch_units = 0},
                                           Layout{.label = "Tp2OptimGradsParams",
                                                  .tp = 2,
                                                  .distributed = false,
                                                  .overlap_grad = false,
                                                  .overlap_param = false,
                                                  .sharding = Sharding::OptimGradsParams},
                                           Layout{.label = "HsdpOptim",
                                                  .tp = 1,
                                                  .distributed = true,
                                                  .overlap_grad = true,
                                                  .overlap_param = false,
                                                  .hsdp = true},
                                           Layout{.label = "HsdpOptimGrads",
                                                  .tp = 1,
                                                  .distributed = false,
                                                  .overlap_grad = false,
                                                  .overlap_param = false,
                                                  .sharding = Sharding::OptimGrads,
                                                  .hsdp = true},
                                           Layout{.label = "HsdpOptimGradsParams",
                                                  .tp = 1,
                                                  .distributed = false,
                                                  .overlap_grad = false,
                                                  .overlap_param = false,
                                                  .sharding = Sharding::OptimGradsParams,
                                                  .hsdp = true}),
                         [](const auto& info) { return std::string(info.param.label); });

// ---- re-binding into the buffers ------------------------------------------------------------------

float loss_and_grads(GPTModel& model, const ModelConfig& c) {
  auto [tokens, targets] = sample(c, 0, 0);
  auto act = model.new_activations();
  const float loss = model.forward(tokens, targets, *act).to_float_vector()[0];
  model.backward(Tensor::full({1}, 1.0, DType::F32), *act);
  return loss;
}

TEST(ParamAndGradBuffer, ModelComputesTheSameAfterRebinding) {
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = small_config();
  GPTModel plain(c, {0, c.num_layers, true, true}, {.seed = 5}, *solo);
  GPTModel bound(c, {0, c.num_layers, true, true}, {.seed = 5}, *solo);
  DataParallelOptions o;
  o.distributed_optimizer = true;  // the 64-element alignment too
  o.bucket_size = 10000;
  DataParallel ddp({&bound}, *solo, o);
  ParamAndGradBuffer& buf = ddp.buffer();
  for (Parameter* p : bound.parameters()) {
    EXPECT_EQ(p->value.storage(), buf.param_data().storage()) << p->name;
    EXPECT_EQ(p->grad.storage(), buf.grad_data().storage()) << p->name;
  }
  // Reverse registration order: the word embedding (registered first) sits last.
  EXPECT_EQ(buf.params().back()->name, "embedding.word.weight");
  EXPECT_EQ(buf.numel() % 128, 0);

  EXPECT_EQ(loss_and_grads(plain, c), loss_and_grads(bound, c));
  auto plain_params = plain.parameters(), bound_params = bound.parameters();
  ASSERT_EQ(plain_params.size(), bound_params.size());
  for (std::size_t i = 0; i < plain_params.size(); ++i) {
    EXPECT_EQ(plain_params[i]->value.to_float_vector(), bound_params[i]->value.to_float_vector());
    EXPECT_EQ(plain_params[i]->grad.to_float_vector(), bound_params[i]->grad.to_float_vector())
        << plain_params[i]->name;
  }
  // The layers read the buffer (not a stale copy): change every parameter through the buffer.
  ops::scale_(buf.param_data(), 0.5f);
  for (Parameter* p : plain_params) ops::scale_(p->value, 0.5f);
  zero_grads(plain_params);
  ddp.zero_grad();
  EXPECT_EQ(loss_and_grads(plain, c), loss_and_grads(bound, c));
  for (std::size_t i = 0; i < plain_params.size(); ++i)
    EXPECT_EQ(plain_params[i]->grad.to_float_vector(), bound_params[i]->grad.to_float_vector())
        << plain_params[i]->name;
}

// ---- overlap ----------------------------------------------------------------------------------------

TEST(DataParallelOverlap, EarlyBucketsStartBeforeTheBackwardEnds) {
  const ModelConfig c = small_config();
  // The world is the dp group; each replica has tp = 1.
  auto solo = world().split(world().rank(), 0);
  GPTModel replica(c, {0, c.num_layers, true, true}, {.seed = 3}, *solo);
  DataParallelOptions o;
  o.overlap_grad_reduce = true;
  o.distributed_optimizer = true;
  o.bucket_size = 8000;
  DataParallel ddp({&replica}, world(), o);
  ddp.set_record_events(true);
  ddp.zero_grad();
  ddp.set_is_last_microbatch(true);
  auto [tokens, targets] = sample(c, 0, world().rank());
  auto act = replica.new_activations();
  replica.forward(tokens, targets, *act);
  replica.backward(Tensor::full({1}, 1.0, DType::F32), *act);
  ddp.finish_grad_sync();

  const auto& ev = ddp.events();
  // The last transformer layer to run its backward is layer 0; its parameters become ready when it
  // has finished.
  std::size_t layer0_done = ev.size();
  for (std::size_t i = 0; i < ev.size(); ++i)
    if (ev[i].kind == DdpEvent::Kind::GradReady && ev[i].param->name.starts_with("layers.0.")) {
      layer0_done = i;
      break;
    }
  ASSERT_LT(layer0_done, ev.size());
  int launched_before = 0;
  for (std::size_t i = 0; i < layer0_done; ++i)
    launched_before += ev[i].kind == DdpEvent::Kind::ReduceLaunched;
  EXPECT_GE(launched_before, 2) << "of " << ddp.buffer().buckets().size() << " buckets";
  for (std::size_t i = 1; i < ev.size(); ++i) EXPECT_LE(ev[i - 1].time, ev[i].time);
  int launched = 0;
  for (const DdpEvent& e : ev) launched += e.kind == DdpEvent::Kind::ReduceLaunched;
  EXPECT_EQ(launched, static_cast<int>(ddp.buffer().buckets().size()));  // each exactly once
}

TEST(DataParallelOverlap, ParamGatherOverlapsTheNextForward) {
  const ModelConfig c = small_config();
  ParallelState state(world(), RankGrid::from_world(world().size(), 1, 1));  // dp = world
  GPTModel replica(c, {0, c.num_layers, true, true}, {.seed = 3}, state.tp());
  OptimizerConfig oc = optimizer_config();
  oc.distributed = true;
  oc.overlap_param_gather = true;
  oc.bucket_size = 8000;
  DataParallel ddp({&replica}, state.dp(), DataParallelOptions::from(oc, Precision::FP32));
  const int buckets = static_cast<int>(ddp.buffer().buckets().size());
  ASSERT_GE(buckets, 3);
  DistributedOptimizer opt(ddp, oc, OptimizerGroups::from(state));
  const Tensor seed = Tensor::full({1}, 1.0, DType::F32);

  auto train_step = [&](int step) {
    ddp.zero_grad();
    ddp.set_is_last_microbatch(true);
    auto [tokens, targets] = sample(c, step, world().rank());
    auto act = replica.new_activations();
    replica.forward(tokens, targets, *act);
    replica.backward(seed, *act);
    ddp.finish_grad_sync();
    opt.step(1e-3);
  };
  train_step(0);  // leaves every bucket's gather in flight

  ddp.set_record_events(true);
  ddp.zero_grad();  // must not wait for the gathers: the forward does, bucket by bucket
  for (const DdpEvent& e : ddp.events()) EXPECT_NE(e.kind, DdpEvent::Kind::GatherDone);
  auto [tokens, targets] = sample(c, 1, world().rank());
  auto act = replica.new_activations();
  replica.forward(tokens, targets, *act);

  const auto& ev = ddp.events();
  std::size_t first_use = ev.size();
  for (std::size_t i = 0; i < ev.size(); ++i)
    if (ev[i].kind == DdpEvent::Kind::ParamUse) {
      first_use = i;
      break;
    }
  ASSERT_LT(first_use, ev.size());
  // Every bucket's gather completes exactly once, and before any of its parameters is used.
  std::vector<int> done(static_cast<std::size_t>(buckets), 0);
  int done_after_forward_began = 0;
  for (std::size_t i = 0; i < ev.size(); ++i) {
    const auto b = static_cast<std::size_t>(ev[i].bucket);
    if (ev[i].kind == DdpEvent::Kind::GatherDone) {
      ++done[b];
      if (i > first_use && ev[i].bucket != ev[first_use].bucket) ++done_after_forward_began;
    }
    if (ev[i].kind == DdpEvent::Kind::ParamUse)
      EXPECT_EQ(done[b], 1) << ev[i].param->name << " used before its bucket's gather finished";
  }
  for (int b = 0; b < buckets; ++b) EXPECT_EQ(done[static_cast<std::size_t>(b)], 1) << "bucket " << b;
  // The overlap: later buckets' gathers were still pending while earlier layers ran.
  EXPECT_GE(done_after_forward_began, 1) << "of " << buckets << " buckets";
  for (std::size_t i = 1; i < ev.size(); ++i) EXPECT_LE(ev[i - 1].time, ev[i].time);

  // The rest of the step and another one still work; nothing is left in flight at the end.
  replica.backward(seed, *act);
  ddp.finish_grad_sync();
  opt.step(1e-3);
  train_step(2);
  ddp.finish_param_gather();
}

// ZeRO-3: the next unit's all-gather (the previous unit's, in backward) is launched before the
// current unit starts computing and waited for only after it has finished, and each unit computes
// on gathered parameters that are freed again afterwards.
// One ZeRO-3 step with `prefetch` units prefetched; returns, for forward and backward, how many
// units had their successor's (predecessor's) gather in flight the whole time they computed:
// launched before the unit began and waited for only after it ended.
std::pair<int, int> units_overlapping_the_next_gather(int prefetch, int& pairs) {
  const ModelConfig c = small_config();
  ParallelState state(world(), RankGrid::from_world(world().size(), 1, 1));  // dp = world
  GPTModel replica(c, {0, c.num_layers, true, true}, {.seed = 3}, state.tp());
  OptimizerConfig oc = optimizer_config();
  oc.sharding = Sharding::OptimGradsParams;
  oc.prefetch_units = prefetch;
  DataParallel ddp({&replica}, state.dp(), DataParallelOptions::from(oc, Precision::FP32));
  DistributedOptimizer opt(ddp, oc, OptimizerGroups::from(state));
  const auto& units = ddp.unit_buckets();
  const int n = static_cast<int>(units.size());
  EXPECT_EQ(n, c.num_layers + 2);  // embedding, layers, final norm + output

  ddp.set_record_events(true);
  ddp.zero_grad();
  auto [tokens, targets] = sample(c, 0, world().rank());
  auto act = replica.new_activations();
  replica.forward(tokens, targets, *act);
  replica.backward(Tensor::full({1}, 1.0, DType::F32), *act);
  ddp.finish_grad_sync();
  opt.step(1e-3);
  // Everything gathered was freed again: nothing is left between steps.
  EXPECT_EQ(ddp.gathered_param_bytes(), 0);
  EXPECT_GT(ddp.peak_gathered_param_bytes(), 0);

  const auto& ev = ddp.events();
  using K = DdpEvent::Kind;
  auto find = [&](K kind, int id, bool backward, std::size_t from) {
    const bool unit_event = kind == K::UnitBegin || kind == K::UnitEnd;
    for (std::size_t i = from; i < ev.size(); ++i)
      if (ev[i].kind == kind && ev[i].bucket == id && (!unit_event || ev[i].backward == backward)) return i;
    return ev.size();
  };
  int overlapped[2] = {0, 0};
  pairs = 0;
  for (bool backward : {false, true}) {
    const std::size_t phase_start = backward ? find(K::UnitEnd, n - 1, false, 0) : 0;  // the forward's end
    EXPECT_LT(phase_start, ev.size());
    for (int u = 0; u < n; ++u) {
      const int next = backward ? u - 1 : u + 1;
      if (next < 0 || next >= n) continue;
      if (!backward) ++pairs;
      const std::size_t begin = find(K::UnitBegin, u, backward, phase_start);
      const std::size_t end = find(K::UnitEnd, u, backward, begin);
      EXPECT_LT(end, ev.size()) << "unit " << u;
      const int b = units[static_cast<std::size_t>(next)].front();
      std::size_t launched = ev.size();  // the last launch of the next unit's gather before u began
      for (std::size_t i = phase_start; i < begin; ++i)
        if (ev[i].kind == K::GatherLaunched && ev[i].bucket == b) launched = i;
      if (launched < begin && find(K::GatherDone, b, false, launched) > end) ++overlapped[backward];
    }
  }
  return {overlapped[0], overlapped[1]};
}

// ZeRO-3: with prefetch_units 1 the next unit's all-gather (the previous unit's, in backward) runs
// while the current unit computes, for every unit; with 0 it never does (gathered on demand).
TEST(DataParallelOverlap, Zero3PrefetchesTheNextUnitWhileOneComputes) {
  int pairs = 0;
  const auto [forward, backward] = units_overlapping_the_next_gather(1, pairs);
  EXPECT_EQ(forward, pairs);
  EXPECT_EQ(backward, pairs);
  const auto [forward_off, backward_off] = units_overlapping_the_next_gather(0, pairs);
  EXPECT_EQ(forward_off, 0);
  EXPECT_EQ(backward_off, 0);
}

TEST(DataParallelOverlap, GradientAfterLaunchIsAnError) {
  auto solo = world().split(world().rank(), 0);
  const ModelConfig c = small_config();
  GPTModel replica(c, {0, c.num_layers, true, true}, {.seed = 3}, *solo);
  DataParallelOptions o;
  o.overlap_grad_reduce = true;
  DataParallel ddp({&replica}, *solo, o);
  ddp.zero_grad();
  ddp.set_is_last_microbatch(true);  // twice "last": the second backward would add to reduced grads
  for (int m = 0; m < 2; ++m) {
    auto [tokens, targets] = sample(c, 0, m);
    auto act = replica.new_activations();
    replica.forward(tokens, targets, *act);
    if (m == 0)
      replica.backward(Tensor::full({1}, 1.0, DType::F32), *act);
    else
      EXPECT_THROW(replica.backward(Tensor::full({1}, 1.0, DType::F32), *act), Error);
  }
}

}  // namespace
}  // namespace parallel
