#pragma once
// Element types a tensor can hold, and the scalar conversions between them.
//
// bf16 and fp16 are stored as raw 16-bit patterns on the host; the conversions here are the
// reference the CPU kernels and the tests use (round to nearest even, as the hardware does).
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace parallel {

enum class DType : uint8_t {
  F32 = 0,
  BF16 = 1,
  F16 = 2,
  F8E4M3 = 3,  // storage only for now: room for fp8 training, no arithmetic kernels yet
  I32 = 4,     // token ids, targets
  I64 = 5,
  U8 = 6,
};

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);
// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16", ...; throws parallel::Error.
DType dtype_from_name(std::string_view name);
bool is_floating(DType t);

struct bf16 {
  uint16_t bits = 0;
};
struct f16 {
  uint16_t bits = 0;
};

float bf16_to_float(bf16 v);
bf16 float_to_bf16(float v);  // round to nearest even; NaN stays NaN
float f16_to_float(f16 v);
f16 float_to_f16(float v);  // round to nearest even; overflow -> inf

// Bulk conversions of n contiguous values between fp32 and `dt` (F32, BF16 or F16), vectorised,
// with exactly the rounding of the scalar functions above (NaN payloads aside). The *_block forms
// run on the calling thread (for use inside parallel regions); the others split large inputs
// over the OpenMP threads.
void convert_block_to_f32(const void* src, DType dt, float* dst, int64_t n);
void convert_block_from_f32(const float* src, DType dt, void* dst, int64_t n);
void convert_to_f32(const void* src, DType dt, float* dst, int64_t n);
void convert_from_f32(const float* src, DType dt, void* dst, int64_t n);

// A run's training precision (train.precision): fp32, or bf16 / fp16 with fp32 main weights. What
// each tensor's dtype is under it is decided in precision.hpp.
enum class Precision { FP32, BF16, FP16 };

// Maps a C++ type to its DType, for typed accessors such as Tensor::data<T>().
template <typename T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::F16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::U8;
};

}  // namespace parallel
