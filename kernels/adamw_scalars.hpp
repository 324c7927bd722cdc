#pragma once
// The per-step scalars of an AdamW update (torch.optim.AdamW's single-tensor arithmetic), computed
// once in double and rounded to float. Shared by the CPU kernel (cpu/adamw.cpp) and the CUDA one
// (cuda/adamw.cu) so that both perform the same float operations per element. Plain C++.
#include <cmath>
#include <cstdint>

namespace parallel::kernels {

struct AdamWScalars {
  float step_size;       // lr / (1 - beta1^t)
  float bc2s;            // sqrt(1 - beta2^t)
  float b1, b2, a1, a2;  // beta1, beta2, 1 - beta1, 1 - beta2
  float eps;
  float decay;  // 1 - lr * weight_decay
  float clip;   // the gradient scale (1: none)
};

inline AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay,
                                  int64_t step, float grad_scale) {
  const double bc1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(beta2, static_cast<double>(step)));
  AdamWScalars k;
  k.step_size = static_cast<float>(lr / bc1);
  k.bc2s = static_cast<float>(bc2_sqrt);
  k.b1 = static_cast<float>(beta1);
  k.b2 = static_cast<float>(beta2);
  k.a1 = static_cast<float>(1.0 - beta1);
  k.a2 = static_cast<float>(1.0 - beta2);
  k.eps = static_cast<float>(eps);
  k.decay = static_cast<float>(1.0 - lr * weight_decay);
  k.clip = grad_scale;
  return k;
}

}  // namespace parallel::kernels
