// Non-finite and spiking steps (include/parallel/training_guard.hpp).
#include "parallel/training_guard.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace parallel {
namespace {

const char* policy_name(GuardPolicy p) {
  switch (p) {
    case GuardPolicy::Stop:
      return "stop";
    case GuardPolicy::Skip:
      return "skip";
    case GuardPolicy::Warn:
      return "warn";
  }
  return "?";
}

GuardVerdict::Action action_of(GuardPolicy p) {
  return p == GuardPolicy::Stop   ? GuardVerdict::Action::Stop
         : p == GuardPolicy::Skip ? GuardVerdict::Action::Skip
                                  : GuardVerdict::Action::Update;
}

double median(const std::deque<double>& values) {
  std::vector<double> sorted(values.begin(), values.end());
  std::sort(sorted.begin(), sorted.end());
  const std::size_t n = sorted.size();
  return n % 2 == 1 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
}

}  // namespace

TrainingGuard::TrainingGuard(const TrainConfig& config) : config_(config) {}

GuardVerdict TrainingGuard::check(double loss, double grad_norm, bool grad_norm_checked) const {
  GuardVerdict v;
  const bool bad_loss = !std::isfinite(loss);
  const bool bad_norm = grad_norm_checked && !std::isfinite(grad_norm);
  if (bad_loss || bad_norm) {
    v.nonfinite = true;
    v.what = bad_loss && bad_norm ? fmt::format("the loss is {} and the gradient norm {}", loss, grad_norm)
             : bad_loss           ? fmt::format("the loss is {}", loss)
                        : fmt::format("the gradient norm is {} (the loss is {:.4f})", grad_norm, loss);
    v.rule = fmt::format("train.nonfinite_policy = {}", policy_name(config_.nonfinite_policy));
    v.action = action_of(config_.nonfinite_policy);
    return v;
  }
  const double factor = config_.spike_factor;
  if (factor <= 0 || losses_.size() < static_cast<std::size_t>(config_.spike_window)) return v;
  const double loss_median = median(losses_);
  const double norm_median = median(norms_);
  const auto spikes = [&](double value, double base) { return base > 0 && value > factor * base; };
  const auto describe = [&](const char* name, double value, double base) {
    return fmt::format(
        "{} {:.4g} is {:.1f}x the median {:.4g} of the last {} steps (train.spike_factor = {})", name, value,
        value / base, base, losses_.size(), factor);
  };
  if (spikes(loss, loss_median)) {
    v.what = describe("the loss", loss, loss_median);
  } else if (grad_norm_checked && spikes(grad_norm, norm_median)) {
    v.what = describe("the gradient norm", grad_norm, norm_median);
  } else {
    return v;
  }
  v.spike = true;
  v.rule = fmt::format("train.spike_policy = {}", policy_name(config_.spike_policy));
  v.action = action_of(config_.spike_policy);
  return v;
}

std::string TrainingGuard::record(const GuardVerdict& verdict, bool updated, double loss, double grad_norm) {
  nonfinite_ += verdict.nonfinite;
  spikes_ += verdict.spike;
  if (updated) {
    skipped_in_a_row_ = 0;
    losses_.push_back(loss);
    norms_.push_back(grad_norm);
    while (losses_.size() > static_cast<std::size_t>(std::max(config_.spike_window, 1))) {
      losses_.pop_front();
      norms_.pop_front();
    }
    return {};
  }
  ++skipped_;
  ++skipped_in_a_row_;
  if (config_.max_consecutive_skips > 0 && skipped_in_a_row_ >= config_.max_consecutive_skips)
    return fmt::format("{} updates in a row were skipped (train.max_consecutive_skips = {})",
                       skipped_in_a_row_, config_.max_consecutive_skips);
  return {};
}

}  // namespace parallel
