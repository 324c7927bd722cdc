// AdamW against PyTorch's semantics: decoupled weight decay only for >= 2-D parameters, bias
// correction, eps outside the square root; checked against a formula evaluated here in double and
// against a fixture written by torch.optim.AdamW (tests/reference/make_adamw_fixture.py). Also the
// emulated low-precision path (fp32 main weights, values rounded to bf16) and clipping.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <sstream>

#include "parallel/ops.hpp"
#include "parallel/optimizer.hpp"
#include "parallel/precision.hpp"
#include "parallel/safetensors.hpp"
#include "paths.hpp"

namespace parallel {
namespace {

namespace fs = std::filesystem;

using parallel::testing::fixtures_dir;

Parameter make_param(const std::string& name, const std::vector<float>& values, const Shape& shape) {
  Parameter p;
  p.name = name;
  p.value = Tensor::from_floats(values, shape, DType::F32);
  p.grad = Tensor::zeros(shape, DType::F32);
  p.global_shape = shape;
  return p;
}

void set(Tensor& t, const std::vector<float>& v) { t.copy_(Tensor::from_floats(v, t.shape(), DType::F32)); }

// The PyTorch AdamW update in double, element by element.
struct RefAdam {
  double lr_wd, b1, b2, eps;
  std::vector<double> p, m, v;
  int t = 0;
  void step(const std::vector<float>& g, double lr, double wd) {
    ++t;
    for (std::size_t i = 0; i < p.size(); ++i) {
      p[i] *= 1.0 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
      const double mhat = m[i] / (1 - std::pow(b1, t));
      const double denom = std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps;
      p[i] -= lr * mhat / denom;
    }
  }
};

double max_rel(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(a[i] - b[i]));
    scale = std::max(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

TEST(AdamW, MatchesTheFormulaWithDecayOnlyOnMatrices) {
  Parameter w = make_param("w", {0.5f, -0.25f, 1.0f, 0.0f, 2.0f, -1.5f}, {2, 3});
  Parameter b = make_param("b", {0.1f, -0.2f, 0.3f}, {3});
  OptimizerConfig cfg;
  cfg.weight_decay = 0.1;
  cfg.beta1 = 0.9;
  cfg.beta2 = 0.95;
  cfg.eps = 1e-8;
  cfg.clip_grad = 0.0;  // clipping is tested separately
  AdamW opt({&w, &b}, cfg, Precision::FP32);
  RefAdam rw{
      0, 0.9, 0.95, 1e-8, {0.5, -0.25, 1.0, 0.0, 2.0, -1.5}, std::vector<double>(6), std::vector<double>(6)};
  RefAdam rb{0, 0.9, 0.95, 1e-8, {0.1, -0.2, 0.3}, std::vector<double>(3), std::vector<double>(3)};
  for (int t = 1; t <= 6; ++t) {
    const double lr = 1e-2 * t;
    std::vector<float> gw = {0.1f * t, -0.2f, 0.0f, 0.05f, -0.3f / t, 1e-4f};
    std::vector<float> gb = {0.01f, -0.02f * t, 0.5f};
    set(w.grad, gw);
    set(b.grad, gb);
    const StepResult r = opt.step(lr);
    EXPECT_FALSE(r.skipped);
    EXPECT_EQ(r.clip_coef, 1.0);
    rw.step(gw, lr, 0.1);
    rb.step(gb, lr, 0.0);  // 1-D: never decayed
    EXPECT_LE(max_rel(w.value.to_float_vector(), rw.p), 1e-6) << "step " << t;
    EXPECT_LE(max_rel(b.value.to_float_vector(), rb.p), 1e-6) << "step " << t;
  }
  EXPECT_EQ(opt.updates(), 6);
  EXPECT_EQ(opt.state_bytes(), 2u * 9u * sizeof(float));  // fp32: no main copy
}

TEST(AdamW, MatchesTorchOptimAdamWFixture) {
  const std::string path = fixtures_dir() + "/adamw.safetensors";
  auto t = safetensors::load(path);
  auto meta = safetensors::load_metadata(path);
  std::vector<double> lrs;
  std::stringstream ss(meta.at("lrs"));
  for (std::string item; std::getline(ss, item, ',');) lrs.push_back(std::stod(item));
  ASSERT_EQ(lrs.size(), 5u);
  Parameter w = make_param("w", t.at("w0").to_float_vector(), {4, 6});
  Parameter b = make_param("b", t.at("b0").to_float_vector(), {6});
  OptimizerConfig cfg;
  cfg.weight_decay = std::stod(meta.at("weight_decay"));
  cfg.beta1 = std::stod(meta.at("beta1"));
  cfg.beta2 = std::stod(meta.at("beta2"));
  cfg.eps = std::stod(meta.at("eps"));
  cfg.clip_grad = 0.0;
  AdamW opt({&w, &b}, cfg, Precision::FP32);
  for (int s = 1; s <= 5; ++s) {
    w.grad.copy_(t.at("gw" + std::to_string(s)));
    b.grad.copy_(t.at("gb" + std::to_string(s)));
    opt.step(lrs[s - 1]);
    const auto ew = t.at("w" + std::to_string(s)).to_float_vector();
    const auto eb = t.at("b" + std::to_string(s)).to_float_vector();
    EXPECT_LE(max_rel(w.value.to_float_vector(), {ew.begin(), ew.end()}), 2e-6) << "step " << s;
    EXPECT_LE(max_rel(b.value.to_float_vector(), {eb.begin(), eb.end()}), 2e-6) << "step " << s;
  }
}

TEST(AdamW, ClipsByTheGlobalNorm) {
  Parameter w = make_param("w", {1, 2, 3, 4}, {2, 2});
  Parameter b = make_param("b", {1, 1}, {2});
  OptimizerConfig cfg;
  cfg.clip_grad = 0.5;
  cfg.weight_decay = 0.0;
  AdamW clipped({&w, &b}, cfg, Precision::FP32);
  set(w.grad, {3, 0, 0, 0});
  set(b.grad, {0, 4});
  const StepResult r = clipped.step(1e-3);
  EXPECT_NEAR(r.grad_norm, 5.0, 1e-6);
  EXPECT_NEAR(r.clip_coef, 0.5 / (5.0 + 1e-6), 1e-12);
  // Adam's first step is ~lr * sign(g) whatever the scale, so check the moments instead.
  EXPECT_NEAR(clipped.exp_avg().to_float_vector()[0], 0.1 * 3.0 * r.clip_coef, 1e-7);
  EXPECT_NEAR(clipped.exp_avg_sq().to_float_vector()[5], 0.05 * 16.0 * r.clip_coef * r.clip_coef, 1e-7);
}

TEST(AdamW, Bf16KeepsFp32MainWeightsAndWritesTheModelsBf16Values) {
  Parameter w = make_param("w", {1.0f, 1.001f, -3.14159f, 0.3f}, {2, 2});
  OptimizerConfig cfg;
  cfg.clip_grad = 0.0;
  cfg.weight_decay = 0.0;
  // The precision policy gives the model a bf16 copy (precision.hpp); the optimizer keeps fp32.
  cast_parameters({&w}, DType::BF16);
  ASSERT_EQ(w.value.dtype(), DType::BF16);
  AdamW opt({&w}, cfg, Precision::BF16);
  ASSERT_TRUE(opt.main_params().defined());
  EXPECT_EQ(opt.state_bytes(), 3u * 4u * sizeof(float));  // main + exp_avg + exp_avg_sq
  auto is_bf16 = [](float x) { return bf16_to_float(float_to_bf16(x)) == x; };
  for (float x : w.value.to_float_vector()) EXPECT_TRUE(is_bf16(x)) << x;
  // Tiny updates accumulate in the fp32 main weights even when bf16 cannot show each one.
  for (int i = 0; i < 20; ++i) {
    set(w.grad, {1, 1, 1, 1});
    opt.step(1e-5);
  }
  const auto main = opt.main_params().to_float_vector();
  const auto value = w.value.to_float_vector();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(is_bf16(value[i])) << value[i];
    EXPECT_EQ(value[i], bf16_to_float(float_to_bf16(main[i])));
  }
  EXPECT_NEAR(main[0], 1.0f - 20 * 1e-5f, 1e-6);
}

TEST(AdamW, LowPrecisionRefusesFp32ModelValues) {
  Parameter w = make_param("w", {1.0f, 2.0f}, {2});
  try {
    AdamW opt({&w}, OptimizerConfig{}, Precision::BF16);
    FAIL() << "accepted fp32 values for a bf16 run";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be contiguous with a bf16 value"), std::string::npos)
        << e.what();
  }
}

// The op under the optimizer (ops::adamw_update_, shared by CPU and CUDA) checks its arguments.
TEST(AdamW, UpdateOpRejectsMismatchedBuffersAndStepZero) {
  Tensor p = Tensor::zeros({8}, DType::F32), g = Tensor::zeros({8}, DType::F32);
  Tensor m = Tensor::zeros({8}, DType::F32), short_v = Tensor::zeros({7}, DType::F32);
  EXPECT_THROW(ops::adamw_update_(p, g, m, short_v, {}), Error);
  Tensor v = Tensor::zeros({8}, DType::F32);
  EXPECT_THROW(ops::adamw_update_(p, g, m, v, {.step = 0}), Error);
  Tensor half = Tensor::zeros({8}, DType::BF16);
  EXPECT_THROW(ops::adamw_update_(p, half, m, v, {}), Error);
  EXPECT_NO_THROW(ops::adamw_update_(p, g, m, v, {}));
}

}  // namespace
}  // namespace parallel
