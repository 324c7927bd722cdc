// fp16 dynamic loss scaling: an overflow skips the step (parameters and optimizer state untouched)
// and halves the scale; the next clean step proceeds; the scale doubles after a window of clean
// steps.
#include <gtest/gtest.h>

#include <limits>

#include "parallel/loss_scaler.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/precision.hpp"

namespace parallel {
namespace {

TEST(LossScaler, HalvesOnOverflowAndGrowsAfterTheWindow) {
  DynamicLossScaler s(1024.0, 3);
  s.update(true);
  EXPECT_EQ(s.scale(), 512.0);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512.0);
  s.update(false);  // third clean step in a row
  EXPECT_EQ(s.scale(), 1024.0);
  s.update(false);
  s.update(true);  // an overflow resets the window
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 512.0);
  DynamicLossScaler floor(2.0, 10, /*min_scale=*/1.0);
  floor.update(true);
  floor.update(true);
  EXPECT_EQ(floor.scale(), 1.0);
}

TEST(LossScaler, DetectsInfAndNan) {
  Tensor t = Tensor::from_floats({1, 2, 3}, {3}, DType::F32);
  EXPECT_FALSE(has_inf_or_nan(t));
  t.data<float>()[1] = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(has_inf_or_nan(t));
  t.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(has_inf_or_nan(t));
}

TEST(LossScaler, Fp16OverflowSkipsTheStep) {
  Parameter w;
  w.name = "w";
  w.value = Tensor::from_floats({0.5f, -1.0f, 0.25f, 2.0f}, {2, 2}, DType::F32);
  w.grad = Tensor::zeros({2, 2}, DType::F32);
  w.global_shape = {2, 2};
  OptimizerConfig cfg;
  cfg.initial_loss_scale = 256.0;
  cfg.loss_scale_window = 2;
  cfg.clip_grad = 0.0;
  cast_parameters({&w}, DType::F16);  // the model's fp16 copy (precision.hpp)
  AdamW opt({&w}, cfg, Precision::FP16);
  DynamicLossScaler* scaler = opt.loss_scaler();
  ASSERT_NE(scaler, nullptr);
  auto set_scaled_grad = [&](std::vector<float> g) {
    for (float& x : g) x *= static_cast<float>(scaler->scale());  // as the scaled loss would give
    w.grad.copy_(Tensor::from_floats(g, {2, 2}, DType::F32));
  };

  set_scaled_grad({0.1f, 0.2f, -0.3f, 0.4f});
  StepResult r = opt.step(1e-2);
  ASSERT_FALSE(r.skipped);
  EXPECT_EQ(r.loss_scale, 256.0);
  EXPECT_NEAR(r.grad_norm, std::sqrt(0.01 + 0.04 + 0.09 + 0.16), 1e-4);  // unscaled
  const auto params = w.value.to_float_vector(), m = opt.exp_avg().to_float_vector(),
             v = opt.exp_avg_sq().to_float_vector(), main = opt.main_params().to_float_vector();
  for (float x : params) EXPECT_EQ(x, f16_to_float(float_to_f16(x)));  // fp16 values

  set_scaled_grad({0.1f, 0.2f, -0.3f, 0.4f});
  w.grad.data<float>()[2] = std::numeric_limits<float>::infinity();  // the injected overflow
  r = opt.step(1e-2);
  EXPECT_TRUE(r.skipped);
  EXPECT_EQ(scaler->scale(), 128.0);
  EXPECT_EQ(opt.updates(), 1);
  EXPECT_EQ(w.value.to_float_vector(), params);
  EXPECT_EQ(opt.exp_avg().to_float_vector(), m);
  EXPECT_EQ(opt.exp_avg_sq().to_float_vector(), v);
  EXPECT_EQ(opt.main_params().to_float_vector(), main);

  set_scaled_grad({0.1f, 0.2f, -0.3f, 0.4f});
  r = opt.step(1e-2);
  EXPECT_FALSE(r.skipped);
  EXPECT_EQ(r.loss_scale, 128.0);
  EXPECT_EQ(opt.updates(), 2);
  EXPECT_NE(w.value.to_float_vector(), params);
  EXPECT_NEAR(opt.exp_avg().to_float_vector()[0], 0.9 * m[0] + 0.1 * 0.1, 1e-6);  // unscaled grads

  set_scaled_grad({0.1f, 0.2f, -0.3f, 0.4f});
  opt.step(1e-2);
  EXPECT_EQ(scaler->scale(), 256.0);  // two clean steps in a row: grows back
}

}  // namespace
}  // namespace parallel
