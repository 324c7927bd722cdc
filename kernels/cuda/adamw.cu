// A fused AdamW step over flat fp32 buffers (see kernels.hpp): one read of param, grad, exp_avg,
// exp_avg_sq and one write of param, exp_avg, exp_avg_sq (and optionally the bf16 model copy) per
// element: 28-30 bytes per parameter, bandwidth-bound. Scalars (bias corrections, step size) come from
// adamw_scalars.hpp, shared with the CPU kernel, so both perform the same float operations per element.
#include <cuda_bf16.h>

#include <cmath>

#include "adamw_scalars.hpp"
#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::cuda {
namespace {

using kernels::AdamWScalars;

__global__ void adamw_kernel(float* p, const float* g, float* m, float* v, __nv_bfloat16* out, int64_t n,
                             AdamWScalars k, const uint8_t* mask, int64_t decay_begin, int64_t decay_end) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float gi = k.clip == 1.0f ? g[i] : g[i] * k.clip;
    const bool decayed = mask ? mask[i] != 0 : (i >= decay_begin && i < decay_end);
    float pi = p[i];
    if (decayed) pi *= k.decay;
    const float mi = m[i] * k.b1 + gi * k.a1;
    const float vi = v[i] * k.b2 + gi * gi * k.a2;
    const float denom = sqrtf(vi) / k.bc2s + k.eps;
    pi += -k.step_size * (mi / denom);
    p[i] = pi;
    m[i] = mi;
    v[i] = vi;
    if (out) out[i] = __float2bfloat16_rn(pi);
  }
}

}  // namespace

void adamw_step(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, bf16* model_bf16,
                int64_t n, const AdamWHyper& h, const uint8_t* decay_mask, int64_t decay_begin,
                int64_t decay_end, void* stream) {
  CUDA_OPS_REQUIRE(h.step >= 1, "adamw_step: step counts from 1");
  if (n == 0) return;
  const AdamWScalars k =
      kernels::adamw_scalars(h.lr, h.beta1, h.beta2, h.eps, h.weight_decay, h.step, h.grad_scale);
  adamw_kernel<<<detail::blocks_for(n), detail::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      param, grad, exp_avg, exp_avg_sq, reinterpret_cast<__nv_bfloat16*>(model_bf16), n, k, decay_mask,
      decay_begin, decay_end);
  CUDA_OPS_LAUNCHED();
}

}  // namespace parallel::cuda
