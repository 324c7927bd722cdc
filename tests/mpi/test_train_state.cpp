// Training-state checkpoints (train_state.hpp) under mpirun (world 4 and 8):
//   - reshard: a tiny GPT trains 2 steps in one layout (world 8: tp2 x pp2 x dp2 with the
//     distributed optimizer; world 4: tp2 x pp2 with AdamW), saves, and the checkpoint resumes
//       (a) on one rank in-process (size-1 communicators, the whole model, plain AdamW),
//       (b) at tp = 4 (world 8: tp4 x dp2 distributed; world 4: tp4 with AdamW),
//       (c) in the saving layout;
//     each takes the third step and must match the uninterrupted run: (a) and (b) the one-rank
//     3-step reference to relative 1e-4 (see kTol), (c) the saving layout's own third step bit for
//     bit.
//   - weights only: a checkpoint saved without an optimizer loads as step 0 with a fresh optimizer.
//   - exact resume in bf16 / fp16 with the distributed optimizer (fp32 main params, loss scaler).
// Loaded models are built with another seed, so anything the load misses shows up.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "parallel/checkpoint.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/finalize_grads.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/lr_schedule.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/train_state.hpp"
#include "samples.hpp"

namespace parallel {
namespace {

using testing::world;
namespace fs = std::filesystem;

// Across layouts the comparison is bounded by training parity itself, not by the checkpoint: the
// uninterrupted tp2 x pp2 run already differs from the one-rank run by up to ~4e-5 after 3 steps
// (fp32 summation order; Adam turns small gradient differences into larger relative ones). A lost
// or misplaced optimizer state moves parameters by ~lr, i.e. ~1e-2 relative: far above this bound.
// The same-layout resume is held to bitwise equality.
constexpr double kTol = 1e-4;
constexpr int kGlobalBatch = 4;  // sequences per step; micro-batches of one sequence
constexpr int kSteps = 3;        // the uninterrupted run; the checkpoint is taken after step 2
constexpr int kSaveAt = 2;
constexpr uint64_t kSeed = 11, kOtherSeed = 99;

ModelConfig tiny_config() {
  ModelConfig c;
  c.num_layers = 2;
  c.hidden_size = 64;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;
  c.normalization = Normalization::RMSNorm;
  c.activation = Activation::SwiGLU;
  c.position_embedding = PositionEmbedding::Rope;
  c.vocab_size = 300;  // padded to 384 at tp 1, 512 at tp 2 and 4: checkpoints hold the real rows
  c.seq_length = 16;
  c.add_bias = true;
  c.tie_embeddings = true;  // on two pipeline stages at pp 2
  c.init_std = 0.1;
  return c;
}

OptimizerConfig optimizer_config() {
  OptimizerConfig o;
  o.lr = 2e-3;
  o.min_lr = 2e-4;
  o.warmup_steps = 0;
  o.lr_decay = LrDecay::Cosine;
  o.weight_decay = 0.1;
  o.clip_grad = 0.05;     // active: the global norm must be right after resharding too
  o.bucket_size = 20000;  // several buckets
  o.initial_loss_scale = 1024;
  o.loss_scale_window = 3;  // fp16: grows at step 3, so the clean-step count matters
  return o;
}

using testing::sample;

struct Layout {
  int tp = 1, pp = 1;
  bool distributed = false;
  Precision precision = Precision::FP32;
};

// One layout's training set-up over `comm` (dp = comm.size() / (tp * pp)): model chunks, DDP,
// optimizer, and for pp > 1 the pipeline executor.
class LayoutRun {
 public:
  LayoutRun(Communicator& comm, Layout layout, const ModelConfig& c, uint64_t seed) : layout_(layout), c_(c) {
    state_ = std::make_unique<ParallelState>(comm, RankGrid::from_world(comm.size(), layout.tp, layout.pp));
    for (const ChunkSpec& spec : pipeline::stage_layout({c.num_layers, layout.pp, 1}, state_->coord().pp)) {
      chunks_.push_back(std::make_unique<GPTModel>(c, spec, GPTModel::Options{.seed = seed}, state_->tp()));
      chunk_ptrs_.push_back(chunks_.back().get());
    }
    local_ = kGlobalBatch / state_->dp().size();
    if (layout.pp > 1) {
      pmodel_ = std::make_unique<pipeline::ChunkPipelineModel>(chunk_ptrs_);
      executor_ = std::make_unique<pipeline::PipelineExecutor>(
          state_->pp(), pipeline::ExecutorOptions{.micro_batches = local_,
                                                  .activation_shape = {c.seq_length, 1, c.hidden_size}});
    }
    OptimizerConfig oc = optimizer_config();
    oc.distributed = layout.distributed;
    ddp_ = std::make_unique<DataParallel>(chunk_ptrs_, state_->dp(),
                                          DataParallelOptions::from(oc, layout.precision));
    opt_ = make_optimizer(*ddp_, oc, OptimizerGroups::from(*state_));
  }

  // Optimizer step `step` (0-based) over this dp rank's share of the global batch.
  void step(int step) {
    const int d = state_->coord().dp;
    double scale = 1.0 / (local_ * c_.seq_length);
    if (opt_->loss_scaler() != nullptr) scale *= opt_->loss_scaler()->scale();
    const Tensor seed = Tensor::full({1}, scale, DType::F32);
    ddp_->zero_grad();
    if (pmodel_) {
      pmodel_->start_step(
          [&](int mb) {
            auto [tokens, targets] = sample(c_, step, d * local_ + mb);
            return pipeline::MicroBatch{tokens, targets};
          },
          seed);
      executor_->run(*pmodel_);
    } else {
      GPTModel& model = *chunks_.front();
      for (int m = 0; m < local_; ++m) {
        auto [tokens, targets] = sample(c_, step, d * local_ + m);
        auto act = model.new_activations();
        model.forward(tokens, targets, *act, static_cast<uint64_t>(m));
        model.backward(seed, *act);
      }
    }
    finalize_grads(params(), *state_);
    ddp_->finish_grad_sync();
    const StepResult r = opt_->step(LrSchedule(optimizer_config(), kSteps).lr(step));
    ASSERT_FALSE(r.skipped) << "step " << step;
    ddp_->finish_param_gather();
  }

  std::vector<Parameter*> params() {
    std::vector<Parameter*> out;
    for (GPTModel* m : chunk_ptrs_)
      for (Parameter* p : m->parameters()) out.push_back(p);
    return out;
  }
  ParallelState& state() { return *state_; }
  Optimizer& optimizer() { return *opt_; }

 private:
  Layout layout_;
  ModelConfig c_;
  int local_ = 1;
  std::unique_ptr<ParallelState> state_;
  std::vector<std::unique_ptr<GPTModel>> chunks_;
  std::vector<GPTModel*> chunk_ptrs_;
  std::unique_ptr<pipeline::ChunkPipelineModel> pmodel_;
  std::unique_ptr<pipeline::PipelineExecutor> executor_;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<Optimizer> opt_;
};

// The whole model on one rank with plain AdamW over the Parameters: the whole global batch as
// accumulated micro-batches.
struct Solo {
  Solo(Communicator& solo, const ModelConfig& c, uint64_t seed)
      : c(c),
        state(solo, RankGrid(ParallelSizes{})),
        model(c, {0, c.num_layers, true, true}, {.seed = seed}, solo),
        opt(model.parameters(), optimizer_config(), Precision::FP32) {}
  void step(int step) {
    zero_grads(model.parameters());
    const Tensor seed = Tensor::full({1}, 1.0 / (kGlobalBatch * c.seq_length), DType::F32);
    for (int i = 0; i < kGlobalBatch; ++i) {
      auto [tokens, targets] = sample(c, step, i);
      auto act = model.new_activations();
      model.forward(tokens, targets, *act, static_cast<uint64_t>(i));
      model.backward(seed, *act);
    }
    opt.step(LrSchedule(optimizer_config(), kSteps).lr(step));
  }
  ModelConfig c;
  ParallelState state;
  GPTModel model;
  AdamW opt;
};

// The real rows of this rank's slice of `p` (vocabulary padding excluded) and where they start.
std::pair<Tensor, int64_t> real_part(const Parameter& p) {
  if (p.unpadded_rows < 0) return {p.value, 0};
  const int64_t start = p.partition_dim == 0 ? p.partition_offset : 0, rows = p.value.size(0);
  const int64_t real = std::clamp<int64_t>(p.unpadded_rows - start, 0, rows);
  return {p.value.narrow(0, 0, real), start};
}

// The real part of this rank's slice of `p`, and the matching part of the whole `ref_value`.
std::pair<Tensor, Tensor> comparable(const Parameter& p, const Tensor& ref_value) {
  auto [mine, start] = real_part(p);
  if (p.unpadded_rows >= 0) return {mine, ref_value.narrow(0, start, mine.size(0))};
  if (p.partition_dim < 0) return {mine, ref_value};
  return {mine, ref_value.narrow(p.partition_dim, p.partition_offset, p.value.size(p.partition_dim))};
}

// Relative error of every parameter slice against the reference; the key bias (whose gradient is
// near rounding noise, see test_data_parallel.cpp) is judged against the weights' scale.
void expect_close(const std::vector<Parameter*>& params, GPTModel& ref, const std::string& what) {
  std::map<std::string, Parameter*> by_name;
  for (Parameter* p : ref.parameters()) by_name[p->name] = p;
  for (Parameter* p : params) {
    ASSERT_TRUE(by_name.count(p->name)) << p->name;
    auto [mine, expected] = comparable(*p, by_name[p->name]->value);
    const auto a = mine.contiguous().to_float_vector(), b = expected.contiguous().to_float_vector();
    ASSERT_EQ(a.size(), b.size()) << p->name;
    double diff = 0, scale = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    }
    if (a.empty()) continue;
    if (p->name.ends_with("attention.key.bias"))
      EXPECT_LE(diff, kTol * tiny_config().init_std)
          << what << ": " << p->name << " on rank " << world().rank();
    else
      EXPECT_LE(diff / std::max(scale, 1e-30), kTol)
          << what << ": " << p->name << " on rank " << world().rank();
  }
}

// Bit-for-bit equality of the real rows of two runs' parameters (same layout, same order).
void expect_identical(const std::vector<Parameter*>& a, const std::vector<Parameter*>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i]->name, b[i]->name);
    EXPECT_EQ(real_part(*a[i]).first.contiguous().to_float_vector(),
              real_part(*b[i]).first.contiguous().to_float_vector())
        << what << ": " << a[i]->name << " on rank " << world().rank();
  }
}

// A fresh checkpoint root shared by all ranks (rank 0 names it).
std::string fresh_root(Communicator& comm, const std::string& tag) {
  Tensor nonce =
      Tensor::full({1}, comm.rank() == 0 ? static_cast<double>(::getpid() % 1000000) : 0.0, DType::F32);
  comm.all_reduce(nonce);
  const std::string root =
      (fs::temp_directory_path() /
       ("parallel_train_state_" + tag + "_" + std::to_string(static_cast<int>(nonce.to_float_vector()[0]))))
          .string();
  if (comm.rank() == 0) fs::remove_all(root);
  comm.barrier();
  return root;
}

TEST(TrainState, ReshardsAndResumes) {
  const int n = world().size();
  if (n != 4 && n != 8) GTEST_SKIP() << "needs 4 or 8 ranks";
  const ModelConfig c = tiny_config();
  // world 8: tp2 x pp2 x dp2 with the distributed optimizer; world 4: tp2 x pp2 with AdamW.
  const Layout saving{.tp = 2, .pp = 2, .distributed = n == 8};
  const Layout tp4{.tp = 4, .pp = 1, .distributed = n == 8};
  const std::string root = fresh_root(world(), "reshard"), weights_root = root + "_weights";
  auto solo = world().split(world().rank(), 0);

  // The reference: one rank, 3 uninterrupted steps.
  Solo ref(*solo, c, kSeed);
  for (int s = 0; s < kSteps; ++s) ref.step(s);

  // Train in the saving layout, checkpoint after steps 1 and 2 (keep_last 1), finish step 3.
  LayoutRun run(world(), saving, c, kSeed);
  TrainProgress progress;
  progress.seed = kSeed;
  // A config of the saving job (extras are checked against it on load: consumed_samples = step * gbs).
  progress.config_yaml = fmt::format(
      "model:\n  num_layers: 4\nparallel:\n  tensor: 2\n  pipeline: 2\ntrain:\n  micro_batch_size: 1\n  "
      "global_batch_size: {}\n",
      kGlobalBatch);
  for (int s = 0; s < kSaveAt; ++s) {
    run.step(s);
    progress.step = s + 1;
    progress.consumed_samples = (s + 1) * kGlobalBatch;
    const std::string dir = save_train_state(root, progress, run.params(), &run.optimizer(), run.state(), 1);
    EXPECT_EQ(fs::path(dir).filename().string(), checkpoint::step_dir_name(s + 1));
  }
  save_train_state(weights_root, progress, run.params(), nullptr, run.state());
  run.step(kSaveAt);
  // The uninterrupted run in the saving layout matches the reference too (the parity under test).
  expect_close(run.params(), ref.model, "uninterrupted");
  if (world().rank() == 0) {
    const auto steps = checkpoint::list_steps(root);
    ASSERT_EQ(steps.size(), 1u) << "keep_last 1";
    EXPECT_EQ(steps[0].step, kSaveAt);
    const checkpoint::CheckpointInfo info = checkpoint::read_info(root);
    EXPECT_TRUE(info.has_optimizer_state);
    EXPECT_EQ(info.saved_world_size, n);
    EXPECT_FALSE(checkpoint::read_info(weights_root).has_optimizer_state);
  }

  // (c) the saving layout, through "latest": bit for bit.
  {
    LayoutRun resumed(world(), saving, c, kOtherSeed);
    const LoadResult r =
        load_train_state("latest", root, resumed.params(), &resumed.optimizer(), resumed.state());
    EXPECT_TRUE(r.had_optimizer_state);
    EXPECT_EQ(r.progress.step, kSaveAt);
    EXPECT_EQ(r.progress.consumed_samples, kSaveAt * kGlobalBatch);
    EXPECT_EQ(r.progress.optimizer_updates, kSaveAt);
    EXPECT_EQ(r.progress.seed, kSeed);
    EXPECT_EQ(r.progress.config_yaml, progress.config_yaml);
    EXPECT_EQ(resumed.optimizer().updates(), kSaveAt);
    EXPECT_EQ(fs::path(r.path).filename().string(), checkpoint::step_dir_name(kSaveAt));
    resumed.step(kSaveAt);
    expect_identical(resumed.params(), run.params(), "same layout");
  }

  // (b) tp = 4.
  {
    LayoutRun resumed(world(), tp4, c, kOtherSeed);
    const LoadResult r = load_train_state(root, "", resumed.params(), &resumed.optimizer(), resumed.state());
    EXPECT_TRUE(r.had_optimizer_state);
    EXPECT_EQ(resumed.optimizer().updates(), kSaveAt);
    resumed.step(kSaveAt);
    expect_close(resumed.params(), ref.model, "tp4");
  }

  // (a) one rank, the whole model, plain AdamW; and a weights-only checkpoint.
  if (world().rank() == 0) {
    Solo resumed(*solo, c, kOtherSeed);
    const LoadResult r = load_train_state(root, "", resumed.model.parameters(), &resumed.opt, resumed.state);
    EXPECT_TRUE(r.had_optimizer_state);
    EXPECT_EQ(resumed.opt.updates(), kSaveAt);
    Solo fresh(*solo, c, kOtherSeed);
    const LoadResult w =
        load_train_state(weights_root, "", fresh.model.parameters(), &fresh.opt, fresh.state);
    EXPECT_FALSE(w.had_optimizer_state);
    EXPECT_EQ(w.progress.step, 0);
    EXPECT_EQ(w.progress.consumed_samples, 0);
    EXPECT_EQ(w.progress.seed, kSeed);
    EXPECT_EQ(fresh.opt.updates(), 0);
    for (float x : fresh.opt.exp_avg().to_float_vector()) ASSERT_EQ(x, 0.0f);
    // Both hold the step-2 weights.
    expect_identical(fresh.model.parameters(), resumed.model.parameters(), "weights only");

    resumed.step(kSaveAt);
    expect_close(resumed.model.parameters(), ref.model, "one rank");
  }
  world().barrier();
  if (world().rank() == 0) {
    fs::remove_all(root);
    fs::remove_all(weights_root);
  }
}

// Low precision with the distributed optimizer: the fp32 main params and (fp16) the loss scaler
// come back exactly, so the resumed step equals the uninterrupted one bit for bit.
class TrainStateLowPrecision : public ::testing::TestWithParam<Precision> {};

TEST_P(TrainStateLowPrecision, ResumesBitForBit) {
  const int n = world().size();
  if (n % 2 != 0) GTEST_SKIP() << "needs an even world";
  ModelConfig c = tiny_config();
  c.num_layers = 2;
  const Layout layout{.tp = 2, .pp = 1, .distributed = true, .precision = GetParam()};
  const std::string root = fresh_root(world(), "lowp");
  LayoutRun run(world(), layout, c, kSeed);
  for (int s = 0; s < kSaveAt; ++s) run.step(s);
  TrainProgress progress;
  progress.step = kSaveAt;
  save_train_state(root, progress, run.params(), &run.optimizer(), run.state());
  run.step(kSaveAt);

  LayoutRun resumed(world(), layout, c, kOtherSeed);
  const LoadResult r = load_train_state(root, "", resumed.params(), &resumed.optimizer(), resumed.state());
  EXPECT_TRUE(r.had_optimizer_state);
  if (GetParam() == Precision::FP16) {
    ASSERT_NE(resumed.optimizer().loss_scaler(), nullptr);
    EXPECT_EQ(resumed.optimizer().loss_scaler()->clean_steps(), kSaveAt);
    EXPECT_EQ(r.progress.loss_scale, optimizer_config().initial_loss_scale);
  }
  resumed.step(kSaveAt);
  expect_identical(resumed.params(), run.params(), "low precision");
  if (GetParam() == Precision::FP16)
    EXPECT_EQ(resumed.optimizer().loss_scaler()->scale(), run.optimizer().loss_scaler()->scale());
  world().barrier();
  if (world().rank() == 0) fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Precisions, TrainStateLowPrecision,
                         ::testing::Values(Precision::BF16, Precision::FP16),
                         [](const auto& info) { return info.param == Precision::BF16 ? "BF16" : "FP16"; });

}  // namespace
}  // namespace parallel
