// Rows by index (ops.hpp, "rows by index"): the MoE layer's permutation, dispatch buffers and
// combine, as gathers. Each output element (or, for row_dot, each output row) is computed by one
// thread (block) from the rows its index names, in index order: no scatter and no float atomics, so
// results are the same run to run, and the fp32 arithmetic per element is the CPU kernel's
// (kernels/cpu/rows.cpp). row_dot reduces its double products in a tree rather than left to right:
// the difference is far below the one fp32 rounding of its result.
#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

using cuda::detail::block_reduce;
using cuda::detail::blocks_for;
using cuda::detail::kThreads;
using cuda::detail::SumOp;
using cuda::detail::to_f32;
using cuda::detail::to_storage;

template <typename T>
__global__ void gather_rows_kernel(const T* src, const int64_t* index, T* out, int64_t n, int64_t h) {
  const int64_t total = n * h;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / h, c = e % h, r = index[i];
    out[e] = r < 0 ? T{} : src[r * h + c];  // T{}: all-zero bits, +0 in every type
  }
}

template <typename T>
__global__ void gather_rows_scaled_kernel(const T* src, const int64_t* index, const float* scale, T* out,
                                          int64_t n, int64_t h) {
  const int64_t total = n * h;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = e / h, c = e % h, r = index[i];
    out[e] = to_storage<T>(r < 0 ? 0.0f : scale[i] * to_f32(src[r * h + c]));
  }
}

// O: out's storage type, float or S.
template <typename S, typename O>
__global__ void gather_sum_rows_kernel(const S* src, const int64_t* index, const float* weight, O* out,
                                       int64_t rows, int64_t k, int64_t h) {
  const int64_t total = rows * h;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = e / h, c = e % h;
    float acc = 0.0f;
    for (int64_t j = 0; j < k; j++) {
      const int64_t r = index[t * k + j];
      if (r < 0) continue;
      const float x = to_f32(src[r * h + c]);
      if (weight == nullptr)
        acc += x;
      else
        acc += weight[t * k + j] * x;
    }
    out[e] = to_storage<O>(acc);
  }
}

template <typename T>
__global__ void row_dot_kernel(const T* a, const T* b, const int64_t* index, float* out, int64_t h) {
  __shared__ double shared[32];
  const int64_t i = blockIdx.x;
  const T* x = a + i * h;
  const T* y = b + index[i] * h;
  double s = 0.0;
  for (int64_t c = threadIdx.x; c < h; c += blockDim.x)
    s += static_cast<double>(to_f32(x[c])) * static_cast<double>(to_f32(y[c]));
  s = block_reduce(s, shared, SumOp{}, 0.0);
  if (threadIdx.x == 0) out[i] = static_cast<float>(s);
}

}  // namespace

void gather_rows(const void* src, const int64_t* index, void* out, DType dtype, int64_t n, int64_t h,
                 stream_t stream) {
  if (n * h == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    gather_rows_kernel<T><<<blocks_for(n * h), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(src), index, static_cast<T*>(out), n, h);
  });
  CUDA_OPS_LAUNCHED();
}

void gather_rows_scaled(const void* src, const int64_t* index, const float* scale, void* out, DType dtype,
                        int64_t n, int64_t h, stream_t stream) {
  if (n * h == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    gather_rows_scaled_kernel<T><<<blocks_for(n * h), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(src), index, scale, static_cast<T*>(out), n, h);
  });
  CUDA_OPS_LAUNCHED();
}

void gather_sum_rows(const void* src, DType dtype, const int64_t* index, const float* weight, void* out,
                     DType out_dtype, int64_t rows, int64_t k, int64_t h, stream_t stream) {
  if (rows * h == 0) return;
  const auto cs = static_cast<cudaStream_t>(stream);
  PARALLEL_CUDA_DISPATCH_ACT_PARAM(dtype, out_dtype, S, O, {
    gather_sum_rows_kernel<S, O><<<blocks_for(rows * h), kThreads, 0, cs>>>(
        static_cast<const S*>(src), index, weight, static_cast<O*>(out), rows, k, h);
  });
  CUDA_OPS_LAUNCHED();
}

void row_dot(const void* a, const void* b, DType dtype, const int64_t* index, float* out, int64_t n,
             int64_t h, stream_t stream) {
  if (n == 0) return;
  CUDA_OPS_REQUIRE(n < (int64_t{1} << 31), "row_dot: too many rows for one block each");
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    row_dot_kernel<T><<<static_cast<unsigned>(n), 128, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<const T*>(a), static_cast<const T*>(b), index, out, h);
  });
  CUDA_OPS_LAUNCHED();
}

}  // namespace parallel::kernels
