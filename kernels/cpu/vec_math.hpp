#pragma once
// exp and sigmoid written so that GCC vectorises the loops that call them. libm's expf/tanhf are
// opaque calls that block vectorisation without -ffast-math, and gelu, swiglu and the softmax of
// cross-entropy spend most of their time in them.
#include <bit>
#include <cstdint>

namespace parallel::cpu {

// e^x for fp32 with Cephes' range reduction and polynomial: within 2 ulp of expf on [-87, 88].
// Inputs are clamped to that range: below -87 the result is ~1.6e-38 instead of a denormal or 0
// (negligible next to the 1 + ... or sums >= 1 it is always added to here); above 88, 1.6e38.
inline float fast_exp(float x) {
  x = x < 88.0f ? x : 88.0f;
  x = x > -87.0f ? x : -87.0f;
  // n = round(x / ln 2) by the 1.5 * 2^23 trick (vectorises, unlike nearbyintf on baseline x86-64).
  const float shifter = 12582912.0f;
  const float n = (x * 1.44269504088896341f + shifter) - shifter;
  // r = x - n ln2 in two steps (Cody-Waite) so that r keeps full precision.
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = p * r * r + r + 1.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return er * two_n;
}

inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

}  // namespace parallel::cpu
