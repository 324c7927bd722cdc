// Our tensor-core GEMM (kernels/gemm/gemm_mma.cu) against a CPU reference computed in double from the
// same bf16 (or fp16) inputs: all four transposition cases (the three of a linear layer and a^T b^T),
// sizes that are not multiples of the 128 x 128 x 32 tile, leading dimensions that are and are not
// multiples of 8 (the cp.async path and the element-wise fallback), beta accumulation, and the
// bias / GeLU epilogue. Tolerance 1e-3 of the largest reference value: the products of bf16 values
// are exact in fp32 and only the fp32 accumulation order differs, ~K ulp at worst.
// Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "../../kernels/cuda/kernels.hpp"
#include "../../kernels/gemm/gemm.hpp"
#include "gpu.hpp"
#include "parallel/tensor.hpp"

namespace parallel {
namespace {

struct Case {
  int64_t m, n, k;
  bool ta, tb;
};

std::vector<float> rand_vec(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

double gelu_ref(double v) {
  const double u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
  return 0.5 * v * (1.0 + std::tanh(u));
}

// Runs one case through gemm_bf16 (or gemm_f16) and checks it against the double reference.
void run_case(const Case& cs, float alpha, float beta, bool with_bias, bool with_gelu, DType type) {
  SCOPED_TRACE(::testing::Message() << "m " << cs.m << " n " << cs.n << " k " << cs.k << " trans_a " << cs.ta
                                    << " trans_b " << cs.tb << " alpha " << alpha << " beta " << beta
                                    << " bias " << with_bias << " gelu " << with_gelu << " "
                                    << dtype_name(type));
  const int64_t M = cs.m, N = cs.n, K = cs.k;
  // Stored shapes: a [m, k] or [k, m]; b [k, n] or [n, k].
  const Tensor a32 = Tensor::from_vector(rand_vec(M * K, 1), cs.ta ? Shape{K, M} : Shape{M, K});
  const Tensor b32 = Tensor::from_vector(rand_vec(K * N, 2), cs.tb ? Shape{N, K} : Shape{K, N});
  const Tensor a16 = a32.to(type), b16 = b32.to(type);
  const std::vector<float> A = a16.to_float_vector(), B = b16.to_float_vector();  // the rounded values
  const std::vector<float> C0 = rand_vec(M * N, 3), bias = rand_vec(N, 4);

  std::vector<double> ref(M * N), pre(M * N);
  for (int64_t i = 0; i < M; i++) {
    for (int64_t j = 0; j < N; j++) {
      double s = 0.0;
      for (int64_t kk = 0; kk < K; kk++) {
        const double av = cs.ta ? A[kk * M + i] : A[i * K + kk];
        const double bv = cs.tb ? B[j * K + kk] : B[kk * N + j];
        s += av * bv;
      }
      double v = alpha * s + (beta != 0.0f ? beta * C0[i * N + j] : 0.0);
      if (with_bias) v += bias[j];
      pre[i * N + j] = v;
      ref[i * N + j] = with_gelu ? gelu_ref(v) : v;
    }
  }

  const Device dev = Device::cuda(0);
  const Tensor a_g = a16.to(dev), b_g = b16.to(dev), bias_g = Tensor::from_vector(bias, {N}).to(dev);
  // beta == 0: c holds NaN, which must never be read.
  Tensor c_g =
      beta != 0.0f ? Tensor::from_vector(C0, {M, N}).to(dev) : Tensor::full({M, N}, NAN, DType::F32, dev);
  Tensor pre_g = Tensor::zeros({M, N}, DType::F32, dev);
  kernels::GemmEpilogue epi;
  epi.bias = with_bias ? static_cast<const float*>(bias_g.data_ptr()) : nullptr;
  epi.gelu = with_gelu;
  epi.pre_gelu = with_gelu ? static_cast<float*>(pre_g.data_ptr()) : nullptr;
  if (type == DType::BF16)
    kernels::gemm_bf16(static_cast<const bf16*>(a_g.data_ptr()), cs.ta,
                       static_cast<const bf16*>(b_g.data_ptr()), cs.tb, static_cast<float*>(c_g.data_ptr()),
                       M, N, K, alpha, beta, epi, nullptr);
  else
    kernels::gemm_f16(static_cast<const f16*>(a_g.data_ptr()), cs.ta, static_cast<const f16*>(b_g.data_ptr()),
                      cs.tb, static_cast<float*>(c_g.data_ptr()), M, N, K, alpha, beta, epi, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  const std::vector<float> got = c_g.to(Device::cpu()).to_float_vector();
  double scale = 1e-30, diff = 0.0;
  for (int64_t i = 0; i < M * N; i++) {
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    scale = std::max(scale, std::fabs(ref[i]));
    diff = std::max(diff, std::fabs(got[i] - ref[i]));
  }
  EXPECT_LT(diff / scale, 1e-3);
  if (with_gelu) {
    const std::vector<float> p = pre_g.to(Device::cpu()).to_float_vector();
    double pd = 0.0, ps = 1e-30;
    for (int64_t i = 0; i < M * N; i++) {
      pd = std::max(pd, std::fabs(p[i] - pre[i]));
      ps = std::max(ps, std::fabs(pre[i]));
    }
    EXPECT_LT(pd / ps, 1e-3);
  }
}

const Case kShapes[] = {
    {256, 128, 64, false, true},   // exact tiles
    {200, 136, 104, false, true},  // ld multiple of 8, edges: cp.async with zero-filled chunks
    {197, 131, 75, false, true},   // nothing a multiple of 8: element-wise fallback loads
    {1, 1, 1, false, true},       {130, 260, 300, false, true},
};

TEST(GemmMma, AllTranspositionsOddSizes) {
  REQUIRE_GPU();
  for (const Case& base : kShapes) {
    for (int ta = 0; ta < 2; ta++) {
      for (int tb = 0; tb < 2; tb++) {
        Case c = base;
        c.ta = ta;
        c.tb = tb;
        run_case(c, 1.0f, 0.0f, false, false, DType::BF16);
      }
    }
  }
}

TEST(GemmMma, LinearLayerCasesWithAlphaBetaAccumulate) {
  REQUIRE_GPU();
  // forward y = x W^T, input gradient dx = dy W, weight gradient dW += dy^T x (beta = 1).
  run_case({203, 96, 136, false, true}, 1.0f, 0.0f, false, false, DType::BF16);
  run_case({203, 136, 96, false, false}, 1.0f, 0.0f, false, false, DType::BF16);
  run_case({96, 136, 203, true, false}, 1.0f, 1.0f, false, false, DType::BF16);
  run_case({96, 130, 211, true, false}, 0.5f, 1.0f, false, false, DType::BF16);
  run_case({77, 65, 45, false, false}, -2.0f, 0.25f, false, false, DType::BF16);
}

TEST(GemmMma, BiasAndGeluEpilogues) {
  REQUIRE_GPU();
  run_case({203, 136, 96, false, true}, 1.0f, 0.0f, true, false, DType::BF16);
  run_case({203, 136, 96, false, true}, 1.0f, 0.0f, true, true, DType::BF16);
  run_case({197, 131, 75, false, true}, 1.0f, 0.0f, false, true, DType::BF16);
  run_case({120, 250, 64, false, false}, 1.0f, 1.0f, true, true, DType::BF16);
}

TEST(GemmMma, Fp16Inputs) {
  REQUIRE_GPU();
  run_case({200, 136, 104, false, true}, 1.0f, 0.0f, false, false, DType::F16);
  run_case({197, 131, 75, true, false}, 1.0f, 1.0f, true, true, DType::F16);
}

TEST(GemmMma, AgreesWithCublasLt) {
  REQUIRE_GPU();
  const int64_t M = 384, N = 256, K = 512;
  const Device dev = Device::cuda(0);
  const Tensor a = Tensor::from_vector(rand_vec(M * K, 7), {M, K}).to(DType::BF16).to(dev);
  const Tensor b = Tensor::from_vector(rand_vec(N * K, 8), {N, K}).to(DType::BF16).to(dev);
  Tensor ours = Tensor::zeros({M, N}, DType::F32, dev), theirs = Tensor::zeros({M, N}, DType::F32, dev);
  kernels::gemm_bf16(static_cast<const bf16*>(a.data_ptr()), false, static_cast<const bf16*>(b.data_ptr()),
                     true, static_cast<float*>(ours.data_ptr()), M, N, K, 1.0f, 0.0f, {}, nullptr);
  cuda::gemm_cublaslt_bf16(static_cast<const bf16*>(a.data_ptr()), false,
                           static_cast<const bf16*>(b.data_ptr()), true,
                           static_cast<float*>(theirs.data_ptr()), M, N, K, 1.0f, 0.0f, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> x = ours.to(Device::cpu()).to_float_vector(),
                           y = theirs.to(Device::cpu()).to_float_vector();
  double d = 0.0, s = 1e-30;
  for (std::size_t i = 0; i < x.size(); i++) {
    d = std::max(d, static_cast<double>(std::fabs(x[i] - y[i])));
    s = std::max(s, static_cast<double>(std::fabs(y[i])));
  }
  EXPECT_LT(d / s, 1e-3);
}

}  // namespace
}  // namespace parallel
