// Every parallel::ops kernel on the GPU against the CPU implementation, on the same random inputs,
// with odd sizes (nothing a multiple of a tile or a warp). Parameter gradients start non-zero so
// that accumulation (+=) is tested, not just the value. Every test skips without a GPU.
//
// Tolerances (max |gpu - cpu| / max |cpu|, tests/common/compare.hpp):
//   1e-5  element-wise, norms, rope, cross-entropy, bias: fp32 with a different summation order
//         or exp implementation (expf vs the CPU's polynomial), a few ulp;
//   1e-5  gemm: cuBLASLt with CUBLAS_COMPUTE_32F (TF32 disabled) vs oneDNN fp32;
//   1e-4  gemm on bf16 / fp16 tensors with an fp32 c, vs the CPU on the same 16-bit operands: the
//         products are exact in fp32 on both sides, only the summation order (and the tensor cores'
//         accumulation) differs, ~K ulp of the partial sums at worst;
//   0     round_to_precision_ (bit-identical to the CPU kernel, NaN payloads included).
//   16-bit outputs: 0 (bit for bit) where the fp32 arithmetic is the CPU's (add, scale, bias,
//         dropout, embedding), else one 16-bit ulp of the largest value (tol16: 1e-2 bf16, 2e-3 fp16);
//         fp32 statistics and parameter gradients from 16-bit inputs keep the fp32 tolerances.
//   1e-4  attention: tiled online softmax in a different tile order than the CPU's;
//   2e-2 / 3e-2  attention with bf16 operands (16-bit tensor-core kernels; forward / gradients);
//   0     dropout (masks and values bit-identical) and embedding backward (same summation order).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../../kernels/cuda/cuda_ops.hpp"
#include "../../kernels/cuda/kernels.hpp"
#include "compare.hpp"
#include "gpu.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

namespace parallel {
namespace {

using testing::rel_err;

Tensor rand_cpu(const Shape& shape, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(gen);
  return Tensor::from_vector(v, shape);
}
Tensor gpu(const Tensor& t) { return t.to(Device::cuda(0)); }
Tensor host(const Tensor& t) { return t.to(Device::cpu()); }
// Error of a GPU result against the CPU one.
double err(const Tensor& g, const Tensor& c) { return rel_err(host(g), c); }

bool bits_equal(const Tensor& a, const Tensor& b) {
  const Tensor x = host(a), y = host(b);
  return x.nbytes() == y.nbytes() && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

// ---- dense algebra ----------------------------------------------------------------------------

TEST(CudaOps, GemmAllTranspositionsAndBetaAccumulate) {
  REQUIRE_GPU();
  const int64_t M = 67, N = 45, K = 83;
  for (int ta = 0; ta < 2; ta++) {
    for (int tb = 0; tb < 2; tb++) {
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        const Tensor a = rand_cpu(ta ? Shape{K, M} : Shape{M, K}, 1 + ta);
        const Tensor b = rand_cpu(tb ? Shape{N, K} : Shape{K, N}, 3 + tb);
        Tensor c_cpu = rand_cpu({M, N}, 5);
        Tensor c_gpu = gpu(c_cpu);
        ops::gemm(a, ta, b, tb, c_cpu, 0.75f, beta);
        ops::gemm(gpu(a), ta, gpu(b), tb, c_gpu, 0.75f, beta);
        EXPECT_LT(err(c_gpu, c_cpu), 1e-5) << "trans_a " << ta << " trans_b " << tb << " beta " << beta;
      }
    }
  }
}

TEST(CudaOps, GemmEmptyK) {
  REQUIRE_GPU();
  const Tensor a = Tensor::empty({5, 0}, DType::F32), b = Tensor::empty({0, 7}, DType::F32);
  Tensor c_cpu = rand_cpu({5, 7}, 9);
  Tensor c_gpu = gpu(c_cpu);
  ops::gemm(a, false, b, false, c_cpu, 1.0f, 0.5f);
  ops::gemm(gpu(a), false, gpu(b), false, c_gpu, 1.0f, 0.5f);
  EXPECT_LT(err(c_gpu, c_cpu), 1e-6);
}

// ---- real 16-bit tensors (ops.hpp, "Precision") -----------------------------------------------
// Every op on bf16 / fp16 tensors against the CPU op on the same 16-bit inputs. Both compute in fp32
// and round 16-bit outputs to nearest even with the same narrowing, so where the fp32 arithmetic is
// the same (add, scale, bias, dropout, embedding, copies) the outputs are compared bit for bit;
// elsewhere (different summation order, expf vs the CPU's polynomial, tensor-core accumulation) an
// fp32 difference of a few ulp can move a value to the neighbouring 16-bit value: tol16 allows one
// 16-bit ulp relative to the largest value (bf16 2^-7, fp16 2^-10, with margin).
constexpr DType kHalfTypes[] = {DType::BF16, DType::F16};
double tol16(DType t) { return t == DType::BF16 ? 1e-2 : 2e-3; }
// Random values rounded to `t` on the host (the CPU's float_to_bf16 / float_to_f16).
Tensor rand16(const Shape& shape, uint32_t seed, DType t, float lo = -1.0f, float hi = 1.0f) {
  return rand_cpu(shape, seed, lo, hi).to(t);
}
Tensor empty_like_cpu(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype()); }

// ops::gemm on 16-bit a, b: c fp32 (accumulated: weight gradients) or of a's dtype, every
// transposition, alpha and beta; against the CPU (oneDNN's bf16 matmul or the widening fallback,
// fp32 accumulation on both sides).
TEST(CudaOps, GemmOn16BitTensorsMatchesCpu) {
  REQUIRE_GPU();
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
    float alpha, beta;
  };
  const Case cases[] = {
      {203, 96, 136, false, true, 1.0f, 0.0f},   // forward y = x W^T
      {203, 136, 96, false, false, 1.0f, 0.0f},  // input gradient dx = dy W
      {96, 136, 203, true, false, 1.0f, 1.0f},   // weight gradient dW += dy^T x
      {77, 65, 300, true, true, -0.5f, 0.25f},
  };
  for (const DType t : kHalfTypes) {
    for (const DType ct : {DType::F32, t}) {
      for (const Case& cs : cases) {
        SCOPED_TRACE(::testing::Message()
                     << dtype_name(t) << " c " << dtype_name(ct) << " m " << cs.m << " n " << cs.n << " k "
                     << cs.k << " trans_a " << cs.ta << " trans_b " << cs.tb << " beta " << cs.beta);
        const Tensor a = rand16(cs.ta ? Shape{cs.k, cs.m} : Shape{cs.m, cs.k}, 151, t);
        const Tensor b = rand16(cs.tb ? Shape{cs.n, cs.k} : Shape{cs.k, cs.n}, 152, t);
        Tensor c_cpu = rand_cpu({cs.m, cs.n}, 153).to(ct);
        Tensor c_gpu = gpu(c_cpu);
        ops::gemm(a, cs.ta, b, cs.tb, c_cpu, cs.alpha, cs.beta);
        ops::gemm(gpu(a), cs.ta, gpu(b), cs.tb, c_gpu, cs.alpha, cs.beta);
        ASSERT_EQ(c_gpu.dtype(), ct);
        // fp32 c: the products are exact in fp32, only the summation order differs.
        EXPECT_LT(err(c_gpu, c_cpu), ct == DType::F32 ? 1e-4 : tol16(t));
      }
    }
  }
}

// Both candidates of the automatic choice (our mma kernel and cuBLASLt) write a 16-bit c, and agree
// with their own fp32 output rounded to 16 bits (to within one 16-bit ulp: the fp32 sums differ in
// order between the two, not within one).
TEST(CudaOps, Gemm16BitOutputOursAndCublasLt) {
  REQUIRE_GPU();
  const int64_t m = 150, n = 72, k = 260;
  for (const DType t : kHalfTypes) {
    for (const float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " beta " << beta);
      const Tensor a = gpu(rand16({m, k}, 171, t)), b = gpu(rand16({n, k}, 172, t));
      const Tensor c0 = rand_cpu({m, n}, 173).to(t);
      Tensor ours = gpu(c0), lt = gpu(c0), ref32 = gpu(c0.to(DType::F32));
      kernels::gemm_mma(t, a.data_ptr(), false, b.data_ptr(), true, ours.data_ptr(), t, m, n, k, 1.0f, beta,
                        {}, nullptr);
      cuda::gemm_cublaslt_16(t, a.data_ptr(), false, b.data_ptr(), true, lt.data_ptr(), t, m, n, k, 1.0f,
                             beta, nullptr);
      kernels::gemm_mma(t, a.data_ptr(), false, b.data_ptr(), true, ref32.data_ptr(), DType::F32, m, n, k,
                        1.0f, beta, {}, nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const Tensor ref = host(ref32);
      EXPECT_LT(err(ours, ref), tol16(t));
      EXPECT_LT(err(lt, ref), tol16(t));
      // Ours rounds its own fp32 result: bit for bit the fp32 output's narrowing.
      EXPECT_TRUE(bits_equal(ours, ref.to(t)));
    }
  }
}

TEST(CudaOps, GemmEmptyKOn16BitTensors) {
  REQUIRE_GPU();
  for (const DType t : kHalfTypes) {
    const Tensor a = Tensor::empty({5, 0}, t), b = Tensor::empty({0, 7}, t);
    Tensor c_cpu = rand16({5, 7}, 154, t);
    Tensor c_gpu = gpu(c_cpu);
    ops::gemm(a, false, b, false, c_cpu, 1.0f, 0.5f);
    ops::gemm(gpu(a), false, gpu(b), false, c_gpu, 1.0f, 0.5f);
    EXPECT_TRUE(bits_equal(c_gpu, c_cpu)) << dtype_name(t);  // 0.5 c: exact
  }
}

TEST(CudaOps, ElementwiseOn16BitTensorsBitIdenticalToCpu) {
  REQUIRE_GPU();
  for (const DType t : kHalfTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Shape sh{3, 5, 77};
    const Tensor a = rand16(sh, 301, t, -3.0f, 3.0f), b = rand16(sh, 302, t, -3.0f, 3.0f);
    Tensor out_c = empty_like_cpu(a), out_g = gpu(out_c);
    ops::add(a, b, out_c);
    ops::add(gpu(a), gpu(b), out_g);
    EXPECT_TRUE(bits_equal(out_g, out_c)) << "add";
    Tensor x_c = a.clone(), x_g = gpu(a);
    ops::add_(x_c, b);
    ops::add_(x_g, gpu(b));
    EXPECT_TRUE(bits_equal(x_g, x_c)) << "add_";
    ops::scale_(x_c, -1.7f);
    ops::scale_(x_g, -1.7f);
    EXPECT_TRUE(bits_equal(x_g, x_c)) << "scale_";
    // The bias as fp32 (a master copy) and as the activations' dtype (the model's 16-bit copy).
    for (const DType bt : {DType::F32, t}) {
      const Tensor bias = rand_cpu({77}, 303).to(bt);
      Tensor y_c = a.clone(), y_g = gpu(a);
      ops::add_bias(y_c, bias);
      ops::add_bias(y_g, gpu(bias));
      EXPECT_TRUE(bits_equal(y_g, y_c)) << "add_bias, bias " << dtype_name(bt);
    }
    for (float p : {0.0f, 0.3f, 1.0f}) {
      Tensor d_c = empty_like_cpu(a), d_g = gpu(d_c);
      ops::dropout_forward(a, d_c, p, 99, 12345);
      ops::dropout_forward(gpu(a), d_g, p, 99, 12345);
      EXPECT_TRUE(bits_equal(d_g, d_c)) << "dropout_forward p " << p;
      ops::dropout_backward(b, d_c, p, 99, 12345);
      ops::dropout_backward(gpu(b), d_g, p, 99, 12345);
      EXPECT_TRUE(bits_equal(d_g, d_c)) << "dropout_backward p " << p;
    }
  }
}

TEST(CudaOps, ActivationsOn16BitTensors) {
  REQUIRE_GPU();
  for (const DType t : kHalfTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor x = rand16({7, 3, 101}, 311, t, -6.0f, 6.0f), dy = rand16({7, 3, 101}, 312, t);
    Tensor y_c = empty_like_cpu(x), dx_c = empty_like_cpu(x);
    Tensor y_g = gpu(y_c), dx_g = gpu(dx_c);
    ops::gelu_forward(x, y_c);
    ops::gelu_forward(gpu(x), y_g);
    ops::gelu_backward(dy, x, dx_c);
    ops::gelu_backward(gpu(dy), gpu(x), dx_g);
    EXPECT_EQ(y_g.dtype(), t);
    EXPECT_LT(err(y_g, y_c), tol16(t));
    EXPECT_LT(err(dx_g, dx_c), tol16(t));

    const int64_t f = 45;
    const Tensor xs = rand16({5, 3, 2 * f}, 313, t, -4.0f, 4.0f), dys = rand16({5, 3, f}, 314, t);
    Tensor ys_c = empty_like_cpu(dys), dxs_c = empty_like_cpu(xs);
    Tensor ys_g = gpu(ys_c), dxs_g = gpu(dxs_c);
    ops::swiglu_forward(xs, ys_c);
    ops::swiglu_forward(gpu(xs), ys_g);
    ops::swiglu_backward(dys, xs, dxs_c);
    ops::swiglu_backward(gpu(dys), gpu(xs), dxs_g);
    EXPECT_LT(err(ys_g, ys_c), tol16(t));
    EXPECT_LT(err(dxs_g, dxs_c), tol16(t));
  }
}

TEST(CudaOps, BiasBackwardOn16BitGradientsAccumulatesFp32) {
  REQUIRE_GPU();
  for (const DType t : kHalfTypes) {
    const Tensor dy = rand16({1000, 131}, 321, t);
    Tensor db_c = rand_cpu({131}, 322), db_g = gpu(db_c);
    ops::bias_backward(dy, db_c);
    ops::bias_backward(gpu(dy), db_g);
    EXPECT_EQ(db_g.dtype(), DType::F32);
    EXPECT_LT(err(db_g, db_c), 1e-5) << dtype_name(t);  // exact inputs, fp32 sums in another order
  }
}

TEST(CudaOps, NormsOn16BitTensors) {
  REQUIRE_GPU();
  const int64_t rows = 300, h = 193;
  for (const DType t : kHalfTypes) {
    // Weight and bias: fp32, the activations' dtype, and one of each (each is fp32 or 16-bit).
    const std::pair<DType, DType> params[] = {{DType::F32, DType::F32}, {t, t}, {t, DType::F32}};
    for (const auto& [wt, bt] : params) {
      SCOPED_TRACE(::testing::Message()
                   << dtype_name(t) << " weight " << dtype_name(wt) << " bias " << dtype_name(bt));
      const Tensor x = rand16({rows, h}, 331, t, -2.0f, 3.0f), dy = rand16({rows, h}, 332, t);
      const Tensor w = rand_cpu({h}, 333).to(wt), bias = rand_cpu({h}, 334).to(bt);
      Tensor y_c = empty_like_cpu(x), mean_c = Tensor::empty({rows}, DType::F32),
             rstd_c = Tensor::empty({rows}, DType::F32);
      Tensor y_g = gpu(y_c), mean_g = gpu(mean_c), rstd_g = gpu(rstd_c);
      ops::layernorm_forward(x, w, bias, y_c, mean_c, rstd_c, 1e-5f);
      ops::layernorm_forward(gpu(x), gpu(w), gpu(bias), y_g, mean_g, rstd_g, 1e-5f);
      EXPECT_LT(err(y_g, y_c), tol16(t));
      EXPECT_LT(err(mean_g, mean_c), 1e-5);
      EXPECT_LT(err(rstd_g, rstd_c), 1e-5);
      Tensor dx_c = empty_like_cpu(x), dw_c = rand_cpu({h}, 335), db_c = rand_cpu({h}, 336);
      Tensor dx_g = gpu(dx_c), dw_g = gpu(dw_c), db_g = gpu(db_c);
      ops::layernorm_backward(dy, x, w, mean_c, rstd_c, dx_c, dw_c, db_c);
      ops::layernorm_backward(gpu(dy), gpu(x), gpu(w), mean_g, rstd_g, dx_g, dw_g, db_g);
      EXPECT_LT(err(dx_g, dx_c), tol16(t));
      EXPECT_LT(err(dw_g, dw_c), 1e-4);
      EXPECT_LT(err(db_g, db_c), 1e-5);

      Tensor ry_c = empty_like_cpu(x), rr_c = Tensor::empty({rows}, DType::F32);
      Tensor ry_g = gpu(ry_c), rr_g = gpu(rr_c);
      ops::rmsnorm_forward(x, w, ry_c, rr_c, 1e-6f);
      ops::rmsnorm_forward(gpu(x), gpu(w), ry_g, rr_g, 1e-6f);
      EXPECT_LT(err(ry_g, ry_c), tol16(t));
      EXPECT_LT(err(rr_g, rr_c), 1e-5);
      Tensor rdx_c = empty_like_cpu(x), rdw_c = rand_cpu({h}, 337);
      Tensor rdx_g = gpu(rdx_c), rdw_g = gpu(rdw_c);
      ops::rmsnorm_backward(dy, x, w, rr_c, rdx_c, rdw_c);
      ops::rmsnorm_backward(gpu(dy), gpu(x), gpu(w), rr_g, rdx_g, rdw_g);
      EXPECT_LT(err(rdx_g, rdx_c), tol16(t));
      EXPECT_LT(err(rdw_g, rdw_c), 1e-4);
    }
  }
}

TEST(CudaOps, RopeOn16BitTensors) {
  REQUIRE_GPU();
  for (const DType t : kHalfTypes) {
    const Tensor x = rand16({13, 3, 5, 24}, 341, t);
    Tensor c = x.clone(), g = gpu(x);
    ops::rope_forward(c, 1000, 10000.0f);
    ops::rope_forward(g, 1000, 10000.0f);
    EXPECT_LT(err(g, c), tol16(t)) << dtype_name(t);
    ops::rope_backward(c, 1000, 10000.0f);
    ops::rope_backward(g, 1000, 10000.0f);
    EXPECT_LT(err(g, c), tol16(t)) << dtype_name(t);
  }
}

TEST(CudaOps, EmbeddingOn16BitTensorsBitIdenticalToCpu) {
  REQUIRE_GPU();
  const int64_t b = 3, s = 37, rows = 50, h = 67, vocab_start = 40;
  std::mt19937 gen(351);
  std::uniform_int_distribution<int32_t> id(0, 120);
  std::vector<int32_t> ids(b * s);
  for (auto& x : ids) x = id(gen);
  ids[0] = ids[1] = ids[2] = 45;
  const Tensor tokens = Tensor::from_vector(ids, {b, s});
  for (const DType t : kHalfTypes) {
    // The table as the model's 16-bit copy (a copy of bits) and as fp32 (rounded into the output).
    for (const DType wt : {t, DType::F32}) {
      SCOPED_TRACE(::testing::Message() << dtype_name(t) << " weight " << dtype_name(wt));
      const Tensor w = rand_cpu({rows, h}, 352).to(wt);
      Tensor out_c = Tensor::empty({s, b, h}, t), out_g = gpu(out_c);
      ops::embedding_forward(tokens, w, vocab_start, out_c);
      ops::embedding_forward(gpu(tokens), gpu(w), vocab_start, out_g);
      EXPECT_TRUE(bits_equal(out_g, out_c));
    }
    const Tensor dout = rand16({s, b, h}, 353, t);
    Tensor dw_c = rand_cpu({rows, h}, 354), dw_g = gpu(dw_c);
    ops::embedding_backward(tokens, dout, vocab_start, dw_c);
    ops::embedding_backward(gpu(tokens), gpu(dout), vocab_start, dw_g);
    EXPECT_TRUE(bits_equal(dw_g, dw_c)) << dtype_name(t) << " error " << err(dw_g, dw_c);
  }
}

TEST(CudaOps, CrossEntropyOn16BitLogits) {
  REQUIRE_GPU();
  const int64_t n = 29, v = 1000, vocab_start = 500, vocab_size = 1400;
  std::vector<int32_t> tv(n);
  for (int64_t i = 0; i < n; i++) tv[i] = static_cast<int32_t>((i * 97) % 1400);
  const Tensor targets = Tensor::from_vector(tv, {n});
  const Tensor gs = rand_cpu({n}, 362, 0.1f, 1.0f);
  for (const DType t : kHalfTypes) {
    SCOPED_TRACE(dtype_name(t));
    const Tensor logits = rand16({n, v}, 361, t, -8.0f, 8.0f);
    Tensor mx_c = Tensor::empty({n}, DType::F32), tl_c = Tensor::empty({n}, DType::F32),
           se_c = Tensor::empty({n}, DType::F32), dl_c = Tensor::empty({n, v}, t);
    Tensor mx_g = gpu(mx_c), tl_g = gpu(tl_c), se_g = gpu(se_c), dl_g = gpu(dl_c);
    ops::cross_entropy_local_stats(logits, targets, vocab_start, vocab_size, mx_c, tl_c);
    ops::cross_entropy_local_stats(gpu(logits), gpu(targets), vocab_start, vocab_size, mx_g, tl_g);
    EXPECT_TRUE(bits_equal(mx_g, mx_c));
    EXPECT_TRUE(bits_equal(tl_g, tl_c));
    ops::cross_entropy_sum_exp(logits, mx_c, vocab_start, vocab_size, se_c);
    ops::cross_entropy_sum_exp(gpu(logits), mx_g, vocab_start, vocab_size, se_g);
    EXPECT_LT(err(se_g, se_c), 1e-5);
    ops::cross_entropy_backward(logits, targets, mx_c, se_c, gs, vocab_start, vocab_size, dl_c);
    ops::cross_entropy_backward(gpu(logits), gpu(targets), mx_g, se_g, gpu(gs), vocab_start, vocab_size,
                                dl_g);
    EXPECT_EQ(dl_g.dtype(), t);
    EXPECT_LT(err(dl_g, dl_c), tol16(t));
  }
}

TEST(CudaOps, SumOfSquaresOn16BitTensors) {
  REQUIRE_GPU();
  for (const DType t : kHalfTypes) {
    const Tensor x = rand16({100003}, 371, t);
    const double c = ops::sum_of_squares(x), g = ops::sum_of_squares(gpu(x));
    EXPECT_NEAR(g, c, 1e-12 * c) << dtype_name(t);
  }
}

TEST(CudaOps, BiasForwardAndBackwardAccumulates) {
  REQUIRE_GPU();
  for (int64_t rows : {37, 1000}) {  // 1000 rows: several row chunks in the partial sums
    const int64_t h = 131;
    Tensor y_cpu = rand_cpu({rows, h}, 11);
    const Tensor bias = rand_cpu({h}, 12);
    Tensor y_gpu = gpu(y_cpu);
    ops::add_bias(y_cpu, bias);
    ops::add_bias(y_gpu, gpu(bias));
    EXPECT_LT(err(y_gpu, y_cpu), 1e-6);

    Tensor db_cpu = rand_cpu({h}, 13);  // non-zero: the op accumulates
    Tensor db_gpu = gpu(db_cpu);
    ops::bias_backward(y_cpu, db_cpu);
    ops::bias_backward(y_gpu, db_gpu);
    EXPECT_LT(err(db_gpu, db_cpu), 1e-5) << "rows " << rows;
  }
}

// ---- element-wise -----------------------------------------------------------------------------

TEST(CudaOps, AddScale) {
  REQUIRE_GPU();
  const Tensor a = rand_cpu({3, 5, 77}, 21), b = rand_cpu({3, 5, 77}, 22);
  Tensor out_cpu = Tensor::empty(a.shape(), DType::F32);
  Tensor out_gpu = Tensor::empty(a.shape(), DType::F32, Device::cuda(0));
  ops::add(a, b, out_cpu);
  ops::add(gpu(a), gpu(b), out_gpu);
  EXPECT_LT(err(out_gpu, out_cpu), 1e-7);

  Tensor x_cpu = a.clone(), x_gpu = gpu(a);
  ops::add_(x_cpu, b);
  ops::add_(x_gpu, gpu(b));
  ops::scale_(x_cpu, -1.7f);
  ops::scale_(x_gpu, -1.7f);
  EXPECT_LT(err(x_gpu, x_cpu), 1e-7);
}

// ---- round_to_precision_ ----
// fp32 bit patterns that reach every branch of both roundings, each also with the sign flipped.
std::vector<float> rounding_special_values() {
  const uint32_t bits[] = {
      0x00000000u, 0x7f800000u,                            // 0, inf
      0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fffffffu,  // quiet NaN, signalling NaNs, NaN payloads
      0x7f812345u, 0x7fc0ffffu,                            // payload bits below 16 (bf16 keeps only the top)
      0x00000001u, 0x007fffffu, 0x00800000u,               // fp32 subnormals, smallest fp32 normal
      0x3f808000u, 0x3f818000u,                            // bf16 ties: 1 + 2^-8 (to even: down), odd: up
      0x3f807fffu, 0x3f808001u,                            // just below / above a bf16 tie
      0x7f7f8000u, 0x7f7fffffu, 0x7f7effffu,               // bf16 ties and rounding at the top: -> inf
      0x3f801000u, 0x3f803000u,                            // fp16 ties: 1 + 2^-11 (down), 1 + 3 2^-11 (up)
      0x3f800fffu, 0x3f801001u,                            // around an fp16 tie
      0x477fe000u,                                         // 65504, the largest fp16
      0x477fefffu, 0x477ff000u, 0x477ff001u, 0x47800000u,  // just below 65520 (-> 65504), 65520 (-> inf)
      0x38800000u, 0x387fffffu, 0x387fc000u,               // 2^-14 (smallest fp16 normal) and below
      0x33800000u, 0x33000000u, 0x33000001u, 0x32ffffffu,  // 2^-24 (smallest fp16 subnormal), 2^-25 tie
      0x33c00000u, 0x34200000u,  // 1.5 2^-24 (tie -> 2^-23), 2.5 2^-24 (tie -> 2 2^-24)
      0x3dcccccdu, 0x3eaaaaabu, 0x40490fdbu, 0x4b000001u,  // 0.1, 1/3, pi, 2^23 + 1
  };
  std::vector<float> v;
  for (uint32_t u : bits) {
    v.push_back(std::bit_cast<float>(u));
    v.push_back(std::bit_cast<float>(u | 0x80000000u));
  }
  return v;
}

// Random bit patterns (every exponent, NaNs and subnormals included) and random values around the
// fp16 range's ends.
std::vector<float> rounding_random_values(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exp(-30, 17);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; i++)
    v[i] = i % 2 == 0 ? std::bit_cast<float>(static_cast<uint32_t>(gen())) : std::ldexp(mant(gen), exp(gen));
  return v;
}

bool is_quiet_nan(float x) {
  const uint32_t u = std::bit_cast<uint32_t>(x);
  return (u & 0x7fffffffu) > 0x7f800000u && (u & 0x00400000u) != 0;
}

void check_rounding(const std::vector<float>& values, DType precision, int64_t offset) {
  SCOPED_TRACE(::testing::Message() << dtype_name(precision) << " offset " << offset);
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor all_cpu = Tensor::from_vector(values, {n});
  Tensor all_gpu = gpu(all_cpu);
  // A view starting `offset` elements in: offset 1 is not 16-byte aligned (the one-element path).
  Tensor x_cpu = all_cpu.narrow(0, offset, n - offset), x_gpu = all_gpu.narrow(0, offset, n - offset);
  ops::round_to_precision_(x_cpu, precision);
  cuda::round_to_precision_(x_gpu, precision, {});
  const std::vector<float> got = host(all_gpu).to_float_vector(), want = all_cpu.to_float_vector();
  for (int64_t i = 0; i < n; i++) {
    const uint32_t g = std::bit_cast<uint32_t>(got[i]), w = std::bit_cast<uint32_t>(want[i]);
    ASSERT_EQ(g, w) << "element " << i << ": input bits 0x" << std::hex << std::bit_cast<uint32_t>(values[i]);
    // Independently of the CPU kernel: the scalar conversions' result, or a quiet NaN.
    if (i < offset) {
      ASSERT_EQ(g, std::bit_cast<uint32_t>(values[i])) << "element " << i << " before the view was written";
    } else if (std::isnan(values[i])) {
      ASSERT_TRUE(is_quiet_nan(got[i])) << "element " << i;
    } else {
      const float ref = precision == DType::BF16 ? bf16_to_float(float_to_bf16(values[i]))
                                                 : f16_to_float(float_to_f16(values[i]));
      ASSERT_EQ(g, std::bit_cast<uint32_t>(ref)) << "element " << i;
    }
  }
}

TEST(CudaOps, RoundToPrecisionBitIdenticalToCpu) {
  REQUIRE_GPU();
  const std::vector<float> special = rounding_special_values();
  const std::vector<float> random = rounding_random_values(100003, 161);  // odd: a tail after the packs
  for (const DType precision : {DType::BF16, DType::F16}) {
    check_rounding(special, precision, 0);
    check_rounding(random, precision, 0);
    check_rounding(random, precision, 1);
  }
  // F32: nothing changes, NaN payloads included.
  Tensor x = gpu(Tensor::from_vector(random, {static_cast<int64_t>(random.size())}));
  const Tensor before = host(x);
  cuda::round_to_precision_(x, DType::F32, {});
  EXPECT_TRUE(bits_equal(x, before));
}

TEST(CudaOps, GeluForwardBackward) {
  REQUIRE_GPU();
  const Tensor x = rand_cpu({7, 3, 101}, 31, -6.0f, 6.0f), dy = rand_cpu({7, 3, 101}, 32);
  Tensor y_cpu = Tensor::empty(x.shape(), DType::F32), dx_cpu = Tensor::empty(x.shape(), DType::F32);
  Tensor y_gpu = Tensor::empty(x.shape(), DType::F32, Device::cuda(0));
  Tensor dx_gpu = Tensor::empty(x.shape(), DType::F32, Device::cuda(0));
  ops::gelu_forward(x, y_cpu);
  ops::gelu_forward(gpu(x), y_gpu);
  ops::gelu_backward(dy, x, dx_cpu);
  ops::gelu_backward(gpu(dy), gpu(x), dx_gpu);
  EXPECT_LT(err(y_gpu, y_cpu), 1e-5);
  EXPECT_LT(err(dx_gpu, dx_cpu), 1e-5);
}

TEST(CudaOps, SwigluForwardBackward) {
  REQUIRE_GPU();
  const int64_t f = 45;
  const Tensor x = rand_cpu({5, 3, 2 * f}, 41, -4.0f, 4.0f), dy = rand_cpu({5, 3, f}, 42);
  Tensor y_cpu = Tensor::empty(dy.shape(), DType::F32), dx_cpu = Tensor::empty(x.shape(), DType::F32);
  Tensor y_gpu = Tensor::empty(dy.shape(), DType::F32, Device::cuda(0));
  Tensor dx_gpu = Tensor::empty(x.shape(), DType::F32, Device::cuda(0));
  ops::swiglu_forward(x, y_cpu);
  ops::swiglu_forward(gpu(x), y_gpu);
  ops::swiglu_backward(dy, x, dx_cpu);
  ops::swiglu_backward(gpu(dy), gpu(x), dx_gpu);
  EXPECT_LT(err(y_gpu, y_cpu), 1e-5);
  EXPECT_LT(err(dx_gpu, dx_cpu), 1e-5);
}

TEST(CudaOps, DropoutMaskBitIdenticalToCpu) {
  REQUIRE_GPU();
  const Tensor x = rand_cpu({13, 7, 97}, 51);
  for (float p : {0.0f, 0.1f, 0.5f, 1.0f}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{123456789}}) {
      Tensor y_cpu = Tensor::empty(x.shape(), DType::F32);
      Tensor y_gpu = Tensor::empty(x.shape(), DType::F32, Device::cuda(0));
      ops::dropout_forward(x, y_cpu, p, 1234, offset);
      ops::dropout_forward(gpu(x), y_gpu, p, 1234, offset);
      EXPECT_TRUE(bits_equal(y_gpu, y_cpu)) << "p " << p << " offset " << offset;
      Tensor dx_cpu = Tensor::empty(x.shape(), DType::F32);
      Tensor dx_gpu = Tensor::empty(x.shape(), DType::F32, Device::cuda(0));
      ops::dropout_backward(x, dx_cpu, p, 1234, offset);
      ops::dropout_backward(gpu(x), dx_gpu, p, 1234, offset);
      EXPECT_TRUE(bits_equal(dx_gpu, dx_cpu)) << "p " << p << " offset " << offset;
    }
  }
}

// ---- normalisation ----------------------------------------------------------------------------

TEST(CudaOps, LayerNormForwardBackwardAccumulates) {
  REQUIRE_GPU();
  const int64_t s = 100, b = 3, h = 193;  // 300 rows: 5 row chunks for the parameter gradients
  const Tensor x = rand_cpu({s, b, h}, 61, -2.0f, 3.0f), w = rand_cpu({h}, 62), bias = rand_cpu({h}, 63);
  const Tensor dy = rand_cpu({s, b, h}, 64);
  Tensor y_c = Tensor::empty(x.shape(), DType::F32), mean_c = Tensor::empty({s * b}, DType::F32),
         rstd_c = Tensor::empty({s * b}, DType::F32);
  Tensor y_g = gpu(y_c), mean_g = gpu(mean_c), rstd_g = gpu(rstd_c);
  ops::layernorm_forward(x, w, bias, y_c, mean_c, rstd_c, 1e-5f);
  ops::layernorm_forward(gpu(x), gpu(w), gpu(bias), y_g, mean_g, rstd_g, 1e-5f);
  EXPECT_LT(err(y_g, y_c), 1e-5);
  EXPECT_LT(err(mean_g, mean_c), 1e-5);
  EXPECT_LT(err(rstd_g, rstd_c), 1e-5);

  Tensor dx_c = Tensor::empty(x.shape(), DType::F32), dw_c = rand_cpu({h}, 65), db_c = rand_cpu({h}, 66);
  Tensor dx_g = gpu(dx_c), dw_g = gpu(dw_c), db_g = gpu(db_c);
  ops::layernorm_backward(dy, x, w, mean_c, rstd_c, dx_c, dw_c, db_c);
  ops::layernorm_backward(gpu(dy), gpu(x), gpu(w), mean_g, rstd_g, dx_g, dw_g, db_g);
  EXPECT_LT(err(dx_g, dx_c), 1e-5);
  EXPECT_LT(err(dw_g, dw_c), 1e-5);
  EXPECT_LT(err(db_g, db_c), 1e-5);

  // Deterministic: the same inputs give the same bits.
  Tensor dw2 = gpu(rand_cpu({h}, 65)), db2 = gpu(rand_cpu({h}, 66)), dx2 = gpu(dx_c);
  ops::layernorm_backward(gpu(dy), gpu(x), gpu(w), mean_g, rstd_g, dx2, dw2, db2);
  EXPECT_TRUE(bits_equal(dw2, dw_g));
  EXPECT_TRUE(bits_equal(db2, db_g));
}

TEST(CudaOps, RmsNormForwardBackwardAccumulates) {
  REQUIRE_GPU();
  const int64_t rows = 259, h = 77;
  const Tensor x = rand_cpu({rows, h}, 71, -2.0f, 2.0f), w = rand_cpu({h}, 72), dy = rand_cpu({rows, h}, 73);
  Tensor y_c = Tensor::empty(x.shape(), DType::F32), rstd_c = Tensor::empty({rows}, DType::F32);
  Tensor y_g = gpu(y_c), rstd_g = gpu(rstd_c);
  ops::rmsnorm_forward(x, w, y_c, rstd_c, 1e-6f);
  ops::rmsnorm_forward(gpu(x), gpu(w), y_g, rstd_g, 1e-6f);
  EXPECT_LT(err(y_g, y_c), 1e-5);
  EXPECT_LT(err(rstd_g, rstd_c), 1e-5);
  Tensor dx_c = Tensor::empty(x.shape(), DType::F32), dw_c = rand_cpu({h}, 74);
  Tensor dx_g = gpu(dx_c), dw_g = gpu(dw_c);
  ops::rmsnorm_backward(dy, x, w, rstd_c, dx_c, dw_c);
  ops::rmsnorm_backward(gpu(dy), gpu(x), gpu(w), rstd_g, dx_g, dw_g);
  EXPECT_LT(err(dx_g, dx_c), 1e-5);
  EXPECT_LT(err(dw_g, dw_c), 1e-5);
}

// ---- attention --------------------------------------------------------------------------------

TEST(CudaOps, RopeForwardBackward) {
  REQUIRE_GPU();
  const Tensor x = rand_cpu({13, 3, 5, 24}, 81);
  Tensor c = x.clone(), g = gpu(x);
  ops::rope_forward(c, 1000, 10000.0f);
  ops::rope_forward(g, 1000, 10000.0f);
  EXPECT_LT(err(g, c), 1e-5);
  ops::rope_backward(c, 1000, 10000.0f);
  ops::rope_backward(g, 1000, 10000.0f);
  EXPECT_LT(err(g, c), 1e-5);
  EXPECT_LT(err(g, x), 1e-5);  // the backward undoes the forward
}

void check_attention(int64_t s, int64_t b, int64_t hq, int64_t hkv, int64_t d, bool causal) {
  SCOPED_TRACE(::testing::Message() << "s " << s << " b " << b << " hq " << hq << " hkv " << hkv << " d " << d
                                    << " causal " << causal);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Tensor q = rand_cpu({s, b, hq, d}, 91, -2.0f, 2.0f), k = rand_cpu({s, b, hkv, d}, 92, -2.0f, 2.0f);
  const Tensor v = rand_cpu({s, b, hkv, d}, 93), dout = rand_cpu({s, b, hq, d}, 94);
  Tensor out_c = Tensor::empty(q.shape(), DType::F32), lse_c = Tensor::empty({b, hq, s}, DType::F32);
  Tensor out_g = gpu(out_c), lse_g = gpu(lse_c);
  ops::attention_forward(q, k, v, out_c, lse_c, causal, scale);
  ops::attention_forward(gpu(q), gpu(k), gpu(v), out_g, lse_g, causal, scale);
  EXPECT_LT(err(out_g, out_c), 1e-4);
  EXPECT_LT(err(lse_g, lse_c), 1e-4);

  Tensor dq_c = Tensor::empty(q.shape(), DType::F32), dk_c = Tensor::empty(k.shape(), DType::F32),
         dv_c = Tensor::empty(v.shape(), DType::F32);
  // Garbage in the GPU outputs: they must be written, not accumulated.
  Tensor dq_g = gpu(rand_cpu(q.shape(), 95)), dk_g = gpu(rand_cpu(k.shape(), 96)),
         dv_g = gpu(rand_cpu(v.shape(), 97));
  ops::attention_backward(dout, q, k, v, out_c, lse_c, dq_c, dk_c, dv_c, causal, scale);
  ops::attention_backward(gpu(dout), gpu(q), gpu(k), gpu(v), out_g, lse_g, dq_g, dk_g, dv_g, causal, scale);
  EXPECT_LT(err(dq_g, dq_c), 1e-4);
  EXPECT_LT(err(dk_g, dk_c), 1e-4);
  EXPECT_LT(err(dv_g, dv_c), 1e-4);
}

TEST(CudaOps, AttentionCausalGqaOddSizes) {
  REQUIRE_GPU();
  check_attention(77, 2, 4, 2, 40, true);
  check_attention(77, 2, 4, 2, 40, false);
  check_attention(5, 1, 3, 1, 8, true);  // fewer rows than one tile
}

TEST(CudaOps, AttentionHeadDim128) {
  REQUIRE_GPU();
  check_attention(130, 1, 2, 2, 128, true);
  check_attention(70, 2, 2, 1, 128, false);
}

// More (batch, head) pairs than one grid.y takes (65535): the tensor-core path declines, and the
// fp32 kernels must cover them in several launches (kernels/attention/attention_launch.hpp).
// b * hq = 66000 forward and dq (two launches), b * hkv = 33000 for dk / dv (one); tiny s and d.
TEST(CudaOps, AttentionPastTheGridYLimit) {
  REQUIRE_GPU();
  check_attention(3, 33000, 2, 1, 8, true);
}

// The model's mixed-precision path: real 16-bit tensors (ops.hpp, "Precision"). CUDA runs the
// tensor-core kernels on them directly (head dims 64 and 128); the CPU widens the same values and
// computes in fp32. Tolerances as the kernels' own tests (tests/cuda/test_flash_attention_mma.cpp):
// P and dS are rounded to 16 bits and the outputs are 16-bit. Other head dims (40 here) take the fp32
// kernel on widened copies: then only the final rounding differs from the CPU.
Tensor to_bf16(const Tensor& t) { return t.to(DType::BF16); }
void check_attention_16(DType t, int64_t d, bool causal) {
  SCOPED_TRACE(::testing::Message() << dtype_name(t) << " d " << d << " causal " << causal);
  const int64_t s = 97, b = 2, hq = 4, hkv = 2;
  const bool mma = d == 64 || d == 128;
  const double fwd_tol = mma ? 2e-2 : tol16(t), bwd_tol = mma ? 3e-2 : 2 * tol16(t);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const Tensor q = rand16({s, b, hq, d}, 191, t, -2.0f, 2.0f),
               k = rand16({s, b, hkv, d}, 192, t, -2.0f, 2.0f);
  const Tensor v = rand16({s, b, hkv, d}, 193, t), dout = rand16({s, b, hq, d}, 194, t);
  Tensor out_c = Tensor::empty(q.shape(), t), lse_c = Tensor::empty({b, hq, s}, DType::F32);
  Tensor out_g = gpu(out_c), lse_g = gpu(lse_c);
  ops::attention_forward(q, k, v, out_c, lse_c, causal, scale);
  ops::attention_forward(gpu(q), gpu(k), gpu(v), out_g, lse_g, causal, scale);
  EXPECT_EQ(out_g.dtype(), t);
  EXPECT_LT(err(out_g, out_c), fwd_tol);
  EXPECT_LT(err(lse_g, lse_c), 1e-3);
  Tensor dq_c = Tensor::empty(q.shape(), t), dk_c = Tensor::empty(k.shape(), t),
         dv_c = Tensor::empty(v.shape(), t);
  Tensor dq_g = gpu(dq_c), dk_g = gpu(dk_c), dv_g = gpu(dv_c);
  ops::attention_backward(dout, q, k, v, out_c, lse_c, dq_c, dk_c, dv_c, causal, scale);
  ops::attention_backward(gpu(dout), gpu(q), gpu(k), gpu(v), out_g, lse_g, dq_g, dk_g, dv_g, causal, scale);
  EXPECT_LT(err(dq_g, dq_c), bwd_tol);
  EXPECT_LT(err(dk_g, dk_c), bwd_tol);
  EXPECT_LT(err(dv_g, dv_c), bwd_tol);
}
TEST(CudaOps, AttentionOnBf16TensorsUsesTensorCoresWithinBf16Tolerance) {
  REQUIRE_GPU();
  for (int64_t d : {64, 128}) check_attention_16(DType::BF16, d, true);
}
TEST(CudaOps, AttentionOn16BitTensorsAllPaths) {
  REQUIRE_GPU();
  check_attention_16(DType::F16, 64, true);
  check_attention_16(DType::F16, 128, false);
  check_attention_16(DType::BF16, 64, false);
  check_attention_16(DType::BF16, 40, true);  // no tensor-core kernel: fp32 kernel on widened copies
  check_attention_16(DType::F16, 40, false);
}

TEST(CudaOps, GemmOnBf16TensorsMatchesCpu) {
  REQUIRE_GPU();
  const Tensor a = to_bf16(rand_cpu({67, 83}, 201)), b = to_bf16(rand_cpu({45, 83}, 202));
  Tensor c = rand_cpu({67, 45}, 203), cg = gpu(c);
  ops::gemm(a, false, b, true, c, 1.0f, 1.0f);
  ops::gemm(gpu(a), false, gpu(b), true, cg, 1.0f, 1.0f);
  EXPECT_LT(err(cg, c), 1e-4);
}

TEST(CudaOps, AdamWUpdateOpMatchesCpuBitwise) {
  REQUIRE_GPU();
  const int64_t n = 10007;
  Tensor p = rand_cpu({n}, 211), g = rand_cpu({n}, 212), m = rand_cpu({n}, 213, -0.1f, 0.1f);
  Tensor v = rand_cpu({n}, 214, 0.0f, 0.01f);
  Tensor pg = gpu(p), gg = gpu(g), mg = gpu(m), vg = gpu(v);
  const ops::AdamWStep h{.lr = 3e-4, .weight_decay = 0.1, .step = 3, .grad_scale = 0.5f};
  ops::adamw_update_(p, g, m, v, h);
  ops::adamw_update_(pg, gg, mg, vg, h);
  // Same float operations per element on both devices; sqrt and division are correctly rounded
  // in both (no fast-math), so only FMA contraction could differ: allow 1 ulp.
  EXPECT_LT(err(pg, p), 1e-6);
  EXPECT_LT(err(mg, m), 1e-6);
  EXPECT_LT(err(vg, v), 1e-6);
}

// ---- embedding and loss -----------------------------------------------------------------------

TEST(CudaOps, EmbeddingForwardBackwardVocabParallel) {
  REQUIRE_GPU();
  const int64_t b = 3, s = 37, rows = 50, h = 67, vocab_start = 40;
  std::mt19937 gen(101);
  std::uniform_int_distribution<int32_t> id(0, 120);  // many ids outside [40, 90), many repeats
  std::vector<int32_t> ids(b * s);
  for (auto& t : ids) t = id(gen);
  ids[0] = ids[1] = ids[2] = 45;
  const Tensor tokens = Tensor::from_vector(ids, {b, s});
  const Tensor w = rand_cpu({rows, h}, 102), dout = rand_cpu({s, b, h}, 103);
  Tensor out_c = Tensor::empty({s, b, h}, DType::F32), out_g = gpu(out_c);
  ops::embedding_forward(tokens, w, vocab_start, out_c);
  ops::embedding_forward(gpu(tokens), gpu(w), vocab_start, out_g);
  EXPECT_TRUE(bits_equal(out_g, out_c));
  Tensor dw_c = rand_cpu({rows, h}, 104), dw_g = gpu(dw_c);
  ops::embedding_backward(tokens, dout, vocab_start, dw_c);
  ops::embedding_backward(gpu(tokens), gpu(dout), vocab_start, dw_g);
  EXPECT_TRUE(bits_equal(dw_g, dw_c)) << "error " << err(dw_g, dw_c);  // same summation order
}

TEST(CudaOps, CrossEntropyPiecesWithPadding) {
  REQUIRE_GPU();
  const int64_t n = 29, v = 1000, vocab_start = 500, vocab_size = 1400;  // local columns 900.. are padding
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; i++) t[i] = static_cast<int32_t>((i * 97) % 1400);
  const Tensor targets = Tensor::from_vector(t, {n});
  const Tensor logits = rand_cpu({n, v}, 111, -8.0f, 8.0f), gs = rand_cpu({n}, 112, 0.1f, 1.0f);
  Tensor mx_c = Tensor::empty({n}, DType::F32), tl_c = Tensor::empty({n}, DType::F32),
         se_c = Tensor::empty({n}, DType::F32), dl_c = Tensor::empty({n, v}, DType::F32);
  Tensor mx_g = gpu(mx_c), tl_g = gpu(tl_c), se_g = gpu(se_c), dl_g = gpu(dl_c);
  ops::cross_entropy_local_stats(logits, targets, vocab_start, vocab_size, mx_c, tl_c);
  ops::cross_entropy_local_stats(gpu(logits), gpu(targets), vocab_start, vocab_size, mx_g, tl_g);
  EXPECT_TRUE(bits_equal(mx_g, mx_c));
  EXPECT_TRUE(bits_equal(tl_g, tl_c));
  ops::cross_entropy_sum_exp(logits, mx_c, vocab_start, vocab_size, se_c);
  ops::cross_entropy_sum_exp(gpu(logits), mx_g, vocab_start, vocab_size, se_g);
  EXPECT_LT(err(se_g, se_c), 1e-5);
  ops::cross_entropy_backward(logits, targets, mx_c, se_c, gs, vocab_start, vocab_size, dl_c);
  ops::cross_entropy_backward(gpu(logits), gpu(targets), mx_g, se_g, gpu(gs), vocab_start, vocab_size, dl_g);
  EXPECT_LT(err(dl_g, dl_c), 1e-5);

  // A rank holding only padding: row_max -inf, sum_exp 0, gradients 0.
  Tensor mx2 = Tensor::empty({n}, DType::F32, Device::cuda(0)), tl2 = gpu(tl_c), se2 = gpu(se_c);
  ops::cross_entropy_local_stats(gpu(logits), gpu(targets), 1400, vocab_size, mx2, tl2);
  ops::cross_entropy_sum_exp(gpu(logits), mx2, 1400, vocab_size, se2);
  for (float m : host(mx2).to_float_vector()) EXPECT_TRUE(std::isinf(m) && m < 0);
  for (float e : host(se2).to_float_vector()) EXPECT_EQ(e, 0.0f);
}

// ---- reductions and the optimizer -------------------------------------------------------------

TEST(CudaOps, SumOfSquaresInDouble) {
  REQUIRE_GPU();
  const Tensor x = rand_cpu({1000003}, 121);
  const double c = ops::sum_of_squares(x), g = ops::sum_of_squares(gpu(x));
  EXPECT_NEAR(g, c, 1e-12 * c);
  EXPECT_EQ(ops::sum_of_squares(gpu(x)), g);  // deterministic
}

TEST(CudaOps, AdamWStepMatchesHostReference) {
  REQUIRE_GPU();
  const int64_t n = 10007, decay_end = 6000;
  Tensor p = rand_cpu({n}, 131), g = rand_cpu({n}, 132), m = rand_cpu({n}, 133, -0.1f, 0.1f);
  Tensor v = rand_cpu({n}, 134, 0.0f, 0.01f);
  cuda::AdamWHyper hp;
  hp.lr = 3e-4;
  hp.weight_decay = 0.1;
  hp.step = 7;
  hp.grad_scale = 0.5f;
  // Host reference: src/optim/adamw.cpp's arithmetic.
  std::vector<float> P = p.to_float_vector(), G = g.to_float_vector(), Mv = m.to_float_vector(),
                     V = v.to_float_vector();
  const double bc1 = 1.0 - std::pow(hp.beta1, 7.0), bc2s = std::sqrt(1.0 - std::pow(hp.beta2, 7.0));
  for (int64_t i = 0; i < n; i++) {
    const float gi = G[i] * hp.grad_scale;
    if (i < decay_end) P[i] *= static_cast<float>(1.0 - hp.lr * hp.weight_decay);
    Mv[i] = Mv[i] * 0.9f + gi * static_cast<float>(1.0 - 0.9);
    V[i] = V[i] * 0.999f + gi * gi * static_cast<float>(1.0 - 0.999);
    const float denom = std::sqrt(V[i]) / static_cast<float>(bc2s) + 1e-8f;
    P[i] += -static_cast<float>(hp.lr / bc1) * (Mv[i] / denom);
  }
  Tensor pg = gpu(p), gg = gpu(g), mg = gpu(m), vg = gpu(v);
  Tensor model = Tensor::empty({n}, DType::BF16, Device::cuda(0));
  cuda::adamw_step(static_cast<float*>(pg.data_ptr()), static_cast<const float*>(gg.data_ptr()),
                   static_cast<float*>(mg.data_ptr()), static_cast<float*>(vg.data_ptr()),
                   static_cast<bf16*>(model.data_ptr()), n, hp, nullptr, 0, decay_end, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const Tensor ref = Tensor::from_vector(P, {n});
  EXPECT_LT(err(pg, ref), 1e-6);
  EXPECT_LT(err(mg, Tensor::from_vector(Mv, {n})), 1e-6);
  EXPECT_LT(err(vg, Tensor::from_vector(V, {n})), 1e-6);
  // The bf16 copy is the updated fp32 param rounded to nearest even.
  const std::vector<float> pm = host(pg).to_float_vector(), mb = host(model).to_float_vector();
  for (int64_t i = 0; i < n; i++) ASSERT_EQ(mb[i], bf16_to_float(float_to_bf16(pm[i]))) << i;
}

TEST(CudaOps, NonDefaultStreamOrdersWork) {
  REQUIRE_GPU();
  cudaStream_t cs;
  ASSERT_EQ(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), cudaSuccess);
  const Stream st{cs};
  const Tensor x = rand_cpu({4099}, 141);
  Tensor xg = x.to(Device::cuda(0), st), yg = Tensor::empty({4099}, DType::F32, Device::cuda(0), st);
  ops::gelu_forward(xg, yg, st);
  ops::scale_(yg, 2.0f, st);
  const Tensor y = yg.to(Device::cpu(), st);
  Tensor ref = Tensor::empty({4099}, DType::F32);
  ops::gelu_forward(x, ref);
  ops::scale_(ref, 2.0f);
  EXPECT_LT(rel_err(y, ref), 1e-5);
  ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
  cudaStreamDestroy(cs);
}

}  // namespace
}  // namespace parallel
