// The overlapped optimizer update (docs/optimizer.md#the-overlapped-update) under mpirun (world 1,
// 2, 4; dp = world): two identical replicas train a small GPT side by side for a few steps with
// gradient accumulation (2 micro-batches per rank) and no clipping, one with the unfused update
// (step() updates everything after finish_grad_sync), one with begin_overlapped_update(): every
// bucket updated as soon as its reduction is final. After every step the optimizers' state
// (parameters or fp32 main weights, exp_avg, exp_avg_sq) and the step results must be equal bit
// for bit, under plain AdamW (all-reduce), ZeRO-1 (with and without overlap_param_gather, fp32 and
// bf16), ZeRO-2, ZeRO-3 and HSDP. The event log must show the overlap: buckets updated before the
// backward's last gradient was ready, each only after its own reduction completed.
// The refusals (clipping, fp16, Muon) are checked too.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/lr_schedule.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "samples.hpp"

namespace parallel {
namespace {

using testing::sample;
using testing::world;
constexpr int kMicroBatches = 2;  // per rank and step
constexpr int kSteps = 3;

ModelConfig small_config() {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;
  c.normalization = Normalization::RMSNorm;
  c.activation = Activation::SwiGLU;
  c.position_embedding = PositionEmbedding::Rope;
  c.vocab_size = 256;
  c.seq_length = 16;
  c.add_bias = true;
  c.tie_embeddings = true;
  c.init_std = 0.1;
  return c;
}

struct Case {
  const char* label;
  Sharding sharding = Sharding::None;
  bool overlap_grad = true;
  bool overlap_param = false;
  Precision precision = Precision::FP32;
  bool hsdp = false;
};
void PrintTo(const Case& s, std::ostream* os) { *os << s.label; }

OptimizerConfig config_of(const Case& k) {
  OptimizerConfig o;
  o.lr = 2e-3;
  o.min_lr = 2e-4;
  o.warmup_steps = 1;
  o.lr_decay = LrDecay::Cosine;
  o.weight_decay = 0.1;
  o.clip_grad = 0;  // the overlapped update needs it off
  o.sharding = k.sharding;
  o.distributed = k.sharding != Sharding::None;
  o.overlap_grad_reduce = k.overlap_grad;
  o.overlap_param_gather = k.overlap_param;
  o.bucket_size = 8000;  // many buckets
  if (k.hsdp) o.sharding_group_size = world().size() / 2;
  return o;
}

// One replica: model, DDP and optimizer over the world as dp.
struct Replica {
  Replica(const Case& k, ParallelState& state)
      : config(config_of(k)),
        model(small_config(), {0, small_config().num_layers, true, true},
              {.seed = 7, .precision = k.precision}, state.tp()),
        ddp({&model}, state.dp(), DataParallelOptions::from(config, k.precision)) {
    opt = make_optimizer(ddp, config, OptimizerGroups::from(state));
  }
  StepResult step(int step, double lr, bool overlapped) {
    const ModelConfig c = small_config();
    if (overlapped) opt->begin_overlapped_update(lr, /*during_backward=*/true);
    ddp.zero_grad();
    const Tensor seed = Tensor::full({1}, 1.0 / (kMicroBatches * c.seq_length), DType::F32);
    for (int m = 0; m < kMicroBatches; ++m) {
      const int i = world().rank() * kMicroBatches + m;
      auto [tokens, targets] = sample(c, step, i);
      ddp.set_is_last_microbatch(m == kMicroBatches - 1);
      auto act = model.new_activations();
      model.forward(tokens, targets, *act, static_cast<uint64_t>(i));
      model.backward(seed, *act);
    }
    ddp.finish_grad_sync();
    return opt->step(lr);
  }
  OptimizerConfig config;
  GPTModel model;
  DataParallel ddp;
  std::unique_ptr<Optimizer> opt;
};

bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.dtype() == y.dtype() && x.numel() == y.numel() &&
         std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

class OverlappedUpdate : public ::testing::TestWithParam<Case> {};

TEST_P(OverlappedUpdate, BitwiseTheUnfusedUpdate) {
  const Case k = GetParam();
  if (k.hsdp && world().size() < 4) GTEST_SKIP() << "HSDP needs dp >= 4";
  ParallelState state(world(), RankGrid::from_world(world().size(), 1, 1));
  Replica unfused(k, state), overlapped(k, state);
  ASSERT_GE(overlapped.ddp.buffer().buckets().size(), 4u);
  ASSERT_EQ(overlapped.opt->overlap_refusal(), "");
  LrSchedule schedule(unfused.config, kSteps);
  overlapped.ddp.set_record_events(true);
  for (int step = 0; step < kSteps; ++step) {
    const double lr = schedule.lr(step);
    const StepResult a = unfused.step(step, lr, false);
    overlapped.ddp.events().clear();
    const StepResult b = overlapped.step(step, lr, true);
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << step;
    EXPECT_EQ(a.skipped, b.skipped);
    EXPECT_EQ(unfused.opt->updates(), overlapped.opt->updates());
    const auto sa = unfused.opt->state_slices(), sb = overlapped.opt->state_slices();
    ASSERT_EQ(sa.size(), sb.size());
    for (std::size_t i = 0; i < sa.size(); ++i) {
      EXPECT_TRUE(same_bits(sa[i].main, sb[i].main)) << sa[i].param->name << " step " << step;
      EXPECT_TRUE(same_bits(sa[i].exp_avg, sb[i].exp_avg)) << sa[i].param->name << " step " << step;
      EXPECT_TRUE(same_bits(sa[i].exp_avg_sq, sb[i].exp_avg_sq)) << sa[i].param->name << " step " << step;
    }

    // The overlap happened: some buckets were updated while the backward still produced
    // gradients, and none before its own reduction was complete.
    const auto& ev = overlapped.ddp.events();
    std::size_t last_ready = 0;
    for (std::size_t i = 0; i < ev.size(); ++i)
      if (ev[i].kind == DdpEvent::Kind::GradReady) last_ready = i;
    const int buckets = static_cast<int>(overlapped.ddp.buffer().buckets().size());
    // ZeRO-2/3 reduce every micro-batch: the update must follow the last one.
    const int reductions = overlapped.ddp.buffer().grads_sharded() ? kMicroBatches : 1;
    std::vector<int> done(static_cast<std::size_t>(buckets), 0),
        updated(static_cast<std::size_t>(buckets), 0);
    int early = 0;
    for (std::size_t i = 0; i < ev.size(); ++i) {
      const auto b = static_cast<std::size_t>(ev[i].bucket);
      if (ev[i].kind == DdpEvent::Kind::ReduceDone) ++done[b];
      if (ev[i].kind != DdpEvent::Kind::BucketReduced) continue;
      EXPECT_EQ(done[b], reductions) << "bucket " << b << " updated before its reduction completed";
      ++updated[b];
      early += i < last_ready;
    }
    for (int b = 0; b < buckets; ++b) EXPECT_EQ(updated[static_cast<std::size_t>(b)], 1) << "bucket " << b;
    EXPECT_GE(early, 2) << "of " << buckets << " buckets updated during the backward";
  }
  // The parameters the model computes with (all-gathered, 16-bit under bf16) agree as well.
  unfused.ddp.unshard();
  overlapped.ddp.unshard();
  const auto pa = unfused.model.parameters(), pb = overlapped.model.parameters();
  for (std::size_t i = 0; i < pa.size(); ++i)
    EXPECT_TRUE(same_bits(pa[i]->value, pb[i]->value)) << pa[i]->name;
  unfused.ddp.reshard();
  overlapped.ddp.reshard();
}

INSTANTIATE_TEST_SUITE_P(
    Modes, OverlappedUpdate,
    ::testing::Values(Case{.label = "AdamW"}, Case{.label = "Zero1", .sharding = Sharding::Optim},
                      Case{.label = "Zero1GatherOverlap", .sharding = Sharding::Optim, .overlap_param = true},
                      Case{.label = "Zero1Bf16", .sharding = Sharding::Optim, .precision = Precision::BF16},
                      Case{.label = "AdamWBf16", .precision = Precision::BF16},
                      Case{.label = "Zero2", .sharding = Sharding::OptimGrads, .overlap_grad = false},
                      Case{.label = "Zero3", .sharding = Sharding::OptimGradsParams, .overlap_grad = false},
                      Case{.label = "Zero3Bf16",
                           .sharding = Sharding::OptimGradsParams,
                           .overlap_grad = false,
                           .precision = Precision::BF16},
                      Case{.label = "HsdpZero1", .sharding = Sharding::Optim, .hsdp = true}),
    [](const auto& info) { return std::string(info.param.label); });

// Where step() looks at every gradient before updating any, the overlapped update is refused.
TEST(OverlappedUpdate, RefusedWhereItCannotBeExact) {
  ParallelState state(world(), RankGrid::from_world(world().size(), 1, 1));
  const Case k{.label = "AdamW"};
  {
    Case clipped = k;
    Replica r(clipped, state);
    r.config.clip_grad = 1.0;
    AdamW opt(r.ddp, r.config, OptimizerGroups::from(state));
    EXPECT_NE(opt.overlap_refusal().find("clip_grad"), std::string::npos) << opt.overlap_refusal();
    EXPECT_THROW(opt.begin_overlapped_update(1e-3, true), Error);
  }
  {
    Case half = k;
    half.precision = Precision::FP16;
    Replica r(half, state);
    EXPECT_NE(r.opt->overlap_refusal().find("fp16"), std::string::npos) << r.opt->overlap_refusal();
  }
  {
    Replica r(k, state);
    r.config.type = OptimizerType::Muon;
    AdamW opt(r.ddp, r.config, OptimizerGroups::from(state));
    EXPECT_NE(opt.overlap_refusal().find("Muon"), std::string::npos) << opt.overlap_refusal();
  }
  {
    Replica r(k, state);
    AdamW plain(r.model.parameters(), r.config, Precision::FP32);
    EXPECT_NE(plain.overlap_refusal().find("plain Parameters"), std::string::npos);
  }
}

}  // namespace
}  // namespace parallel
