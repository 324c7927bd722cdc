// Device-side pieces of the loss and the gradient norm (ops::cross_entropy_loss,
// ops::sum_of_squares_accumulate): they exist so that a training step reads nothing back to the
// host per micro-batch or per tensor (issue 12, "the loss stays on the device"). fp32 only: both
// work on statistics and gradients, which the precision policy keeps in fp32.
//
// sum_of_squares_accumulate is deterministic: a fixed grid (from n only) writes one double per
// block, and a single block adds those partials in block order before adding the total to acc.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "cuda/loss_kernels.hpp"

namespace parallel::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

__global__ void ce_loss_kernel(const float* row_max, const float* sum_exp, const float* target_logit,
                               float* loss, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) loss[i] = logf(sum_exp[i]) + row_max[i] - target_logit[i];
}

__device__ double block_sum(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

__global__ void sum_sq_partial_kernel(const float* x, int64_t n, double* partial) {
  __shared__ double shared[kThreads];
  double s = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = x[i];
    s += v * v;
  }
  s = block_sum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sum_sq_finish_kernel(const double* partial, int blocks, float* acc) {
  __shared__ double shared[kThreads];
  double s = 0.0;
  for (int i = threadIdx.x; i < blocks; i += blockDim.x) s += partial[i];
  s = block_sum(s, shared);
  if (threadIdx.x == 0) acc[0] = static_cast<float>(static_cast<double>(acc[0]) + s);
}

}  // namespace

const char* cross_entropy_loss(const float* row_max, const float* sum_exp, const float* target_logit,
                               float* loss, int64_t n, void* stream) {
  if (n == 0) return nullptr;
  const auto cs = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  ce_loss_kernel<<<blocks, kThreads, 0, cs>>>(row_max, sum_exp, target_logit, loss, n);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* sum_of_squares_accumulate(const float* x, int64_t n, float* acc, double* partial, void* stream) {
  if (n == 0) return nullptr;
  const auto cs = static_cast<cudaStream_t>(stream);
  const int blocks = sum_of_squares_blocks(n);
  sum_sq_partial_kernel<<<blocks, kThreads, 0, cs>>>(x, n, partial);
  sum_sq_finish_kernel<<<1, kThreads, 0, cs>>>(partial, blocks, acc);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

int sum_of_squares_blocks(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

}  // namespace parallel::kernels
