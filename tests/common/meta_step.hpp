#pragma once
// One training step as the trainer takes it (TrainStep, train_step.hpp: the trainer's own
// composition), on any device over any world communicator: the meta runs of test_meta_step
// (against the real ranks) and test_meta_ranks (every rank of a job in one process, no MPI) share
// it.
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
#include "parallel/train_step.hpp"

namespace parallel::testing {

// A layout of the meta tests: a name, the ranks it needs, and the config overrides.
struct MetaLayout {
  const char* label;
  int world_size;
  std::vector<std::string> overrides;
  // MoE without model.moe_router_force_load_balancing: the meta run routes balanced (moe.cpp), the
  // real router routes by its weights, so what depends on the routing (the dispatch's all_to_allv
  // bytes, and the peak) may differ. With it, the real router chooses as the meta run does and the
  // layout is not `routed`.
  bool routed = false;
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

struct StepResult {
  // The device allocator's high-water mark above what was live before, from the end of the model's
  // construction on (with the parameters live) to the end of the step: the step's peak.
  int64_t peak_bytes = 0;
  // The same from the start, model construction included. The model is initialised on the host in
  // fp32 and cast there (gpt_model.cpp), so under bf16 / fp16 the CPU device's allocator - the host's
  // - also counts that transient; a meta (or CUDA) device receives the cast parameters only.
  int64_t peak_with_construction = 0;
  std::size_t op_events = 0;
  double flops = 0;
};

// One training step of `c` as rank world.rank() of world.size(), on `device`: the trainer's
// TrainStep, on a synthetic batch.
inline StepResult run_step(const Config& c, Communicator& world, Device device) {
  Allocator& alloc = allocator_for(device);
  const auto base = static_cast<int64_t>(alloc.stats().allocated);
  MetaOpRecorder ops;
  StepResult result;
  {
    TrainStep step(c, world, device);
    const GPTDataset data = make_gpt_dataset(c, DataSplit::Train);
    const int dp_size = step.state().grid().sizes().data, dp_rank = step.state().coord().dp;
    const int cp_size = step.state().grid().sizes().context, cp_rank = step.state().coord().cp;
    // Synthetic tokens, made on the host and moved to the device (to meta: shapes only).
    auto micro_batch = [&data, dp_rank, dp_size, cp_rank, cp_size, device](int mb) {
      MicroBatch m = data.micro_batch(0, dp_rank, dp_size, mb);
      return pipeline::MicroBatch{cp::slice_sequence(m.tokens, cp_rank, cp_size).to(device),
                                  cp::slice_sequence(m.targets, cp_rank, cp_size).to(device)};
    };
    step.run(0, micro_batch, 1e-3);
    result.peak_bytes = step.peak_bytes() - base;
    result.peak_with_construction = std::max(step.construction_peak_bytes() - base, result.peak_bytes);
  }
  result.op_events = ops.events().size();
  result.flops = ops.total_flops();
  return result;
}

}  // namespace parallel::testing
