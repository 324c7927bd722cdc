// Our tensor-core FlashAttention-2 (kernels/attention/flash_attention_mma.cu), forward and backward,
// against a CPU reference computed in double from the same 16-bit-rounded inputs, and against our
// fp32 CUDA kernel (kernels::attention_forward / attention_backward) run on those rounded inputs.
// Cases: d = 64 and 128, causal and not, s = 100, 257, 17 (not multiples of any tile) and 128
// (exact tiles), b = 2, grouped-query (hq = 4, hkv = 2) and multi-head, bf16 and fp16; plus
// determinism of the backward and the launcher's rejection of unsupported shapes.
//
// Inputs: q, k uniform in [-2, 2] (scaled scores with a standard deviation of about 1.3, so the
// softmax is neither flat nor one-hot), v, dout uniform in [-1, 1], softmax_scale = 1 / sqrt(d).
//
// Tolerances, per output, as max |got - ref| / max |ref| ("max") and rms(got - ref) / rms(ref)
// ("rms"); u = 2^-8 for bf16 (8 significant bits: rounding error <= u / 2 relative), 2^-11 for fp16.
//   out   the kernel rounds P to the 16-bit type before P V (as FA2 does): each P V sum carries a
//         relative error of at most u / 2 per term, plus the final rounding of out (u / 2): both
//         <= u relative to max |v|. max 2e-2 (bf16) / 5e-3 (fp16): about 5 u and 10 u; rms 1e-2 /
//         2.5e-3.
//   lse   computed in fp32 from exact products of the 16-bit inputs: absolute 1e-3 (lse ~ 5, fp32
//         accumulation and exp2/log error ~1e-6 relative).
//   dq, dk, dv  dS and P are rounded to the 16-bit type before the dQ, dK, dV products, D =
//         rowsum(dO * O) uses the rounded O, and the gradients are rounded at the end: a few u.
//         max 3e-2 / 8e-3, rms 1.5e-2 / 4e-3.
// A wrong fragment layout, swizzle or mask gives errors of order 1 (or ~1e-1 for a single wrong
// key column in a row), far above these bounds. Skips without a GPU, except the shape-rejection
// test, which fails before any CUDA call.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../../kernels/attention/flash_attention_mma.hpp"
#include "../../kernels/cuda/kernels.hpp"
#include "gpu.hpp"
#include "parallel/error.hpp"
#include "parallel/tensor.hpp"

namespace parallel {
namespace {

struct Case {
  int64_t s, b, hq, hkv, d;
  bool causal;
};

struct Tol {
  double out_max, out_rms, grad_max, grad_rms, lse_abs;
};
constexpr Tol kTolBf16{2e-2, 1e-2, 3e-2, 1.5e-2, 1e-3};
constexpr Tol kTolF16{5e-3, 2.5e-3, 8e-3, 4e-3, 1e-3};

std::vector<float> rand_vec(int64_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  return v;
}

// Attention forward and backward in double, straight from the definition (layouts of ops.hpp).
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};
Reference reference(const Case& c, double scale, const std::vector<float>& q, const std::vector<float>& k,
                    const std::vector<float>& v, const std::vector<float>& dout) {
  const int64_t S = c.s, B = c.b, HQ = c.hq, HKV = c.hkv, D = c.d, G = HQ / HKV;
  Reference r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  r.lse.assign(static_cast<std::size_t>(B * HQ * S), 0.0);
  auto qi = [&](int64_t i, int64_t bi, int64_t h) { return ((i * B + bi) * HQ + h) * D; };
  auto ki = [&](int64_t j, int64_t bi, int64_t h) { return ((j * B + bi) * HKV + h) * D; };
  std::vector<double> p(static_cast<std::size_t>(S)), dp(static_cast<std::size_t>(S));
  for (int64_t bi = 0; bi < B; bi++) {
    for (int64_t h = 0; h < HQ; h++) {
      const int64_t hk = h / G;
      for (int64_t i = 0; i < S; i++) {
        const int64_t n = c.causal ? i + 1 : S;  // visible keys 0 .. n - 1
        double mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
          double dot = 0.0;
          for (int64_t e = 0; e < D; e++) dot += double(q[qi(i, bi, h) + e]) * k[ki(j, bi, hk) + e];
          p[j] = scale * dot;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) sum += std::exp(p[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[(bi * HQ + h) * S + i] = lse;
        double delta = 0.0;
        for (int64_t j = 0; j < n; j++) {
          p[j] = std::exp(p[j] - lse);
          double dot = 0.0;
          for (int64_t e = 0; e < D; e++) {
            r.out[qi(i, bi, h) + e] += p[j] * v[ki(j, bi, hk) + e];
            dot += double(dout[qi(i, bi, h) + e]) * v[ki(j, bi, hk) + e];
          }
          dp[j] = dot;
          delta += p[j] * dot;  // = dout_i . out_i
        }
        for (int64_t j = 0; j < n; j++) {
          const double ds = scale * p[j] * (dp[j] - delta);
          for (int64_t e = 0; e < D; e++) {
            r.dq[qi(i, bi, h) + e] += ds * k[ki(j, bi, hk) + e];
            r.dk[ki(j, bi, hk) + e] += ds * q[qi(i, bi, h) + e];
            r.dv[ki(j, bi, hk) + e] += p[j] * dout[qi(i, bi, h) + e];
          }
        }
      }
    }
  }
  return r;
}

struct Err {
  double max_rel = 0.0, rms_rel = 0.0, max_abs = 0.0;
};
template <typename R>
Err compare(const std::vector<float>& got, const std::vector<R>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double mref = 1e-30, mdiff = 0.0, sref = 0.0, sdiff = 0.0;
  for (std::size_t i = 0; i < got.size() && i < ref.size(); i++) {
    if (!std::isfinite(got[i])) {
      ADD_FAILURE() << "element " << i << " is " << got[i];
      return {INFINITY, INFINITY, INFINITY};
    }
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    mref = std::max(mref, std::fabs(double(ref[i])));
    mdiff = std::max(mdiff, d);
    sref += double(ref[i]) * double(ref[i]);
    sdiff += d * d;
  }
  return {mdiff / mref, std::sqrt(sdiff / std::max(sref, 1e-300)), mdiff};
}

void expect_close(const char* what, const Err& e, double max_tol, double rms_tol) {
  EXPECT_LT(e.max_rel, max_tol) << what << ": max |diff| / max |ref|";
  EXPECT_LT(e.rms_rel, rms_tol) << what << ": rms(diff) / rms(ref)";
}

void* ptr(const Tensor& t) { return t.data_ptr(); }

void fa_forward(DType type, const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                const kernels::AttentionShape& sh, bool causal, float scale) {
  if (type == DType::BF16)
    kernels::flash_attention_forward_bf16(static_cast<const bf16*>(ptr(q)), static_cast<const bf16*>(ptr(k)),
                                          static_cast<const bf16*>(ptr(v)), static_cast<bf16*>(ptr(out)),
                                          static_cast<float*>(ptr(lse)), sh, AttentionBounds{causal}, scale,
                                          nullptr);
  else
    kernels::flash_attention_forward_f16(static_cast<const f16*>(ptr(q)), static_cast<const f16*>(ptr(k)),
                                         static_cast<const f16*>(ptr(v)), static_cast<f16*>(ptr(out)),
                                         static_cast<float*>(ptr(lse)), sh, AttentionBounds{causal}, scale,
                                         nullptr);
}

void fa_backward(DType type, const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& out, const Tensor& lse, Tensor& dq, Tensor& dk, Tensor& dv,
                 const kernels::AttentionShape& sh, bool causal, float scale) {
  if (type == DType::BF16)
    kernels::flash_attention_backward_bf16(
        static_cast<const bf16*>(ptr(dout)), static_cast<const bf16*>(ptr(q)),
        static_cast<const bf16*>(ptr(k)), static_cast<const bf16*>(ptr(v)),
        static_cast<const bf16*>(ptr(out)), static_cast<const float*>(ptr(lse)), static_cast<bf16*>(ptr(dq)),
        static_cast<bf16*>(ptr(dk)), static_cast<bf16*>(ptr(dv)), sh, AttentionBounds{causal}, scale,
        nullptr);
  else
    kernels::flash_attention_backward_f16(
        static_cast<const f16*>(ptr(dout)), static_cast<const f16*>(ptr(q)), static_cast<const f16*>(ptr(k)),
        static_cast<const f16*>(ptr(v)), static_cast<const f16*>(ptr(out)),
        static_cast<const float*>(ptr(lse)), static_cast<f16*>(ptr(dq)), static_cast<f16*>(ptr(dk)),
        static_cast<f16*>(ptr(dv)), sh, AttentionBounds{causal}, scale, nullptr);
}

std::vector<float> host(const Tensor& t) { return t.to(Device::cpu()).to_float_vector(); }

// Runs forward and backward of one case on the GPU and checks them against the double reference
// and against the fp32 CUDA kernel.
void run_case(const Case& c, DType type) {
  SCOPED_TRACE(::testing::Message() << "s " << c.s << " b " << c.b << " hq " << c.hq << " hkv " << c.hkv
                                    << " d " << c.d << " causal " << c.causal << " " << dtype_name(type));
  const Tol tol = type == DType::BF16 ? kTolBf16 : kTolF16;
  const Shape qs{c.s, c.b, c.hq, c.d}, ks{c.s, c.b, c.hkv, c.d};
  const int64_t nq = c.s * c.b * c.hq * c.d, nk = c.s * c.b * c.hkv * c.d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  const uint32_t seed = static_cast<uint32_t>(c.s * 131 + c.d * 7 + c.causal + c.hkv * 17);
  // 16-bit inputs and their exact float values (the reference and the fp32 kernel use those).
  const Tensor q16 = Tensor::from_vector(rand_vec(nq, seed + 1, -2.0f, 2.0f), qs).to(type);
  const Tensor k16 = Tensor::from_vector(rand_vec(nk, seed + 2, -2.0f, 2.0f), ks).to(type);
  const Tensor v16 = Tensor::from_vector(rand_vec(nk, seed + 3, -1.0f, 1.0f), ks).to(type);
  const Tensor do16 = Tensor::from_vector(rand_vec(nq, seed + 4, -1.0f, 1.0f), qs).to(type);
  const std::vector<float> q = q16.to_float_vector(), k = k16.to_float_vector(), v = v16.to_float_vector(),
                           dout = do16.to_float_vector();
  const Reference ref = reference(c, scale, q, k, v, dout);

  const Device dev = Device::cuda(0);
  const kernels::AttentionShape sh{c.s, c.b, c.hq, c.hkv, c.d};
  const Tensor qg = q16.to(dev), kg = k16.to(dev), vg = v16.to(dev), dog = do16.to(dev);
  Tensor out = Tensor::empty(qs, type, dev), lse = Tensor::empty({c.b, c.hq, c.s}, DType::F32, dev);
  Tensor dq = Tensor::empty(qs, type, dev), dk = Tensor::empty(ks, type, dev),
         dv = Tensor::empty(ks, type, dev);
  fa_forward(type, qg, kg, vg, out, lse, sh, c.causal, scale);
  fa_backward(type, dog, qg, kg, vg, out, lse, dq, dk, dv, sh, c.causal, scale);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got_out = host(out), got_lse = host(lse), got_dq = host(dq), got_dk = host(dk),
                           got_dv = host(dv);

  expect_close("out vs double", compare(got_out, ref.out), tol.out_max, tol.out_rms);
  EXPECT_LT(compare(got_lse, ref.lse).max_abs, tol.lse_abs) << "lse vs double";
  expect_close("dq vs double", compare(got_dq, ref.dq), tol.grad_max, tol.grad_rms);
  expect_close("dk vs double", compare(got_dk, ref.dk), tol.grad_max, tol.grad_rms);
  expect_close("dv vs double", compare(got_dv, ref.dv), tol.grad_max, tol.grad_rms);

  // The fp32 kernel on the same (rounded) values: fp32 all the way, so within the same bounds.
  const Tensor q32 = Tensor::from_vector(q, qs).to(dev), k32 = Tensor::from_vector(k, ks).to(dev),
               v32 = Tensor::from_vector(v, ks).to(dev), do32 = Tensor::from_vector(dout, qs).to(dev);
  Tensor out32 = Tensor::empty(qs, DType::F32, dev), lse32 = Tensor::empty({c.b, c.hq, c.s}, DType::F32, dev);
  Tensor dq32 = Tensor::empty(qs, DType::F32, dev), dk32 = Tensor::empty(ks, DType::F32, dev),
         dv32 = Tensor::empty(ks, DType::F32, dev);
  auto f = [](const Tensor& t) { return static_cast<float*>(t.data_ptr()); };
  kernels::attention_forward(f(q32), f(k32), f(v32), f(out32), f(lse32), sh, AttentionBounds{c.causal}, scale,
                             nullptr);
  kernels::attention_backward(f(do32), f(q32), f(k32), f(v32), f(out32), f(lse32), f(dq32), f(dk32), f(dv32),
                              sh, AttentionBounds{c.causal}, scale, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  expect_close("out vs fp32 kernel", compare(got_out, host(out32)), tol.out_max, tol.out_rms);
  EXPECT_LT(compare(got_lse, host(lse32)).max_abs, tol.lse_abs) << "lse vs fp32 kernel";
  expect_close("dq vs fp32 kernel", compare(got_dq, host(dq32)), tol.grad_max, tol.grad_rms);
  expect_close("dk vs fp32 kernel", compare(got_dk, host(dk32)), tol.grad_max, tol.grad_rms);
  expect_close("dv vs fp32 kernel", compare(got_dv, host(dv32)), tol.grad_max, tol.grad_rms);
}

TEST(FlashAttentionMma, Bf16HeadDim64) {
  REQUIRE_GPU();
  for (bool causal : {false, true}) {
    run_case({100, 2, 4, 2, 64, causal}, DType::BF16);  // GQA, partial tiles
    run_case({257, 2, 4, 4, 64, causal}, DType::BF16);  // MHA, one row past the tiles
    run_case({128, 2, 2, 1, 64, causal}, DType::BF16);  // exact 128-row tiles, group of 2
  }
}

TEST(FlashAttentionMma, Bf16HeadDim128) {
  REQUIRE_GPU();
  for (bool causal : {false, true}) {
    run_case({257, 2, 4, 2, 128, causal}, DType::BF16);
    run_case({100, 2, 2, 2, 128, causal}, DType::BF16);
    run_case({17, 2, 4, 2, 128, causal}, DType::BF16);  // less than one tile
  }
}

TEST(FlashAttentionMma, Fp16) {
  REQUIRE_GPU();
  run_case({257, 2, 4, 2, 64, true}, DType::F16);
  run_case({100, 2, 4, 4, 64, false}, DType::F16);
  run_case({100, 2, 4, 2, 128, false}, DType::F16);
  run_case({257, 2, 2, 2, 128, true}, DType::F16);
}

// No atomics anywhere: two runs give the same bits.
TEST(FlashAttentionMma, BackwardIsDeterministic) {
  REQUIRE_GPU();
  const Case c{300, 2, 4, 2, 128, true};
  const Shape qs{c.s, c.b, c.hq, c.d}, ks{c.s, c.b, c.hkv, c.d};
  const Device dev = Device::cuda(0);
  const kernels::AttentionShape sh{c.s, c.b, c.hq, c.hkv, c.d};
  const float scale = 0.088f;
  const Tensor q =
      Tensor::from_vector(rand_vec(shape_numel(qs), 11, -2.0f, 2.0f), qs).to(DType::BF16).to(dev);
  const Tensor k =
      Tensor::from_vector(rand_vec(shape_numel(ks), 12, -2.0f, 2.0f), ks).to(DType::BF16).to(dev);
  const Tensor v =
      Tensor::from_vector(rand_vec(shape_numel(ks), 13, -1.0f, 1.0f), ks).to(DType::BF16).to(dev);
  const Tensor d =
      Tensor::from_vector(rand_vec(shape_numel(qs), 14, -1.0f, 1.0f), qs).to(DType::BF16).to(dev);
  Tensor out = Tensor::empty(qs, DType::BF16, dev), lse = Tensor::empty({c.b, c.hq, c.s}, DType::F32, dev);
  fa_forward(DType::BF16, q, k, v, out, lse, sh, c.causal, scale);
  std::vector<std::vector<float>> runs[2];
  for (auto& run : runs) {
    Tensor dq = Tensor::empty(qs, DType::BF16, dev), dk = Tensor::empty(ks, DType::BF16, dev),
           dv = Tensor::empty(ks, DType::BF16, dev);
    fa_backward(DType::BF16, d, q, k, v, out, lse, dq, dk, dv, sh, c.causal, scale);
    run = {host(dq), host(dk), host(dv)};
  }
  for (int i = 0; i < 3; i++) {
    ASSERT_EQ(runs[0][i].size(), runs[1][i].size());
    EXPECT_EQ(std::memcmp(runs[0][i].data(), runs[1][i].data(), runs[0][i].size() * sizeof(float)), 0)
        << "gradient " << i;
  }
}

// Validation happens before any CUDA call, so this runs without a GPU too.
TEST(FlashAttentionMma, RejectsUnsupportedShapes) {
  const float scale = 0.1f;
  EXPECT_THROW(kernels::flash_attention_forward_bf16(nullptr, nullptr, nullptr, nullptr, nullptr,
                                                     kernels::AttentionShape{64, 1, 2, 2, 96},
                                                     AttentionBounds{false}, scale, nullptr),
               Error);
  EXPECT_THROW(kernels::flash_attention_forward_f16(nullptr, nullptr, nullptr, nullptr, nullptr,
                                                    kernels::AttentionShape{64, 1, 2, 2, 256},
                                                    AttentionBounds{}, scale, nullptr),
               Error);
  EXPECT_THROW(kernels::flash_attention_backward_bf16(
                   nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                   kernels::AttentionShape{64, 1, 3, 2, 64}, AttentionBounds{false}, scale, nullptr),
               Error);
  // A misaligned pointer (cp.async and the 16-byte stores need 16-byte alignment).
  alignas(16) static uint16_t dummy[16];
  const auto* odd = reinterpret_cast<const bf16*>(dummy + 1);
  EXPECT_THROW(kernels::flash_attention_forward_bf16(odd, odd, odd, nullptr, nullptr,
                                                     kernels::AttentionShape{64, 1, 2, 2, 64},
                                                     AttentionBounds{false}, scale, nullptr),
               Error);
}

}  // namespace
}  // namespace parallel
