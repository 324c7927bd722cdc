// Vocab-parallel token embedding. tokens are [b, s] (as the data loader produces them) while
// activations are [s, b, h] (sequence first), so out row (si, bi) reads token tokens[bi, si].
#include <algorithm>
#include <cstring>

#include "cpu/cpu_ops.hpp"

namespace parallel::cpu {

void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t vocab_start, Tensor& out) {
  const int64_t b = tokens.size(0), s = tokens.size(1), rows = weight.size(0), h = weight.size(1);
  const int32_t* T = tokens.data<int32_t>();
  const float* W = weight.data<float>();
  float* O = out.data<float>();
#pragma omp parallel for collapse(2) schedule(static) if (s * b * h > (1 << 15))
  for (int64_t si = 0; si < s; si++) {
    for (int64_t bi = 0; bi < b; bi++) {
      const int64_t local = static_cast<int64_t>(T[bi * s + si]) - vocab_start;
      float* o = O + (si * b + bi) * h;
      // Another rank owns this id: zero here, the vocab-parallel all-reduce adds the owner's row.
      if (local < 0 || local >= rows)
        std::memset(o, 0, static_cast<size_t>(h) * sizeof(float));
      else
        std::memcpy(o, W + local * h, static_cast<size_t>(h) * sizeof(float));
    }
  }
}

// Repeated ids make a row-parallel scatter racy; instead each thread owns a block of columns of
// every weight row and walks all tokens in order: no atomics, and the sum order is fixed.
void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dweight) {
  const int64_t b = tokens.size(0), s = tokens.size(1), rows = dweight.size(0), h = dweight.size(1);
  const int32_t* T = tokens.data<int32_t>();
  const float* D = dout.data<float>();
  float* dW = dweight.data<float>();
  constexpr int64_t kCols = 128;
  const int64_t blocks = (h + kCols - 1) / kCols;
#pragma omp parallel for schedule(static) if (s * b * h > (1 << 15))
  for (int64_t blk = 0; blk < blocks; blk++) {
    const int64_t c0 = blk * kCols, c1 = std::min(h, c0 + kCols);
    for (int64_t si = 0; si < s; si++) {
      for (int64_t bi = 0; bi < b; bi++) {
        const int64_t local = static_cast<int64_t>(T[bi * s + si]) - vocab_start;
        if (local < 0 || local >= rows) continue;
        const float* d = D + (si * b + bi) * h;
        float* w = dW + local * h;
#pragma omp simd
        for (int64_t c = c0; c < c1; c++) w[c] += d[c];
      }
    }
  }
}

}  // namespace parallel::cpu
