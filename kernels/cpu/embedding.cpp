// Vocab-parallel token embedding. tokens are [b, s] (as the data loader produces them) while
// activations are [s, b, h] (sequence first), so out row (si, bi) reads token tokens[bi, si].
// The weight may be fp32 or the activations' 16-bit dtype; a row copied between equal dtypes is a
// memcpy, otherwise converted. The gradient is fp32 (accumulated).
#include <algorithm>
#include <cstring>

#include "cpu/cpu_ops.hpp"
#include "cpu/widen.hpp"

namespace parallel::cpu {

void embedding_forward(const Tensor& tokens, const Tensor& weight, int64_t vocab_start, Tensor& out) {
  const int64_t b = tokens.size(0), s = tokens.size(1), rows = weight.size(0), h = weight.size(1);
  const int32_t* T = tokens.data<int32_t>();
  const DType wt = weight.dtype(), ot = out.dtype();
  const std::size_t row_bytes = static_cast<std::size_t>(h) * dtype_size(ot);
#pragma omp parallel for collapse(2) schedule(static) if (s * b * h > (1 << 15))
  for (int64_t si = 0; si < s; si++) {
    for (int64_t bi = 0; bi < b; bi++) {
      const int64_t local = static_cast<int64_t>(T[bi * s + si]) - vocab_start;
      void* o = offset_ptr(out.data_ptr(), ot, (si * b + bi) * h);
      // Another rank owns this id: zero here, the vocab-parallel all-reduce adds the owner's row.
      if (local < 0 || local >= rows) {
        std::memset(o, 0, row_bytes);
      } else if (wt == ot) {
        std::memcpy(o, offset_ptr(weight.data_ptr(), wt, local * h), row_bytes);
      } else {
        const float* w = read_f32(offset_ptr(weight.data_ptr(), wt, local * h), wt, h, 0);
        narrow_from_f32(w, ot, o, h);
      }
    }
  }
}

// Repeated ids make a row-parallel scatter racy; instead each thread owns a block of columns of
// every weight row and walks all tokens in order: no atomics, and the sum order is fixed.
void embedding_backward(const Tensor& tokens, const Tensor& dout, int64_t vocab_start, Tensor& dweight) {
  const int64_t b = tokens.size(0), s = tokens.size(1), rows = dweight.size(0), h = dweight.size(1);
  const int32_t* T = tokens.data<int32_t>();
  const DType dt = dout.dtype();
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
        const float* d = read_f32(offset_ptr(dout.data_ptr(), dt, (si * b + bi) * h + c0), dt, c1 - c0, 0);
        float* w = dW + local * h + c0;
#pragma omp simd
        for (int64_t c = 0; c < c1 - c0; c++) w[c] += d[c];
      }
    }
  }
}

}  // namespace parallel::cpu
