// philox_normals (init.hpp): runs of consecutive Philox normals, vectorised and bitwise equal to
// philox_normal (init.cpp), which stays the reference.
//
// The reference draws two uniforms from Philox-4x32-10 and evaluates Box-Muller in double with
// libm's log and cos, then rounds to float. Here the same Philox words come from a loop that the
// compiler vectorises (cloned for AVX-512 / AVX2 / baseline, chosen at load time), and log and cos
// are branch-free polynomial versions (fdlibm's kernels) that agree with any libm's results to a
// few double ulps. The float result can then differ from the reference only when the double lies
// within those few ulps of a float rounding boundary. Each element checks that every double within
// a relative 2^-40 of its own value (far more than the error, far less than a float ulp at 2^-24)
// rounds to the same float; the rare element that fails the check (about one in 40,000), and the
// exact zero (its sign follows libm's log(1)), is recomputed with the scalar reference. So every
// element equals the reference bit for bit on every CPU (test_init_vectorised).
//
// Built with -fno-math-errno (CMakeLists.txt): the square root must not call libm for errno or the
// loop stays scalar. Contraction into FMAs only changes the polynomials' last bits, which the check
// above covers; the Box-Muller argument 2*pi*u2 is one product, as in the reference.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <numbers>

#include "parallel/init.hpp"

#define PARALLEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace parallel {
namespace {

// An unsigned 32-bit value as an exact double without int64 conversions (AVX2 has none):
// the bits of 2^52 + v, minus 2^52.
inline double u32_to_double(uint32_t v) { return std::bit_cast<double>(0x4330000000000000ull | v) - 0x1p52; }

// Natural log of x in (0, 1], x normal (fdlibm e_log.c's reduction and polynomial, < 1 ulp).
inline double log_poly(double x) {
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;
  constexpr double kLg1 = 6.666666666666735130e-01, kLg2 = 3.999999999940941908e-01,
                   kLg3 = 2.857142874366239149e-01, kLg4 = 2.222219843214978396e-01,
                   kLg5 = 1.818357216161805012e-01, kLg6 = 1.531383769920937332e-01,
                   kLg7 = 1.479819860511658591e-01;
  // x = 2^k * m with m in [sqrt(1/2), sqrt(2)).
  // Branch-free (selects on mixed widths keep AVX2 loops scalar): the mantissa above sqrt(2)'s
  // moves one power of two into the exponent.
  const uint64_t bits = std::bit_cast<uint64_t>(x);
  const uint64_t mant = bits & 0x000fffffffffffffull;
  const uint64_t big = mant > 0x6a09e667f3bcdull ? 1 : 0;  // sqrt(2) = 0x3ff6a09e667f3bcd
  const double m = std::bit_cast<double>(mant | (0x3ff0000000000000ull - (big << 52)));
  const double dk = u32_to_double(static_cast<uint32_t>((bits >> 52) + big)) - 1023.0;
  const double f = m - 1.0;
  const double hfsq = 0.5 * f * f;
  const double s = f / (2.0 + f);
  const double z = s * s, w = z * z;
  const double t1 = w * (kLg2 + w * (kLg4 + w * kLg6));
  const double t2 = z * (kLg1 + w * (kLg3 + w * (kLg5 + w * kLg7)));
  const double r = t2 + t1;
  return dk * kLn2Hi - ((hfsq - (s * (hfsq + r) + dk * kLn2Lo)) - f);
}

// sin and cos of r in [-pi/4, pi/4] (fdlibm k_sin.c / k_cos.c, < 1 ulp).
inline double sin_poly(double x) {
  constexpr double kS1 = -1.66666666666666324348e-01, kS2 = 8.33333333332248946124e-03,
                   kS3 = -1.98412698298579493134e-04, kS4 = 2.75573137070700676789e-06,
                   kS5 = -2.50507602534068634195e-08, kS6 = 1.58969099521155010221e-10;
  const double z = x * x, v = z * x;
  const double r = kS2 + z * (kS3 + z * (kS4 + z * (kS5 + z * kS6)));
  return x + v * (kS1 + z * r);
}
inline double cos_poly(double x) {
  constexpr double kC1 = 4.16666666666666019037e-02, kC2 = -1.38888888888741095749e-03,
                   kC3 = 2.48015872894767294178e-05, kC4 = -2.75573143513906633035e-07,
                   kC5 = 2.08757232129817482790e-09, kC6 = -1.13596475577881948265e-11;
  const double z = x * x;
  const double r = z * (kC1 + z * (kC2 + z * (kC3 + z * (kC4 + z * (kC5 + z * kC6)))));
  const double hz = 0.5 * z, w = 1.0 - hz;
  return w + (((1.0 - w) - hz) + z * r);
}

// cos(a) for a in [0, 2*pi]. a - q*pi/2 with pi/2 in three pieces (fdlibm's pio2_1, pio2_2 and
// pio2_2t): q * pio2_1 and q * pio2_2 are exact (33-bit constants, q <= 4), so the reduced argument
// keeps its relative accuracy even where cos(a) is near zero.
inline double cos_0_2pi(double a) {
  constexpr double kPio2_1 = 1.57079632673412561417e+00, kPio2_2 = 6.07710050630396597660e-11,
                   kPio2_2t = 2.02226624879595063154e-21, kTwoOverPi = 6.36619772367581382433e-01;
  // q = round(a * 2/pi), 0..4, by the 1.5 * 2^52 trick: the sum's low mantissa bits hold q.
  const double t = a * kTwoOverPi + 0x1.8p52;
  const double q = t - 0x1.8p52;
  const uint64_t qi = std::bit_cast<uint64_t>(t) & 3;
  const double r = ((a - q * kPio2_1) - q * kPio2_2) - q * kPio2_2t;
  // cos(r + q pi/2): q = 0: cos r, 1: -sin r, 2: -cos r, 3: sin r, 4: cos r; as bit operations.
  const uint64_t pick_sin = 0 - (qi & 1), negate = ((qi + 1) & 2) << 62;
  const uint64_t v =
      (std::bit_cast<uint64_t>(sin_poly(r)) & pick_sin) | (std::bit_cast<uint64_t>(cos_poly(r)) & ~pick_sin);
  return std::bit_cast<double>(v ^ negate);
}

// One Philox-4x32-10 block's first two words (the two uniforms Box-Muller uses), as init.cpp.
inline void philox_words(uint64_t seed, uint64_t stream, uint64_t index, uint32_t& w0, uint32_t& w1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(index), c1 = static_cast<uint32_t>(index >> 32);
  uint32_t c2 = static_cast<uint32_t>(stream), c3 = static_cast<uint32_t>(stream >> 32);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  // The ten rounds written out: a loop inside the vectorised loop would keep it scalar.
  auto round = [&] {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    c0 = hi1 ^ c1 ^ k0;
    c1 = lo1;
    c2 = hi0 ^ c3 ^ k1;
    c3 = lo0;
    k0 += kW0;
    k1 += kW1;
  };
  round(), round(), round(), round(), round(), round(), round(), round(), round(), round();
  w0 = c0;
  w1 = c1;
}

constexpr int kBlock = 256;

// Box-Muller's double for first + i, i < n <= kBlock.
PARALLEL_CLONES void normals_block(uint64_t seed, uint64_t stream, uint64_t first, double* out, int n) {
#pragma omp simd
  for (int i = 0; i < n; ++i) {
    uint32_t w0, w1;
    philox_words(seed, stream, first + static_cast<uint64_t>(i), w0, w1);
    // The reference's uniforms, exactly: u1 in (0, 1], u2 in [0, 1).
    const double u1 = (u32_to_double(w0) + 1.0) * 0x1p-32;
    const double u2 = u32_to_double(w1) * 0x1p-32;
    out[i] = std::sqrt(-2.0 * log_poly(u1)) * cos_0_2pi(2.0 * std::numbers::pi * u2);
  }
}

}  // namespace

void philox_normals(uint64_t seed, uint64_t stream, uint64_t first, float std_dev, float* out, int64_t n) {
  double d[kBlock];
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int len = static_cast<int>(std::min<int64_t>(kBlock, n - lo));
    const uint64_t base = first + static_cast<uint64_t>(lo);
    normals_block(seed, stream, base, d, len);
    for (int i = 0; i < len; ++i) {
      // Every double within a relative 2^-40 of d rounds to the same float, or the reference decides.
      const float f = static_cast<float>(d[i]);
      const bool sure =
          static_cast<float>(d[i] * (1.0 - 0x1p-40)) == static_cast<float>(d[i] * (1.0 + 0x1p-40));
      out[lo + i] =
          std_dev * (sure && d[i] != 0.0 ? f : philox_normal(seed, stream, base + static_cast<uint64_t>(i)));
    }
  }
}

}  // namespace parallel
