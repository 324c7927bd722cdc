#pragma once
// Dropout's keep decision, shared by every CPU kernel that drops (elementwise.cpp's dropout and
// dropout_add, norm.cpp's fused residual ops), so a fused op draws exactly dropout_forward's mask.
//
// splitmix64's output function: the i-th draw of a splitmix64 stream seeded with `key` is
// mix(key + (i + 1) * golden), a counter-based generator that passes BigCrush, so element i's
// decision depends only on (seed, offset + i), whatever the split of the tensor. CUDA's kernel
// (kernels/cuda/elementwise.cu) draws the same numbers.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <type_traits>

#include "cpu/bf16_io.hpp"

// The generator is three 64-bit multiplies per element: AVX-512 vectorises them only with AVX512DQ
// (vpmullq), which plain "avx512f" clones do not enable, so dropout's loops get an x86-64-v4 clone
// (AVX512F/BW/CD/DQ/VL) of their own.
#define PARALLEL_DROPOUT_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))

namespace parallel::cpu {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// Uniform in [0, 1) from the top 24 bits: exactly representable, never 1. The 24 bits go to float
// through int32: the same value (exact either way), but a 64-bit integer to float conversion has no
// vector instruction below AVX512DQ and kept the AVX2 clone's loops scalar; int32 to float does.
inline float uniform(uint64_t key, uint64_t index) {
  const auto top = static_cast<int32_t>(mix64(key + (index + 1) * kGolden) >> 40);
  return static_cast<float>(top) * (1.0f / 16777216.0f);
}

// The per-call constants: element i is kept iff uniform(key, first + i) >= p, and kept values are
// multiplied by scale. p == 1 drops everything (1/(1-p) would be inf and inf * 0 NaN).
struct DropoutMask {
  float p = 0.0f;
  float scale = 1.0f;
  uint64_t key = 0;  // mix64(seed): decorrelates the streams of nearby seeds
  uint64_t first = 0;
  DropoutMask() = default;
  DropoutMask(float p_, uint64_t seed, uint64_t offset)
      : p(p_), scale(p_ < 1.0f ? 1.0f / (1.0f - p_) : 0.0f), key(mix64(seed)), first(offset) {}
  bool active() const { return p > 0.0f; }
};

// The loops, inline so that each kernel's target_clones wrapper compiles them for its own ISA, and
// templates over the storage types (float, or uint16_t bf16 bits: bf16_io.hpp) so that a bf16
// kernel reads and writes its tensors in the loop itself.
// Element i of a row is element first + i of the tensor. out may be the input (or, for
// dropout_add_row, the branch or the residual), element for element: `omp simd` says there is no
// other overlap, which GCC cannot prove (out could alias m's fields) and would otherwise not
// vectorise. m's fields are read into locals for the same reason.
// Every loop spells a dropped value as `x * scale & mask` (x * scale or +0.0f, the values of
// `keep ? x * scale : 0.0f`): the product is taken for every element, since under -ftrapping-math
// GCC will not speculate a conditional one and the loop would stay scalar. With uniform()'s int32
// conversion the generator vectorises in the AVX2 clone too (vpmuludq for the 64-bit multiplies).
// The residual add follows the masked product, so no clone can fuse the two into an FMA: every
// ISA adds the rounded product, as the scalar loop did.
// 16-bit storage: a block of kMaskBlock elements is done in two loops. dropout_row: the keep
// decisions into a mask, then the masked product. dropout_add_row: the fp32 loop's own expression
// into an fp32 block, then the rounding. fp32 keeps the one loop.
constexpr int64_t kMaskBlock = 256;

[[gnu::always_inline]] inline void keep_mask(uint32_t* mask, uint64_t key, float p, uint64_t first,
                                             int64_t n) {
  for (int64_t i = 0; i < n; i++) mask[i] = uniform(key, first + i) >= p ? ~0u : 0u;
}
[[gnu::always_inline]] inline float masked(float x, uint32_t mask) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(x) & mask);
}

template <class In, class Out>
[[gnu::always_inline]] inline void dropout_row(const DropoutMask& m, const In* in, Out* out, int64_t n,
                                               uint64_t first) {
  const float p = m.p, scale = m.scale;
  const uint64_t key = m.key;
  if constexpr (std::is_same_v<In, float> && std::is_same_v<Out, float>) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) out[i] = masked(in[i] * scale, uniform(key, first + i) >= p ? ~0u : 0u);
  } else {
    uint32_t mask[kMaskBlock];
    for (int64_t b = 0; b < n; b += kMaskBlock) {
      const int64_t len = std::min(kMaskBlock, n - b);
      keep_mask(mask, key, p, first + static_cast<uint64_t>(b), len);
#pragma omp simd
      for (int64_t i = 0; i < len; i++) store_elem(out, b + i, masked(load_elem(in, b + i) * scale, mask[i]));
    }
  }
}
// out = residual + dropout(branch); the plain add when p == 0.
template <class T, class Out>
[[gnu::always_inline]] inline void dropout_add_row(const DropoutMask& m, const T* branch, const T* residual,
                                                   Out* out, int64_t n, uint64_t first) {
  const float p = m.p, scale = m.scale;
  const uint64_t key = m.key;
  if (p == 0.0f) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++) store_elem(out, i, load_elem(residual, i) + load_elem(branch, i));
    return;
  }
  if constexpr (std::is_same_v<T, float> && std::is_same_v<Out, float>) {
#pragma omp simd
    for (int64_t i = 0; i < n; i++)
      out[i] = residual[i] + masked(branch[i] * scale, uniform(key, first + i) >= p ? ~0u : 0u);
  } else {
    float sum[kMaskBlock];
    for (int64_t b = 0; b < n; b += kMaskBlock) {
      const int64_t len = std::min(kMaskBlock, n - b);
      const T* br = branch + b;
      const T* re = residual + b;
#pragma omp simd
      for (int64_t i = 0; i < len; i++)
        sum[i] =
            load_elem(re, i) + masked(load_elem(br, i) * scale, uniform(key, first + b + i) >= p ? ~0u : 0u);
#pragma omp simd
      for (int64_t i = 0; i < len; i++) store_elem(out, b + i, sum[i]);
    }
  }
}

}  // namespace parallel::cpu
