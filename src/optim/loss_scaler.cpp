// Dynamic loss scaling: halve on overflow, double after a window of clean steps.
#include "parallel/loss_scaler.hpp"

#include <algorithm>
#include <cmath>

#include "parallel/ops.hpp"

namespace parallel {

DynamicLossScaler::DynamicLossScaler(double initial_scale, int growth_interval, double min_scale,
                                     double backoff_factor, double growth_factor)
    : scale_(initial_scale),
      min_scale_(min_scale),
      backoff_(backoff_factor),
      growth_(growth_factor),
      growth_interval_(growth_interval) {
  PARALLEL_CHECK(initial_scale > 0 && growth_interval > 0 && backoff_factor > 0 && backoff_factor < 1 &&
                     growth_factor > 1,
                 "DynamicLossScaler: invalid settings (scale {}, window {})", initial_scale, growth_interval);
}

void DynamicLossScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ = std::max(scale_ * backoff_, min_scale_);
    clean_steps_ = 0;
    return;
  }
  if (++clean_steps_ == growth_interval_) {
    scale_ *= growth_;
    clean_steps_ = 0;
  }
}

bool has_inf_or_nan(const Tensor& t) {
  PARALLEL_CHECK(t.dtype() == DType::F32 && t.is_contiguous(),
                 "has_inf_or_nan: needs a contiguous fp32 tensor, got {}", t.str());
  // On a GPU: the sum of squares (accumulated in double) is finite exactly when every element is,
  // short of values beyond 1e154, which no gradient reaches.
  if (!t.device().is_cpu()) return !std::isfinite(ops::sum_of_squares(t));
  const float* x = t.data<float>();
  const int64_t n = t.numel();
  // Sum of x * 0 is 0 for finite values and nan otherwise: one branch-free pass.
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * 0.0f;
  return !std::isfinite(acc);
}

}  // namespace parallel
