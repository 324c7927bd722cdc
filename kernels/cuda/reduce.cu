// sum_of_squares for the global gradient norm: each thread accumulates x^2 in double over a
// grid-stride loop, blocks reduce in a fixed order and write one double each, and the host adds the
// block partials in block order. Double throughout (as the CPU kernel): a float sum over ~1e8
// parameters would lose the small contributions. The grid size depends only on n: deterministic.
// x may be fp32, bf16 or fp16 (each element widened exactly).
#include <vector>

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

using cuda::detail::block_reduce;
using cuda::detail::SumOp;

constexpr int kBlock = 512;

template <typename T>
__global__ void sum_sq_kernel(const T* x, int64_t n, double* partial) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const double v = cuda::detail::to_f32(x[i]);
    s += v * v;
  }
  s = block_reduce(s, shared, SumOp{}, 0.0);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

}  // namespace

double sum_of_squares(const void* x, DType dtype, int64_t n, stream_t stream) {
  if (n == 0) return 0.0;
  const auto cs = static_cast<cudaStream_t>(stream);
  const int blocks = static_cast<int>(std::clamp<int64_t>((n + kBlock - 1) / kBlock, 1, 1024));
  cuda::detail::Scratch partial(blocks * sizeof(double), cs);
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    sum_sq_kernel<T><<<blocks, kBlock, 0, cs>>>(static_cast<const T*>(x), n, partial.as<double>());
  });
  CUDA_OPS_LAUNCHED();
  std::vector<double> host(blocks);
  CUDA_OPS_CHECK(cudaMemcpyAsync(host.data(), partial.as<double>(), blocks * sizeof(double),
                                 cudaMemcpyDeviceToHost, cs));
  CUDA_OPS_CHECK(cudaStreamSynchronize(cs));
  double total = 0.0;
  for (double v : host) total += v;
  return total;
}

}  // namespace parallel::kernels
