// AdamW over flat fp32 buffers (contract in include/parallel/ops.hpp). The scalars come from
// adamw_scalars.hpp, shared with kernels/cuda/adamw.cu: both devices do the same float operations.
#include <cmath>

#include "adamw_scalars.hpp"
#include "cpu/cpu_ops.hpp"

namespace parallel::cpu {

void adamw_update_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                   const ops::AdamWStep& h) {
  const kernels::AdamWScalars k =
      kernels::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step, h.grad_scale);
  const float* g = grad.data<float>();
  float* p = param.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const int64_t n = param.numel();
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    const float gi = k.clip == 1.0f ? g[i] : g[i] * k.clip;
    float pi = p[i] * k.decay;
    const float mi = m[i] * k.b1 + gi * k.a1;
    const float vi = v[i] * k.b2 + gi * gi * k.a2;
    const float denom = std::sqrt(vi) / k.bc2s + k.eps;
    pi += -k.step_size * (mi / denom);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace parallel::cpu
