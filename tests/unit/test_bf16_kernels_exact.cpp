// The CPU's bf16 element-wise and norm kernels read and write bf16 inside their loops
// (kernels/cpu/bf16_io.hpp). Their contract is exact: a bf16 op gives bitwise the result of the fp32
// op on the widened inputs, rounded to bf16 (for the fused residual norm: with the stored sum
// rounded first, as ops.hpp says). Every case here compares bits, on sizes with vector tails and
// more than one thread chunk, with NaN, infinities, subnormals and rounding ties among the inputs.
// The narrowing's NaN branch only shows on NaNs whose low 16 bits would carry into the kept ones
// (arithmetic on bf16 inputs makes none): the last case feeds such payloads to the block conversion
// and to AdamW's bf16 write-back.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "parallel/dtype.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

using namespace parallel;

namespace {

constexpr DType kF32 = DType::F32;
constexpr DType kBF16 = DType::BF16;

// bf16 values (stored as bf16) from a uniform draw, with special values at fixed places.
Tensor bf16_input(const Shape& shape, uint32_t seed, float lo = -3.0f, float hi = 3.0f, bool special = true) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(shape_numel(shape)));
  for (float& x : v) x = dist(gen);
  if (special && v.size() > 64) {
    v[3] = std::numeric_limits<float>::quiet_NaN();
    v[5] = std::numeric_limits<float>::infinity();
    v[7] = -std::numeric_limits<float>::infinity();
    v[11] = 1e-40f;                             // subnormal
    v[13] = std::bit_cast<float>(0x3f808000u);  // ties once scaled or added to
    v[v.size() - 1] = -std::numeric_limits<float>::quiet_NaN();
    v[v.size() - 2] = 3.0e38f;  // overflows through gelu's cube
  }
  return Tensor::from_vector(v, shape).to(kBF16);
}

Tensor widen(const Tensor& t) { return t.to(kF32); }

// Bitwise equality of two tensors of one dtype, with the first differing element on failure.
void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.nbytes(), want.nbytes()) << what;
  const auto* a = static_cast<const unsigned char*>(got.data_ptr());
  const auto* b = static_cast<const unsigned char*>(want.data_ptr());
  if (std::memcmp(a, b, got.nbytes()) == 0) return;
  const size_t es = dtype_size(got.dtype());
  for (size_t i = 0; i < got.nbytes(); i += es) {
    if (std::memcmp(a + i, b + i, es) != 0) {
      uint32_t x = 0, y = 0;
      std::memcpy(&x, a + i, es);
      std::memcpy(&y, b + i, es);
      ADD_FAILURE() << what << ": element " << i / es << " has bits 0x" << std::hex << x << ", expected 0x"
                    << y;
      return;
    }
  }
}

// Three thread chunks (16K elements each) and a tail that no vector width divides.
constexpr int64_t kFlat = 3 * 16384 + 37;

TEST(Bf16KernelsExact, Gelu) {
  Tensor x = bf16_input({kFlat}, 1), dy = bf16_input({kFlat}, 2);
  Tensor y = Tensor::zeros({kFlat}, kBF16), dx = Tensor::zeros({kFlat}, kBF16);
  ops::gelu_forward(x, y);
  ops::gelu_backward(dy, x, dx);
  Tensor y32 = Tensor::zeros({kFlat}, kF32), dx32 = Tensor::zeros({kFlat}, kF32);
  ops::gelu_forward(widen(x), y32);
  ops::gelu_backward(widen(dy), widen(x), dx32);
  expect_same_bits(y, y32.to(kBF16), "gelu_forward");
  expect_same_bits(dx, dx32.to(kBF16), "gelu_backward");
}

TEST(Bf16KernelsExact, AddScaleDropout) {
  Tensor a = bf16_input({kFlat}, 3), b = bf16_input({kFlat}, 4);
  Tensor sum = Tensor::zeros({kFlat}, kBF16), sum32 = Tensor::zeros({kFlat}, kF32);
  ops::add(a, b, sum);
  ops::add(widen(a), widen(b), sum32);
  expect_same_bits(sum, sum32.to(kBF16), "add");
  Tensor acc = a.clone(), acc32 = widen(a);
  ops::add_(acc, b);
  ops::add_(acc32, widen(b));
  expect_same_bits(acc, acc32.to(kBF16), "add_");
  ops::scale_(acc, 0.37f);
  Tensor rounded = acc32.to(kBF16).to(kF32);
  ops::scale_(rounded, 0.37f);
  expect_same_bits(acc, rounded.to(kBF16), "scale_");
  for (float p : {0.0f, 0.1f}) {
    const std::string at = " p " + std::to_string(p);
    Tensor d = Tensor::zeros({kFlat}, kBF16), d32 = Tensor::zeros({kFlat}, kF32);
    ops::dropout_forward(a, d, p, 5, 11);
    ops::dropout_forward(widen(a), d32, p, 5, 11);
    expect_same_bits(d, d32.to(kBF16), "dropout_forward" + at);
    Tensor o = Tensor::zeros({kFlat}, kBF16), o32 = Tensor::zeros({kFlat}, kF32);
    ops::dropout_add(a, b, o, ops::DropoutSpec{p, 5, 11});
    ops::dropout_add(widen(a), widen(b), o32, ops::DropoutSpec{p, 5, 11});
    expect_same_bits(o, o32.to(kBF16), "dropout_add" + at);
    Tensor in_place = b.clone();  // out aliases the residual
    ops::dropout_add(a, in_place, in_place, ops::DropoutSpec{p, 5, 11});
    expect_same_bits(in_place, o32.to(kBF16), "dropout_add in place" + at);
  }
}

TEST(Bf16KernelsExact, BiasAndSwiglu) {
  for (int64_t h : {int64_t{389}, int64_t{1536}}) {
    const int64_t rows = 67;
    const std::string at = " h " + std::to_string(h);
    Tensor y = bf16_input({rows, h}, 5), bias = bf16_input({h}, 6, -1, 1, false);
    Tensor y32 = widen(y);
    ops::add_bias(y, bias);
    ops::add_bias(y32, widen(bias));
    expect_same_bits(y, y32.to(kBF16), "add_bias" + at);
    Tensor db = Tensor::full({h}, 0.25, kF32), db32 = Tensor::full({h}, 0.25, kF32);
    ops::bias_backward(y, db);
    ops::bias_backward(y.to(kF32), db32);
    expect_same_bits(db, db32, "bias_backward" + at);
    Tensor x = bf16_input({rows, 2 * h}, 7, -5, 5), dy = bf16_input({rows, h}, 8);
    Tensor s = Tensor::zeros({rows, h}, kBF16), s32 = Tensor::zeros({rows, h}, kF32);
    ops::swiglu_forward(x, s);
    ops::swiglu_forward(widen(x), s32);
    expect_same_bits(s, s32.to(kBF16), "swiglu_forward" + at);
    Tensor dx = Tensor::zeros({rows, 2 * h}, kBF16), dx32 = Tensor::zeros({rows, 2 * h}, kF32);
    ops::swiglu_backward(dy, x, dx);
    ops::swiglu_backward(widen(dy), widen(x), dx32);
    expect_same_bits(dx, dx32.to(kBF16), "swiglu_backward" + at);
  }
}

// LayerNorm (bias defined) and RMSNorm, plain and fused with the residual add and dropout.
TEST(Bf16KernelsExact, Norms) {
  for (int64_t h : {int64_t{389}, int64_t{768}}) {
    for (bool ln : {true, false}) {
      const int64_t rows = 130;  // rows * h > 2^15: the threaded path
      const std::string at = std::string(ln ? " layernorm" : " rmsnorm") + " h " + std::to_string(h);
      Tensor x = bf16_input({rows, h}, 10, -2, 2), w = bf16_input({h}, 11, 0.5, 1.5, false);
      Tensor b = ln ? bf16_input({h}, 12, -0.5, 0.5, false) : Tensor{};
      Tensor w32 = widen(w), b32 = ln ? widen(b) : Tensor{};
      Tensor y = Tensor::zeros({rows, h}, kBF16), y32 = Tensor::zeros({rows, h}, kF32);
      Tensor m = ln ? Tensor::zeros({rows}, kF32) : Tensor{},
             m32 = ln ? Tensor::zeros({rows}, kF32) : Tensor{};
      Tensor r = Tensor::zeros({rows}, kF32), r32 = Tensor::zeros({rows}, kF32);
      Tensor dy = bf16_input({rows, h}, 13, -1, 1);
      Tensor dx = Tensor::zeros({rows, h}, kBF16), dx32 = Tensor::zeros({rows, h}, kF32);
      Tensor dw = Tensor::zeros({h}, kF32), dw32 = Tensor::zeros({h}, kF32);
      Tensor db = ln ? Tensor::zeros({h}, kF32) : Tensor{}, db32 = ln ? Tensor::zeros({h}, kF32) : Tensor{};
      if (ln) {
        ops::layernorm_forward(x, w, b, y, m, r, 1e-5f);
        ops::layernorm_forward(widen(x), w32, b32, y32, m32, r32, 1e-5f);
        ops::layernorm_backward(dy, x, w, m, r, dx, dw, db);
        ops::layernorm_backward(widen(dy), widen(x), w32, m32, r32, dx32, dw32, db32);
        expect_same_bits(m, m32, "mean" + at);
        expect_same_bits(db, db32, "dbias" + at);
      } else {
        ops::rmsnorm_forward(x, w, y, r, 1e-6f);
        ops::rmsnorm_forward(widen(x), w32, y32, r32, 1e-6f);
        ops::rmsnorm_backward(dy, x, w, r, dx, dw);
        ops::rmsnorm_backward(widen(dy), widen(x), w32, r32, dx32, dw32);
      }
      expect_same_bits(y, y32.to(kBF16), "y" + at);
      expect_same_bits(r, r32, "rstd" + at);
      expect_same_bits(dx, dx32.to(kBF16), "dx" + at);
      expect_same_bits(dw, dw32, "dweight" + at);

      for (float p : {0.0f, 0.1f}) {
        const std::string fat = at + " fused p " + std::to_string(p);
        const ops::DropoutSpec drop{p, 3, 17};
        Tensor res = bf16_input({rows, h}, 14, -2, 2, false), br = bf16_input({rows, h}, 15, -2, 2, false);
        Tensor sum = Tensor::zeros({rows, h}, kBF16);
        ops::residual_norm_forward(res, br, drop, w, b, sum, y, m, r, 1e-5f);
        // The reference: the fp32 sum rounded to bf16 (the stored sum), then the fp32 norm of it.
        Tensor sum32 = Tensor::zeros({rows, h}, kF32);
        ops::dropout_add(widen(br), widen(res), sum32, drop);
        Tensor stored = sum32.to(kBF16);
        expect_same_bits(sum, stored, "sum" + fat);
        if (ln)
          ops::layernorm_forward(widen(stored), w32, b32, y32, m32, r32, 1e-5f);
        else
          ops::rmsnorm_forward(widen(stored), w32, y32, r32, 1e-5f);
        expect_same_bits(y, y32.to(kBF16), "y" + fat);
        expect_same_bits(r, r32, "rstd" + fat);
        // Backward with the residual gradient added in place (dx aliases dresidual) and, for p > 0,
        // the branch gradient; both from the fp32 gradient, each rounded once.
        Tensor dres = bf16_input({rows, h}, 16, -1, 1, false);
        Tensor dres32 = widen(dres);
        Tensor dbr = p > 0 ? Tensor::zeros({rows, h}, kBF16) : Tensor{};
        Tensor dbr32 = p > 0 ? Tensor::zeros({rows, h}, kF32) : Tensor{};
        dw.zero_();
        dw32.zero_();
        if (ln) {
          db.zero_();
          db32.zero_();
        }
        ops::norm_backward_residual(dy, dres, sum, w, m, r, dres, dw, db, drop, dbr);
        ops::norm_backward_residual(widen(dy), dres32, widen(sum), w32, m32, r32, dres32, dw32, db32, drop,
                                    dbr32);
        expect_same_bits(dres, dres32.to(kBF16), "dx" + fat);
        expect_same_bits(dw, dw32, "dweight" + fat);
        if (p > 0) expect_same_bits(dbr, dbr32.to(kBF16), "dbranch" + fat);
      }
    }
  }
}

// Vocab-parallel cross-entropy's pieces on a rank holding columns [4000, 8100) of a 8090-word
// vocabulary (the last 10 local columns are padding), targets inside, outside and at the edges.
TEST(Bf16KernelsExact, CrossEntropy) {
  const int64_t n = 9, v = 4100, start = 4000, vocab = 8090;
  Tensor logits = bf16_input({n, v}, 30, -6, 6, false);
  Tensor targets =
      Tensor::from_vector(std::vector<int32_t>{4000, 8089, 7, 4555, 8099, 6000, 4001, 8088, 5000}, {n});
  Tensor grad = Tensor::full({n}, 1.0 / 9, kF32);
  Tensor l32 = widen(logits);
  Tensor mx = Tensor::zeros({n}, kF32), tl = Tensor::zeros({n}, kF32), se = Tensor::zeros({n}, kF32);
  Tensor mx32 = Tensor::zeros({n}, kF32), tl32 = Tensor::zeros({n}, kF32), se32 = Tensor::zeros({n}, kF32);
  ops::cross_entropy_local_stats(logits, targets, start, vocab, mx, tl);
  ops::cross_entropy_local_stats(l32, targets, start, vocab, mx32, tl32);
  expect_same_bits(mx, mx32, "row_max");
  expect_same_bits(tl, tl32, "target_logit");
  ops::cross_entropy_sum_exp(logits, mx, start, vocab, se);
  ops::cross_entropy_sum_exp(l32, mx32, start, vocab, se32);
  expect_same_bits(se, se32, "sum_exp");
  Tensor d = Tensor::full({n, v}, 1.0, kBF16), d32 = Tensor::zeros({n, v}, kF32);
  ops::cross_entropy_backward(logits, targets, mx, se, grad, start, vocab, d);
  ops::cross_entropy_backward(l32, targets, mx32, se32, grad, start, vocab, d32);
  expect_same_bits(d, d32.to(kBF16), "dlogits");
}

// fp32 patterns that plain rounding would turn into inf, -0 or 0 instead of a quiet NaN, next to
// ties and the largest finite values, through Tensor::to (dtype_convert.cpp) and through AdamW's
// bf16 model copy (the update multiplies by the decay and adds: NaN payloads survive quietened).
TEST(Bf16KernelsExact, NaNPayloadsAndAdamWCopy) {
  const std::vector<uint32_t> bits = {0x7f800001u, 0x7fbfffffu, 0x7fffffffu, 0xffffffffu, 0xff800001u,
                                      0x7f7fffffu, 0xff7fffffu, 0x3f808000u, 0x3f818000u, 0x00008000u,
                                      0x7f800000u, 0x80000000u, 0x3f800001u, 0x7fc00000u, 0x7fc0ffffu};
  std::vector<float> v;
  for (int rep = 0; rep < 37; rep++)  // a length that leaves vector tails
    for (uint32_t b : bits) v.push_back(std::bit_cast<float>(b));
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor x = Tensor::from_vector(v, {n});
  Tensor narrowed = x.to(kBF16);
  const auto* got = static_cast<const uint16_t*>(narrowed.data_ptr());
  for (int64_t i = 0; i < n; i++)
    ASSERT_EQ(got[i], float_to_bf16(v[static_cast<size_t>(i)]).bits)
        << "element " << i << " bits 0x" << std::hex << bits[static_cast<size_t>(i) % bits.size()];
  Tensor p = x.clone(), g = Tensor::full({n}, 1e-3, kF32), m = Tensor::zeros({n}, kF32),
         var = Tensor::zeros({n}, kF32);
  Tensor copy = Tensor::zeros({n}, kBF16);
  ops::AdamWStep step;
  step.weight_decay = 0.1;
  ops::adamw_update_(p, g, m, var, copy, step);
  const auto* c = static_cast<const uint16_t*>(copy.data_ptr());
  const float* updated = p.data<float>();
  for (int64_t i = 0; i < n; i++)
    ASSERT_EQ(c[i], float_to_bf16(updated[i]).bits)
        << "element " << i << " bits 0x" << std::hex << std::bit_cast<uint32_t>(updated[i]);
}

}  // namespace
