// Reductions. sum_of_squares feeds the global gradient norm (clip_grad_norm): accumulated in
// double because a float sum over ~1e8 parameters loses the small contributions entirely.
#include <algorithm>
#include <cmath>
#include <vector>

#include "cpu/cpu_ops.hpp"
#include "cpu/widen.hpp"

namespace parallel::cpu {

double sum_of_squares(const Tensor& x) {
  const int64_t n = x.numel();
  if (x.dtype() != DType::F32) {  // 16-bit tensors (not on the gradient path, which is fp32)
    std::vector<float> wide(static_cast<size_t>(n));
    widen_to_f32(x.data_ptr(), x.dtype(), wide.data(), n);
    Tensor w = Tensor::from_blob(wide.data(), {n}, DType::F32);
    return sum_of_squares(w);
  }
  const float* X = x.data<float>();
  double total = 0.0;
#pragma omp parallel for simd reduction(+ : total) schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; i++) total += static_cast<double>(X[i]) * static_cast<double>(X[i]);
  return total;
}

// The accumulator is fp32 (a [1] tensor on the tensors' device, so that on a GPU nothing is read
// back per tensor); each tensor's own sum is formed in double first.
void sum_of_squares_accumulate(const Tensor& x, Tensor& acc) {
  float* a = acc.data<float>();
  a[0] = static_cast<float>(static_cast<double>(a[0]) + sum_of_squares(x));
}

// Muon's Newton-Schulz input: the norm in double (as above), then one division per element.
void normalize_(Tensor& x, float eps) {
  const float norm = std::max(static_cast<float>(std::sqrt(sum_of_squares(x))), eps);
  float* X = x.data<float>();
  const int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; i++) X[i] /= norm;
}

}  // namespace parallel::cpu
