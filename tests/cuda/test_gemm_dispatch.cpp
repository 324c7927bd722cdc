// The GEMM dispatch (kernels/gemm/gemm_dispatch.cu): gemm_bf16_auto and
// gemm_f16_auto against our kernel, cuBLASLt and a CPU reference computed in double from the same
// bf16 (fp16) inputs, for the three GEMMs of a linear layer (forward x W^T, input gradient dy W,
// weight gradient dy^T x accumulated with beta = 1). Tolerance 1e-3 of the largest reference value,
// as test_gemm_mma.cpp: products of bf16 values are exact in fp32, only the accumulation order
// differs. Parsing PARALLEL_GEMM needs no GPU; everything else skips without one.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/cuda/kernels.hpp"
#include "../../kernels/gemm/gemm.hpp"
#include "gpu.hpp"
#include "parallel/error.hpp"
#include "parallel/tensor.hpp"

namespace parallel {
namespace {

using kernels::GemmImpl;
using kernels::GemmMode;

// PARALLEL_GEMM's parsing and the rule are pure functions: test_gemm_rule checks them on the CPU.
TEST(GemmDispatch, NamesItsImplementations) {
  EXPECT_STREQ(kernels::gemm_impl_name(GemmImpl::Ours), "ours");
  EXPECT_STREQ(kernels::gemm_impl_name(GemmImpl::CublasLt), "cublaslt");
}

std::vector<float> rand_vec(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

double max_rel_diff(const std::vector<float>& got, const std::vector<double>& ref) {
  double diff = 0.0, scale = 1e-30;
  for (std::size_t i = 0; i < ref.size(); i++) {
    if (!std::isfinite(got[i])) return INFINITY;
    diff = std::max(diff, std::fabs(got[i] - ref[i]));
    scale = std::max(scale, std::fabs(ref[i]));
  }
  return diff / scale;
}

struct Case {
  const char* name;
  int64_t m, n, k;
  bool ta, tb;
  float beta;
};

// Which implementation computes c: 0 ours, 1 cuBLASLt, 2 the automatic choice.
void gemm_with(int which, DType type, const Tensor& a, bool ta, const Tensor& b, bool tb, Tensor& c,
               const Case& cs, float alpha, void* stream) {
  auto* C = static_cast<float*>(c.data_ptr());
  if (type == DType::BF16) {
    const auto* A = static_cast<const bf16*>(a.data_ptr());
    const auto* B = static_cast<const bf16*>(b.data_ptr());
    if (which == 0)
      kernels::gemm_bf16(A, ta, B, tb, C, cs.m, cs.n, cs.k, alpha, cs.beta, {}, stream);
    else if (which == 1)
      cuda::gemm_cublaslt_bf16(A, ta, B, tb, C, cs.m, cs.n, cs.k, alpha, cs.beta, stream);
    else
      kernels::gemm_bf16_auto(A, ta, B, tb, C, cs.m, cs.n, cs.k, alpha, cs.beta, {}, stream);
  } else {
    const auto* A = static_cast<const f16*>(a.data_ptr());
    const auto* B = static_cast<const f16*>(b.data_ptr());
    if (which == 0)
      kernels::gemm_f16(A, ta, B, tb, C, cs.m, cs.n, cs.k, alpha, cs.beta, {}, stream);
    else if (which == 1)
      cuda::gemm_cublaslt_f16(A, ta, B, tb, C, cs.m, cs.n, cs.k, alpha, cs.beta, stream);
    else
      kernels::gemm_f16_auto(A, ta, B, tb, C, cs.m, cs.n, cs.k, alpha, cs.beta, {}, stream);
  }
}

// A linear layer with T tokens, `in` inputs and `out` outputs (W [out, in]).
constexpr int64_t T = 300, kIn = 136, kOut = 200;
const Case kLinearCases[] = {
    {"forward x W^T", T, kOut, kIn, false, true, 0.0f},
    {"input gradient dy W", T, kIn, kOut, false, false, 0.0f},
    {"weight gradient dy^T x, beta 1", kOut, kIn, T, true, false, 1.0f},
};

void check_case(const Case& cs, DType type, void* stream) {
  SCOPED_TRACE(::testing::Message() << cs.name << " " << dtype_name(type) << " m " << cs.m << " n " << cs.n
                                    << " k " << cs.k);
  const float alpha = 1.0f;
  const Tensor a16 =
      Tensor::from_vector(rand_vec(cs.m * cs.k, 11), cs.ta ? Shape{cs.k, cs.m} : Shape{cs.m, cs.k}).to(type);
  const Tensor b16 =
      Tensor::from_vector(rand_vec(cs.k * cs.n, 12), cs.tb ? Shape{cs.n, cs.k} : Shape{cs.k, cs.n}).to(type);
  const std::vector<float> A = a16.to_float_vector(), B = b16.to_float_vector(),
                           C0 = rand_vec(cs.m * cs.n, 13);
  std::vector<double> ref(static_cast<std::size_t>(cs.m * cs.n));
  for (int64_t i = 0; i < cs.m; i++) {
    for (int64_t j = 0; j < cs.n; j++) {
      double s = 0.0;
      for (int64_t kk = 0; kk < cs.k; kk++)
        s += static_cast<double>(cs.ta ? A[kk * cs.m + i] : A[i * cs.k + kk]) *
             (cs.tb ? B[j * cs.k + kk] : B[kk * cs.n + j]);
      ref[i * cs.n + j] = alpha * s + (cs.beta != 0.0f ? cs.beta * C0[i * cs.n + j] : 0.0);
    }
  }

  const Device dev = Device::cuda(0);
  const Tensor a = a16.to(dev), b = b16.to(dev);
  std::vector<float> results[3];
  for (int which = 0; which < 3; which++) {
    // beta == 0: c starts as NaN, which must never be read (nor leak out of the timing runs).
    Tensor c = cs.beta != 0.0f ? Tensor::from_vector(C0, {cs.m, cs.n}).to(dev)
                               : Tensor::full({cs.m, cs.n}, NAN, DType::F32, dev);
    gemm_with(which, type, a, cs.ta, b, cs.tb, c, cs, alpha, stream);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    results[which] = c.to(Device::cpu()).to_float_vector();
    EXPECT_LT(max_rel_diff(results[which], ref), 1e-3) << (which == 0   ? "ours"
                                                           : which == 1 ? "cuBLASLt"
                                                                        : "auto");
  }
  std::vector<double> ours(results[0].begin(), results[0].end());
  EXPECT_LT(max_rel_diff(results[1], ours), 1e-3) << "cuBLASLt vs ours";
  EXPECT_LT(max_rel_diff(results[2], ours), 1e-3) << "auto vs ours";

  if (kernels::gemm_mode() == GemmMode::Auto) {
    // The fixed rule: auto ran what gemm_rule says, and timed nothing.
    kernels::GemmProblem problem;
    problem.m = cs.m;
    problem.n = cs.n;
    problem.k = cs.k;
    problem.trans_a = cs.ta;
    problem.trans_b = cs.tb;
    problem.dtype = type;
    problem.arch = kernels::current_arch();
    // Our kernel is deterministic: where the rule picks it, auto's result is exactly ours.
    if (kernels::gemm_rule(problem) == GemmImpl::Ours) EXPECT_EQ(results[2], results[0]);
  }
  kernels::GemmKey key;
  key.device = 0;
  key.m = cs.m;
  key.n = cs.n;
  key.k = cs.k;
  key.trans_a = cs.ta;
  key.trans_b = cs.tb;
  key.beta_nonzero = cs.beta != 0.0f;
  key.dtype = type;
  const auto choice = kernels::gemm_choice(key);
  if (kernels::gemm_mode() != GemmMode::Timed) {  // only PARALLEL_GEMM=timed measures
    EXPECT_FALSE(choice.has_value());
    return;
  }
  ASSERT_TRUE(choice.has_value());
  EXPECT_GT(choice->ours_ms, 0.0f);
  EXPECT_GT(choice->cublaslt_ms, 0.0f);
  EXPECT_EQ(choice->impl == GemmImpl::Ours, choice->ours_ms < choice->cublaslt_ms);
  // Our kernel is deterministic: when it won, auto's result (first call, after the timing runs)
  // is exactly ours, which also shows that the timing runs left c alone.
  if (choice->impl == GemmImpl::Ours) EXPECT_EQ(results[2], results[0]);
  // A shape never run has no choice.
  key.m += 1;
  EXPECT_FALSE(kernels::gemm_choice(key).has_value());
}

TEST(GemmDispatch, LinearLayerCasesAgreeWithOursCublasLtAndReference) {
  REQUIRE_GPU();
  for (const DType type : {DType::BF16, DType::F16})
    for (const Case& cs : kLinearCases) check_case(cs, type, nullptr);
}

TEST(GemmDispatch, NonDefaultStream) {
  REQUIRE_GPU();
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  // Other sizes than above: new keys, timed on this stream.
  check_case({"forward on a stream", 264, 72, 88, false, true, 0.0f}, DType::BF16, s);
  check_case({"weight gradient on a stream", 72, 88, 264, true, false, 1.0f}, DType::BF16, s);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaStreamDestroy(s);
}

// With an epilogue the automatic choice is always ours: bit-identical to calling it directly.
TEST(GemmDispatch, EpilogueRunsOurs) {
  REQUIRE_GPU();
  const int64_t M = 130, N = 96, K = 72;
  const Device dev = Device::cuda(0);
  const Tensor a = Tensor::from_vector(rand_vec(M * K, 21), {M, K}).to(DType::BF16).to(dev);
  const Tensor b = Tensor::from_vector(rand_vec(N * K, 22), {N, K}).to(DType::BF16).to(dev);
  const Tensor bias = Tensor::from_vector(rand_vec(N, 23), {N}).to(dev);
  Tensor c1 = Tensor::zeros({M, N}, DType::F32, dev), c2 = Tensor::zeros({M, N}, DType::F32, dev);
  Tensor p1 = Tensor::zeros({M, N}, DType::F32, dev), p2 = Tensor::zeros({M, N}, DType::F32, dev);
  kernels::GemmEpilogue e1, e2;
  e1.bias = e2.bias = static_cast<const float*>(bias.data_ptr());
  e1.gelu = e2.gelu = true;
  e1.pre_gelu = static_cast<float*>(p1.data_ptr());
  e2.pre_gelu = static_cast<float*>(p2.data_ptr());
  const auto* A = static_cast<const bf16*>(a.data_ptr());
  const auto* B = static_cast<const bf16*>(b.data_ptr());
  kernels::gemm_bf16(A, false, B, true, static_cast<float*>(c1.data_ptr()), M, N, K, 1.0f, 0.0f, e1, nullptr);
  kernels::gemm_bf16_auto(A, false, B, true, static_cast<float*>(c2.data_ptr()), M, N, K, 1.0f, 0.0f, e2,
                          nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(c1.to(Device::cpu()).to_float_vector(), c2.to(Device::cpu()).to_float_vector());
  EXPECT_EQ(p1.to(Device::cpu()).to_float_vector(), p2.to(Device::cpu()).to_float_vector());
}

// A bias alone (what gemm_bias runs on 16-bit operands): the automatic choice adds it in cuBLASLt's
// epilogue, or in ours where cuBLASLt has no algorithm, and either rounds c once. Row 0's bias
// cancels its product, so a product rounded to bf16 before the bias (the double rounding the first
// GPU run found in gemm_bias, 2026-11-28) misses by about an ulp of the product, hundreds of ulp of
// the result. Prints which implementation ran ("[op-path]").
TEST(GemmDispatch, BiasAloneRoundsOnceWhereverItRuns) {
  REQUIRE_GPU();
  const int64_t M = 64, N = 96, K = 256;
  const Device dev = Device::cuda(0);
  const Tensor a16 = Tensor::from_vector(rand_vec(M * K, 41), {M, K}).to(DType::BF16);
  const Tensor b16 = Tensor::from_vector(rand_vec(N * K, 42), {N, K}).to(DType::BF16);
  const std::vector<float> A = a16.to_float_vector(), B = b16.to_float_vector();
  std::vector<double> prod(static_cast<std::size_t>(M * N));
  for (int64_t i = 0; i < M; i++)
    for (int64_t j = 0; j < N; j++) {
      double s = 0.0;
      for (int64_t kk = 0; kk < K; kk++) s += static_cast<double>(A[i * K + kk]) * B[j * K + kk];
      prod[i * N + j] = s;
    }
  std::vector<float> bias_v(static_cast<std::size_t>(N));
  const std::vector<float> jitter = rand_vec(N, 43);
  for (int64_t j = 0; j < N; j++) bias_v[j] = static_cast<float>(-prod[j]) + 1e-3f * jitter[j];
  const Tensor a = a16.to(dev), b = b16.to(dev), bias = Tensor::from_vector(bias_v, {N}).to(dev);
  kernels::GemmEpilogue e;
  e.bias = static_cast<const float*>(bias.data_ptr());
  auto run = [&](int which) {
    Tensor c = Tensor::full({M, N}, NAN, DType::BF16, dev);
    bool lt = true;
    if (which == 0)
      kernels::gemm_mma(DType::BF16, a.data_ptr(), false, b.data_ptr(), true, c.data_ptr(), DType::BF16, M, N,
                        K, 1.0f, 0.0f, e, nullptr);
    else if (which == 1)
      lt = cuda::gemm_cublaslt_16_bias(DType::BF16, a.data_ptr(), false, b.data_ptr(), true, c.data_ptr(),
                                       DType::BF16, M, N, K, 1.0f, 0.0f, e.bias, DType::F32, nullptr);
    else
      kernels::gemm_16_auto(DType::BF16, a.data_ptr(), false, b.data_ptr(), true, c.data_ptr(), DType::BF16,
                            M, N, K, 1.0f, 0.0f, e, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    return std::make_pair(lt, c.to(Device::cpu()).to_float_vector());
  };
  // c against the product plus `bias_values` (what the bias holds in its dtype): one rounding to
  // bf16 (half an ulp, 2^-9 relative) plus fp32 accumulation over K terms.
  auto expect_rounded_once = [&](const std::vector<float>& got, const std::vector<float>& bias_values) {
    for (int64_t i = 0; i < M * N; i++) {
      const double want = prod[i] + bias_values[i % N];
      ASSERT_NEAR(got[i], want, std::ldexp(std::fabs(want), -8) + 2e-5)
          << "c[" << i / N << ", " << i % N << "]";
    }
  };
  auto print_path = [](const char* bias_kind, bool in_cublaslt) {
    std::printf("[op-path] gemm bf16 -> bf16 with %s bias: %s\n", bias_kind,
                in_cublaslt ? "cuBLASLt's bias epilogue" : "ours (cuBLASLt has no algorithm for it)");
  };
  const auto [lt_has_algo, lt_result] = run(1);
  print_path("an fp32", lt_has_algo);
  for (int which : {0, 1, 2}) {
    if (which == 1 && !lt_has_algo) continue;
    SCOPED_TRACE(which == 0 ? "ours" : which == 1 ? "cuBLASLt" : "auto");
    expect_rounded_once(which == 1 ? lt_result : run(which).second, bias_v);
  }
  // A bf16 bias (the mixed-precision model's; ops::gemm_bias hands it to cuBLASLt as it is): the
  // same bound against the product plus the bias's bf16 values.
  const Tensor bias16 = bias.to(DType::BF16);
  const std::vector<float> b16v = bias16.to(Device::cpu()).to_float_vector();
  Tensor c = Tensor::full({M, N}, NAN, DType::BF16, dev);
  const bool lt16 =
      cuda::gemm_cublaslt_16_bias(DType::BF16, a.data_ptr(), false, b.data_ptr(), true, c.data_ptr(),
                                  DType::BF16, M, N, K, 1.0f, 0.0f, bias16.data_ptr(), DType::BF16, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  print_path("a bf16", lt16);
  if (lt16) {
    SCOPED_TRACE("cuBLASLt, bf16 bias");
    expect_rounded_once(c.to(Device::cpu()).to_float_vector(), b16v);
  }
}

// k == 0: only the beta term (cuBLASLt would reject it; the dispatch runs ours).
TEST(GemmDispatch, EmptyK) {
  REQUIRE_GPU();
  const int64_t M = 5, N = 7;
  const Device dev = Device::cuda(0);
  const std::vector<float> C0 = rand_vec(M * N, 31);
  Tensor c = Tensor::from_vector(C0, {M, N}).to(dev);
  const Tensor a = Tensor::empty({M, 1}, DType::BF16, dev), b = Tensor::empty({1, N}, DType::BF16, dev);
  kernels::gemm_bf16_auto(static_cast<const bf16*>(a.data_ptr()), false,
                          static_cast<const bf16*>(b.data_ptr()), false, static_cast<float*>(c.data_ptr()), M,
                          N, 0, 1.0f, 0.5f, {}, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got = c.to(Device::cpu()).to_float_vector();
  for (int64_t i = 0; i < M * N; i++) EXPECT_EQ(got[i], 0.5f * C0[i]) << i;
}

}  // namespace
}  // namespace parallel
