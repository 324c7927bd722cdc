#pragma once
// Which attention kernel takes a problem, and how the fp32 kernels cover any batch x heads: pure
// functions without CUDA, so that they are unit-tested on the CPU (tests/unit/test_attention_launch.cpp).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "../cuda/kernels.hpp"  // AttentionShape
#include "parallel/dtype.hpp"

namespace parallel::kernels {

// CUDA's limit on gridDim.y: the attention kernels put the (batch, head) pairs on grid.y.
constexpr int64_t kMaxGridY = 65535;

// The tensor-core FlashAttention-2 kernels (flash_attention_mma.cu) take the problem: bf16 or fp16,
// head dimension 64 or 128 with the value head size equal to it, hq a multiple of hkv > 0, s < 2^30, b * hq
// and b * hkv within one grid.y, and every tensor 16-byte aligned (`aligned16`). Otherwise ops run the fp32
// kernels on widened copies (kernels/cuda/cuda_ops.hpp).
inline bool attention_mma_can_implement(const AttentionShape& sh, DType dtype, bool aligned16) {
  if (dtype != DType::BF16 && dtype != DType::F16) return false;
  if ((sh.d != 64 && sh.d != 128) || sh.value_dim() != sh.d) return false;
  if (sh.hkv <= 0 || sh.hq % sh.hkv != 0 || sh.s < 0 || sh.s >= (int64_t{1} << 30)) return false;
  if (sh.b * sh.hq > kMaxGridY || sh.b * sh.hkv > kMaxGridY) return false;
  return aligned16;
}

// The fp32 kernels (flash_attention.cu) launch once per chunk of at most `limit` (batch, head)
// pairs: [first, first + count), in order, covering [0, n) exactly; a single chunk up to the limit.
// The kernels add `first` to blockIdx.y. One launch of all n on grid.y failed past 65535 with a
// bare launch error, on exactly the problems the tensor-core path declines for that limit.
struct GridChunk {
  int64_t first = 0, count = 0;
};
inline std::vector<GridChunk> grid_y_chunks(int64_t n, int64_t limit = kMaxGridY) {
  std::vector<GridChunk> out;
  for (int64_t first = 0; first < n; first += limit) out.push_back({first, std::min(limit, n - first)});
  return out;
}

}  // namespace parallel::kernels
