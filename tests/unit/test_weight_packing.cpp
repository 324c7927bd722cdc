// ops::WeightPackingScope: a weight is packed once per orientation for all the micro-batches of a
// scope, the products equal the unpacked ones, activations are never packed, and nothing packed
// outlives its scope (a weight changed after the scope is read afresh).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

using namespace parallel;

namespace {

Tensor random(const Shape& shape, uint32_t seed, DType dt) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, shape).to(dt);
}

// |got - want| <= tol * max|want| elementwise.
void expect_close(const Tensor& got, const Tensor& want, double tol, const char* what) {
  const std::vector<float> g = got.to_float_vector(), w = want.to_float_vector();
  ASSERT_EQ(g.size(), w.size());
  double mx = 0;
  for (float x : w) mx = std::max(mx, std::abs(double(x)));
  for (size_t i = 0; i < g.size(); i++)
    ASSERT_LE(std::abs(double(g[i]) - w[i]), tol * mx) << what << "[" << i << "]";
}

class WeightPacking : public ::testing::TestWithParam<DType> {};

void one_pack_per_orientation(DType dt, int64_t M, int64_t N, int64_t K) {
  // Two weights in one buffer, as the DDP parameter buffer holds them.
  Tensor buffer = random({2 * N * K}, 1, dt);
  Tensor w0 = buffer.narrow(0, 0, N * K).view({N, K}), w1 = buffer.narrow(0, N * K, N * K).view({N, K});
  Tensor bias = random({N}, 2, dt);
  const double tol = dt == DType::F32 ? 1e-6 : 1e-2;

  // Unpacked reference for two micro-batches: y = x W^T (+ bias), dx = dy W, dW += dy^T x.
  std::vector<Tensor> xs, dys, ys, dxs;
  for (int mb = 0; mb < 2; mb++) {
    xs.push_back(random({M, K}, 10 + mb, dt));
    dys.push_back(random({M, N}, 20 + mb, dt));
    Tensor y = Tensor::empty({M, N}, dt), y1 = Tensor::empty({M, N}, dt), dx = Tensor::empty({M, K}, dt);
    ops::gemm(xs[mb], false, w0, true, y);
    ops::gemm_bias(xs[mb], false, w1, true, bias, y1);
    ops::gemm(dys[mb], false, w0, false, dx);
    ys.push_back(y);
    ys.push_back(y1);
    dxs.push_back(dx);
  }

  const int64_t before = ops::WeightPackingScope::packs_made();
  Tensor dw = Tensor::zeros({N, K}, DType::F32);
  {
    ops::WeightPackingScope scope({buffer});
    for (int mb = 0; mb < 2; mb++) {
      Tensor y = Tensor::empty({M, N}, dt), y1 = Tensor::empty({M, N}, dt), dx = Tensor::empty({M, K}, dt);
      ops::gemm(xs[mb], false, w0, true, y);
      ops::gemm_bias(xs[mb], false, w1, true, bias, y1);
      ops::gemm(dys[mb], false, w0, false, dx);
      ops::gemm(dys[mb], true, xs[mb], false, dw, 1.0f, 1.0f);  // b = x: an activation, never packed
      expect_close(y, ys[2 * mb], tol, "y");
      expect_close(y1, ys[2 * mb + 1], tol, "y + bias");
      expect_close(dx, dxs[mb], tol, "dx");
    }
    // w0 forward, w0 backward, w1 forward: three packs for two micro-batches, none for x. fp32
    // weights are used as they are, and so are 16-bit ones where this CPU's oneDNN has no native
    // kernel for the dtype (bf16 without AVX512-BF16/AMX, e.g. Zen 3: the GEMM widens instead).
    const bool packs = ops::WeightPackingScope::packs(dt);
    EXPECT_EQ(ops::WeightPackingScope::packs_made() - before, packs ? 3 : 0);
  }

  // After the scope the weights may change (the optimizer step) and are read afresh.
  w0.copy_(random({N, K}, 3, dt));
  Tensor y = Tensor::empty({M, N}, dt), y_fresh = Tensor::empty({M, N}, dt);
  ops::gemm(xs[0], false, w0, true, y);
  {
    ops::WeightPackingScope scope({buffer});
    ops::gemm(xs[0], false, w0, true, y_fresh);
  }
  expect_close(y_fresh, y, tol, "y after the weight changed");
  EXPECT_EQ(ops::WeightPackingScope::packs_made() - before, ops::WeightPackingScope::packs(dt) ? 4 : 0);
}

TEST_P(WeightPacking, OnePackPerOrientationForAllMicroBatches) {
  one_pack_per_orientation(GetParam(), 96, 80, 72);
}

// A square W packs to the same layout in both orientations: x W^T and dy W must still differ.
TEST_P(WeightPacking, SquareWeightKeepsItsOrientations) { one_pack_per_orientation(GetParam(), 96, 64, 64); }

INSTANTIATE_TEST_SUITE_P(Dtypes, WeightPacking, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(WeightPackingScope, DoesNotNest) {
  Tensor buffer = Tensor::zeros({16}, DType::F32);
  ops::WeightPackingScope scope({buffer});
  EXPECT_THROW(ops::WeightPackingScope inner({buffer}), Error);
}

}  // namespace
