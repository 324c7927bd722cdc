// normalize_ (Muon's Newton-Schulz input): x /= max(||x||_F, eps) without a host read. One
// single-block pass sums x^2 in double in a fixed order (deterministic) and writes the float norm
// to scratch; a grid-stride pass divides by it. Same float operations per element as the CPU
// kernel (kernels/cpu/reduce.cpp): the norm rounded to float once, then one division. Muon's
// matrices are small next to a step's GEMMs, so one block for the sum is enough.
#include <cmath>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

using cuda::detail::block_reduce;
using cuda::detail::SumOp;

constexpr int kSumThreads = 1024;

__global__ void norm_kernel(const float* x, int64_t n, float eps, float* norm) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += static_cast<double>(x[i]) * x[i];
  s = block_reduce(s, shared, SumOp{}, 0.0);
  if (threadIdx.x == 0) *norm = fmaxf(static_cast<float>(sqrt(s)), eps);
}

__global__ void divide_kernel(float* x, int64_t n, const float* norm) {
  const float d = *norm;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] /= d;
}

}  // namespace

void normalize(float* x, int64_t n, float eps, stream_t stream) {
  if (n == 0) return;
  const auto cs = static_cast<cudaStream_t>(stream);
  cuda::detail::Scratch norm(sizeof(float), cs);
  norm_kernel<<<1, kSumThreads, 0, cs>>>(x, n, eps, norm.as<float>());
  CUDA_OPS_LAUNCHED();
  divide_kernel<<<cuda::detail::blocks_for(n), cuda::detail::kThreads, 0, cs>>>(x, n, norm.as<float>());
  CUDA_OPS_LAUNCHED();
}

}  // namespace parallel::kernels
