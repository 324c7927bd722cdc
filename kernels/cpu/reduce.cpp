// Reductions. sum_of_squares feeds the global gradient norm (clip_grad_norm): accumulated in
// double because a float sum over ~1e8 parameters loses the small contributions entirely.
#include "cpu/cpu_ops.hpp"

namespace parallel::cpu {

double sum_of_squares(const Tensor& x) {
  const float* X = x.data<float>();
  const int64_t n = x.numel();
  double total = 0.0;
#pragma omp parallel for simd reduction(+ : total) schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; i++) total += static_cast<double>(X[i]) * static_cast<double>(X[i]);
  return total;
}

}  // namespace parallel::cpu
