// Document masks, sliding windows and context-parallel block offsets in every CUDA attention kernel
// (issue 27), forward and backward, against the mask of include/parallel/attention_mask.hpp applied
// pair by pair in a host reference computed in double (not the CPU kernels). Each case runs through
// the Tensor-level launchers the ops layer calls (cuda::attention_forward / attention_backward,
// kernels/cuda/cuda_ops.hpp) on both paths:
//   flash  fp32 tensors: the fp32 kernel (flash_attention.cu); bf16 / fp16 with d = 64 or 128: the
//          tensor-core kernels (flash_attention_mma.cu); bf16 / fp16 with another d (96, 32): the
//          fp32 kernel on widened copies;
//   plain  batched cuBLAS products around the masked row softmax (attention_plain.cu).
// Masks: packed documents (different boundaries per batch element, doc_start's row stride wider than
// the sequence, a one-token document), a sliding window, both (also over 1000 tokens, where each
// query tile skips key tiles on both sides), and context parallelism's blocks (a
// query block below, on and above the key block: rows at q_pos0, keys at k_pos0, doc_start indexed
// by absolute position) with documents and a window. GQA (hq 4, hkv 2) and MHA (hq = hkv = 2).
// Rows that see no key must give out = 0, lse = -inf and zero gradients, exactly.
//
// Tile skipping is checked where it is observable: in a block no query of which sees any key, K and V
// hold NaN; a kernel that computed any tile of it would spread the NaN into out or the gradients
// (0 * NaN = NaN), so finite, zero outputs prove every tile was skipped (flash path only: the plain
// path multiplies the whole [s, s] matrices by design).
//
// Inputs: q, k uniform in [-2, 2], v, dout in [-1, 1], rounded to the case's dtype so that the
// reference sees the kernels' values; softmax_scale = 1 / sqrt(d). Tolerances (max |diff| / max |ref|,
// rms(diff) / rms(ref); lse absolute) are those of test_flash_attention_mma.cpp and
// test_attention_plain.cpp: fp32 1e-4 / 2e-5, lse 1e-4; bf16 2e-2 / 1e-2 (out), 3e-2 / 1.5e-2
// (gradients); fp16 5e-3 / 2.5e-3 and 8e-3 / 4e-3; lse 1e-3. A key wrongly seen or missed changes
// a row by order 1 / (visible keys), far above these bounds.
// UNVERIFIED ON A GPU when written (2026-11): without a device every test but the rejection test
// skips (REQUIRE_GPU; PARALLEL_REQUIRE_GPU=1 turns the skips into failures).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../../kernels/attention/attention_plain.hpp"
#include "../../kernels/attention/flash_attention_mma.hpp"
#include "../../kernels/cuda/cuda_ops.hpp"
#include "../../kernels/cuda/kernels.hpp"
#include "gpu.hpp"
#include "parallel/attention_mask.hpp"
#include "parallel/error.hpp"
#include "parallel/tensor.hpp"

namespace parallel {
namespace {

using kernels::AttentionPath;

// A problem: s query and key rows of a sequence of S positions (S = s unless a context-parallel
// block), documents per batch element (lengths summing to S; empty: none), a window (0: none).
struct Case {
  std::string name;
  int64_t s, b, hq, hkv, d;
  DType dtype;
  int64_t S = 0;                           // sequence length doc_start covers (0: s)
  std::vector<std::vector<int64_t>> docs;  // per batch element, or empty
  int64_t window = 0;
  int64_t q_pos0 = 0, k_pos0 = 0;
  bool causal = true;
};

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<float> rand_vec(int64_t n, uint32_t seed, float lo, float hi, DType round_to) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = dist(gen);
  if (round_to == DType::F32) return v;
  return Tensor::from_vector(v, {n}).to(round_to).to(DType::F32).to_float_vector();
}

// doc_start [b, stride] (stride = S + 3: a row stride wider than the sequence), or empty.
std::vector<int32_t> doc_start_of(const Case& c, int64_t stride) {
  if (c.docs.empty()) return {};
  const int64_t S = c.S ? c.S : c.s;
  std::vector<int32_t> out(static_cast<std::size_t>(c.b * stride), -1);
  for (int64_t bi = 0; bi < c.b; bi++) {
    int64_t p = 0;
    for (int64_t len : c.docs[static_cast<std::size_t>(bi)]) {
      for (int64_t i = 0; i < len; i++)
        out[static_cast<std::size_t>(bi * stride + p + i)] = static_cast<int32_t>(p);
      p += len;
    }
    EXPECT_EQ(p, S) << c.name << ": documents of batch element " << bi << " must cover the sequence";
  }
  return out;
}

// The contract of attention_mask.hpp, literally: position p of batch element bi sees position t.
bool sees(const Case& c, const std::vector<int32_t>& docs, int64_t stride, int64_t bi, int64_t p, int64_t t) {
  if (!c.causal) return true;
  if (t > p) return false;
  if (c.window > 0 && t <= p - c.window) return false;
  if (!docs.empty() && t < docs[static_cast<std::size_t>(bi * stride + p)]) return false;
  return true;
}

struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
};

// Masked attention forward and backward in double, straight from the definition (layouts of ops.hpp).
Reference reference(const Case& c, const std::vector<int32_t>& docs, int64_t stride, double scale,
                    const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v,
                    const std::vector<float>& dout) {
  const int64_t S = c.s, B = c.b, HQ = c.hq, HKV = c.hkv, D = c.d, G = HQ / HKV;
  Reference r;
  r.out.assign(q.size(), 0.0);
  r.dq.assign(q.size(), 0.0);
  r.dk.assign(k.size(), 0.0);
  r.dv.assign(v.size(), 0.0);
  r.lse.assign(static_cast<std::size_t>(B * HQ * S), -kInf);
  auto qi = [&](int64_t i, int64_t bi, int64_t h) {
    return static_cast<std::size_t>(((i * B + bi) * HQ + h) * D);
  };
  auto ki = [&](int64_t j, int64_t bi, int64_t h) {
    return static_cast<std::size_t>(((j * B + bi) * HKV + h) * D);
  };
  std::vector<double> p(static_cast<std::size_t>(S)), dp(static_cast<std::size_t>(S));
  std::vector<char> vis(static_cast<std::size_t>(S));
  for (int64_t bi = 0; bi < B; bi++)
    for (int64_t h = 0; h < HQ; h++) {
      const int64_t hk = h / G;
      for (int64_t i = 0; i < S; i++) {
        double mx = -kInf;
        for (int64_t j = 0; j < S; j++) {
          vis[j] = sees(c, docs, stride, bi, c.q_pos0 + i, c.k_pos0 + j);
          if (!vis[j]) continue;
          double dot = 0.0;
          for (int64_t e = 0; e < D; e++) dot += double(q[qi(i, bi, h) + e]) * double(k[ki(j, bi, hk) + e]);
          p[j] = scale * dot;
          mx = std::max(mx, p[j]);
        }
        if (mx == -kInf) continue;  // sees nothing: out, lse, gradients stay 0 / -inf
        double sum = 0.0;
        for (int64_t j = 0; j < S; j++)
          if (vis[j]) sum += std::exp(p[j] - mx);
        r.lse[static_cast<std::size_t>((bi * HQ + h) * S + i)] = mx + std::log(sum);
        double dsum = 0.0;  // D = dO . O
        for (int64_t j = 0; j < S; j++) {
          p[j] = vis[j] ? std::exp(p[j] - mx) / sum : 0.0;
          if (p[j] == 0.0) continue;
          for (int64_t e = 0; e < D; e++) r.out[qi(i, bi, h) + e] += p[j] * v[ki(j, bi, hk) + e];
        }
        for (int64_t e = 0; e < D; e++) dsum += double(dout[qi(i, bi, h) + e]) * r.out[qi(i, bi, h) + e];
        for (int64_t j = 0; j < S; j++) {
          if (!vis[j]) continue;
          double g = 0.0;
          for (int64_t e = 0; e < D; e++) g += double(dout[qi(i, bi, h) + e]) * double(v[ki(j, bi, hk) + e]);
          dp[j] = p[j] * (g - dsum);  // dS
          for (int64_t e = 0; e < D; e++) {
            r.dv[ki(j, bi, hk) + e] += p[j] * dout[qi(i, bi, h) + e];
            r.dq[qi(i, bi, h) + e] += scale * dp[j] * k[ki(j, bi, hk) + e];
            r.dk[ki(j, bi, hk) + e] += scale * dp[j] * q[qi(i, bi, h) + e];
          }
        }
      }
    }
  return r;
}

struct Tol {
  double out_max, out_rms, grad_max, grad_rms, lse_abs;
};
Tol tol_of(DType t) {
  if (t == DType::BF16) return {2e-2, 1e-2, 3e-2, 1.5e-2, 1e-3};
  if (t == DType::F16) return {5e-3, 2.5e-3, 8e-3, 4e-3, 1e-3};
  return {1e-4, 2e-5, 1e-4, 2e-5, 1e-4};
}

// got against ref: relative to max |ref| and rms(ref); an all-zero reference must be matched exactly.
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref,
                  double max_tol, double rms_tol) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double max_ref = 0, max_diff = 0, ss_ref = 0, ss_diff = 0;
  for (std::size_t i = 0; i < ref.size(); i++) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << ": element " << i << " is " << got[i];
    const double diff = std::abs(double(got[i]) - ref[i]);
    max_ref = std::max(max_ref, std::abs(ref[i]));
    max_diff = std::max(max_diff, diff);
    ss_ref += ref[i] * ref[i];
    ss_diff += diff * diff;
  }
  if (max_ref == 0.0) {
    EXPECT_EQ(max_diff, 0.0) << what << ": every reference value is 0";
    return;
  }
  EXPECT_LT(max_diff / max_ref, max_tol) << what << ": max |diff| / max |ref|";
  EXPECT_LT(std::sqrt(ss_diff / ss_ref), rms_tol) << what << ": rms(diff) / rms(ref)";
}

// Rows that see nothing: -inf exactly, and their out / dq rows exactly 0 (checked by expect_close's
// zero reference only when the whole tensor is empty, so per row here).
void expect_lse(const std::string& what, const std::vector<float>& got, const std::vector<double>& ref,
                double tol, const Case& c, const std::vector<float>& out, const std::vector<float>& dq) {
  ASSERT_EQ(got.size(), ref.size());
  for (std::size_t r = 0; r < ref.size(); r++) {
    if (ref[r] == -kInf) {
      EXPECT_TRUE(std::isinf(got[r]) && got[r] < 0)
          << what << ": lse of row " << r << " (sees no key) is " << got[r];
      const int64_t bh = static_cast<int64_t>(r) / c.s,
                    i = static_cast<int64_t>(r) % c.s;  // bh = bi * hq + h
      for (int64_t e = 0; e < c.d; e++) {
        const std::size_t at = static_cast<std::size_t>((i * c.b * c.hq + bh) * c.d + e);
        ASSERT_EQ(out[at], 0.0f) << what << ": out of a row that sees no key";
        ASSERT_EQ(dq[at], 0.0f) << what << ": dq of a row that sees no key";
      }
    } else {
      EXPECT_NEAR(got[r], ref[r], tol) << what << ": lse of row " << r;
    }
  }
}

std::vector<float> host(const Tensor& t) { return t.to(Device::cpu()).to_float_vector(); }

const char* path_name(AttentionPath p) { return p == AttentionPath::Plain ? "plain" : "flash"; }

// Restores the flash path however a test ends.
struct PathGuard {
  explicit PathGuard(AttentionPath p) { kernels::set_attention_path(p); }
  ~PathGuard() { kernels::set_attention_path(AttentionPath::Flash); }
};

// Runs one case on both paths against the reference.
void run_case(const Case& c) {
  const int64_t S = c.S ? c.S : c.s, stride = S + 3;
  const std::vector<int32_t> docs = doc_start_of(c, stride);
  const Shape qs{c.s, c.b, c.hq, c.d}, ks{c.s, c.b, c.hkv, c.d};
  const uint32_t seed = static_cast<uint32_t>(std::hash<std::string>{}(c.name));
  const std::vector<float> q = rand_vec(shape_numel(qs), seed, -2, 2, c.dtype);
  const std::vector<float> k = rand_vec(shape_numel(ks), seed + 1, -2, 2, c.dtype);
  const std::vector<float> v = rand_vec(shape_numel(ks), seed + 2, -1, 1, c.dtype);
  const std::vector<float> dout = rand_vec(shape_numel(qs), seed + 3, -1, 1, c.dtype);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  const Reference ref = reference(c, docs, stride, scale, q, k, v, dout);

  const Device dev = Device::cuda(0);
  auto up = [&](const std::vector<float>& x, const Shape& sh) {
    return Tensor::from_vector(x, sh).to(c.dtype).to(dev);
  };
  const Tensor tq = up(q, qs), tk = up(k, ks), tv = up(v, ks), tdo = up(dout, qs);
  Tensor doc_t;
  AttentionBounds mask;
  mask.causal = c.causal;
  mask.window = c.window;
  mask.q_pos0 = c.q_pos0;
  mask.k_pos0 = c.k_pos0;
  if (!docs.empty()) {
    doc_t = Tensor::from_vector(docs, {c.b, stride}).to(dev);
    mask.doc_start = static_cast<const int32_t*>(doc_t.data_ptr());
    mask.doc_stride = stride;
  }
  const Tol tol = tol_of(c.dtype);
  for (AttentionPath path : {AttentionPath::Flash, AttentionPath::Plain}) {
    SCOPED_TRACE(c.name + " " + std::string(dtype_name(c.dtype)) + " " + path_name(path));
    PathGuard guard(path);
    Tensor out = Tensor::empty(qs, c.dtype, dev), lse = Tensor::empty({c.b, c.hq, c.s}, DType::F32, dev);
    Tensor dq = Tensor::empty(qs, c.dtype, dev), dk = Tensor::empty(ks, c.dtype, dev),
           dv = Tensor::empty(ks, c.dtype, dev);
    cuda::attention_forward(tq, tk, tv, out, lse, mask, static_cast<float>(scale), Stream{});
    cuda::attention_backward(tdo, tq, tk, tv, out, lse, dq, dk, dv, mask, static_cast<float>(scale),
                             Stream{});
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> h_out = host(out), h_dq = host(dq);
    expect_close("out", h_out, ref.out, tol.out_max, tol.out_rms);
    expect_lse("lse", host(lse), ref.lse, tol.lse_abs, c, h_out, h_dq);
    expect_close("dq", h_dq, ref.dq, tol.grad_max, tol.grad_rms);
    expect_close("dk", host(dk), ref.dk, tol.grad_max, tol.grad_rms);
    expect_close("dv", host(dv), ref.dv, tol.grad_max, tol.grad_rms);
  }
}

// The mask shapes, for one dtype and head dimension (GQA for d = 64 and 128, MHA otherwise).
std::vector<Case> cases(DType dtype, int64_t d) {
  const int64_t hq = d == 64 || d == 128 ? 4 : 2, hkv = 2;
  std::vector<Case> out;
  const std::string tag = "d" + std::to_string(d);
  // Packed documents, different per batch element, with a one-token document and one longer than
  // every tile.
  Case docs{"docs_" + tag, 300, 2, hq, hkv, d, dtype};
  docs.docs = {{70, 1, 100, 45, 84}, {150, 150}};
  out.push_back(docs);
  // A sliding window, shorter than a tile and not a multiple of one.
  Case window{"window_" + tag, 300, 2, hq, hkv, d, dtype};
  window.window = 37;
  out.push_back(window);
  // Both (a window longer than a tile), a 1-token sequence end.
  Case both{"docs_window_" + tag, 257, 2, hq, hkv, d, dtype};
  both.docs = {{100, 156, 1}, {3, 254}};
  both.window = 90;
  out.push_back(both);
  // A longer sequence: many tiles skipped on both sides of each query tile (d = 64 only, to keep the
  // host reference within the GPU check's time for this binary).
  if (d == 64) {
    Case long_seq{"long_docs_window_" + tag, 1000, 1, hq, hkv, d, dtype};
    long_seq.docs = {{300, 450, 250}};
    long_seq.window = 100;
    out.push_back(long_seq);
  }
  // Context parallelism's blocks of 128 rows of a 384-token packed sequence with a window.
  const std::vector<std::vector<int64_t>> cp_docs = {{200, 184}, {60, 60, 264}};
  for (auto [q0, k0] : {std::pair<int64_t, int64_t>{256, 128}, {128, 128}, {256, 0}}) {
    Case cp{"cp_q" + std::to_string(q0) + "_k" + std::to_string(k0) + "_" + tag, 128, 2, hq, hkv, d, dtype};
    cp.S = 384;
    cp.docs = cp_docs;
    cp.window = q0 == 256 && k0 == 0 ? 0 : 150;
    cp.q_pos0 = q0;
    cp.k_pos0 = k0;
    out.push_back(cp);
  }
  // Causal blocks with no documents or window: wholly below the diagonal, and cut by it at an
  // offset that is no multiple of a tile (key j visible to query i iff j <= i + 100).
  Case below{"cp_causal_q128_k0_" + tag, 128, 2, hq, hkv, d, dtype};
  below.q_pos0 = 128;
  out.push_back(below);
  Case cut{"cp_causal_q200_k100_" + tag, 160, 2, hq, hkv, d, dtype};
  cut.q_pos0 = 200;
  cut.k_pos0 = 100;
  out.push_back(cut);
  return out;
}

TEST(AttentionMasks, Fp32Kernel) {
  REQUIRE_GPU();
  for (int64_t d : {64, 96})
    for (const Case& c : cases(DType::F32, d)) run_case(c);
}

TEST(AttentionMasks, TensorCoreKernelsBf16) {
  REQUIRE_GPU();
  for (int64_t d : {64, 128})
    for (const Case& c : cases(DType::BF16, d)) run_case(c);
}

TEST(AttentionMasks, TensorCoreKernelsF16) {
  REQUIRE_GPU();
  for (int64_t d : {64, 128})
    for (const Case& c : cases(DType::F16, d)) run_case(c);
}

// 16-bit tensors with a head dim the tensor-core kernels do not take: the fp32 kernel on widened
// copies.
TEST(AttentionMasks, WidenedFallbackBf16) {
  REQUIRE_GPU();
  for (const Case& c : cases(DType::BF16, 32)) run_case(c);
}

// A query block above the key block (context parallelism's upper blocks) and, with documents, a
// query block whose documents all start after the key block: no row sees a key. K and V are NaN,
// so a kernel that multiplied a single tile of them would return NaN instead of zeros.
TEST(AttentionMasks, EmptyBlocksSkipEveryTile) {
  REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  for (DType dtype : {DType::F32, DType::BF16, DType::F16})
    for (int64_t d : {64, 128}) {
      const int64_t s = 128, b = 2, hq = 4, hkv = 2, S = 512, stride = S;
      std::vector<int32_t> docs(static_cast<std::size_t>(b * stride));
      for (int64_t bi = 0; bi < b; bi++)
        for (int64_t p = 0; p < S; p++) docs[static_cast<std::size_t>(bi * stride + p)] = p < 300 ? 0 : 300;
      const Tensor doc_t = Tensor::from_vector(docs, {b, stride}).to(dev);
      const Shape qs{s, b, hq, d}, ks{s, b, hkv, d};
      const float nan = std::numeric_limits<float>::quiet_NaN();
      const Tensor q = Tensor::from_vector(rand_vec(shape_numel(qs), 5, -2, 2, dtype), qs).to(dtype).to(dev);
      const Tensor dout =
          Tensor::from_vector(rand_vec(shape_numel(qs), 6, -1, 1, dtype), qs).to(dtype).to(dev);
      const Tensor k = Tensor::full(ks, nan, dtype).to(dev), v = Tensor::full(ks, nan, dtype).to(dev);
      AttentionBounds above;  // causal, queries 0..127, keys 128..255
      above.k_pos0 = 128;
      AttentionBounds other_doc;  // queries 384..511 (document from 300), keys 128..255
      other_doc.q_pos0 = 384;
      other_doc.k_pos0 = 128;
      other_doc.doc_start = static_cast<const int32_t*>(doc_t.data_ptr());
      other_doc.doc_stride = stride;
      AttentionBounds out_of_window;  // queries 384..511, keys 0..127, window 200
      out_of_window.q_pos0 = 384;
      out_of_window.window = 200;
      for (const AttentionBounds& mask : {above, other_doc, out_of_window}) {
        SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << " d " << d << " q_pos0 " << mask.q_pos0
                                          << " k_pos0 " << mask.k_pos0 << " window " << mask.window);
        Tensor out = Tensor::empty(qs, dtype, dev), lse = Tensor::empty({b, hq, s}, DType::F32, dev);
        Tensor dq = Tensor::empty(qs, dtype, dev), dk = Tensor::empty(ks, dtype, dev),
               dv = Tensor::empty(ks, dtype, dev);
        cuda::attention_forward(q, k, v, out, lse, mask, 0.125f, Stream{});
        cuda::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, mask, 0.125f, Stream{});
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        for (float x : host(out)) ASSERT_EQ(x, 0.0f) << "out";
        for (float x : host(lse)) ASSERT_TRUE(std::isinf(x) && x < 0) << "lse " << x;
        for (float x : host(dq)) ASSERT_EQ(x, 0.0f) << "dq";
        for (float x : host(dk)) ASSERT_EQ(x, 0.0f) << "dk";
        for (float x : host(dv)) ASSERT_EQ(x, 0.0f) << "dv";
      }
    }
}

// The masked backward stays free of atomics: bit-identical gradients from run to run (tensor-core
// and fp32 kernels, documents and a window).
TEST(AttentionMasks, MaskedBackwardIsDeterministic) {
  REQUIRE_GPU();
  const Device dev = Device::cuda(0);
  for (DType dtype : {DType::BF16, DType::F32}) {
    const int64_t s = 700, b = 2, hq = 4, hkv = 2, d = 64;
    std::vector<int32_t> docs(static_cast<std::size_t>(b * s));
    for (int64_t p = 0; p < b * s; p++)
      docs[static_cast<std::size_t>(p)] = static_cast<int32_t>((p % s) / 250 * 250);
    const Tensor doc_t = Tensor::from_vector(docs, {b, s}).to(dev);
    AttentionBounds mask;
    mask.window = 180;
    mask.doc_start = static_cast<const int32_t*>(doc_t.data_ptr());
    mask.doc_stride = s;
    const Shape qs{s, b, hq, d}, ks{s, b, hkv, d};
    auto up = [&](const Shape& sh, uint32_t seed) {
      return Tensor::from_vector(rand_vec(shape_numel(sh), seed, -2, 2, dtype), sh).to(dtype).to(dev);
    };
    const Tensor q = up(qs, 11), k = up(ks, 12), v = up(ks, 13), dout = up(qs, 14);
    Tensor out = Tensor::empty(qs, dtype, dev), lse = Tensor::empty({b, hq, s}, DType::F32, dev);
    cuda::attention_forward(q, k, v, out, lse, mask, 0.125f, Stream{});
    std::vector<std::vector<float>> first;
    for (int run = 0; run < 2; run++) {
      Tensor dq = Tensor::empty(qs, dtype, dev), dk = Tensor::empty(ks, dtype, dev),
             dv = Tensor::empty(ks, dtype, dev);
      cuda::attention_backward(dout, q, k, v, out, lse, dq, dk, dv, mask, 0.125f, Stream{});
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<std::vector<float>> got = {host(dq), host(dk), host(dv)};
      if (run == 0)
        first = got;
      else
        for (std::size_t t = 0; t < got.size(); t++)
          EXPECT_EQ(0, std::memcmp(got[t].data(), first[t].data(), got[t].size() * sizeof(float)))
              << dtype_name(dtype) << " gradient " << t << " differs between two runs";
    }
  }
}

// A window or documents without causal masking means nothing (attention_mask.hpp): every launcher
// refuses it before any CUDA call, so this runs without a GPU.
TEST(AttentionMasks, RejectsWindowWithoutCausal) {
  AttentionBounds bad;
  bad.causal = false;
  bad.window = 16;
  const kernels::AttentionShape sh{64, 1, 2, 2, 64};
  EXPECT_THROW(
      kernels::attention_forward(nullptr, nullptr, nullptr, nullptr, nullptr, sh, bad, 0.1f, nullptr), Error);
  EXPECT_THROW(kernels::flash_attention_forward_bf16(nullptr, nullptr, nullptr, nullptr, nullptr, sh, bad,
                                                     0.1f, nullptr),
               Error);
  EXPECT_THROW(kernels::flash_attention_backward_f16(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                     nullptr, nullptr, nullptr, sh, bad, 0.1f, nullptr),
               Error);
  EXPECT_THROW(kernels::attention_plain_forward(nullptr, nullptr, nullptr, DType::BF16, nullptr, nullptr, sh,
                                                bad, 0.1f, nullptr),
               Error);
  AttentionBounds negative;
  negative.window = -3;
  EXPECT_THROW(kernels::attention_backward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                           nullptr, nullptr, sh, negative, 0.1f, nullptr),
               Error);
}

}  // namespace
}  // namespace parallel
