// Scalar conversions: checked against the IEEE definitions bit by bit, independently of the
// implementation's shift tricks (the reference below goes through double and explicit rounding).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "parallel/dtype.hpp"
#include "parallel/error.hpp"

using namespace parallel;

namespace {

// Reference: round a finite float to the nearest value with `mant_bits` explicit mantissa bits and
// exponent range [emin, emax], ties to even, by scanning the two neighbours in double precision.
double round_to_format(double x, int mant_bits, int emin, int emax) {
  if (x == 0) return x;
  const double ax = std::fabs(x);
  int e = std::ilogb(ax);
  if (e < emin) e = emin;  // subnormal range: fixed quantum
  const double quantum = std::ldexp(1.0, e - mant_bits);
  double lo = std::floor(ax / quantum) * quantum;
  double hi = lo + quantum;
  double r;
  if (ax - lo < hi - ax) r = lo;
  else if (ax - lo > hi - ax) r = hi;
  else r = std::fmod(lo / quantum, 2.0) == 0.0 ? lo : hi;
  const double max = std::ldexp(2.0 - std::ldexp(1.0, -mant_bits), emax);
  if (r > max) r = std::numeric_limits<double>::infinity();
  return std::copysign(r, x);
}

}  // namespace

TEST(DType, SizesAndNames) {
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::F8E4M3), 1u);
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::BF16);
  EXPECT_EQ(dtype_from_name(dtype_name(DType::F16)), DType::F16);
  EXPECT_THROW(dtype_from_name("fp64"), Error);
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even gives 1.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even).
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(std::nanf("")))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(std::numeric_limits<float>::infinity()))));
  // A sweep of values against the reference rounding.
  for (float x = -300.0f; x < 300.0f; x += 0.0137f) {
    const double want = round_to_format(x, 7, -126, 127);
    ASSERT_EQ(bf16_to_float(float_to_bf16(x)), static_cast<float>(want)) << x;
  }
}

TEST(DType, F16RoundsToNearestEvenIncludingSubnormalsAndOverflow) {
  for (float x : {1.0f, -2.5f, 65504.0f, 1e-5f, 6e-8f, 3e-8f, 5.9604645e-8f, 0.1f, 1000.3f, 2049.0f, 2051.0f}) {
    const double want = round_to_format(x, 10, -14, 15);
    EXPECT_EQ(f16_to_float(float_to_f16(x)), static_cast<float>(want)) << x;
  }
  EXPECT_TRUE(std::isinf(f16_to_float(float_to_f16(65520.0f))));  // rounds up past the largest finite
  EXPECT_EQ(f16_to_float(float_to_f16(65519.0f)), 65504.0f);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(std::nanf("")))));
  for (float x = -70000.0f; x < 70000.0f; x += 13.37f) {
    const double want = round_to_format(x, 10, -14, 15);
    ASSERT_EQ(f16_to_float(float_to_f16(x)), static_cast<float>(want)) << x;
  }
  for (float x = -0.001f; x < 0.001f; x += 1.3e-7f) {
    const double want = round_to_format(x, 10, -14, 15);
    ASSERT_EQ(f16_to_float(float_to_f16(x)), static_cast<float>(want)) << x;
  }
}

TEST(DType, F16DecodesEveryPatternConsistently) {
  // Every non-NaN half survives half -> float -> half unchanged.
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    f16 h{static_cast<uint16_t>(bits)};
    float f = f16_to_float(h);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_f16(f).bits, h.bits) << std::hex << bits;
  }
}
