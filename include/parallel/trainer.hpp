#pragma once
// The GPT pretraining loop, composed from the library's orthogonal pieces:
//
//   ParallelState      tp / pp / dp groups from the config and the world size
//   stage_layout       this rank's model chunks (virtual pipeline stages)
//   GPTModel           each chunk, tensor-parallel inside
//   PipelineExecutor   the 1F1B / interleaved schedule over real point-to-point messages
//   DataParallel       gradient buffers and bucketed, overlapped dp reduction
//   AdamW / DistributedOptimizer, LrSchedule, DynamicLossScaler (fp16)
//   GPTDataset         the layout-independent sample stream
//   train_state        resharding checkpoints; metrics: metrics.jsonl and the progress line
//
// The step itself - groups, chunks, DDP, optimizer, executors and the step body - is TrainStep
// (train_step.hpp), which the planner runs on the meta device; the trainer adds data, the guard,
// metrics, evaluation and checkpoints.
//
// Data, initial weights and losses do not depend on the parallel layout.
#include <cstdint>
#include <memory>
#include <vector>

#include "parallel/config.hpp"
#include "parallel/metrics.hpp"
#include "parallel/mpi_communicator.hpp"

namespace parallel {

struct TrainerOptions {
  // Refuse, before anything is allocated, a run whose memory plan (memory_plan.hpp) does not fit in
  // what the largest rank can use (ConfigError, one line).
  bool check_memory = true;
};

class Trainer {
 public:
  // Collective over `world`: checks the memory plan, builds the groups, this rank's model chunks,
  // data, DDP and optimizer, and loads checkpoint.load if set. `config` must have been validated for
  // world.size() ranks.
  Trainer(const Config& config, MpiCommunicator& world, TrainerOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains up to train.steps. Evaluates every train.eval_interval steps, saves every
  // checkpoint.save_interval steps and at the end (when checkpoint.dir is set). On SIGTERM, SIGUSR1
  // (Slurm's --signal=USR1@T warning) or SIGINT every rank stops at the same step boundary, saves,
  // and returns. Returns the last step done.
  int64_t train();
  // Mean token loss over train.eval_steps global batches of the validation split (dropout off).
  double evaluate();

  int64_t step() const;  // optimizer steps done
  // This rank's tensor-allocator high-water mark (bytes) since the trainer was constructed: what
  // the memory plan's allocator_bytes predicts; metrics.jsonl's mem_peak_bytes is its maximum over
  // the ranks.
  int64_t measured_peak_bytes() const;
  const std::vector<StepMetrics>& history() const;  // metrics of the steps this object trained

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace parallel
