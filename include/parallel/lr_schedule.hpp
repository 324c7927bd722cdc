#pragma once
// Learning-rate schedule (Megatron-Core's OptimizerParamScheduler, lr part): linear warm-up from 0
// over warmup_steps, then constant, linear or cosine decay from lr to min_lr by decay_steps, and
// min_lr after that.
#include "parallel/config.hpp"

namespace parallel {

class LrSchedule {
 public:
  LrSchedule(double max_lr, double min_lr, int warmup_steps, int decay_steps, LrDecay style);
  // Decays over the whole run (Megatron's lr_decay_iters defaulting to train_iters).
  LrSchedule(const OptimizerConfig& config, int total_steps);

  // `step`: optimizer updates already applied (Megatron's num_steps when the update is made), so
  // the first update of a run with warm-up uses lr(0) = 0, as Megatron's does.
  //   step <= warmup (warmup > 0):  max_lr * step / warmup
  //   constant:                     max_lr
  //   step > decay_steps:           min_lr
  //   otherwise, r = (step - warmup) / (decay_steps - warmup):
  //     linear: min_lr + (max_lr - min_lr) * (1 - r)
  //     cosine: min_lr + (max_lr - min_lr) * 0.5 * (1 + cos(pi r))
  double lr(int step) const;

 private:
  double max_lr_, min_lr_;
  int warmup_, decay_steps_;
  LrDecay style_;
};

}  // namespace parallel
