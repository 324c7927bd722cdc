#pragma once
// The CUDA side of ops::cross_entropy_loss and ops::sum_of_squares_accumulate (ops.hpp), in the
// style of cuda_ops.hpp: src/ops/ops.cpp has validated the arguments.
#include "cuda/loss_kernels.hpp"
#include "cuda_check.hpp"
#include "parallel/error.hpp"
#include "parallel/tensor.hpp"

namespace parallel::cuda {

inline void cross_entropy_loss(const Tensor& row_max, const Tensor& sum_exp, const Tensor& target_logit,
                               Tensor& loss, Stream stream) {
  DeviceGuard guard(loss.device().index);
  const char* err = kernels::cross_entropy_loss(
      static_cast<const float*>(row_max.data_ptr()), static_cast<const float*>(sum_exp.data_ptr()),
      static_cast<const float*>(target_logit.data_ptr()), static_cast<float*>(loss.data_ptr()), loss.numel(),
      stream.handle);
  PARALLEL_CHECK(err == nullptr, "ops::cross_entropy_loss: CUDA launch failed: {}", err);
}

inline void sum_of_squares_accumulate(const Tensor& x, Tensor& acc, Stream stream) {
  DeviceGuard guard(acc.device().index);
  // Scratch from the caching allocator, freed (stream-ordered) when it goes out of scope.
  Tensor partial =
      Tensor::empty({kernels::sum_of_squares_blocks(x.numel()) * 2}, DType::F32, acc.device(), stream);
  const char* err = kernels::sum_of_squares_accumulate(
      static_cast<const float*>(x.data_ptr()), x.numel(), static_cast<float*>(acc.data_ptr()),
      static_cast<double*>(partial.data_ptr()), stream.handle);
  PARALLEL_CHECK(err == nullptr, "ops::sum_of_squares_accumulate: CUDA launch failed: {}", err);
}

}  // namespace parallel::cuda
