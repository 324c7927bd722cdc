#pragma once
// One training step of a configured job, as one rank of it: the composition the trainer runs, in
// one place, so that the trainer, the meta device's proof test (test_meta_step) and the planner run
// the same step by construction (docs/planner.md).
//
// Construction (collective over `world`, in this order):
//   ParallelState      the groups of this rank, from the config's RankGrid
//   GPTModel chunks    one per virtual pipeline stage (stage_layout), in a ChunkPipelineModel
//   parameter count    every element counted once over the world (one all-reduce)
//   DataParallel       the dense replica over dp x cp; with MoE also the expert replica over
//                      expert-dp, sharing the chunks' hooks (SharedChunkHooks)
//   AdamW / DistributedOptimizer, with its loss scaler under fp16
//   PipelineExecutor   the configured schedule, and a forward-only one for evaluation
// One step (run): zero the gradients, start the step (data, loss scale, dropout seeds), run the
// schedule inside a WeightPackingScope (CPU, several micro-batches), finalize_grads, finish the
// data-parallel reductions, read the global mean loss, and take the optimizer step.
//
// On Device::meta() over a MetaCommunicator the same code runs with no values: the one value the
// step reads back, the loss, is not read (the sum all-reduced is the host tensor's 0, the loss is
// reported as 0), and the optimizer's gradient norm is taken as finite (meta.hpp). Weight packing
// is a CPU kernel's concern: the scope opens on CPU devices only, so a meta run counts no packed
// copies.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "parallel/communicator.hpp"
#include "parallel/config.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/device.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"

namespace parallel {

// What one step did: the loss (before the update) and the optimizer's result.
struct StepOutcome {
  double loss = 0.0;  // global mean token loss; 0 on meta (not read)
  StepResult update;
};

// What the silent-data-corruption check compares between the two runs of a step on one rank:
// CRC-32C of the rank's loss sum and of its gradient buffers before any reduction over ranks (a
// CRC sees every single-bit change).
struct RunFingerprint {
  uint32_t loss = 0, grads = 0;
};

// train.sdc_check_interval (docs/configuration.md#training-guards): when `enabled`, the step's
// forward and backward run twice from the same state, with the data-parallel reduction held back
// until both are done, and `compare` (collective) gets the rank's fingerprint of each run before
// the reduction and the update, which use the second run. `flip_first` (fault injection,
// PARALLEL_INJECT_BITFLIP) flips one mantissa bit of one gradient element after the first run.
struct RerunCheck {
  bool enabled = false;
  bool flip_first = false;
  std::function<void(const RunFingerprint& first, const RunFingerprint& second)> compare;
};

class TrainStep {
 public:
  // Builds this rank's part of the job described by `config` (validated for world.size() ranks)
  // on `device`. Collective over `world`.
  TrainStep(const Config& config, Communicator& world, Device device);
  ~TrainStep();
  TrainStep(const TrainStep&) = delete;
  TrainStep& operator=(const TrainStep&) = delete;

  // Sees the loss and the global gradient norm before the update; true skips it (the trainer's
  // guard). Must answer alike on every rank (both figures are alike).
  using SkipUpdate = std::function<bool(double loss, double grad_norm)>;

  // Step `step` (0-based index of its global batch) with learning rate `lr` on `data` (this rank's
  // micro-batches, on its device). `loss_factor` multiplies this rank's loss sum and the gradient
  // its backward starts from (fault injection; 1 otherwise).
  // `loss_tokens` > 0: the number of tokens whose loss counts in the global batch (data.eod_mask_loss;
  // the loss is then the mean over those); 0: every token.
  StepOutcome run(int64_t step, const pipeline::MicroBatchFn& data, double lr, double loss_factor = 1.0,
                  const SkipUpdate& skip_update = {}, const RerunCheck& rerun = {}, double loss_tokens = 0);

  // The global mean token loss of the last pipeline run (the last stage's sums, one tp rank each,
  // added over the world: one all-reduce). `factor` multiplies this rank's sum. On meta: 0, the
  // all-reduce still issued.
  double global_mean_loss(double factor = 1.0, double loss_tokens = 0);
  // This rank's loss sum behind the last global_mean_loss, before the reduction (host, [1]).
  const Tensor& local_loss() const { return local_loss_; }

  const Config& config() const { return cfg_; }
  Communicator& world() const { return world_; }
  Device device() const { return device_; }
  ParallelState& state() const { return *state_; }
  const std::vector<std::unique_ptr<GPTModel>>& chunks() const { return chunks_; }
  pipeline::ChunkPipelineModel& model() const { return *model_; }
  std::vector<Parameter*> parameters() const { return model_->parameters(); }
  // State the checkpoint keeps besides the parameters: the MoE routers' expert biases
  // (GPTModel::router_buffers), updated by run() after each update.
  std::vector<Parameter*> buffers() const;
  DataParallel& ddp() const { return *ddp_; }
  DataParallel* expert_ddp() const { return expert_ddp_.get(); }  // MoE; else null
  Optimizer& optimizer() const { return *optimizer_; }
  pipeline::PipelineExecutor& executor() const { return *executor_; }
  pipeline::PipelineExecutor& eval_executor() const { return *eval_executor_; }
  int micro_batches() const { return micro_batches_; }  // per data-parallel rank and step
  // optimizer.overlap_update resolved (docs/optimizer.md#the-overlapped-update): whether run()
  // arms the optimizer's overlapped update (not on a step that runs twice for the
  // silent-data-corruption check), and whether buckets are updated during the backward (one
  // pipeline stage) or only from finish_grad_sync() (pipeline schedules).
  bool overlapped_update() const { return overlap_update_; }
  // "on (during the backward)", "on (after the pipeline schedule)" or "off (WHY)", for the log.
  const std::string& overlapped_update_description() const { return overlap_description_; }
  // The model's parameter count: every element once, without vocabulary padding. On meta, this
  // rank's own share (the all-reduce moves nothing).
  int64_t parameter_count() const { return parameter_count_; }

  // The planner's micro-batch replay (step_cost.hpp) stands between the executor and the model: from
  // now on the step's schedule runs `wrap(model)` instead of the model itself (empty: the model).
  using ModelWrapper = std::function<std::unique_ptr<pipeline::PipelineModel>(pipeline::PipelineModel&)>;
  void wrap_pipeline_model(const ModelWrapper& wrap);

  // The device allocator's high-water mark (absolute bytes) while the groups and the model chunks
  // were built, and since then (sampled before every pipeline run, which resets the allocator's
  // peak, and after every step; sample_peak() samples it now).
  int64_t construction_peak_bytes() const { return construction_peak_; }
  int64_t peak_bytes() const;
  void sample_peak();

 private:
  Config cfg_;
  Communicator& world_;
  Device device_;
  std::unique_ptr<ParallelState> state_;
  std::vector<std::unique_ptr<GPTModel>> chunks_;
  std::unique_ptr<pipeline::ChunkPipelineModel> model_;
  std::unique_ptr<DataParallel> ddp_;
  std::unique_ptr<DataParallel> expert_ddp_;
  // MoE: the chunks' hooks, shared by ddp_ and expert_ddp_ (declared after them: removed first).
  std::unique_ptr<SharedChunkHooks> shared_hooks_;
  std::unique_ptr<Optimizer> optimizer_;
  std::unique_ptr<pipeline::PipelineExecutor> executor_, eval_executor_;
  std::unique_ptr<pipeline::PipelineModel> driver_;
  std::unique_ptr<pipeline::PipelineModel> wrapped_;  // wrap_pipeline_model's, around driver_
  int micro_batches_ = 1;
  bool overlap_update_ = false;
  bool overlap_during_backward_ = false;
  std::string overlap_description_;
  int64_t parameter_count_ = 0;
  int64_t construction_peak_ = 0;
  int64_t peak_ = 0;
  Tensor local_loss_;
};

}  // namespace parallel
