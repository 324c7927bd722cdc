#pragma once
// The CUDA kernel behind ops::adamw_update_ (include/parallel/ops.hpp), in the style of
// cuda_ops.hpp: src/ops/ops.cpp has validated the arguments; this passes raw pointers to the fused
// AdamW launcher of kernels.hpp (adamw.cu), which computes the same float scalars as the CPU.
#include "cuda_check.hpp"
#include "kernels.hpp"
#include "parallel/ops.hpp"
#include "parallel/tensor.hpp"

namespace parallel::cuda {

inline void adamw_update_(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                          const ops::AdamWStep& h, Stream stream) {
  DeviceGuard guard(param.device().index);
  AdamWHyper hyper;
  hyper.lr = h.lr;
  hyper.beta1 = h.beta1;
  hyper.beta2 = h.beta2;
  hyper.eps = h.eps;
  hyper.weight_decay = h.weight_decay;
  hyper.step = h.step;
  hyper.grad_scale = h.grad_scale;
  const int64_t n = param.numel();
  // Every element decays, or none: the kernel's decay range is all of [0, n) or empty. (p * 1.0f
  // is exact, so "none" equals the CPU's multiplication by 1.)
  const int64_t decay_end = h.weight_decay != 0.0 ? n : 0;
  adamw_step(static_cast<float*>(param.data_ptr()), static_cast<const float*>(grad.data_ptr()),
             static_cast<float*>(exp_avg.data_ptr()), static_cast<float*>(exp_avg_sq.data_ptr()), nullptr, n,
             hyper, nullptr, 0, decay_end, stream.handle);
}

}  // namespace parallel::cuda
