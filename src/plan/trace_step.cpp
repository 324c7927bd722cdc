// trace_step: the planner's run of one training step on meta (step_cost.hpp): the trainer's own
// step (TrainStep: ParallelState over a MetaCommunicator, the real GPTModel chunks, the pipeline
// executor with the configured schedule, DataParallel/ZeRO, finalize_grads, the optimizer and the
// loss read-back's all-reduce), fed synthetic meta token tensors of the micro-batch's shape, then
// the trainer's per-step all-reduce of its maxima, which its timed span also holds.
#include <memory>
#include <optional>

#include "parallel/allocator.hpp"
#include "parallel/error.hpp"
#include "parallel/meta_communicator.hpp"
#include "parallel/pipeline.hpp"
#include "parallel/step_cost.hpp"
#include "parallel/train_step.hpp"

namespace parallel::plan {

namespace {

RankTrace trace_once(const Config& c, int world_size, int rank, bool replay) {
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
    const int micro_batches = step.micro_batches();
    if (replay)
      step.wrap_pipeline_model([micro_batches](pipeline::PipelineModel& inner) {
        return std::make_unique<MicroBatchReplay>(inner, micro_batches);
      });
    // Synthetic tokens: this rank's [micro-batch, sequence / cp] int32 ids, shapes only.
    const int64_t local_seq = c.model.seq_length / c.parallel.context;
    const auto micro_batch = [&](int) {
      return pipeline::MicroBatch{Tensor::empty({c.train.micro_batch_size, local_seq}, DType::I32, device),
                                  Tensor::empty({c.train.micro_batch_size, local_seq}, DType::I32, device)};
    };
    timeline.emplace();
    step.run(0, micro_batch, 1e-3);
    // What else the trainer's timed span holds (trainer.cpp, Trainer::train): after the step, the
    // per-step maxima (host reads, allocator peak, conversions, page faults: 4 int64 on the host)
    // all-reduced over the world, a small blocking collective every rank joins.
    Tensor maxima = Tensor::zeros({4}, DType::I64);
    world.all_reduce(maxima, ReduceOp::Max);
    trace.peak_bytes = static_cast<int64_t>(alloc.stats().peak_allocated) - base;
  }
  trace.timeline = timeline->entries();
  // FLOPs up to each entry, so that a replay adds its range's.
  std::vector<double> before(trace.timeline.size() + 1, 0.0);
  for (std::size_t i = 0; i < trace.timeline.size(); ++i) {
    const TimelineEntry& e = trace.timeline[i];
    double f = e.kind == TimelineEntry::Kind::Op ? e.op.flops : 0.0;
    if (e.kind == TimelineEntry::Kind::Replay)
      f = before[static_cast<std::size_t>(e.replay_end)] - before[static_cast<std::size_t>(e.replay_begin)];
    before[i + 1] = before[i] + f;
  }
  trace.flops = before.back();
  return trace;
}

}  // namespace

RankTrace trace_step(const Config& c, int world_size, int rank, bool replay) {
  if (!replay) return trace_once(c, world_size, rank, false);
  try {
    return trace_once(c, world_size, rank, true);
  } catch (const Error&) {
    // A micro-batch that waits for an earlier one's calls in a way the replay cannot map: run
    // every micro-batch (a genuine error recurs there).
    return trace_once(c, world_size, rank, false);
  }
}

}  // namespace parallel::plan
