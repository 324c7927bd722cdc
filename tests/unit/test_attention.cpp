// Tiled attention (ops::attention_forward / attention_backward) against a plain double-precision
// reference that materialises the full softmax, the reference itself against finite differences,
// and the point of the tiling: no [s, s] matrix at long sequence lengths.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "parallel/allocator.hpp"
#include "parallel/error.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

using namespace parallel;

namespace {

struct Dims {
  int64_t s, b, hq, hkv, d;
};

// Index helpers for [s, b, heads, d] and [b, hq, s].
int64_t at(const Dims& x, int64_t heads, int64_t t, int64_t b, int64_t h, int64_t e) {
  return ((t * x.b + b) * heads + h) * x.d + e;
}
int64_t lse_at(const Dims& x, int64_t b, int64_t h, int64_t t) { return (b * x.hq + h) * x.s + t; }

std::vector<float> randn(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& e : v) e = scale * dist(gen);
  return v;
}

// ---- the reference: full softmax in double, written plainly ------------------------------------

struct RefForward {
  std::vector<double> out, lse;
  std::vector<double> P;  // [b, hq, s, s] probabilities (0 where masked)
};

RefForward ref_forward(const Dims& x, const std::vector<double>& q, const std::vector<double>& k,
                       const std::vector<double>& v, bool causal, double scale) {
  const int64_t S = x.s, group = x.hq / x.hkv;
  RefForward r;
  r.out.assign(static_cast<size_t>(S * x.b * x.hq * x.d), 0.0);
  r.lse.assign(static_cast<size_t>(x.b * x.hq * S), 0.0);
  r.P.assign(static_cast<size_t>(x.b * x.hq * S * S), 0.0);
  std::vector<double> scores(static_cast<size_t>(S));
  for (int64_t b = 0; b < x.b; b++) {
    for (int64_t h = 0; h < x.hq; h++) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < S; i++) {
        const int64_t n_keys = causal ? i + 1 : S;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < n_keys; j++) {
          double dot = 0.0;
          for (int64_t e = 0; e < x.d; e++) dot += q[at(x, x.hq, i, b, h, e)] * k[at(x, x.hkv, j, b, hk, e)];
          scores[j] = scale * dot;
          mx = std::max(mx, scores[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < n_keys; j++) sum += std::exp(scores[j] - mx);
        const double lse = mx + std::log(sum);
        r.lse[lse_at(x, b, h, i)] = lse;
        double* P = &r.P[((b * x.hq + h) * S + i) * S];
        for (int64_t j = 0; j < n_keys; j++) {
          P[j] = std::exp(scores[j] - lse);
          for (int64_t e = 0; e < x.d; e++)
            r.out[at(x, x.hq, i, b, h, e)] += P[j] * v[at(x, x.hkv, j, b, hk, e)];
        }
      }
    }
  }
  return r;
}

struct RefGrads {
  std::vector<double> dq, dk, dv;
};

// Straight from the chain rule: dV = P^T dO, dP = dO V^T, dS = P * (dP - rowsum(P * dP)),
// dQ = scale dS K, dK = scale dS^T Q (D computed from P and dP, not from out, on purpose).
RefGrads ref_backward(const Dims& x, const std::vector<double>& q, const std::vector<double>& k,
                      const std::vector<double>& v, const std::vector<double>& dout, const RefForward& fwd,
                      double scale) {
  const int64_t S = x.s, group = x.hq / x.hkv;
  RefGrads g;
  g.dq.assign(q.size(), 0.0);
  g.dk.assign(k.size(), 0.0);
  g.dv.assign(v.size(), 0.0);
  std::vector<double> dP(static_cast<size_t>(S));
  for (int64_t b = 0; b < x.b; b++) {
    for (int64_t h = 0; h < x.hq; h++) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < S; i++) {
        const double* P = &fwd.P[((b * x.hq + h) * S + i) * S];
        double D = 0.0;
        for (int64_t j = 0; j < S; j++) {
          double dot = 0.0;
          for (int64_t e = 0; e < x.d; e++)
            dot += dout[at(x, x.hq, i, b, h, e)] * v[at(x, x.hkv, j, b, hk, e)];
          dP[j] = dot;
          D += P[j] * dot;
        }
        for (int64_t j = 0; j < S; j++) {
          const double dS = P[j] * (dP[j] - D);
          for (int64_t e = 0; e < x.d; e++) {
            g.dv[at(x, x.hkv, j, b, hk, e)] += P[j] * dout[at(x, x.hq, i, b, h, e)];
            g.dq[at(x, x.hq, i, b, h, e)] += scale * dS * k[at(x, x.hkv, j, b, hk, e)];
            g.dk[at(x, x.hkv, j, b, hk, e)] += scale * dS * q[at(x, x.hq, i, b, h, e)];
          }
        }
      }
    }
  }
  return g;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// max |got - want| / (atol + rtol |want|) must be <= 1; reports the worst element.
void expect_close(const std::vector<float>& got, const std::vector<double>& want, double atol, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); i++) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]) / (atol + rtol * std::abs(want[i]));
    if (!(err <= worst)) {  // also catches NaN
      worst = std::isnan(err) ? std::numeric_limits<double>::infinity() : err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " is " << got[worst_i] << ", reference "
                        << want[worst_i];
}

// ---- the kernels vs the reference ------------------------------------------------------------

struct Case {
  Dims x;
  bool causal;
  float q_scale = 1.0f;  // multiplies q: 100 makes scores in the thousands
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "s=" << c.x.s << " b=" << c.x.b << " hq=" << c.x.hq << " hkv=" << c.x.hkv << " d=" << c.x.d
      << (c.causal ? " causal" : " full") << " q_scale=" << c.q_scale;
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string name = "s" + std::to_string(c.x.s) + "_b" + std::to_string(c.x.b) + "_hq" +
                     std::to_string(c.x.hq) + "_hkv" + std::to_string(c.x.hkv) + "_d" +
                     std::to_string(c.x.d) + (c.causal ? "_causal" : "_full");
  if (c.q_scale != 1.0f) name += "_qx" + std::to_string(static_cast<int>(c.q_scale));
  return name;
}

class AttentionVsReference : public testing::TestWithParam<Case> {};

TEST_P(AttentionVsReference, ForwardAndBackward) {
  const Case& c = GetParam();
  const Dims& x = c.x;
  const Shape q_shape{x.s, x.b, x.hq, x.d}, kv_shape{x.s, x.b, x.hkv, x.d};
  const float scale = 1.0f / std::sqrt(static_cast<float>(x.d));
  const std::vector<float> qv = randn(shape_numel(q_shape), 1, c.q_scale),
                           kv = randn(shape_numel(kv_shape), 2), vv = randn(shape_numel(kv_shape), 3),
                           gv = randn(shape_numel(q_shape), 4);

  Tensor q = Tensor::from_vector(qv, q_shape), k = Tensor::from_vector(kv, kv_shape),
         v = Tensor::from_vector(vv, kv_shape), dout = Tensor::from_vector(gv, q_shape);
  // Outputs start as NaN: every element must be written, and dq/dk/dv not accumulated into.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor out = Tensor::full(q_shape, nan, DType::F32), lse = Tensor::full({x.b, x.hq, x.s}, nan, DType::F32);
  Tensor dq = Tensor::full(q_shape, nan, DType::F32), dk = Tensor::full(kv_shape, nan, DType::F32),
         dv = Tensor::full(kv_shape, nan, DType::F32);

  ops::attention_forward(q, k, v, out, lse, c.causal, scale);
  ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, c.causal, scale);

  const auto qd = to_double(qv), kd = to_double(kv), vd = to_double(vv), gd = to_double(gv);
  const RefForward ref = ref_forward(x, qd, kd, vd, c.causal, scale);
  const RefGrads grads = ref_backward(x, qd, kd, vd, gd, ref, scale);

  // fp32 sums over up to s * d terms against double: ~1e-6 relative per op, a few 1e-5 overall.
  // With q x100 the scores are ~1e3, so their fp32 rounding (~1e-4 absolute) shows up as ~1e-4
  // relative error in every probability: the point of those cases is no overflow, not precision.
  const double loose = c.q_scale == 1.0f ? 1.0 : 20.0;
  expect_close(out.to_float_vector(), ref.out, 2e-5 * loose, 1e-4 * loose, "out");
  expect_close(lse.to_float_vector(), ref.lse, 2e-5 * loose, 1e-5 * loose, "lse");
  expect_close(dv.to_float_vector(), grads.dv, 1e-4 * loose, 1e-4 * loose, "dv");
  expect_close(dq.to_float_vector(), grads.dq, 1e-4 * loose, 1e-3 * loose, "dq");
  expect_close(dk.to_float_vector(), grads.dk, 1e-4 * loose, 1e-3 * loose, "dk");
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionVsReference,
    testing::Values(
        // MHA, one partial block (s = 37), and d = 64
        Case{{37, 2, 4, 4, 64}, false}, Case{{37, 2, 4, 4, 64}, true},
        // GQA 8:2, one full block + one row (s = 65), d = 16
        Case{{65, 2, 8, 2, 16}, false}, Case{{65, 2, 8, 2, 16}, true},
        // three blocks, the last partial: diagonal tiles and skipped tiles both exercised
        Case{{130, 2, 4, 4, 64}, false}, Case{{130, 2, 4, 4, 64}, true}, Case{{130, 2, 8, 2, 64}, true},
        // multi-query attention, an odd head size, d = 128
        Case{{70, 1, 4, 1, 7}, true}, Case{{66, 1, 2, 2, 128}, true},
        // scores ~ +-1000: exp would overflow without the running max
        Case{{130, 2, 4, 2, 64}, false, 100.0f}, Case{{130, 2, 4, 2, 64}, true, 100.0f}),
    case_name);

// ---- views into a fused qkv tensor ---------------------------------------------------------------

// q, k, v read as views of one fused [s, b, (hq + 2 hkv) d] tensor, and dq, dk, dv written into
// one fused gradient (what the self-attention layer does on the CPU), give bitwise the results of
// contiguous copies: the kernels change only where they read and write. Every dtype's kernel
// (fp32; bf16 on AVX512-BF16 or widened; fp16 widened), under GQA, a window and documents.
TEST(Attention, ViewsOfFusedQkvMatchContiguousCopiesBitwise) {
  const int64_t s = 150, b = 2, hq = 8, hkv = 2, d = 32, n = (hq + 2 * hkv) * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // Two documents per sequence, starting at 0 and at 70 (b = 0) or 100 (b = 1).
  std::vector<int32_t> starts(static_cast<size_t>(b * s));
  for (int64_t bb = 0; bb < b; bb++)
    for (int64_t p = 0; p < s; p++) starts[bb * s + p] = p < (bb == 0 ? 70 : 100) ? 0 : (bb == 0 ? 70 : 100);
  const Tensor doc_start = Tensor::from_vector(starts, {b, s});
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    for (int mask_kind = 0; mask_kind < 3; mask_kind++) {
      ops::AttentionMask mask;
      if (mask_kind == 1) mask.window = 50;
      if (mask_kind == 2) mask.doc_start = doc_start;
      const std::string what = std::string(dtype_name(dt)) + " mask " + std::to_string(mask_kind);
      Tensor qkv = Tensor::from_vector(randn(s * b * n, 41), {s, b, n}).to(dt);
      Tensor q = qkv.narrow(2, 0, hq * d).view({s, b, hq, d});
      Tensor k = qkv.narrow(2, hq * d, hkv * d).view({s, b, hkv, d});
      Tensor v = qkv.narrow(2, (hq + hkv) * d, hkv * d).view({s, b, hkv, d});
      ASSERT_FALSE(q.is_contiguous());
      const Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
      Tensor dout = Tensor::from_vector(randn(s * b * hq * d, 42), {s, b, hq, d}).to(dt);

      Tensor out = Tensor::empty({s, b, hq, d}, dt), lse = Tensor::empty({b, hq, s}, DType::F32);
      Tensor out_c = Tensor::empty({s, b, hq, d}, dt), lse_c = Tensor::empty({b, hq, s}, DType::F32);
      ops::attention_forward(q, k, v, out, lse, mask, scale);
      ops::attention_forward(qc, kc, vc, out_c, lse_c, mask, scale);
      EXPECT_EQ(out.to_float_vector(), out_c.to_float_vector()) << what;
      EXPECT_EQ(lse.to_float_vector(), lse_c.to_float_vector()) << what;

      // The fused gradient starts as NaN: the three views must cover and write all of it.
      Tensor dqkv = Tensor::full({s, b, n}, std::numeric_limits<double>::quiet_NaN(), dt);
      Tensor dq = dqkv.narrow(2, 0, hq * d).view({s, b, hq, d});
      Tensor dk = dqkv.narrow(2, hq * d, hkv * d).view({s, b, hkv, d});
      Tensor dv = dqkv.narrow(2, (hq + hkv) * d, hkv * d).view({s, b, hkv, d});
      Tensor dq_c = Tensor::empty(qc.shape(), dt), dk_c = Tensor::empty(kc.shape(), dt),
             dv_c = Tensor::empty(vc.shape(), dt);
      ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, mask, scale);
      ops::attention_backward(dout, qc, kc, vc, out_c, lse_c, dq_c, dk_c, dv_c, mask, scale);
      EXPECT_EQ(dq.to_float_vector(), dq_c.to_float_vector()) << what;
      EXPECT_EQ(dk.to_float_vector(), dk_c.to_float_vector()) << what;
      EXPECT_EQ(dv.to_float_vector(), dv_c.to_float_vector()) << what;
      for (float g : dqkv.to_float_vector()) ASSERT_FALSE(std::isnan(g)) << what;
    }
  }
  // A view whose heads are not side by side is refused with the rule, not read wrongly.
  Tensor qkv = Tensor::empty({s, b, 2 * hq * d}, DType::F32);
  Tensor every_other = qkv.view({s, b, hq, 2 * d}).narrow(3, 0, d);
  Tensor out = Tensor::empty({s, b, hq, d}, DType::F32), lse = Tensor::empty({b, hq, s}, DType::F32);
  EXPECT_THROW(ops::attention_forward(every_other, every_other, every_other, out, lse, true, scale), Error);
}

// ---- the reference's backward against finite differences --------------------------------------

TEST(AttentionReference, BackwardMatchesFiniteDifferences) {
  for (bool causal : {false, true}) {
    const Dims x{5, 1, 2, 1, 4};  // GQA: two query heads share the kv head
    const double scale = 0.5;
    const auto q = to_double(randn(x.s * x.b * x.hq * x.d, 11)),
               k = to_double(randn(x.s * x.b * x.hkv * x.d, 12)),
               v = to_double(randn(x.s * x.b * x.hkv * x.d, 13)),
               g = to_double(randn(x.s * x.b * x.hq * x.d, 14));
    // loss = sum(out * g), so dout = g.
    auto loss = [&](const std::vector<double>& qq, const std::vector<double>& kk,
                    const std::vector<double>& vv) {
      const RefForward f = ref_forward(x, qq, kk, vv, causal, scale);
      double l = 0.0;
      for (size_t i = 0; i < g.size(); i++) l += f.out[i] * g[i];
      return l;
    };
    const RefGrads grads = ref_backward(x, q, k, v, g, ref_forward(x, q, k, v, causal, scale), scale);

    const double h = 1e-6;
    auto check = [&](const std::vector<double>& analytic, int which, const char* name) {
      for (size_t i = 0; i < analytic.size(); i++) {
        std::vector<double> qq = q, kk = k, vv = v;
        std::vector<double>& p = which == 0 ? qq : which == 1 ? kk : vv;
        p[i] += h;
        const double up = loss(qq, kk, vv);
        p[i] -= 2 * h;
        const double down = loss(qq, kk, vv);
        EXPECT_NEAR(analytic[i], (up - down) / (2 * h), 1e-7) << name << "[" << i << "] causal=" << causal;
      }
    };
    check(grads.dq, 0, "dq");
    check(grads.dk, 1, "dk");
    check(grads.dv, 2, "dv");
  }
}

// ---- memory: tiles, not an [s, s] matrix -------------------------------------------------------

// The workspace the memory plan counts (ops::attention_workspace_bytes) is what the kernels
// allocate, for each dtype's kernel (fp32 tiles; bf16 on AVX512-BF16 or widened; fp16 widened).
TEST(Attention, WorkspaceBytesAreWhatTheKernelsAllocate) {
  const int64_t s = 200, b = 2, hq = 4, hkv = 2, d = 32;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Allocator& alloc = allocator_for(Device::cpu());
  for (DType dt : {DType::F32, DType::BF16, DType::F16}) {
    const Shape qs{s, b, hq, d}, ks{s, b, hkv, d};
    Tensor q = Tensor::from_vector(randn(shape_numel(qs), 31), qs).to(dt);
    Tensor k = Tensor::from_vector(randn(shape_numel(ks), 32), ks).to(dt);
    Tensor v = Tensor::from_vector(randn(shape_numel(ks), 33), ks).to(dt);
    Tensor dout = Tensor::from_vector(randn(shape_numel(qs), 34), qs).to(dt);
    Tensor out = Tensor::empty(qs, dt), lse = Tensor::empty({b, hq, s}, DType::F32);
    Tensor dq = Tensor::empty(qs, dt), dk = Tensor::empty(ks, dt), dv = Tensor::empty(ks, dt);
    for (bool backward : {false, true}) {
      alloc.reset_peak();
      const size_t before = memory_stats(Device::cpu()).allocated;
      if (backward)
        ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, /*causal=*/true, scale);
      else
        ops::attention_forward(q, k, v, out, lse, /*causal=*/true, scale);
      const double got = static_cast<double>(memory_stats(Device::cpu()).peak_allocated - before);
      const double want = static_cast<double>(ops::attention_workspace_bytes(dt, s, b, hq, hkv, d, backward));
      EXPECT_NEAR(got, want, 0.01 * want + 4096) << dtype_name(dt) << (backward ? " backward" : " forward")
                                                 << ", " << ops::attention_implementation(dt, d);
    }
  }
}

TEST(Attention, LongSequenceNeverAllocatesScoreMatrix) {
  const Dims x{4096, 1, 2, 2, 64};
  const Shape shape{x.s, x.b, x.hq, x.d};
  const float scale = 1.0f / std::sqrt(static_cast<float>(x.d));
  const std::vector<float> qv = randn(shape_numel(shape), 21), kv = randn(shape_numel(shape), 22),
                           vv = randn(shape_numel(shape), 23), gv = randn(shape_numel(shape), 24);
  Tensor q = Tensor::from_vector(qv, shape), k = Tensor::from_vector(kv, shape),
         v = Tensor::from_vector(vv, shape), dout = Tensor::from_vector(gv, shape);
  Tensor out = Tensor::empty(shape, DType::F32), lse = Tensor::empty({x.b, x.hq, x.s}, DType::F32);
  Tensor dq = Tensor::empty(shape, DType::F32), dk = Tensor::empty(shape, DType::F32),
         dv = Tensor::empty(shape, DType::F32);

  // One head's score matrix in fp32 is 64 MiB; an eighth of it is far more than tiles need.
  const size_t budget = static_cast<size_t>(x.s) * x.s * 4 / 8;
  Allocator& alloc = allocator_for(Device::cpu());

  alloc.reset_peak();
  size_t before = memory_stats(Device::cpu()).allocated;
  ops::attention_forward(q, k, v, out, lse, /*causal=*/true, scale);
  const size_t fwd_extra = memory_stats(Device::cpu()).peak_allocated - before;
  EXPECT_LT(fwd_extra, budget) << "forward allocated " << fwd_extra << " bytes of scratch";

  alloc.reset_peak();
  before = memory_stats(Device::cpu()).allocated;
  ops::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, /*causal=*/true, scale);
  const size_t bwd_extra = memory_stats(Device::cpu()).peak_allocated - before;
  EXPECT_LT(bwd_extra, budget) << "backward allocated " << bwd_extra << " bytes of scratch";

  // Spot-check a few rows (first, last, one in the middle of a tile) against the reference for
  // just those rows, O(s d) each.
  const std::vector<float> o = out.to_float_vector(), l = lse.to_float_vector();
  for (int64_t h = 0; h < x.hq; h++) {
    for (int64_t i : {int64_t{0}, int64_t{2077}, x.s - 1}) {
      double mx = -std::numeric_limits<double>::infinity();
      std::vector<double> sc(static_cast<size_t>(i + 1));
      for (int64_t j = 0; j <= i; j++) {
        double dot = 0.0;
        for (int64_t e = 0; e < x.d; e++)
          dot += double(qv[at(x, x.hq, i, 0, h, e)]) * kv[at(x, x.hkv, j, 0, h, e)];
        sc[j] = scale * dot;
        mx = std::max(mx, sc[j]);
      }
      double sum = 0.0;
      for (int64_t j = 0; j <= i; j++) sum += std::exp(sc[j] - mx);
      const double ref_lse = mx + std::log(sum);
      EXPECT_NEAR(l[lse_at(x, 0, h, i)], ref_lse, 1e-4) << "row " << i;
      for (int64_t e = 0; e < x.d; e++) {
        double ref = 0.0;
        for (int64_t j = 0; j <= i; j++) ref += std::exp(sc[j] - ref_lse) * vv[at(x, x.hkv, j, 0, h, e)];
        EXPECT_NEAR(o[at(x, x.hq, i, 0, h, e)], ref, 1e-4) << "row " << i << " e " << e;
      }
    }
  }
  for (float g : dq.to_float_vector()) ASSERT_TRUE(std::isfinite(g));
  for (float g : dk.to_float_vector()) ASSERT_TRUE(std::isfinite(g));
}

}  // namespace
