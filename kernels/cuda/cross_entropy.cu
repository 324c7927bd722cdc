// The local pieces of vocab-parallel cross-entropy (see ops.hpp and kernels/cpu/cross_entropy.cpp).
// Row statistics: one block per row (the vocabulary is long: 50k-150k columns), a strided loop and
// a fixed-order block reduction. The backward is element-wise. Columns [valid, v) are padding.
// Logits and dlogits may be fp32, bf16 or fp16 (widened on load, dlogits rounded to nearest even);
// the per-row statistics are fp32.
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

using cuda::detail::block_reduce;
using cuda::detail::blocks_for;
using cuda::detail::kThreads;
using cuda::detail::MaxOp;
using cuda::detail::SumOp;
using cuda::detail::to_f32;
using cuda::detail::to_storage;

template <typename T>
__global__ void ce_stats_kernel(const T* logits, const int32_t* targets, int64_t v, int64_t vocab_start,
                                int64_t valid, float* row_max, float* target_logit) {
  __shared__ float shared[32];
  const int64_t i = blockIdx.x;
  const T* l = logits + i * v;
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) m = fmaxf(m, to_f32(l[j]));
  m = block_reduce(m, shared, MaxOp{}, -INFINITY);
  if (threadIdx.x == 0) {
    row_max[i] = m;  // -inf when this rank holds only padding
    const int64_t t = static_cast<int64_t>(targets[i]) - vocab_start;
    target_logit[i] = t >= 0 && t < valid ? to_f32(l[t]) : 0.0f;
  }
}

template <typename T>
__global__ void ce_sum_exp_kernel(const T* logits, const float* row_max, int64_t v, int64_t valid,
                                  float* sum_exp) {
  __shared__ float shared[32];
  const int64_t i = blockIdx.x;
  const float m = row_max[i];
  if (isinf(m) && m < 0.0f) {  // uniform over the block: all threads leave together
    if (threadIdx.x == 0) sum_exp[i] = 0.0f;
    return;
  }
  const T* l = logits + i * v;
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) s += expf(to_f32(l[j]) - m);
  s = block_reduce(s, shared, SumOp{}, 0.0f);
  if (threadIdx.x == 0) sum_exp[i] = s;
}

// dlogits[i, j] = g_i (softmax_ij - [j == target_i]), 0 on padding columns.
template <typename T>
__global__ void ce_backward_kernel(const T* logits, const int32_t* targets, const float* row_max,
                                   const float* sum_exp, const float* grad_scale, int64_t n, int64_t v,
                                   int64_t vocab_start, int64_t valid, T* dlogits) {
  const int64_t total = n * v;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < total;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = t / v, j = t % v;
    float d = 0.0f;
    if (j < valid) {
      const float g = grad_scale[i];
      d = g / sum_exp[i] * expf(to_f32(logits[t]) - row_max[i]);
      if (j == static_cast<int64_t>(targets[i]) - vocab_start) d -= g;
    }
    dlogits[t] = to_storage<T>(d);
  }
}

}  // namespace

void ce_local_stats(const void* logits, DType dtype, const int32_t* targets, int64_t n, int64_t v,
                    int64_t vocab_start, int64_t valid, float* row_max, float* target_logit,
                    stream_t stream) {
  if (n == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    ce_stats_kernel<T><<<static_cast<unsigned>(n), 512, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(logits), targets, v, vocab_start, valid, row_max, target_logit);
  });
  CUDA_OPS_LAUNCHED();
}

void ce_sum_exp(const void* logits, DType dtype, const float* row_max, int64_t n, int64_t v, int64_t valid,
                float* sum_exp, stream_t stream) {
  if (n == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    ce_sum_exp_kernel<T><<<static_cast<unsigned>(n), 512, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(logits), row_max, v, valid, sum_exp);
  });
  CUDA_OPS_LAUNCHED();
}

void ce_backward(const void* logits, const int32_t* targets, const float* row_max, const float* sum_exp,
                 const float* grad_scale, int64_t n, int64_t v, int64_t vocab_start, int64_t valid,
                 void* dlogits, DType dtype, stream_t stream) {
  if (n * v == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    ce_backward_kernel<T><<<blocks_for(n * v), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(logits), targets, row_max, sum_exp, grad_scale, n, v, vocab_start, valid,
        static_cast<T*>(dlogits));
  });
  CUDA_OPS_LAUNCHED();
}

}  // namespace parallel::kernels
