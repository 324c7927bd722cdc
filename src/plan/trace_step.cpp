// trace_step: the planner's run of one training step on meta (step_cost.hpp): the trainer's own
// step (TrainStep: ParallelState over a MetaCommunicator, the real GPTModel chunks, the pipeline
// executor with the configured schedule, DataParallel/ZeRO, finalize_grads, the optimizer and the
// loss read-back's all-reduce), fed synthetic meta token tensors of the micro-batch's shape.
#include <memory>
#include <optional>

#include "parallel/allocator.hpp"
#include "parallel/meta_communicator.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/step_cost.hpp"
#include "parallel/train_step.hpp"

namespace parallel::plan {

RankTrace trace_step(const Config& c, int world_size, int rank) {
  const Device device = Device::meta();
  Allocator& alloc = allocator_for(device);
  const auto base = static_cast<int64_t>(alloc.stats().allocated);
  alloc.reset_peak();
  RankTrace trace;
  trace.rank = rank;
  MetaCommunicator world(rank, world_size, std::make_shared<CommLog>());
  // Opened when the step starts: construction (the parameters' cast, the optimizer's copies, DDP's
  // buffers) happens once per run, not per step, and stays off the timeline.
  std::optional<MetaTimeline> timeline;
  {
    TrainStep step(c, world, device);
    // Synthetic tokens: this rank's [micro-batch, sequence / cp] int32 ids, shapes only.
    const int64_t local_seq = c.model.seq_length / c.parallel.context;
    const auto micro_batch = [&](int) {
      return pipeline::MicroBatch{Tensor::empty({c.train.micro_batch_size, local_seq}, DType::I32, device),
                                  Tensor::empty({c.train.micro_batch_size, local_seq}, DType::I32, device)};
    };
    timeline.emplace();
    step.run(0, micro_batch, 1e-3);
    trace.peak_bytes = static_cast<int64_t>(alloc.stats().peak_allocated) - base;
  }
  trace.timeline = timeline->entries();
  for (const TimelineEntry& e : trace.timeline)
    if (e.kind == TimelineEntry::Kind::Op) trace.flops += e.op.flops;
  return trace;
}

}  // namespace parallel::plan
