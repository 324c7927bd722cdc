// The AVX2/FMA GEMM (kernels/cpu/gemm_avx2.hpp) against a double-precision reference over odd
// shapes: every m, n, k edge of the 6 x 16 micro-tile, several k blocks and column panels, both
// transposes, alpha, beta, bias, and every dtype of a, b, c and the bias.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "../../kernels/cpu/gemm_avx2.hpp"
#include "parallel/dtype.hpp"

namespace parallel {
namespace {

using cpu::GemmAvx2Problem;

// n values stored as `dt`, and the fp32 values they hold (what the GEMM reads).
struct Buffer {
  std::vector<unsigned char> bytes;
  std::vector<float> values;
};

Buffer random_buffer(int64_t n, DType dt, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Buffer b;
  b.bytes.resize(static_cast<size_t>(n) * dtype_size(dt));
  b.values.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; i++) {
    const float v = dist(gen);
    if (dt == DType::BF16) {
      const bf16 h = float_to_bf16(v);
      std::memcpy(b.bytes.data() + 2 * i, &h.bits, 2);
      b.values[i] = bf16_to_float(h);
    } else if (dt == DType::F16) {
      const f16 h = float_to_f16(v);
      std::memcpy(b.bytes.data() + 2 * i, &h.bits, 2);
      b.values[i] = f16_to_float(h);
    } else {
      std::memcpy(b.bytes.data() + 4 * i, &v, 4);
      b.values[i] = v;
    }
  }
  return b;
}

float read(const std::vector<unsigned char>& bytes, DType dt, int64_t i) {
  uint16_t h;
  if (dt == DType::BF16) {
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return bf16_to_float(bf16{h});
  }
  if (dt == DType::F16) {
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    return f16_to_float(f16{h});
  }
  float f;
  std::memcpy(&f, bytes.data() + 4 * i, 4);
  return f;
}

struct Case {
  int64_t m, n, k;
  bool ta, tb;
  DType a, b, c;
  float alpha, beta;
  bool bias;
  DType bias_t;
};

// Runs the case and checks every element of c against the double-precision product of the values
// the operands hold: fp32 accumulation error (a few 1e-7 of sum |terms|) plus, for a 16-bit c, half
// an ulp of the result's format.
void check(const Case& t) {
  const Buffer a = random_buffer(t.m * t.k, t.a, 1), b = random_buffer(t.k * t.n, t.b, 2),
               bias = random_buffer(t.n, t.bias_t, 3);
  Buffer c = random_buffer(t.m * t.n, t.c, 4);
  const std::vector<float> c_old = c.values;
  GemmAvx2Problem p;
  p.m = t.m, p.n = t.n, p.k = t.k;
  p.a = a.bytes.data(), p.a_type = t.a, p.trans_a = t.ta;
  p.b = b.bytes.data(), p.b_type = t.b, p.trans_b = t.tb;
  p.c = c.bytes.data(), p.c_type = t.c;
  p.alpha = t.alpha, p.beta = t.beta;
  if (t.bias) p.bias = bias.bytes.data(), p.bias_type = t.bias_t;
  ASSERT_TRUE(cpu::gemm_avx2_can_implement(p));
  cpu::gemm_avx2_run(p);
  const double half_ulp = t.c == DType::BF16  ? std::ldexp(1.0, -8)
                          : t.c == DType::F16 ? std::ldexp(1.0, -11)
                                              : 0.0;
  int64_t bad = 0;
  for (int64_t i = 0; i < t.m; i++)
    for (int64_t j = 0; j < t.n; j++) {
      double ref = 0.0, mag = 0.0;
      for (int64_t l = 0; l < t.k; l++) {
        const double x = a.values[t.ta ? l * t.m + i : i * t.k + l],
                     y = b.values[t.tb ? j * t.k + l : l * t.n + j];
        ref += x * y;
        mag += std::fabs(x * y);
      }
      ref *= t.alpha;
      mag *= std::fabs(t.alpha);
      if (t.beta != 0.0f) {
        ref += static_cast<double>(t.beta) * c_old[i * t.n + j];
        mag += std::fabs(static_cast<double>(t.beta) * c_old[i * t.n + j]);
      }
      if (t.bias) {
        ref += bias.values[j];
        mag += std::fabs(bias.values[j]);
      }
      const double got = read(c.bytes, t.c, i * t.n + j);
      const double tol = 4e-7 * mag * (1.0 + std::log2(static_cast<double>(t.k) + 1.0)) +
                         half_ulp * (std::fabs(ref) + 4e-7 * mag) +
                         (t.c == DType::F16 ? std::ldexp(1.0, -25) : 0.0);
      if (!(std::fabs(got - ref) <= tol) && bad++ < 5)
        ADD_FAILURE() << "c[" << i << ", " << j << "] = " << got << ", reference " << ref << " (tolerance "
                      << tol << ") for m " << t.m << " n " << t.n << " k " << t.k << " ta " << t.ta << " tb "
                      << t.tb << " a " << dtype_name(t.a) << " b " << dtype_name(t.b) << " c "
                      << dtype_name(t.c) << " alpha " << t.alpha << " beta " << t.beta << " bias " << t.bias;
    }
  EXPECT_EQ(bad, 0);
}

bool have_cpu() {
  GemmAvx2Problem p;
  p.m = p.n = p.k = 1;
  return cpu::gemm_avx2_can_implement(p);
}

TEST(GemmAvx2, OddShapesEveryTransposeAndDtype) {
  if (!have_cpu()) GTEST_SKIP() << "no AVX2 + FMA + F16C on this CPU";
  const DType dts[] = {DType::F32, DType::BF16, DType::F16};
  const int64_t sizes[] = {1, 5, 6, 7, 16, 17, 33, 67};
  int64_t run = 0;
  for (const int64_t m : sizes)
    for (const int64_t n : sizes)
      for (const int64_t k : {int64_t{1}, int64_t{7}, int64_t{67}})
        for (int tr = 0; tr < 4; tr++) {
          // The dtypes and epilogue rotate with the shape, so every combination is met many times
          // without running all of them on every shape.
          const DType d = dts[run % 3], dc = dts[(run / 3) % 3];
          const float beta = (run / 9) % 2 == 0 ? 0.0f : 0.5f;
          const bool bias = (run / 2) % 3 == 0;
          check({m, n, k, (tr & 1) != 0, (tr & 2) != 0, d, dts[(run + 1) % 3], dc,
                 run % 5 == 0 ? -0.75f : 1.0f, beta, bias, dts[(run / 7) % 3]});
          run++;
        }
}

TEST(GemmAvx2, SeveralKBlocksAndColumnPanels) {
  if (!have_cpu()) GTEST_SKIP() << "no AVX2 + FMA + F16C on this CPU";
  // k = 600: three k blocks of 200; k = 1100: five of 220, over a 1000-wide panel.
  for (const DType d : {DType::F32, DType::BF16, DType::F16})
    for (int tr = 0; tr < 4; tr++) {
      check({37, 45, 600, (tr & 1) != 0, (tr & 2) != 0, d, d, d, 1.0f, tr == 1 ? 1.0f : 0.0f, tr == 2, d});
      check({13, 1000, 1100, (tr & 1) != 0, (tr & 2) != 0, d, d, d, 0.5f, tr == 3 ? 0.25f : 0.0f, tr == 0,
             DType::F32});
    }
}

// The loops' other edges: two column panels (n > 4096) of a 16-bit c accumulated over several
// k blocks in fp32 scratch and narrowed on the last; a thread's rows in uneven blocks of whole
// slivers (m = 400: 200 rows a thread, two blocks of 102 and 98); op(a) = a^T packed row by row of
// a, where the last k of a block stores exactly 6 floats per sliver (k = 520: blocks of 174 and 172).
TEST(GemmAvx2, WidePanelsUnevenRowBlocksAndTransposedA) {
  if (!have_cpu()) GTEST_SKIP() << "no AVX2 + FMA + F16C on this CPU";
  for (const DType d : {DType::F32, DType::BF16, DType::F16}) {
    check({7, 4200, 300, false, true, d, d, d, 1.0f, d == DType::F32 ? 0.0f : 0.5f, true, d});
    check({5, 4113, 70, true, false, d, d, DType::F32, 1.0f, 1.0f, false, d});
    for (int tr = 0; tr < 4; tr++)
      check({400, 37, 520, (tr & 1) != 0, (tr & 2) != 0, d, d, tr < 2 ? DType::F32 : d, 1.0f,
             tr == 1 ? 1.0f : 0.0f, tr == 3, DType::F32});
  }
}

// Many phases (a panel and a k block each) and few rows: a 4096-wide panel over 4 k blocks of 250,
// 5 rows in one row block, so one thread packs while the other waits on each phase's last
// slivers; an fp32 c adds each block to the last, a 16-bit c accumulates in fp32 scratch.
TEST(GemmAvx2, ManyPhasesFewRows) {
  if (!have_cpu()) GTEST_SKIP() << "no AVX2 + FMA + F16C on this CPU";
  for (const DType d : {DType::F32, DType::BF16, DType::F16})
    for (int tr = 0; tr < 4; tr++)
      check({5, 4096, 1000, (tr & 1) != 0, (tr & 2) != 0, d, d, d, 1.0f, tr == 1 ? 0.5f : 0.0f, tr != 1, d});
}

// A 16-bit c is the library's rounding (float_to_bf16 / float_to_f16) of the fp32 result the same
// GEMM writes into an fp32 c: one rounding, in the epilogue.
TEST(GemmAvx2, SixteenBitOutputIsTheRoundedFp32Output) {
  if (!have_cpu()) GTEST_SKIP() << "no AVX2 + FMA + F16C on this CPU";
  for (const DType dc : {DType::BF16, DType::F16}) {
    const int64_t m = 29, n = 53, k = 300;
    const Buffer a = random_buffer(m * k, DType::BF16, 5), b = random_buffer(k * n, DType::BF16, 6);
    std::vector<float> c32(static_cast<size_t>(m * n));
    std::vector<uint16_t> c16(static_cast<size_t>(m * n));
    GemmAvx2Problem p;
    p.m = m, p.n = n, p.k = k;
    p.a = a.bytes.data(), p.a_type = DType::BF16;
    p.b = b.bytes.data(), p.b_type = DType::BF16, p.trans_b = true;
    p.c = c32.data();
    cpu::gemm_avx2_run(p);
    p.c = c16.data(), p.c_type = dc;
    cpu::gemm_avx2_run(p);
    for (int64_t i = 0; i < m * n; i++) {
      const uint16_t want = dc == DType::BF16 ? float_to_bf16(c32[i]).bits : float_to_f16(c32[i]).bits;
      ASSERT_EQ(c16[i], want) << "element " << i << " of " << dtype_name(dc) << " c";
    }
  }
}

}  // namespace
}  // namespace parallel
