// A fused AdamW step over flat fp32 buffers (see kernels.hpp): one read of param, grad, exp_avg,
// exp_avg_sq and one write of param, exp_avg, exp_avg_sq (and optionally the bf16 model copy) per
// element: 28-30 bytes per parameter, bandwidth-bound. Scalars (bias corrections, step size) are
// computed once on the host in double and rounded to float exactly as src/optim/adamw.cpp does, so
// both paths perform the same float operations per element.
#include <cuda_bf16.h>

#include <cmath>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::cuda {
namespace {

struct AdamWScalars {
  float step_size, bc2s, b1, b2, a1, a2, eps, decay, clip;
};

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
  const double bc1 = 1.0 - std::pow(h.beta1, static_cast<double>(h.step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, static_cast<double>(h.step)));
  AdamWScalars k;
  k.step_size = static_cast<float>(h.lr / bc1);
  k.bc2s = static_cast<float>(bc2_sqrt);
  k.b1 = static_cast<float>(h.beta1);
  k.b2 = static_cast<float>(h.beta2);
  k.a1 = static_cast<float>(1.0 - h.beta1);
  k.a2 = static_cast<float>(1.0 - h.beta2);
  k.eps = static_cast<float>(h.eps);
  k.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  k.clip = h.grad_scale;
  adamw_kernel<<<detail::blocks_for(n), detail::kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
      param, grad, exp_avg, exp_avg_sq, reinterpret_cast<__nv_bfloat16*>(model_bf16), n, k, decay_mask,
      decay_begin, decay_end);
  CUDA_OPS_LAUNCHED();
}

}  // namespace parallel::cuda
