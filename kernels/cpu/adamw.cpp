// AdamW over flat fp32 buffers (contract in include/parallel/ops.hpp). The scalars come from
// adamw_scalars.hpp, shared with kernels/cuda/adamw.cu: both devices do the same float operations.
#include <algorithm>
#include <cmath>

#include "adamw_scalars.hpp"
#include "cpu/cpu_ops.hpp"
#include "cpu/widen.hpp"

namespace parallel::cpu {

namespace {

void update_block(const kernels::AdamWScalars& k, const float* g, float* p, float* m, float* v, int64_t lo,
                  int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
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

}  // namespace

void adamw_update_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                   const ops::AdamWStep& h, Tensor* model_copy) {
  const kernels::AdamWScalars k =
      kernels::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step, h.grad_scale);
  const float* g = grad.data<float>();
  float* p = param.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const int64_t n = param.numel();
  // Blocks small enough that the fresh fp32 values are still in L1 when the 16-bit model copy is
  // written from them: the write-back costs no extra pass over memory.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kBlock, hi = std::min(n, lo + kBlock);
    update_block(k, g, p, m, v, lo, hi);
    if (model_copy != nullptr)
      convert_block_from_f32(p + lo, model_copy->dtype(),
                             offset_ptr(model_copy->data_ptr(), model_copy->dtype(), lo), hi - lo);
  }
}

}  // namespace parallel::cpu
