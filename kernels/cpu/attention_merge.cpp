// ops::attention_merge on the CPU: the log-sum-exp merge of one block's attention into the running
// result (ops.hpp has the contract). OpenMP over the query rows in memory order; a 16-bit block row
// is widened into per-thread scratch (exact), so the arithmetic is the fp32 path's.
#include <algorithm>
#include <cmath>
#include <limits>

#include "cpu/cpu_ops.hpp"
#include "cpu/widen.hpp"

namespace parallel::cpu {

void attention_merge(Tensor& out_acc, Tensor& lse_acc, const Tensor& out_blk, const Tensor& lse_blk,
                     int64_t q0) {
  const int64_t S = out_acc.size(0), b = out_acc.size(1), h = out_acc.size(2), d = out_acc.size(3);
  const int64_t n = out_blk.size(0);
  const DType dt = out_blk.dtype();
  constexpr float kNone = -std::numeric_limits<float>::infinity();
  float* acc = out_acc.data<float>();
  float* lacc = lse_acc.data<float>();
  const void* ob = out_blk.data_ptr();
  const float* lb = lse_blk.data<float>();
  // Position-major, as the [s, b, h, d] tensors lie: consecutive iterations touch consecutive rows.
#pragma omp parallel for collapse(3) schedule(static)
  for (int64_t t = 0; t < n; ++t)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t hi = 0; hi < h; ++hi) {
        float& la = lacc[(bi * h + hi) * S + q0 + t];
        const float l_blk = lb[(bi * h + hi) * n + t];
        if (l_blk == kNone) continue;  // the block masked every key of this row
        float wa = 0.0f, wb = 1.0f, l_new = l_blk;
        if (la != kNone) {
          const float m = std::max(la, l_blk);
          l_new = m + std::log(std::exp(la - m) + std::exp(l_blk - m));
          wa = std::exp(la - l_new);
          wb = std::exp(l_blk - l_new);
        }
        la = l_new;
        float* row = acc + (((q0 + t) * b + bi) * h + hi) * d;
        const float* blk = read_f32(offset_ptr(ob, dt, ((t * b + bi) * h + hi) * d), dt, d, 0);
        for (int64_t e = 0; e < d; ++e) row[e] = wa * row[e] + wb * blk[e];
      }
}

}  // namespace parallel::cpu
