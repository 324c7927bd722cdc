// The learning-rate schedule, term for term as Megatron-Core's OptimizerParamScheduler.get_lr.
#include "parallel/lr_schedule.hpp"

#include <cmath>
#include <numbers>

#include "parallel/error.hpp"

namespace parallel {

LrSchedule::LrSchedule(double max_lr, double min_lr, int warmup_steps, int decay_steps, LrDecay style)
    : max_lr_(max_lr), min_lr_(min_lr), warmup_(warmup_steps), decay_steps_(decay_steps), style_(style) {
  PARALLEL_CHECK(max_lr >= 0 && min_lr >= 0 && min_lr <= max_lr, "LrSchedule: need 0 <= min_lr {} <= lr {}",
                 min_lr, max_lr);
  PARALLEL_CHECK(warmup_steps >= 0 && decay_steps >= 0, "LrSchedule: negative step count");
}

LrSchedule::LrSchedule(const OptimizerConfig& c, int total_steps)
    : LrSchedule(c.lr, c.min_lr, c.warmup_steps, total_steps, c.lr_decay) {}

double LrSchedule::lr(int step) const {
  if (warmup_ > 0 && step <= warmup_) return max_lr_ * static_cast<double>(step) / warmup_;
  if (style_ == LrDecay::Constant) return max_lr_;
  if (step > decay_steps_) return min_lr_;
  // decay_steps <= warmup leaves nothing to decay over: the warm-up hands over to min_lr directly.
  if (decay_steps_ <= warmup_) return min_lr_;
  const double ratio = static_cast<double>(step - warmup_) / static_cast<double>(decay_steps_ - warmup_);
  const double coeff =
      style_ == LrDecay::Linear ? 1.0 - ratio : 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return min_lr_ + coeff * (max_lr_ - min_lr_);
}

}  // namespace parallel
