// pair_reduce: blocks of fp32 in L1. 16-bit operands are widened with the bulk conversions of
// dtype.hpp (exact), combined by loops GCC vectorises (cloned for AVX-512 / AVX2 / baseline), and
// narrowed back (bf16 bit-exact with float_to_bf16; fp16 through F16C, whose NaN payloads are then
// replaced by float_to_f16's canonical NaN). The scalar loop it replaces called two out-of-line
// conversions per element and ran bf16 all-reduces at a third of fp32's speed.
#include "comm/pair_reduce.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "parallel/error.hpp"

#define PARALLEL_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace parallel::detail {
namespace {

constexpr int64_t kBlock = 512;  // 2 KiB per fp32 operand: three blocks stay in L1

// A NaN in `a` is returned whatever the compiler's operand order for `+` (x86 returns the first
// operand's NaN; a + a quiets it as a + b would). Otherwise the plain sum.
PARALLEL_CLONES void combine_sum(const float* __restrict a, const float* __restrict b, float* __restrict r,
                                 int64_t n) {
  for (int64_t i = 0; i < n; i++) r[i] = a[i] != a[i] ? a[i] + a[i] : a[i] + b[i];
}

// NaN wins, as in torch.max, so that a NaN on any rank is never hidden (communicator.hpp).
PARALLEL_CLONES void combine_max(const float* __restrict a, const float* __restrict b, float* __restrict r,
                                 int64_t n) {
  for (int64_t i = 0; i < n; i++) r[i] = (a[i] != a[i] || a[i] > b[i]) ? a[i] : b[i];
}

PARALLEL_CLONES void combine_min(const float* __restrict a, const float* __restrict b, float* __restrict r,
                                 int64_t n) {
  for (int64_t i = 0; i < n; i++) r[i] = (a[i] != a[i] || a[i] < b[i]) ? a[i] : b[i];
}

void combine(ReduceOp op, const float* a, const float* b, float* r, int64_t n) {
  switch (op) {
    case ReduceOp::Sum:
      return combine_sum(a, b, r, n);
    case ReduceOp::Max:
      return combine_max(a, b, r, n);
    case ReduceOp::Min:
      return combine_min(a, b, r, n);
  }
  PARALLEL_FAIL("pair_reduce: unknown reduce op {}", static_cast<int>(op));
}

// float_to_f16 maps every NaN to sign | 0x7e00; F16C keeps the payload's top bits.
PARALLEL_CLONES void canonical_f16_nans(const float* __restrict r, uint16_t* __restrict out, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    const uint32_t u = std::bit_cast<uint32_t>(r[i]);
    const uint16_t nan = static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u);
    out[i] = r[i] != r[i] ? nan : out[i];
  }
}

// Where both operands are NaN, a's wins (quieted, as a + b would): the loop this replaced left
// that to the compiler's operand order (GCC's code returned b's for fp16 and a's for bf16).
float scalar_apply(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::Sum:
      return std::isnan(a) ? a + a : a + b;
    case ReduceOp::Max:
      return (std::isnan(a) || a > b) ? a : b;
    case ReduceOp::Min:
      return (std::isnan(a) || a < b) ? a : b;
  }
  PARALLEL_FAIL("pair_reduce: unknown reduce op {}", static_cast<int>(op));
}

void check_dtype(DType dtype) {
  PARALLEL_CHECK(dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16,
                 "pair_reduce: {} has no CPU reduction (F32, BF16 or F16)", dtype_name(dtype));
}

}  // namespace

void pair_reduce(DType dtype, ReduceOp op, const void* a, const void* b, void* out, int64_t n) {
  check_dtype(dtype);
  const int64_t es = static_cast<int64_t>(dtype_size(dtype));
  alignas(64) float fa[kBlock], fb[kBlock], fr[kBlock];
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int64_t m = std::min(kBlock, n - lo);
    const auto* pa = static_cast<const char*>(a) + lo * es;
    const auto* pb = static_cast<const char*>(b) + lo * es;
    auto* po = static_cast<char*>(out) + lo * es;
    convert_block_to_f32(pa, dtype, fa, m);
    convert_block_to_f32(pb, dtype, fb, m);
    combine(op, fa, fb, fr, m);
    convert_block_from_f32(fr, dtype, po, m);
    if (dtype == DType::F16) canonical_f16_nans(fr, reinterpret_cast<uint16_t*>(po), m);
  }
}

void pair_reduce_reference(DType dtype, ReduceOp op, const void* a, const void* b, void* out, int64_t n) {
  check_dtype(dtype);
  for (int64_t i = 0; i < n; i++) {
    if (dtype == DType::F32) {
      static_cast<float*>(out)[i] =
          scalar_apply(op, static_cast<const float*>(a)[i], static_cast<const float*>(b)[i]);
      continue;
    }
    const uint16_t x = static_cast<const uint16_t*>(a)[i], y = static_cast<const uint16_t*>(b)[i];
    auto* o = static_cast<uint16_t*>(out);
    if (dtype == DType::BF16)
      o[i] = float_to_bf16(scalar_apply(op, bf16_to_float(bf16{x}), bf16_to_float(bf16{y}))).bits;
    else
      o[i] = float_to_f16(scalar_apply(op, f16_to_float(f16{x}), f16_to_float(f16{y}))).bits;
  }
}

}  // namespace parallel::detail
