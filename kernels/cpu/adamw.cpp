// AdamW over flat fp32 buffers (contract in include/parallel/ops.hpp). The scalars are computed
// exactly as kernels/cuda/adamw.cu computes them, so both devices do the same float operations.
#include <cmath>

#include "cpu/cpu_ops.hpp"

namespace parallel::cpu {

void adamw_update_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                   const ops::AdamWStep& h) {
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, static_cast<double>(h.step)));
  const float step_size = static_cast<float>(h.lr / bc1), bc2s = static_cast<float>(bc2_sqrt);
  const float b1 = static_cast<float>(h.beta1), b2 = static_cast<float>(h.beta2);
  const float a1 = static_cast<float>(1.0 - h.beta1), a2 = static_cast<float>(1.0 - h.beta2);
  const float eps = static_cast<float>(h.eps), clip = h.grad_scale;
  const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const float* g = grad.data<float>();
  float* p = param.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const int64_t n = param.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    const float gi = clip == 1.0f ? g[i] : g[i] * clip;
    float pi = p[i] * decay;
    const float mi = m[i] * b1 + gi * a1;
    const float vi = v[i] * b2 + gi * gi * a2;
    const float denom = std::sqrt(vi) / bc2s + eps;
    pi += -step_size * (mi / denom);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace parallel::cpu
