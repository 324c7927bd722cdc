#include "parallel/dtype.hpp"

#include <bit>
#include <cmath>
#include <string>

#include "parallel/error.hpp"

namespace parallel {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::BF16:
      return 2;
    case DType::F16:
      return 2;
    case DType::F8E4M3:
      return 1;
    case DType::I32:
      return 4;
    case DType::I64:
      return 8;
    case DType::U8:
      return 1;
  }
  PARALLEL_FAIL("unknown dtype {}", static_cast<int>(t));
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "fp32";
    case DType::BF16:
      return "bf16";
    case DType::F16:
      return "fp16";
    case DType::F8E4M3:
      return "fp8_e4m3";
    case DType::I32:
      return "int32";
    case DType::I64:
      return "int64";
    case DType::U8:
      return "uint8";
  }
  return "?";
}

DType dtype_from_name(std::string_view name) {
  if (name == "fp32" || name == "float32" || name == "float") return DType::F32;
  if (name == "bf16" || name == "bfloat16") return DType::BF16;
  if (name == "fp16" || name == "float16" || name == "half") return DType::F16;
  if (name == "fp8_e4m3" || name == "float8_e4m3fn") return DType::F8E4M3;
  if (name == "int32") return DType::I32;
  if (name == "int64") return DType::I64;
  if (name == "uint8") return DType::U8;
  PARALLEL_FAIL("unknown dtype '{}' (expected fp32, bf16, fp16, fp8_e4m3, int32, int64 or uint8)", name);
}

bool is_floating(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3;
}

float bf16_to_float(bf16 v) { return std::bit_cast<float>(static_cast<uint32_t>(v.bits) << 16); }

bf16 float_to_bf16(float v) {
  uint32_t u = std::bit_cast<uint32_t>(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};  // quiet NaN
  // Round to nearest, ties to even: add 0x7fff plus the lowest kept bit.
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}

float f16_to_float(f16 v) {
  const uint32_t sign = static_cast<uint32_t>(v.bits & 0x8000u) << 16;
  uint32_t exp = (v.bits >> 10) & 0x1fu;
  uint32_t mant = v.bits & 0x3ffu;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return std::bit_cast<float>(sign);
    // Subnormal: value = mant * 2^-24.
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

f16 float_to_f16(float v) {
  const uint32_t u = std::bit_cast<uint32_t>(v);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return f16{static_cast<uint16_t>(sign | 0x7e00u)};   // NaN
  if (abs >= 0x477ff000u) return f16{static_cast<uint16_t>(sign | 0x7c00u)};  // rounds to >= 65520: inf
  if (abs < 0x38800000u) {
    // Result is subnormal (or zero): round abs / 2^-24 to nearest even integer.
    float f = std::bit_cast<float>(abs);
    float scaled = f * 16777216.0f;                              // exact: power of two
    uint32_t m = static_cast<uint32_t>(std::nearbyint(scaled));  // default rounding mode: ties to even
    return f16{static_cast<uint16_t>(sign | m)};
  }
  // Normal: rebias exponent, round the 13 dropped mantissa bits to nearest even.
  uint32_t r = abs - 0x38000000u;  // exponent 127 -> 15
  r += 0x0fffu + ((r >> 13) & 1u);
  return f16{static_cast<uint16_t>(sign | (r >> 13))};
}

}  // namespace parallel
