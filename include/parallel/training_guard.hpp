#pragma once
// The trainer's guard against steps that would poison the model (docs/configuration.md#training-guards):
// before each update it looks at the step's global loss and gradient norm, the same values on every
// rank, so every rank reaches the same verdict without talking.
//   - not finite (inf or NaN): train.nonfinite_policy, stop (the default) or skip the update;
//   - a spike, above train.spike_factor times the median of the last train.spike_window applied
//     steps (spike_factor 0: off; checked once the window is full): train.spike_policy, stop, skip
//     or warn (update anyway);
//   - train.max_consecutive_skips skipped updates in a row, whatever skipped them (fp16 overflows
//     too), stop the run: a run that never updates must not end as if it had trained.
// fp16's loss scaler keeps its own rule for gradients: an overflow skips the update and lowers the
// scale, so under fp16 only the loss is checked for being finite.
#include <cstdint>
#include <deque>
#include <string>

#include "parallel/config.hpp"

namespace parallel {

struct GuardVerdict {
  enum class Action { Update, Skip, Stop };
  Action action = Action::Update;
  bool nonfinite = false;
  bool spike = false;
  // What was seen, e.g. "the loss is nan" or "gradient norm 812.4 is 95.3x the median 8.52 of the
  // last 20 steps" and the rule that decided, e.g. "train.spike_policy = skip"; empty: all well.
  std::string what, rule;
};

class TrainingGuard {
 public:
  explicit TrainingGuard(const TrainConfig& config);

  // The verdict on a step before its update. `grad_norm_checked` false: the gradient norm is not
  // looked at (an fp16 overflow, which the loss scaler handles).
  GuardVerdict check(double loss, double grad_norm, bool grad_norm_checked) const;

  // After the step: whether its update was applied (then its values join the running window).
  // Returns the reason to stop when this makes max_consecutive_skips skipped updates in a row,
  // else an empty string.
  std::string record(const GuardVerdict& verdict, bool updated, double loss, double grad_norm);

  int64_t skipped_steps() const { return skipped_; }      // updates skipped so far, any cause
  int64_t spikes() const { return spikes_; }              // spikes seen (any policy)
  int64_t nonfinite_steps() const { return nonfinite_; }  // steps with an inf or NaN loss or norm

 private:
  TrainConfig config_;
  std::deque<double> losses_, norms_;  // the last spike_window applied steps
  int64_t skipped_ = 0, spikes_ = 0, nonfinite_ = 0, skipped_in_a_row_ = 0;
};

}  // namespace parallel
