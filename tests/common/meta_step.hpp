#pragma once
// One training step composed as Trainer composes it (trainer.cpp: its constructor and the body of
// train()'s loop, without logging, metrics, the loss all-reduce, MoE statistics and weight
// packing), on any device over any world communicator: the meta runs of test_meta_step (against
// the real ranks) and test_meta_ranks (every rank of a job in one process, no MPI) share it.
#include <algorithm>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "parallel/allocator.hpp"
#include "parallel/config.hpp"
#include "parallel/context_parallel.hpp"
#include "parallel/data_parallel.hpp"
#include "parallel/finalize_grads.hpp"
#include "parallel/gpt_dataset.hpp"
#include "parallel/gpt_model.hpp"
#include "parallel/meta.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/parallel_state.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/precision.hpp"

namespace parallel::testing {

// A layout of the meta tests: a name, the ranks it needs, and the config overrides.
struct MetaLayout {
  const char* label;
  int world_size;
  std::vector<std::string> overrides;
};
inline void PrintTo(const MetaLayout& l, std::ostream* os) { *os << l.label; }

// The model both meta tests run (small, so that 8 meta ranks in one process stay quick).
inline constexpr const char* kMetaModel = R"(
model:
  num_layers: 4
  hidden_size: 64
  num_attention_heads: 4
  vocab_size: 512
  seq_length: 64
train:
  micro_batch_size: 4
  steps: 1
optimizer:
  warmup_steps: 0
data:
  path: synthetic
)";

// trainer.cpp's: only the last micro-batch's backward makes a chunk's gradients final.
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

struct StepResult {
  // The device allocator's high-water mark above what was live before, from the construction of
  // DataParallel on (with the parameters live) to the end of the step: the step's peak.
  int64_t peak_bytes = 0;
  // The same from the start, model construction included. The model is initialised on the host in
  // fp32 and cast there (gpt_model.cpp), so under bf16 / fp16 the CPU device's allocator - the host's
  // - also counts that transient; a meta (or CUDA) device receives the cast parameters only.
  int64_t peak_with_construction = 0;
  std::size_t op_events = 0;
  double flops = 0;
};

// One training step of `c` as rank world.rank() of world.size(), on `device`.
inline StepResult run_step(const Config& c, Communicator& world, Device device) {
  Allocator& alloc = allocator_for(device);
  const auto base = static_cast<int64_t>(alloc.stats().allocated);
  alloc.reset_peak();
  int64_t peak = 0;
  auto sample = [&] { peak = std::max(peak, static_cast<int64_t>(alloc.stats().peak_allocated) - base); };
  MetaOpRecorder ops;
  StepResult result;
  {
    const auto grid = RankGrid::from_world(world.size(), c.parallel.tensor, c.parallel.pipeline,
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
    sample();
    const int64_t construction = peak;
    alloc.reset_peak();
    peak = 0;
    DataParallel ddp(raw, state.dp_cp(), DataParallelOptions::from(c.optimizer, c.train.precision));
    const auto groups = OptimizerGroups::from(state);
    std::unique_ptr<Optimizer> optimizer;
    if (c.optimizer.distributed)
      optimizer = std::make_unique<DistributedOptimizer>(ddp, c.optimizer, groups);
    else
      optimizer = std::make_unique<AdamW>(ddp, c.optimizer, groups);
    const GPTDataset data = make_gpt_dataset(c, DataSplit::Train);

    const int dp_size = grid.sizes().data, dp_rank = state.coord().dp;
    const int cp_size = grid.sizes().context, cp_rank = state.coord().cp;
    const int micro_batches = c.train.global_batch_size / (c.train.micro_batch_size * dp_size);
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

    // Synthetic tokens, made on the host and moved to the device (to meta: shapes only).
    auto micro_batch = [&data, dp_rank, dp_size, cp_rank, cp_size, device](int mb) {
      MicroBatch m = data.micro_batch(0, dp_rank, dp_size, mb);
      return pipeline::MicroBatch{cp::slice_sequence(m.tokens, cp_rank, cp_size).to(device),
                                  cp::slice_sequence(m.targets, cp_rank, cp_size).to(device)};
    };
    const double local_tokens =
        static_cast<double>(micro_batches) * c.train.micro_batch_size * (c.model.seq_length / cp_size);
    ddp.zero_grad();
    model.start_step(micro_batch, Tensor::full({1}, 1.0 / local_tokens, DType::F32, device), 0);
    sample();
    executor.run(driver);
    sample();
    finalize_grads(model.parameters(), state);
    ddp.finish_grad_sync();
    optimizer->step(1e-3);
    sample();
    result.peak_with_construction = std::max(construction, peak);
  }
  result.peak_bytes = peak;
  result.op_events = ops.events().size();
  result.flops = ops.total_flops();
  return result;
}

}  // namespace parallel::testing
