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

namespace {

// Below this many elements sum_of_squares runs on one thread (its `if` clause).
constexpr int64_t kSplitAbove = 1 << 16;

// total += x's sum of squares, by the calling team: sum_of_squares' loop as an orphaned worksharing
// construct. GCC lowers `parallel for simd` as a parallel region around this same `for simd`, so
// each thread forms its partial exactly as there (the same static range, simd lanes and order)
// and adds it into total as there; outside a parallel region the calling thread does the whole
// range, as sum_of_squares' one-thread region does.
void add_sum_of_squares(const float* X, int64_t n, double& total) {
#pragma omp for simd reduction(+ : total) schedule(static) nowait
  for (int64_t i = 0; i < n; i++) total += static_cast<double>(X[i]) * static_cast<double>(X[i]);
}

}  // namespace

// The accumulator is fp32 (a [1] tensor on the tensors' device, so that on a GPU nothing is read
// back per tensor); each tensor's own sum is formed in double first.
void sum_of_squares_accumulate(const Tensor& x, Tensor& acc) {
  float* a = acc.data<float>();
  a[0] = static_cast<float>(static_cast<double>(a[0]) + sum_of_squares(x));
}

// Every tensor's sum formed as sum_of_squares forms it, then added into acc in list order: the
// small ones on this thread, the large ones in one region (each thread its static share of each,
// no barrier between tensors; the partials are complete at the region's end).
void sum_of_squares_accumulate_multi(const std::vector<Tensor>& xs, Tensor& acc) {
  std::vector<double> total(xs.size(), 0.0);
  bool any_large = false;
  for (std::size_t i = 0; i < xs.size(); i++) {
    if (xs[i].numel() > kSplitAbove)
      any_large = true;
    else
      add_sum_of_squares(xs[i].data<float>(), xs[i].numel(), total[i]);
  }
  if (any_large) {
#pragma omp parallel
    for (std::size_t i = 0; i < xs.size(); i++)
      if (xs[i].numel() > kSplitAbove) add_sum_of_squares(xs[i].data<float>(), xs[i].numel(), total[i]);
  }
  float* a = acc.data<float>();
  for (double t : total) a[0] = static_cast<float>(static_cast<double>(a[0]) + t);
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
