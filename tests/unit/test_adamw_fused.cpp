// The one-pass AdamW kernel (kernels/cpu/adamw.cpp) against the update it replaced: the scalar
// element loop followed by a separate narrowing of the fp32 main weights into the 16-bit model copy
// (float_to_bf16 / float_to_f16). Every bit of param, exp_avg, exp_avg_sq and the model copy must be
// equal, for fp32, bf16 and fp16 copies, with and without weight decay and a clip coefficient, and
// for gradients unscaled from an fp16 loss scale. The kernel runs whichever clone the CPU selects
// (AVX-512, AVX2 or baseline), and several steps so that m and v carry history.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../../kernels/adamw_scalars.hpp"
#include "parallel/dtype.hpp"
#include "parallel/ops.hpp"

namespace parallel {
namespace {

// The update before the fusion, operation for operation (no multiply-add contraction: tests are
// built with the library's flags, which keep GCC from contracting across statements).
void reference_step(const kernels::AdamWScalars& k, const std::vector<float>& g, std::vector<float>& p,
                    std::vector<float>& m, std::vector<float>& v) {
  for (std::size_t i = 0; i < p.size(); ++i) {
    const float gi = k.clip == 1.0f ? g[i] : g[i] * k.clip;
    float pi = p[i] * k.decay;
    const float mi = m[i] * k.b1 + gi * k.a1;
    const float vi = v[i] * k.b2 + gi * gi * k.a2;
    const float denom = std::sqrt(vi) / k.bc2s + k.eps;
    pi += -k.step_size * (mi / denom);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

uint16_t narrow(float x, DType dt) {
  return dt == DType::BF16 ? float_to_bf16(x).bits : float_to_f16(x).bits;
}

std::vector<float> floats(const Tensor& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  std::memcpy(out.data(), t.data<float>(), out.size() * sizeof(float));
  return out;
}

void expect_same_bits(const std::vector<float>& want, const Tensor& got, const char* what) {
  const float* g = got.data<float>();
  int64_t bad = 0, first = -1;
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (std::memcmp(&want[i], &g[i], sizeof(float)) != 0) {
      if (first < 0) first = static_cast<int64_t>(i);
      ++bad;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": first difference at " << first << " (want "
                    << (first >= 0 ? want[first] : 0.0f) << ", got " << (first >= 0 ? g[first] : 0.0f) << ")";
}

struct Case {
  DType copy;          // F32: no model copy
  float weight_decay;  // 0: none
  float clip;          // 1: no clipping
  float loss_scale;    // 1: none; else the gradients are unscaled by 1/loss_scale first, as fp16 does
  int64_t n;
};

void run_case(const Case& c) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.copy) << " wd " << c.weight_decay << " clip " << c.clip
                                    << " loss scale " << c.loss_scale << " n " << c.n);
  std::mt19937 rng(static_cast<uint32_t>(c.n * 31 + static_cast<int64_t>(c.clip * 7)));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 99);
  const auto n = static_cast<std::size_t>(c.n);
  std::vector<float> p(n), m(n, 0.0f), v(n, 0.0f);
  for (std::size_t i = 0; i < n; ++i) {
    p[i] = normal(rng) * 0.02f;
    if (c.copy != DType::F32)
      p[i] = c.copy == DType::BF16 ? bf16_to_float(float_to_bf16(p[i])) : f16_to_float(float_to_f16(p[i]));
  }
  Tensor param = Tensor::from_floats(p, {c.n}, DType::F32);
  Tensor exp_avg = Tensor::zeros({c.n}, DType::F32), exp_avg_sq = Tensor::zeros({c.n}, DType::F32);
  Tensor copy = c.copy == DType::F32 ? Tensor() : Tensor::zeros({c.n}, c.copy);
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<float> g(n);
    for (std::size_t i = 0; i < n; ++i) {
      // Mostly ordinary gradients, some zeros, tiny (subnormal after scaling) and large ones.
      const int kind = pick(rng);
      g[i] = kind < 3 ? 0.0f : kind < 6 ? normal(rng) * 1e-38f : kind < 9 ? normal(rng) * 1e4f : normal(rng);
      if (c.loss_scale != 1.0f) g[i] *= c.loss_scale;
    }
    Tensor grad = Tensor::from_floats(g, {c.n}, DType::F32);
    if (c.loss_scale != 1.0f) {
      ops::scale_(grad, 1.0f / c.loss_scale);  // what Optimizer::step does before the update
      g = floats(grad);
    }
    ops::AdamWStep h;
    h.lr = 3e-4;
    h.beta1 = 0.9;
    h.beta2 = 0.95;
    h.eps = 1e-8;
    h.weight_decay = c.weight_decay;
    h.step = step;
    h.grad_scale = c.clip;
    const kernels::AdamWScalars k =
        kernels::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step, h.grad_scale);
    reference_step(k, g, p, m, v);
    if (copy.defined())
      ops::adamw_update_(param, grad, exp_avg, exp_avg_sq, copy, h);
    else
      ops::adamw_update_(param, grad, exp_avg, exp_avg_sq, h);
    expect_same_bits(p, param, "param");
    expect_same_bits(m, exp_avg, "exp_avg");
    expect_same_bits(v, exp_avg_sq, "exp_avg_sq");
    if (copy.defined()) {
      const auto* bits = static_cast<const uint16_t*>(copy.data_ptr());
      int64_t bad = 0, first = -1;
      for (std::size_t i = 0; i < n; ++i) {
        if (bits[i] == narrow(p[i], c.copy)) continue;
        if (first < 0) first = static_cast<int64_t>(i);
        ++bad;
      }
      EXPECT_EQ(bad, 0) << "model copy: first difference at " << first << " (main weight bits 0x" << std::hex
                        << (first >= 0 ? std::bit_cast<uint32_t>(p[first]) : 0u) << ", copy 0x"
                        << (first >= 0 ? bits[first] : 0) << ", want 0x"
                        << (first >= 0 ? narrow(p[first], c.copy) : 0) << ")";
    }
  }
}

// Sizes: below one vector, odd tails, one kernel block (4096) and its neighbours, and above the
// threshold (65536) where blocks are split over the OpenMP threads.
const int64_t kSizes[] = {1, 13, 4095, 4097, 70001};

TEST(AdamWFused, Fp32BitwiseEqualsUnfused) {
  for (int64_t n : kSizes)
    for (float wd : {0.0f, 0.1f})
      for (float clip : {1.0f, 0.37f}) run_case({DType::F32, wd, clip, 1.0f, n});
}

TEST(AdamWFused, Bf16CopyBitwiseEqualsUnfused) {
  for (int64_t n : kSizes)
    for (float wd : {0.0f, 0.1f})
      for (float clip : {1.0f, 0.37f}) run_case({DType::BF16, wd, clip, 1.0f, n});
}

TEST(AdamWFused, Fp16CopyWithLossScaleBitwiseEqualsUnfused) {
  for (int64_t n : kSizes)
    for (float wd : {0.0f, 0.1f})
      for (float clip : {1.0f, 0.37f})
        for (float scale : {1.0f, 65536.0f}) run_case({DType::F16, wd, clip, scale, n});
}

}  // namespace
}  // namespace parallel
