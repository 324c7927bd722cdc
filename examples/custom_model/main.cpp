// Trains the encoder classifier (encoder.hpp) on synthetic sequences with libparallel's parts, in
// the order a program composes them (docs/api.md walks through this file):
//   runtime -> ParallelState (groups by purpose) -> this rank's model chunks (pipeline stage layout)
//   -> DataParallel with a sharding mode -> optimizer and learning-rate schedule -> checkpoint load
//   -> per step: executor runs the named pipeline schedule, finalize_grads, finish_grad_sync,
//      optimizer step -> metrics.jsonl and checkpoints.
// Every layout (tp x pp x dp, sharding, schedule) trains the same model on the same samples, so its
// losses equal one rank's up to fp32 rounding (tests/scripts/custom_model.sh).
//
//   mpirun -np 8 custom_model --tp 2 --pp 2 --sharding optim_grads_params --steps 4 --out run/
#include <chrono>
#include <cstdio>
#include <memory>
#include <parallel/checkpoint.hpp>
#include <parallel/data_parallel.hpp>
#include <parallel/error.hpp>
#include <parallel/finalize_grads.hpp>
#include <parallel/init.hpp>
#include <parallel/lr_schedule.hpp>
#include <parallel/metrics.hpp>
#include <parallel/optimizer.hpp>
#include <parallel/parallel_state.hpp>
#include <parallel/pipeline.hpp>
#include <parallel/pipeline_schedule.hpp>
#include <parallel/runtime.hpp>
#include <parallel/sharding.hpp>
#include <parallel/tensorboard.hpp>
#include <parallel/train_state.hpp>
#include <string>
#include <vector>

#include "encoder.hpp"

namespace {

using parallel::ConfigError;
using parallel::DType;
using parallel::Tensor;

struct Options {
  encoder::EncoderConfig model;
  int tp = 1, pp = 1, virtual_stages = 1;
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::Auto;
  parallel::Sharding sharding = parallel::Sharding::None;
  int steps = 4;
  int global_batch = 8, micro_batch = 2;
  double lr = 1e-2;
  std::string out = "runs/custom_model";  // metrics.jsonl goes here
  std::string tensorboard;                // TensorBoard event files; empty: none
  std::string save;                       // checkpoint root; empty: none
  int save_at = 0;                        // save after this step (0: after the last)
  std::string load;                       // a checkpoint root or step directory to resume from
  uint64_t data_seed = 11;
};

constexpr const char* kUsage =
    "usage: custom_model [--tp N] [--pp N] [--virtual-stages N] [--schedule auto|gpipe|1f1b|interleaved]\n"
    "                    [--sharding none|optim|optim_grads|optim_grads_params] [--sequence-parallel]\n"
    "                    [--layers N] [--steps N] [--global-batch N] [--micro-batch N] [--lr X]\n"
    "                    [--out DIR] [--tensorboard DIR] [--save DIR] [--save-at STEP] [--load PATH]\n";

int to_int(const std::string& flag, const std::string& value) {
  try {
    std::size_t used = 0;
    const int v = std::stoi(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  throw ConfigError("custom_model: " + flag + " = '" + value + "': expected an integer");
}

double to_double(const std::string& flag, const std::string& value) {
  try {
    std::size_t used = 0;
    const double v = std::stod(value, &used);
    if (used == value.size()) return v;
  } catch (const std::exception&) {
  }
  throw ConfigError("custom_model: " + flag + " = '" + value + "': expected a number");
}

// A schedule or sharding mode by the config's name; the library's error names the accepted ones.
template <typename FromName>
auto by_name(const std::string& flag, const std::string& value, FromName from_name) {
  try {
    return from_name(value);
  } catch (const ConfigError& e) {
    throw ConfigError("custom_model: " + flag + ": " + e.what());
  }
}

// Every rank parses the same arguments alike, so a ConfigError is thrown on every rank and
// run_main prints it once and exits 2.
Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") throw parallel::AgreedStop(kUsage, 0);
    if (flag == "--sequence-parallel") {
      o.model.sequence_parallel = true;
      continue;
    }
    if (i + 1 >= argc) throw ConfigError("custom_model: " + flag + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (flag == "--tp")
      o.tp = to_int(flag, v);
    else if (flag == "--pp")
      o.pp = to_int(flag, v);
    else if (flag == "--virtual-stages")
      o.virtual_stages = to_int(flag, v);
    else if (flag == "--schedule")
      o.schedule = by_name(flag, v, parallel::pipeline::schedule_from_name);
    else if (flag == "--sharding")
      o.sharding = by_name(flag, v, parallel::sharding_from_name);
    else if (flag == "--layers")
      o.model.layers = to_int(flag, v);
    else if (flag == "--steps")
      o.steps = to_int(flag, v);
    else if (flag == "--global-batch")
      o.global_batch = to_int(flag, v);
    else if (flag == "--micro-batch")
      o.micro_batch = to_int(flag, v);
    else if (flag == "--lr")
      o.lr = to_double(flag, v);
    else if (flag == "--out")
      o.out = v;
    else if (flag == "--tensorboard")
      o.tensorboard = v;
    else if (flag == "--save")
      o.save = v;
    else if (flag == "--save-at")
      o.save_at = to_int(flag, v);
    else if (flag == "--load")
      o.load = v;
    else
      throw ConfigError("custom_model: unknown flag " + flag + " (see --help)");
  }
  return o;
}

// Sample g of the synthetic stream: seq token ids, and as its class the share of ids in the lower
// half of the vocabulary, bucketed into `classes` (a bag-of-tokens statistic the model can learn).
// A function of g alone, so every layout sees the same samples.
void sample(const Options& o, int64_t g, int32_t* tokens, int32_t& label) {
  const encoder::EncoderConfig& m = o.model;
  int low = 0;
  for (int j = 0; j < m.seq; ++j) {
    const auto id =
        static_cast<int32_t>(parallel::philox_uniform(o.data_seed, static_cast<uint64_t>(g), j) * m.vocab);
    tokens[j] = id < m.vocab ? id : m.vocab - 1;
    low += tokens[j] < m.vocab / 2;
  }
  label = static_cast<int32_t>(low * m.classes / (m.seq + 1));
}

int train(parallel::Runtime& rt, const Options& o) {
  const int world = rt.world_size();
  if (o.tp < 1 || o.pp < 1 || world % (o.tp * o.pp) != 0)
    throw ConfigError("custom_model: --tp " + std::to_string(o.tp) + " x --pp " + std::to_string(o.pp) +
                      " does not divide " + std::to_string(world) + " ranks");
  using parallel::PipelineSchedule;
  if (o.schedule == PipelineSchedule::ZeroBubbleH1 || o.schedule == PipelineSchedule::ZeroBubbleV ||
      o.schedule == PipelineSchedule::DualPipeV)
    throw ConfigError(std::string("custom_model: --schedule ") +
                      parallel::pipeline::schedule_name(o.schedule) +
                      " splits the backward, which the encoder does not (auto, gpipe, 1f1b, interleaved)");
  const int dp = world / (o.tp * o.pp);
  if (o.micro_batch < 1 || o.global_batch % (dp * o.micro_batch) != 0)
    throw ConfigError("custom_model: --global-batch " + std::to_string(o.global_batch) +
                      " is not a multiple of dp (" + std::to_string(dp) + ") x --micro-batch " +
                      std::to_string(o.micro_batch));

  // 1. Groups by purpose: tp, pp, dp (and the model / embedding groups the optimizer reduces over).
  parallel::ParallelState state(rt.world(), parallel::RankGrid::from_world(world, o.tp, o.pp));

  // 2. This rank's chunks of the layer stack: the library's stage layout, in the schedule's placement.
  parallel::pipeline::LayoutParams layout{.num_layers = o.model.layers,
                                          .pipeline_size = o.pp,
                                          .virtual_stages = o.virtual_stages,
                                          .placement = parallel::pipeline::placement_of(o.schedule)};
  std::vector<std::unique_ptr<encoder::EncoderChunk>> owned;
  std::vector<parallel::ModelChunk*> chunks;
  for (const auto& spec : parallel::pipeline::stage_layout(layout, state.coord().pp)) {
    owned.push_back(std::make_unique<encoder::EncoderChunk>(o.model, spec, state.tp()));
    chunks.push_back(owned.back().get());
  }

  // 3. Data parallelism over the chunks, sharded as asked; then the optimizer that matches it.
  parallel::OptimizerConfig oc;
  oc.lr = o.lr;
  oc.min_lr = o.lr / 10;
  oc.warmup_steps = 0;
  oc.lr_decay = parallel::LrDecay::Cosine;
  oc.weight_decay = 0.01;
  oc.clip_grad = 1.0;
  oc.sharding = o.sharding;
  oc.bucket_size = 4096;  // elements: several buckets even for this small model
  parallel::DataParallel ddp(chunks, state.dp(),
                             parallel::DataParallelOptions::from(oc, parallel::Precision::FP32));
  std::unique_ptr<parallel::Optimizer> optimizer;
  if (o.sharding == parallel::Sharding::None)
    optimizer = std::make_unique<parallel::AdamW>(ddp, oc, parallel::OptimizerGroups::from(state));
  else
    optimizer =
        std::make_unique<parallel::DistributedOptimizer>(ddp, oc, parallel::OptimizerGroups::from(state));
  const parallel::LrSchedule lr(oc, o.steps);

  // 4. The pipeline: the chunks behind the executor, which runs the schedule picked by name.
  const int micro_batches = o.global_batch / (dp * o.micro_batch);
  const int64_t seq_local = o.model.sequence_parallel ? o.model.seq / o.tp : o.model.seq;
  parallel::pipeline::ChunkPipelineModel model(chunks);
  parallel::pipeline::PipelineExecutor executor(
      state.pp(), {.micro_batches = micro_batches,
                   .virtual_stages = o.virtual_stages,
                   .activation_shape = {seq_local, o.micro_batch, o.model.hidden},
                   .kind = o.schedule});

  // 5. Resume: weights and optimizer state from a checkpoint of any layout.
  int64_t step = 0;
  const std::vector<parallel::Parameter*> params = model.parameters();
  if (!o.load.empty()) {
    const parallel::LoadResult loaded =
        parallel::load_train_state(o.load, "", params, optimizer.get(), state);
    step = loaded.progress.step;
    if (rt.rank() == 0)
      std::printf("custom_model: resumed at step %lld from %s\n", static_cast<long long>(step),
                  loaded.path.c_str());
  }

  std::unique_ptr<parallel::MetricsWriter> metrics;
  std::unique_ptr<parallel::TensorBoardWriter> tensorboard;
  if (rt.rank() == 0) {
    metrics = std::make_unique<parallel::MetricsWriter>(o.out + "/metrics.jsonl");
    if (!o.tensorboard.empty()) tensorboard = std::make_unique<parallel::TensorBoardWriter>(o.tensorboard);
  }
  const int save_at = o.save_at > 0 ? o.save_at : o.steps;
  const int dp_rank = state.coord().dp;
  for (; step < o.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    ddp.zero_grad();
    // Micro-batch i of this dp rank: samples [first + i * mb, first + (i + 1) * mb) of the step.
    const int64_t first =
        step * o.global_batch + static_cast<int64_t>(dp_rank) * micro_batches * o.micro_batch;
    auto data = [&, first](int i) {
      Tensor tokens = Tensor::empty({o.micro_batch, o.model.seq}, DType::I32);
      Tensor labels = Tensor::empty({o.micro_batch}, DType::I32);
      for (int j = 0; j < o.micro_batch; ++j)
        sample(o, first + static_cast<int64_t>(i) * o.micro_batch + j,
               tokens.data<int32_t>() + j * o.model.seq, labels.data<int32_t>()[j]);
      return parallel::pipeline::MicroBatch{tokens, labels};
    };
    // The objective is the mean loss over the global batch; DDP averages over dp.
    model.start_step(data, Tensor::full({1}, 1.0 / (micro_batches * o.micro_batch), DType::F32),
                     static_cast<uint64_t>(first / o.micro_batch));
    executor.run(model);
    parallel::finalize_grads(params, state);  // sequence-parallel norms over tp
    ddp.finish_grad_sync();
    const double step_lr = lr.lr(static_cast<int>(step));
    const parallel::StepResult result = optimizer->step(step_lr);

    // The step's mean loss: the last stage's sums, once per dp replica (tp rank 0), over the world.
    Tensor loss = Tensor::zeros({1}, DType::F32);
    if (model.computes_loss() && state.coord().tp == 0) loss.copy_(model.loss_sum());
    state.world().all_reduce(loss);
    const double mean_loss = loss.to_float_vector()[0] / o.global_batch;
    if (metrics) {
      parallel::StepMetrics m;
      m.step = step + 1;
      m.loss = mean_loss;
      m.lr = step_lr;
      m.grad_norm = result.grad_norm;
      m.step_time_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      m.tokens_per_sec = o.global_batch * o.model.seq / (m.step_time_ms / 1000.0);
      metrics->write_train(m);  // a failed write is a warning, never the end of the run
      if (tensorboard) tensorboard->write_train(m);
      std::printf("custom_model: step %lld/%d | loss %.6f | lr %.3e | grad norm %.4f | %.0f ms\n",
                  static_cast<long long>(m.step), o.steps, m.loss, m.lr, m.grad_norm, m.step_time_ms);
      std::fflush(stdout);
    }
    if (!o.save.empty() && step + 1 == save_at) {
      parallel::TrainProgress progress;
      progress.step = step + 1;
      progress.consumed_samples = (step + 1) * o.global_batch;
      progress.seed = o.model.seed;
      const std::string dir = parallel::save_train_state(o.save, progress, params, optimizer.get(), state);
      if (rt.rank() == 0) std::printf("custom_model: saved %s\n", dir.c_str());
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return parallel::run_main(argc, argv, [&](parallel::Runtime& rt) { return train(rt, parse(argc, argv)); });
}
