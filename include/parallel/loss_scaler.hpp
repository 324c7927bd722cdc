#pragma once
// Dynamic loss scaling for fp16 (Megatron-Core's DynamicGradScaler with hysteresis 1): the loss
// gradient is multiplied by scale() before the backward; the optimizer divides the gradients by it,
// and if any gradient on any rank is inf or nan the step is skipped and the scale halves. After
// `growth_interval` consecutive clean steps the scale doubles.
#include <cstdint>

#include "parallel/tensor.hpp"

namespace parallel {

class DynamicLossScaler {
 public:
  DynamicLossScaler(double initial_scale, int growth_interval, double min_scale = 1.0,
                    double backoff_factor = 0.5, double growth_factor = 2.0);
  double scale() const { return scale_; }
  // found_inf: this step's gradients overflowed somewhere (already agreed across ranks).
  void update(bool found_inf);
  int clean_steps() const { return clean_steps_; }
  // A resumed run continues with the saved scale and growth countdown (train_state.hpp).
  void restore(double scale, int clean_steps) {
    scale_ = scale;
    clean_steps_ = clean_steps;
  }

 private:
  double scale_, min_scale_, backoff_, growth_;
  int growth_interval_;
  int clean_steps_ = 0;
};

// Whether any element of the fp32 tensor `t` is inf or nan.
bool has_inf_or_nan(const Tensor& t);

}  // namespace parallel
