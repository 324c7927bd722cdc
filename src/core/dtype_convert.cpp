// Bulk conversions between fp32 and bf16/fp16 (dtype.hpp), used by Tensor copies and by the CPU
// kernels' widening (kernels/cpu/widen.hpp).
//
// bf16 is bit arithmetic that GCC vectorises (cloned for AVX-512 / AVX2 / baseline). fp16 uses the
// F16C conversion instructions when the CPU has them (every x86-64 CPU with AVX2 does), checked at
// run time, and the scalar reference conversion otherwise. F16C rounds to nearest even like
// float_to_f16; only NaN payloads may differ (both stay NaN). Large blocks are split over the
// OpenMP threads.
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "parallel/dtype.hpp"
#include "parallel/error.hpp"

#define PARALLEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace parallel {
namespace {

PARALLEL_CLONES void bf16_to_f32_block(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = std::bit_cast<float>(static_cast<uint32_t>(src[i]) << 16);
}

// Round to nearest even on the bit pattern; NaN keeps its top bits with the quiet bit set, as
// float_to_bf16 does. Spelled as kernels/cpu/bf16_io.hpp's bf16_bits (32-bit lanes, NaN by a float
// compare), which GCC vectorises in about two thirds of the operations of the 16-bit spelling.
PARALLEL_CLONES void f32_to_bf16_block(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const float x = src[i];
    const uint32_t u = std::bit_cast<uint32_t>(x);
    const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);
    const uint32_t quiet = u | 0x00400000u;
    dst[i] = static_cast<uint16_t>((x != x ? quiet : rounded) >> 16);
  }
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  for (; i < n; i++) dst[i] = _cvtsh_ss(src[i]);
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(
        reinterpret_cast<__m128i*>(dst + i),
        _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; i++) dst[i] = _cvtss_sh(src[i], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

bool has_f16c() {
  // F16C from CPUID leaf 1 directly: clang 14's __builtin_cpu_supports does not know "f16c".
  static const bool yes = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0 &&
           __builtin_cpu_supports("avx");
  }();
  return yes;
}

}  // namespace

void convert_block_to_f32(const void* src, DType dt, float* dst, int64_t n) {
  switch (dt) {
    case DType::F32:
      if (static_cast<const void*>(dst) != src) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::BF16:
      bf16_to_f32_block(static_cast<const uint16_t*>(src), dst, n);
      return;
    case DType::F16: {
      const auto* s = static_cast<const uint16_t*>(src);
      if (has_f16c()) return f16_to_f32_f16c(s, dst, n);
      for (int64_t i = 0; i < n; i++) dst[i] = f16_to_float(f16{s[i]});
      return;
    }
    default:
      PARALLEL_FAIL("convert_to_f32: {} is not a floating dtype with CPU arithmetic", dtype_name(dt));
  }
}

void convert_block_from_f32(const float* src, DType dt, void* dst, int64_t n) {
  switch (dt) {
    case DType::F32:
      if (dst != static_cast<const void*>(src)) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::BF16:
      f32_to_bf16_block(src, static_cast<uint16_t*>(dst), n);
      return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      if (has_f16c()) return f32_to_f16_f16c(src, d, n);
      for (int64_t i = 0; i < n; i++) d[i] = float_to_f16(src[i]).bits;
      return;
    }
    default:
      PARALLEL_FAIL("convert_from_f32: {} is not a floating dtype with CPU arithmetic", dtype_name(dt));
  }
}

namespace {
constexpr int64_t kBlock = 1 << 15;
}  // namespace

void convert_to_f32(const void* src, DType dt, float* dst, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const std::size_t es = dtype_size(dt);
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t lo = b * kBlock, m = std::min(n, lo + kBlock) - lo;
    convert_block_to_f32(static_cast<const char*>(src) + lo * static_cast<int64_t>(es), dt, dst + lo, m);
  }
}

void convert_from_f32(const float* src, DType dt, void* dst, int64_t n) {
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  const std::size_t es = dtype_size(dt);
#pragma omp parallel for schedule(static) if (blocks > 4)
  for (int64_t b = 0; b < blocks; b++) {
    const int64_t lo = b * kBlock, m = std::min(n, lo + kBlock) - lo;
    convert_block_from_f32(src + lo, dt, static_cast<char*>(dst) + lo * static_cast<int64_t>(es), m);
  }
}

}  // namespace parallel
