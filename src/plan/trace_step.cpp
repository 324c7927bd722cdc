// trace_step: the planner's one composition of a training step on meta (step_cost.hpp).
//
// ---- TO BE REPLACED BY THE SHARED TrainStep -------------------------------------------------------
// This composes the step as tests/common/meta_step.hpp (and so Trainer) does: ParallelState over a
// MetaCommunicator, the real GPTModel chunks, the pipeline executor with the configured schedule,
// DataParallel, finalize_grads and the optimizer step. Synthetic data enters as meta token tensors
// of the micro-batch's shape (no dataset is read). When TrainStep lands, this body becomes "build the
// TrainStep on Device::meta() and run one step" - nothing else in the planner composes the step.
// ---------------------------------------------------------------------------------------------------
#include <algorithm>
#include <memory>
#include <optional>

#include "parallel/allocator.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/error.hpp"
#include "parallel/finalize_grads.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/meta_communicator.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/precision.hpp"
#include "parallel/step_cost.hpp"

namespace parallel::plan {
namespace {

// Trainer's: only the last micro-batch's backward makes a chunk's gradients final.
class LastMicroBatchModel final : public pipeline::PipelineModel {
 public:
  LastMicroBatchModel(pipeline::ChunkPipelineModel& inner, DataParallel& ddp, int micro_batches)
      : inner_(inner), ddp_(ddp), micro_batches_(micro_batches) {}
  Tensor forward(int chunk, int micro_batch, const Tensor& input) override {
    return inner_.forward(chunk, micro_batch, input);
  }
  Tensor backward(int chunk, int micro_batch, const Tensor& grad) override {
    ddp_.set_is_last_microbatch(micro_batch == micro_batches_ - 1);
    return inner_.backward(chunk, micro_batch, grad);
  }
  Tensor backward_input(int chunk, int micro_batch, const Tensor& grad) override {
    return inner_.backward_input(chunk, micro_batch, grad);
  }
  void backward_weight(int chunk, int micro_batch) override {
    ddp_.set_is_last_microbatch(micro_batch == micro_batches_ - 1);
    inner_.backward_weight(chunk, micro_batch);
  }

 private:
  pipeline::ChunkPipelineModel& inner_;
  DataParallel& ddp_;
  int micro_batches_;
};

}  // namespace

RankTrace trace_step(const Config& c, int world_size, int rank) {
  const Device device = Device::meta();
  Allocator& alloc = allocator_for(device);
  const auto base = static_cast<int64_t>(alloc.stats().allocated);
  alloc.reset_peak();
  RankTrace trace;
  trace.rank = rank;
  auto log = std::make_shared<CommLog>();
  MetaCommunicator world(rank, world_size, log);
  // Opened when the step starts: construction (the parameters' cast, the optimizer's copies, DDP's
  // buffers) happens once per run, not per step, and stays off the timeline.
  std::optional<MetaTimeline> timeline;
  {
    const auto grid = RankGrid::from_world(world_size, c.parallel.tensor, c.parallel.pipeline,
                                           c.parallel.context, c.parallel.expert, c.parallel.expert_tensor);
    ParallelState state(world, grid, device);
    const auto specs = pipeline::stage_layout(pipeline::LayoutParams::of(c), state.coord().pp);
    GPTModel::Options options{.sequence_parallel = c.parallel.sequence_parallel,
                              .recompute = c.train.recompute,
                              .seed = c.train.seed,
                              .precision = c.train.precision,
                              .device = device,
                              .cp = &state.cp(),
                              .context_comm = c.parallel.context_comm};
    std::vector<std::unique_ptr<GPTModel>> chunks;
    std::vector<GPTModel*> raw;
    for (const GPTChunkSpec& spec : specs) {
      chunks.push_back(std::make_unique<GPTModel>(c.model, spec, options, state.tp()));
      raw.push_back(chunks.back().get());
    }
    pipeline::ChunkPipelineModel model(raw);
    DataParallel ddp(raw, state.dp_cp(), DataParallelOptions::from(c.optimizer, c.train.precision));
    const auto groups = OptimizerGroups::from(state);
    std::unique_ptr<Optimizer> optimizer;
    if (c.optimizer.distributed)
      optimizer = std::make_unique<DistributedOptimizer>(ddp, c.optimizer, groups);
    else
      optimizer = std::make_unique<AdamW>(ddp, c.optimizer, groups);

    const int dp_size = grid.sizes().data;
    const int cp_size = grid.sizes().context;
    const int micro_batches = c.train.global_batch_size / (c.train.micro_batch_size * dp_size);
    PARALLEL_CHECK(micro_batches >= 1,
                   "plan: train.global_batch_size {} gives no micro-batch of {} on {} dp ranks",
                   c.train.global_batch_size, c.train.micro_batch_size, dp_size);
    const bool sp = c.parallel.sequence_parallel && c.parallel.tensor > 1;
    pipeline::ExecutorOptions exec;
    exec.micro_batches = micro_batches;
    exec.virtual_stages = c.parallel.virtual_stages;
    exec.kind = c.parallel.pipeline_schedule;
    exec.activation_shape = {c.model.seq_length / cp_size / (sp ? c.parallel.tensor : 1),
                             c.train.micro_batch_size, c.model.hidden_size};
    exec.dtype = compute_dtype(c.train.precision);
    exec.device = device;
    pipeline::PipelineExecutor executor(state.pp(), exec);
    LastMicroBatchModel driver(model, ddp, micro_batches);

    // Synthetic tokens: this rank's [micro-batch, sequence / cp] int32 ids, shapes only.
    const int64_t local_seq = c.model.seq_length / cp_size;
    auto micro_batch = [&](int) {
      return pipeline::MicroBatch{Tensor::empty({c.train.micro_batch_size, local_seq}, DType::I32, device),
                                  Tensor::empty({c.train.micro_batch_size, local_seq}, DType::I32, device)};
    };
    const double local_tokens = static_cast<double>(micro_batches) * c.train.micro_batch_size * local_seq;
    timeline.emplace();
    ddp.zero_grad();
    model.start_step(micro_batch, Tensor::full({1}, 1.0 / local_tokens, DType::F32, device), 0);
    executor.run(driver);
    finalize_grads(model.parameters(), state);
    ddp.finish_grad_sync();
    optimizer->step(1e-3);
    trace.peak_bytes = static_cast<int64_t>(alloc.stats().peak_allocated) - base;
  }
  trace.timeline = timeline->entries();
  for (const TimelineEntry& e : trace.timeline)
    if (e.kind == TimelineEntry::Kind::Op) trace.flops += e.op.flops;
  return trace;
}

}  // namespace parallel::plan
