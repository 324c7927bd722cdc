// The plain GPU paths against our own kernels and the CPU (issue 12, item 7): every GPU op that has
// an own kernel also has a plain one built on libraries, so a GPU can train on the plain path while
// an own kernel fails. This test checks, per op, plain vs CPU, own vs CPU and plain vs own, and prints
// one "[op-path]" line per comparison (max |diff| / max |ref|) for scripts/gpu_check.sh's report.
//
//   attention  plain: batched cuBLAS products around a row-softmax kernel (attention_plain.cu);
//              own: the fp32 flash kernel (kernels::attention_forward / _backward) for fp32 tensors,
//              the bf16 mma FlashAttention-2 kernels for bf16 tensors. CPU: the definition computed
//              in double on the host. Plain runs through its Tensor-level launcher
//              (cuda::attention_plain_forward / _backward, attention_plain_ops.hpp), the code
//              PARALLEL_ATTENTION=plain selects; own kernels through their raw launchers, so this
//              test does not depend on the ops layer's argument list. Cases: fp32 and bf16, causal
//              and not, GQA (hq 4, hkv 2) and MHA, d 64 and 128, s = 100 (no tile multiple), b = 2.
//   gemm       plain: cuBLASLt (gemm_cublaslt_bf16); own: our mma.sync kernel (gemm_bf16), on the
//              GPT-2 small shapes (forward, dgrad, wgrad).
//
// Inputs: q, k uniform in [-2, 2], v, dout in [-1, 1] (rounded to bf16 for the bf16 cases, so all
// three sides see the same values); softmax_scale = 1 / sqrt(d).
// Tolerances, max |diff| / max |ref| and rms(diff) / rms(ref):
//   fp32   every product fp32 with fp32 accumulation on all sides, in different orders: 1e-4 / 2e-5
//          (observed errors of such sums are ~1e-6); lse absolute 1e-4.
//   bf16   the GPU paths round P and dS to bf16 before their products and their outputs to bf16, the
//          reference computes in double: the bounds of test_flash_attention_mma.cpp (2e-2 / 1e-2 for out,
//          3e-2 / 1.5e-2 for the gradients, about 5 bf16 ulps); lse absolute 1e-3. Plain vs own uses
//          the same bounds (both sides round, in different places).
//   gemm   bf16 products are exact in fp32; only the summation order differs: 1e-4 / 1e-5.
// UNVERIFIED ON A GPU when written (2026-11): without a device every test but the parser skips.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/attention/attention_plain.hpp"
#include "../../kernels/attention/attention_plain_ops.hpp"
#include "../../kernels/attention/flash_attention_mma.hpp"
#include "../../kernels/cuda/kernels.hpp"
#include "../../kernels/gemm/gemm.hpp"
#include "gpu.hpp"
#include "parallel/error.hpp"
#include "parallel/tensor.hpp"

namespace parallel {
namespace {

std::vector<float> rand_vec(int64_t n, uint32_t seed, float lo, float hi, DType round_to) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  if (round_to == DType::F32) return v;
  return Tensor::from_vector(v, {n}).to(round_to).to(DType::F32).to_float_vector();
}

struct Err {
  double max_rel = 0.0, rms_rel = 0.0, max_abs = 0.0;
};
Err compare(const std::vector<float>& got, const std::vector<float>& ref) {
  EXPECT_EQ(got.size(), ref.size());
  double mref = 1e-30, mdiff = 0.0, sref = 0.0, sdiff = 0.0;
  for (std::size_t i = 0; i < got.size() && i < ref.size(); i++) {
    if (!std::isfinite(got[i])) return {INFINITY, INFINITY, INFINITY};
    const double d = std::fabs(double(got[i]) - double(ref[i]));
    mref = std::max(mref, std::fabs(double(ref[i])));
    mdiff = std::max(mdiff, d);
    sref += double(ref[i]) * double(ref[i]);
    sdiff += d * d;
  }
  return {mdiff / mref, std::sqrt(sdiff / std::max(sref, 1e-300)), mdiff};
}

struct Tol {
  double max, rms, grad_max, grad_rms, lse_abs;
};
constexpr Tol kTolF32{1e-4, 2e-5, 1e-4, 2e-5, 1e-4};
constexpr Tol kTolBf16{2e-2, 1e-2, 3e-2, 1.5e-2, 1e-3};

struct Case {
  int64_t s, b, hq, hkv, d;
  bool causal;
};

// out, lse, dq, dk, dv on the host.
using Results = std::vector<std::vector<float>>;
const char* kNames[] = {"out", "lse", "dq", "dk", "dv"};

// Attention forward and backward in double, straight from the definition (layouts of ops.hpp).
Results reference(const Case& c, const std::vector<float>& q, const std::vector<float>& k,
                  const std::vector<float>& v, const std::vector<float>& dout) {
  const int64_t S = c.s, B = c.b, HQ = c.hq, HKV = c.hkv, D = c.d, G = HQ / HKV;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  std::vector<double> out(q.size()), dq(q.size()), dk(k.size()), dv(v.size()), lse(B * HQ * S);
  auto qi = [&](int64_t i, int64_t bi, int64_t h) { return ((i * B + bi) * HQ + h) * D; };
  auto ki = [&](int64_t j, int64_t bi, int64_t h) { return ((j * B + bi) * HKV + h) * D; };
  std::vector<double> p(S), dp(S);
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t h = 0; h < HQ; h++) {
      const int64_t hk = h / G;
      for (int64_t i = 0; i < S; i++) {
        const int64_t n = c.causal ? i + 1 : S;
        double mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) {
          double dot = 0.0;
          for (int64_t e = 0; e < D; e++) dot += double(q[qi(i, bi, h) + e]) * k[ki(j, bi, hk) + e];
          p[j] = scale * dot;
          mx = std::max(mx, p[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) sum += std::exp(p[j] - mx);
        const double l = mx + std::log(sum);
        lse[(bi * HQ + h) * S + i] = l;
        double delta = 0.0;
        for (int64_t j = 0; j < n; j++) {
          p[j] = std::exp(p[j] - l);
          double dot = 0.0;
          for (int64_t e = 0; e < D; e++) {
            out[qi(i, bi, h) + e] += p[j] * v[ki(j, bi, hk) + e];
            dot += double(dout[qi(i, bi, h) + e]) * v[ki(j, bi, hk) + e];
          }
          dp[j] = dot;
          delta += p[j] * dot;
        }
        for (int64_t j = 0; j < n; j++) {
          const double ds = scale * p[j] * (dp[j] - delta);
          for (int64_t e = 0; e < D; e++) {
            dq[qi(i, bi, h) + e] += ds * k[ki(j, bi, hk) + e];
            dk[ki(j, bi, hk) + e] += ds * q[qi(i, bi, h) + e];
            dv[ki(j, bi, hk) + e] += p[j] * dout[qi(i, bi, h) + e];
          }
        }
      }
    }
  Results r;
  for (const auto* x : {&out, &lse, &dq, &dk, &dv}) r.emplace_back(x->begin(), x->end());
  return r;
}

enum class Path { Plain, Own };

// Forward and backward on the GPU with tensors of `type` (F32 or BF16) holding the given values.
Results run_gpu(Path path, const Case& c, DType type, const std::vector<float>& q, const std::vector<float>& k,
                const std::vector<float>& v, const std::vector<float>& dout) {
  const Device dev = Device::cuda(0);
  const Shape qs{c.s, c.b, c.hq, c.d}, ks{c.s, c.b, c.hkv, c.d};
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
  auto up = [&](const std::vector<float>& x, const Shape& sh) { return Tensor::from_vector(x, sh).to(type).to(dev); };
  const Tensor tq = up(q, qs), tk = up(k, ks), tv = up(v, ks), tdo = up(dout, qs);
  Tensor out = Tensor::empty(qs, type, dev), lse = Tensor::empty({c.b, c.hq, c.s}, DType::F32, dev);
  Tensor dq = Tensor::empty(qs, type, dev), dk = Tensor::empty(ks, type, dev), dv = Tensor::empty(ks, type, dev);
  if (path == Path::Plain) {
    cuda::attention_plain_forward(tq, tk, tv, out, lse, AttentionBounds{c.causal}, scale, Stream{});
    cuda::attention_plain_backward(tdo, tq, tk, tv, out, lse, dq, dk, dv, AttentionBounds{c.causal}, scale,
                                   Stream{});
  } else {
    const kernels::AttentionShape sh{c.s, c.b, c.hq, c.hkv, c.d};
    auto f = [](const Tensor& t) { return static_cast<float*>(t.data_ptr()); };
    auto h = [](const Tensor& t) { return static_cast<bf16*>(t.data_ptr()); };
    if (type == DType::F32) {
      kernels::attention_forward(f(tq), f(tk), f(tv), f(out), f(lse), sh, AttentionBounds{c.causal}, scale, nullptr);
      kernels::attention_backward(f(tdo), f(tq), f(tk), f(tv), f(out), f(lse), f(dq), f(dk), f(dv), sh,
                                  AttentionBounds{c.causal}, scale, nullptr);
    } else {
      kernels::flash_attention_forward_bf16(h(tq), h(tk), h(tv), h(out), f(lse), sh, AttentionBounds{c.causal},
                                            scale, nullptr);
      kernels::flash_attention_backward_bf16(h(tdo), h(tq), h(tk), h(tv), h(out), f(lse), h(dq), h(dk), h(dv), sh,
                                             AttentionBounds{c.causal}, scale, nullptr);
    }
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Results r;
  for (const Tensor* t : {&out, &lse, &dq, &dk, &dv}) r.push_back(t->to(Device::cpu()).to_float_vector());
  return r;
}

// Compares `got` with `ref` output by output, prints one [op-path] line, returns whether all are
// within tol.
bool check(const std::string& label, const Results& got, const Results& ref, const Tol& tol) {
  bool ok = true;
  std::string line = "[op-path] " + label + ":";
  for (std::size_t i = 0; i < got.size(); i++) {
    const Err e = compare(got[i], ref[i]);
    char buf[96];
    if (i == 1) {  // lse: absolute
      std::snprintf(buf, sizeof buf, " %s %.2e", kNames[i], e.max_abs);
      ok = ok && e.max_abs < tol.lse_abs;
    } else {
      const bool grad = i >= 2;
      std::snprintf(buf, sizeof buf, " %s %.2e", kNames[i], e.max_rel);
      ok = ok && e.max_rel < (grad ? tol.grad_max : tol.max) && e.rms_rel < (grad ? tol.grad_rms : tol.rms);
    }
    line += buf;
  }
  line += ok ? "  ok" : "  OUT OF TOLERANCE";
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return ok;
}

void run_case(const Case& c, DType precision) {
  const std::string name = std::string(dtype_name(precision)) + " d" + std::to_string(c.d) +
                           (c.causal ? " causal" : " full") + (c.hq != c.hkv ? " gqa" : " mha") + " s" +
                           std::to_string(c.s);
  SCOPED_TRACE(name);
  const uint32_t seed = static_cast<uint32_t>(c.s * 131 + c.d * 7 + c.causal + c.hkv * 17);
  const int64_t nq = c.s * c.b * c.hq * c.d, nk = c.s * c.b * c.hkv * c.d;
  const auto q = rand_vec(nq, seed + 1, -2.0f, 2.0f, precision), k = rand_vec(nk, seed + 2, -2.0f, 2.0f, precision);
  const auto v = rand_vec(nk, seed + 3, -1.0f, 1.0f, precision), dout = rand_vec(nq, seed + 4, -1.0f, 1.0f, precision);
  const Tol tol = precision == DType::F32 ? kTolF32 : kTolBf16;

  const Results cpu = reference(c, q, k, v, dout);
  const Results plain = run_gpu(Path::Plain, c, precision, q, k, v, dout);
  const Results own = run_gpu(Path::Own, c, precision, q, k, v, dout);

  EXPECT_TRUE(check("attention " + name + " plain vs cpu", plain, cpu, tol)) << "plain path vs CPU";
  EXPECT_TRUE(check("attention " + name + " flash vs cpu", own, cpu, tol)) << "own kernel vs CPU";
  EXPECT_TRUE(check("attention " + name + " plain vs flash", plain, own, tol)) << "plain vs own kernel";
}

// Which path each op takes in this process, from the environment (before any override below).
TEST(OpPaths, Selected) {
  std::printf(
      "[op-path] selected: attention=%s (PARALLEL_ATTENTION: flash|plain), gemm=%s (PARALLEL_GEMM: "
      "ours|cublaslt|auto|timed), other ops: own element-wise/norm/loss kernels (no plain alternative)\n",
      kernels::attention_path_name(kernels::attention_path()), kernels::gemm_mode_name(kernels::gemm_mode()));
  EXPECT_EQ(kernels::parse_attention_path(nullptr), kernels::AttentionPath::Flash);
  EXPECT_EQ(kernels::parse_attention_path(""), kernels::AttentionPath::Flash);
  EXPECT_EQ(kernels::parse_attention_path("flash"), kernels::AttentionPath::Flash);
  EXPECT_EQ(kernels::parse_attention_path("plain"), kernels::AttentionPath::Plain);
  EXPECT_THROW(kernels::parse_attention_path("cudnn"), Error);
  EXPECT_STREQ(kernels::attention_path_name(kernels::AttentionPath::Plain), "plain");
}

TEST(OpPaths, AttentionFp32) {
  REQUIRE_GPU();
  for (int64_t d : {64, 128})
    for (bool causal : {false, true}) {
      run_case({100, 2, 4, 2, d, causal}, DType::F32);
      run_case({100, 2, 2, 2, d, causal}, DType::F32);
    }
}

TEST(OpPaths, AttentionBf16) {
  REQUIRE_GPU();
  for (int64_t d : {64, 128})
    for (bool causal : {false, true}) {
      run_case({100, 2, 4, 2, d, causal}, DType::BF16);
      run_case({100, 2, 2, 2, d, causal}, DType::BF16);
    }
}

// Plain backward is deterministic (cuBLAS without atomics-based split-k, fixed reduction order).
TEST(OpPaths, AttentionPlainDeterministic) {
  REQUIRE_GPU();
  const Case c{130, 2, 4, 2, 64, true};
  const auto q = rand_vec(c.s * c.b * c.hq * c.d, 1, -2.0f, 2.0f, DType::BF16);
  const auto k = rand_vec(c.s * c.b * c.hkv * c.d, 2, -2.0f, 2.0f, DType::BF16);
  const auto v = rand_vec(c.s * c.b * c.hkv * c.d, 3, -1.0f, 1.0f, DType::BF16);
  const auto dout = rand_vec(c.s * c.b * c.hq * c.d, 4, -1.0f, 1.0f, DType::BF16);
  const Results a = run_gpu(Path::Plain, c, DType::BF16, q, k, v, dout);
  const Results b = run_gpu(Path::Plain, c, DType::BF16, q, k, v, dout);
  for (std::size_t i = 0; i < a.size(); i++) EXPECT_EQ(a[i], b[i]) << kNames[i];
}

TEST(OpPaths, GemmOursVsCublasLt) {
  REQUIRE_GPU();
  struct G {
    const char* name;
    int64_t m, n, k;
    bool ta, tb;
  };
  // GPT-2 small, 1024 tokens: qkv forward, dgrad, wgrad (row-major, op(a) [m, k], op(b) [k, n]).
  const G cases[] = {{"qkv fwd", 1024, 2304, 768, false, true},
                     {"qkv dgrad", 1024, 768, 2304, false, false},
                     {"qkv wgrad", 2304, 768, 1024, true, false},
                     {"odd 100x77x50", 100, 77, 50, false, true}};
  const Device dev = Device::cuda(0);
  for (const G& g : cases) {
    SCOPED_TRACE(g.name);
    const Shape as = g.ta ? Shape{g.k, g.m} : Shape{g.m, g.k}, bs = g.tb ? Shape{g.n, g.k} : Shape{g.k, g.n};
    const Tensor a = Tensor::from_vector(rand_vec(g.m * g.k, 7, -1.0f, 1.0f, DType::F32), as).to(DType::BF16).to(dev);
    const Tensor b = Tensor::from_vector(rand_vec(g.k * g.n, 8, -1.0f, 1.0f, DType::F32), bs).to(DType::BF16).to(dev);
    Tensor c_ours = Tensor::empty({g.m, g.n}, DType::F32, dev), c_lt = Tensor::empty({g.m, g.n}, DType::F32, dev);
    const auto* pa = static_cast<const bf16*>(a.data_ptr());
    const auto* pb = static_cast<const bf16*>(b.data_ptr());
    kernels::gemm_bf16(pa, g.ta, pb, g.tb, static_cast<float*>(c_ours.data_ptr()), g.m, g.n, g.k, 1.0f, 0.0f, {},
                       nullptr);
    cuda::gemm_cublaslt_bf16(pa, g.ta, pb, g.tb, static_cast<float*>(c_lt.data_ptr()), g.m, g.n, g.k, 1.0f, 0.0f,
                             nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Err e = compare(c_ours.to(Device::cpu()).to_float_vector(), c_lt.to(Device::cpu()).to_float_vector());
    const bool ok = e.max_rel < 1e-4 && e.rms_rel < 1e-5;
    std::printf("[op-path] gemm bf16 %s %ldx%ldx%ld ours vs cublaslt: max %.2e rms %.2e  %s\n", g.name,
                static_cast<long>(g.m), static_cast<long>(g.n), static_cast<long>(g.k), e.max_rel, e.rms_rel,
                ok ? "ok" : "OUT OF TOLERANCE");
    EXPECT_TRUE(ok) << "our GEMM vs cuBLASLt";
  }
}

}  // namespace
}  // namespace parallel
