#pragma once
// What the CPU attention kernels share (attention.cpp: fp32 tiles; attention_bf16.cpp: bf16 tiles
// on AVX512-BF16 dot products): the tile sizes, the shape bookkeeping and the fp32 row operations
// of the online softmax and its backward. Both kernels keep the scores and probabilities of a tile
// in fp32; they differ only in the products around them.
#include <algorithm>
#include <cstdint>

#include "parallel/tensor.hpp"

namespace parallel::cpu::attention_tiles {

// 64 x 64 tiles: a score tile is 16 KiB, so the tile, the packed key block and a 64-row
// accumulator stay in L2 together for d up to 128.
constexpr int64_t kBr = 64;  // query rows per tile
constexpr int64_t kBc = 64;  // keys per tile

// Layouts: q, out, dout, dq [s, b, hq, d]; k, v, dk, dv [s, b, hkv, d]; lse [b, hq, s].
struct Dims {
  int64_t sq, sk, B, hq, hkv, d, group;
};
Dims attention_dims(const Tensor& q, const Tensor& k);

// What one call allocates besides its outputs, in 4-byte words: `shared` once (packed operands,
// the backward's row sums) and `per_thread` for each OpenMP thread (tiles, accumulators). The
// kernels size their buffers from these, and the memory plan asks for them (attention_workspace_bytes).
struct Workspace {
  int64_t shared = 0, per_thread = 0;
  int64_t bytes(int threads) const { return 4 * (shared + threads * per_thread); }
};
Workspace fp32_workspace(const Dims& x, bool backward);  // attention.cpp
Workspace bf16_workspace(const Dims& x, bool backward);  // attention_bf16.cpp

// Number of keys [j0, j0 + cols) that query row qi may attend to; causal attention is a prefix.
inline int64_t visible_keys(bool causal, int64_t qi, int64_t j0, int64_t cols) {
  if (!causal) return cols;
  return std::clamp<int64_t>(qi - j0 + 1, 0, cols);
}

// s[j] = exp(scale * s[j] - shift) for j < valid, 0 for valid <= j < cols; returns the sum.
// Forward: shift is the running max (unnormalised probabilities); backward: shift is the row's
// lse (the probabilities themselves).
float exp_tile_row(float* __restrict s, int64_t valid, int64_t cols, float scale, float shift);

// Max of scale * s[j] over j < valid (-inf when valid == 0).
float scaled_row_max(const float* __restrict s, int64_t valid, float scale);

// The forward's online softmax over one [rows, cols] score tile S (row stride kBc) of query rows
// i0.. against keys j0..: S becomes the unnormalised probabilities exp(scale * S - m_new), and what
// acc ([rows, d]) and the running sums l accumulated under the old running maxima m is rescaled to
// the new ones (FlashAttention-2's update; the caller then adds P V to acc).
void online_softmax_tile(float* S, int64_t rows, int64_t cols, bool causal, int64_t i0, int64_t j0,
                         float scale, float* m, float* l, float* acc, int64_t d);

// Backward: dS = scale * P * (dP - D), in place in dp. Masked entries have P = 0, hence dS = 0.
// The softmax scale is folded in here once instead of into both dK and dQ.
void dscores_tile_row(const float* __restrict p, float* __restrict dp, int64_t cols, float scale, float D);

}  // namespace parallel::cpu::attention_tiles
