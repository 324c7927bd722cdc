#pragma once
// exp and sigmoid written so that GCC vectorises the loops that call them. libm's expf/tanhf are
// opaque calls that block vectorisation without -ffast-math, and gelu, swiglu and the softmax of
// cross-entropy spend most of their time in them.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

namespace parallel::cpu {

// Clamps an exp argument to [-87, 88] with an integer min on its bit pattern. Call it in a loop of
// its own: with a float compare, or with the clamp inside the exp loop, GCC turns the clamp into a
// branch (jump threading: one side is a constant), which under its default -ftrapping-math it will
// not if-convert, and the loop stays scalar below AVX-512. Negative floats order as their unsigned
// bits, positive ones as their signed bits; -87.0f is 0xC2AE0000, 88.0f is 0x42B00000. Tiny or
// -inf arguments thus give ~1.6e-38, not 0: callers zero masked entries themselves.
inline float clamp_exp_arg(float x) {
  const uint32_t lo = std::min(std::bit_cast<uint32_t>(x), 0xC2AE0000u);
  return std::bit_cast<float>(std::min(static_cast<int32_t>(lo), 0x42B00000));
}

// exp(x) for x in [-87, 88], Cephes' expf (~1 ulp): x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a
// degree-7 polynomial, 2^n built in the exponent bits.
inline float exp_clamped(float x) {
  // Adding 1.5 * 2^23 rounds to the nearest integer and leaves it in the low mantissa bits.
  const float t = x * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const int32_t ni = std::bit_cast<int32_t>(t) - 0x4B400000;
  float r = x - n * 0.693359375f;  // ln2 split in two so that n * ln2_hi is exact
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((ni + 127) << 23);
}

// e^x for any fp32 x, clamped to [-87, 88] first. Loops that must vectorise below AVX-512 should
// clamp in a loop of their own (clamp_exp_arg) and call exp_clamped, as attention does.
inline float fast_exp(float x) { return exp_clamped(clamp_exp_arg(x)); }

inline float fast_sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

// max over j < n of value(j), in 16 independent lanes. A float max reduction is reordered only
// under no-NaNs fast-math in Clang, so `omp simd reduction(max)` stays scalar there (and warns,
// -Wpass-failed); lane-wise maxes are plain element-wise operations that GCC and Clang both
// vectorise. max is exact, so the lane order does not change the result.
// always_inline: Clang otherwise keeps one out-of-line copy for the baseline ISA and calls it from
// every target_clones version of the caller.
template <class Value>
[[gnu::always_inline]] inline float lane_max(int64_t n, Value value) {
  constexpr int kLanes = 16;
  float lane[kLanes];
  for (int l = 0; l < kLanes; l++) lane[l] = -std::numeric_limits<float>::infinity();
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes)
#pragma omp simd
    for (int l = 0; l < kLanes; l++) lane[l] = std::max(lane[l], value(j + l));
  for (; j < n; j++) lane[0] = std::max(lane[0], value(j));
  float m = lane[0];
  for (int l = 1; l < kLanes; l++) m = std::max(m, lane[l]);
  return m;
}

}  // namespace parallel::cpu
