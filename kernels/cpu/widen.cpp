// Widening and narrowing of blocks, and the per-thread scratch (widen.hpp). The conversions
// themselves are core's (dtype.hpp): the same code serves Tensor copies.
#include "cpu/widen.hpp"

#include "parallel/error.hpp"

namespace parallel::cpu {

void widen_to_f32(const void* src, DType dt, float* dst, int64_t n) {
  if (dt == DType::F32 && static_cast<const void*>(dst) == src) return;
  convert_block_to_f32(src, dt, dst, n);
}

void narrow_from_f32(const float* src, DType dt, void* dst, int64_t n) {
  if (dt == DType::F32 && dst == static_cast<const void*>(src)) return;
  convert_block_from_f32(src, dt, dst, n);
}

float* scratch_f32(int slot, int64_t n) {
  PARALLEL_CHECK(slot >= 0 && slot < 8, "scratch_f32: slot {} out of range [0, 8)", slot);
  thread_local std::vector<float> slots[8];
  std::vector<float>& s = slots[slot];
  if (static_cast<int64_t>(s.size()) < n) s.resize(static_cast<size_t>(n));
  return s.data();
}

}  // namespace parallel::cpu
