#pragma once
// 16-bit storage, fp32 arithmetic: how the CPU kernels read and write bf16/fp16 tensors.
//
// Every CPU kernel computes in fp32. A kernel given bf16/fp16 tensors works on blocks (a row, or a
// chunk of a flat tensor) small enough to stay in L1/L2: it widens each 16-bit input block into a
// per-thread fp32 scratch buffer, runs the fp32 code on it, and narrows the output block back
// (round to nearest even, exactly float_to_bf16 / float_to_f16 of dtype.hpp). Memory traffic is
// that of 16-bit tensors; the extra passes touch cache only. fp32 tensors are used in place: the
// helpers return the tensor's own pointer, so the fp32 path is unchanged.
//
// Scratch buffers are thread-local and only grow, so a training step allocates nothing here after
// its first call with the largest block.
#include <cstdint>
#include <vector>

#include "parallel/dtype.hpp"

namespace parallel::cpu {

// n values of `dt` (F32, BF16 or F16) at src, as fp32 into dst.
void widen_to_f32(const void* src, DType dt, float* dst, int64_t n);
// n fp32 values into `dt` at dst, rounded to nearest even. dst == src is allowed for F32 (no-op).
void narrow_from_f32(const float* src, DType dt, void* dst, int64_t n);

// Per-thread fp32 scratch: slot k (0..7) of the calling thread, at least n floats. Slots are
// independent, so a kernel can hold several widened blocks at once.
float* scratch_f32(int slot, int64_t n);

// Element i of a contiguous block of `dt` as a pointer offset (in elements).
inline const void* offset_ptr(const void* base, DType dt, int64_t i) {
  return static_cast<const char*>(base) + i * static_cast<int64_t>(dtype_size(dt));
}
inline void* offset_ptr(void* base, DType dt, int64_t i) {
  return static_cast<char*>(base) + i * static_cast<int64_t>(dtype_size(dt));
}

// A read-only fp32 view of n values at src: src itself for fp32, else widened into scratch slot.
inline const float* read_f32(const void* src, DType dt, int64_t n, int slot) {
  if (dt == DType::F32) return static_cast<const float*>(src);
  float* s = scratch_f32(slot, n);
  widen_to_f32(src, dt, s, n);
  return s;
}

// Where fp32 results for n values destined to dst go: dst itself for fp32, else scratch slot
// (followed by write_back).
inline float* write_f32(void* dst, DType dt, int64_t n, int slot) {
  return dt == DType::F32 ? static_cast<float*>(dst) : scratch_f32(slot, n);
}
inline void write_back(const float* results, DType dt, void* dst, int64_t n) {
  if (dt != DType::F32) narrow_from_f32(results, dt, dst, n);
}

// Scalar conversions for the odd single element (a target logit, a loss).
inline float load_f32(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::BF16:
      return bf16_to_float(static_cast<const bf16*>(base)[i]);
    case DType::F16:
      return f16_to_float(static_cast<const f16*>(base)[i]);
    default:
      return static_cast<const float*>(base)[i];
  }
}

}  // namespace parallel::cpu
