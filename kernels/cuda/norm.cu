// LayerNorm and RMSNorm over the last dimension h, forward and backward (see ops.hpp).
//
// Layering:
//   row kernels   one warp per row (8 rows per 256-thread block): the warp strides over the row's h
//                 values, reduces with shuffles, writes y (forward) or dx (backward). Statistics in
//                 fp32 with two passes (mean, then mean of squared deviations) as the CPU kernel:
//                 no E[x^2] - E[x]^2 cancellation; the second pass hits L1/L2.
//   param grads   dweight / dbias are column sums over rows. Deterministic without atomics: blocks
//                 of 32 columns x a chunk of rows write partials [chunks, h], then one thread per
//                 column adds the chunks in order into dweight / dbias (accumulate, as ops.hpp).
//                 The chunking is a function of the shape only: bit-identical run to run.
//   dtypes        x, y, dy, dx fp32, bf16 or fp16 (T); weight and bias fp32 or T (W); mean, rstd,
//                 dweight, dbias fp32. Loads widen to float, stores round to nearest even.
#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

using cuda::detail::blocks_for;
using cuda::detail::kThreads;
using cuda::detail::to_f32;
using cuda::detail::to_storage;
using cuda::detail::warp_sum;

cudaStream_t st(stream_t s) { return static_cast<cudaStream_t>(s); }

constexpr int kRowsPerBlock = kThreads / 32;

// T: storage type of x, y, dy, dx (float, bf16, f16); W: of the weight and bias (float or T).
// Each row's values are loaded as float on every pass (the second pass hits L1/L2), computed in
// fp32, and y / dx are stored rounded to nearest even (common.cuh), as the CPU narrows.
template <typename T, typename W>
__global__ void layernorm_fwd_kernel(const T* x, const W* w, const W* b, T* y, float* mean, float* rstd,
                                     int64_t rows, int64_t h, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // whole warps leave together: the shuffles below stay convergent
  const T* xr = x + row * h;
  float s = 0.0f;
  for (int64_t i = lane; i < h; i += 32) s += to_f32(xr[i]);
  const float m = warp_sum(s) / static_cast<float>(h);
  float v = 0.0f;
  for (int64_t i = lane; i < h; i += 32) {
    const float d = to_f32(xr[i]) - m;
    v += d * d;
  }
  const float rs = 1.0f / sqrtf(warp_sum(v) / static_cast<float>(h) + eps);
  T* yr = y + row * h;
  for (int64_t i = lane; i < h; i += 32)
    yr[i] = to_storage<T>((to_f32(xr[i]) - m) * rs * to_f32(w[i]) + to_f32(b[i]));
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = rs;
  }
}

// With xhat = (x - m) rs and g = w dy: dx = rs (g - mean(g) - xhat mean(g xhat)).
template <typename T, typename W>
__global__ void layernorm_bwd_dx_kernel(const T* dy, const T* x, const W* w, const float* mean,
                                        const float* rstd, const T* dres, T* dx, int64_t rows, int64_t h) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T *xr = x + row * h, *dyr = dy + row * h;
  const float m = mean[row], rs = rstd[row];
  float sg = 0.0f, sgx = 0.0f;
  for (int64_t i = lane; i < h; i += 32) {
    const float g = to_f32(w[i]) * to_f32(dyr[i]);
    sg += g;
    sgx += g * (to_f32(xr[i]) - m) * rs;
  }
  const float mean_g = warp_sum(sg) / static_cast<float>(h), mean_gx = warp_sum(sgx) / static_cast<float>(h);
  T* dxr = dx + row * h;
  for (int64_t i = lane; i < h; i += 32) {
    const float xhat = (to_f32(xr[i]) - m) * rs;
    const float d = rs * (to_f32(w[i]) * to_f32(dyr[i]) - mean_g - xhat * mean_gx);
    dxr[i] = to_storage<T>(dres ? d + to_f32(dres[row * h + i]) : d);  // dres may alias dx: same element
  }
}

template <typename T, typename W>
__global__ void rmsnorm_fwd_kernel(const T* x, const W* w, T* y, float* rstd, int64_t rows, int64_t h,
                                   float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * h;
  float s = 0.0f;
  for (int64_t i = lane; i < h; i += 32) {
    const float xv = to_f32(xr[i]);
    s += xv * xv;
  }
  const float rs = 1.0f / sqrtf(warp_sum(s) / static_cast<float>(h) + eps);
  T* yr = y + row * h;
  for (int64_t i = lane; i < h; i += 32) yr[i] = to_storage<T>(to_f32(xr[i]) * rs * to_f32(w[i]));
  if (lane == 0) rstd[row] = rs;
}

// dx = rs (w dy - x rs^2 mean(w dy x)).
template <typename T, typename W>
__global__ void rmsnorm_bwd_dx_kernel(const T* dy, const T* x, const W* w, const float* rstd, const T* dres,
                                      T* dx, int64_t rows, int64_t h) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T *xr = x + row * h, *dyr = dy + row * h;
  const float rs = rstd[row];
  float s = 0.0f;
  for (int64_t i = lane; i < h; i += 32) s += to_f32(w[i]) * to_f32(dyr[i]) * to_f32(xr[i]);
  const float c = rs * rs * warp_sum(s) / static_cast<float>(h);
  T* dxr = dx + row * h;
  for (int64_t i = lane; i < h; i += 32) {
    const float d = rs * (to_f32(w[i]) * to_f32(dyr[i]) - to_f32(xr[i]) * c);
    dxr[i] = to_storage<T>(dres ? d + to_f32(dres[row * h + i]) : d);
  }
}

// ---- parameter gradients: column partials, then an ordered sum ----
constexpr int kColTile = 32, kRowLanes = 8;

// partial_w[chunk, c] = sum over the chunk's rows of dy * xhat (layernorm: xhat = (x - mean) rstd;
// rmsnorm, mean == nullptr: xhat = x rstd); partial_b[chunk, c] = sum of dy (when partial_b given).
template <typename T>
__global__ void norm_param_partials_kernel(const T* dy, const T* x, const float* mean, const float* rstd,
                                           float* partial_w, float* partial_b, int64_t rows, int64_t h,
                                           int64_t rows_per_chunk) {
  __shared__ float acc_w[kRowLanes][kColTile];
  __shared__ float acc_b[kRowLanes][kColTile];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float sw = 0.0f, sb = 0.0f;
  if (col < h) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float d = to_f32(dy[r * h + col]);
      const float xhat = (to_f32(x[r * h + col]) - (mean ? mean[r] : 0.0f)) * rstd[r];
      sw += d * xhat;
      sb += d;
    }
  }
  acc_w[threadIdx.y][threadIdx.x] = sw;
  acc_b[threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y == 0 && col < h) {
    float tw = 0.0f, tb = 0.0f;
#pragma unroll
    for (int l = 0; l < kRowLanes; l++) {
      tw += acc_w[l][threadIdx.x];
      tb += acc_b[l][threadIdx.x];
    }
    partial_w[static_cast<int64_t>(blockIdx.y) * h + col] = tw;
    if (partial_b) partial_b[static_cast<int64_t>(blockIdx.y) * h + col] = tb;
  }
}

__global__ void sum_partials_kernel(const float* partial, float* out, int64_t chunks, int64_t h) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < h;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float t = 0.0f;
    for (int64_t k = 0; k < chunks; k++) t += partial[k * h + c];
    out[c] += t;
  }
}

template <typename T>
void param_grads(const T* dy, const T* x, const float* mean, const float* rstd, float* dw, float* db,
                 int64_t rows, int64_t h, cudaStream_t stream) {
  if (rows == 0 || h == 0) return;
  const int64_t chunks = std::min<int64_t>(256, (rows + 63) / 64);
  const int64_t rpc = (rows + chunks - 1) / chunks;
  const std::size_t one = static_cast<std::size_t>(chunks * h) * sizeof(float);
  cuda::detail::Scratch partial(db ? 2 * one : one, stream);
  float* pw = partial.as<float>();
  float* pb = db ? pw + chunks * h : nullptr;
  const dim3 grid(static_cast<unsigned>((h + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  norm_param_partials_kernel<T>
      <<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(dy, x, mean, rstd, pw, pb, rows, h, rpc);
  CUDA_OPS_LAUNCHED();
  sum_partials_kernel<<<blocks_for(h), kThreads, 0, stream>>>(pw, dw, chunks, h);
  CUDA_OPS_LAUNCHED();
  if (db) {
    sum_partials_kernel<<<blocks_for(h), kThreads, 0, stream>>>(pb, db, chunks, h);
    CUDA_OPS_LAUNCHED();
  }
}

unsigned row_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kRowsPerBlock - 1) / kRowsPerBlock);
}

template <typename T>
const T* in(const void* p) {
  return static_cast<const T*>(p);
}
template <typename T>
T* out(void* p) {
  return static_cast<T*>(p);
}

}  // namespace

void layernorm_forward(const void* x, const void* w, const void* b, DType w_dtype, void* y, DType dtype,
                       float* mean, float* rstd, int64_t rows, int64_t h, float eps, stream_t stream) {
  if (rows == 0 || h == 0) return;
  PARALLEL_CUDA_DISPATCH_ACT_PARAM(dtype, w_dtype, T, W, {
    layernorm_fwd_kernel<T, W><<<row_blocks(rows), kThreads, 0, st(stream)>>>(
        in<T>(x), in<W>(w), in<W>(b), out<T>(y), mean, rstd, rows, h, eps);
  });
  CUDA_OPS_LAUNCHED();
}

void layernorm_backward(const void* dy, const void* x, const void* w, DType w_dtype, const float* mean,
                        const float* rstd, const void* dresidual, void* dx, DType dtype, float* dw, float* db,
                        int64_t rows, int64_t h, stream_t stream) {
  if (rows == 0 || h == 0) return;
  PARALLEL_CUDA_DISPATCH_ACT_PARAM(dtype, w_dtype, T, W, {
    layernorm_bwd_dx_kernel<T, W><<<row_blocks(rows), kThreads, 0, st(stream)>>>(
        in<T>(dy), in<T>(x), in<W>(w), mean, rstd, in<T>(dresidual), out<T>(dx), rows, h);
    CUDA_OPS_LAUNCHED();
    param_grads<T>(in<T>(dy), in<T>(x), mean, rstd, dw, db, rows, h, st(stream));
  });
}

void rmsnorm_forward(const void* x, const void* w, DType w_dtype, void* y, DType dtype, float* rstd,
                     int64_t rows, int64_t h, float eps, stream_t stream) {
  if (rows == 0 || h == 0) return;
  PARALLEL_CUDA_DISPATCH_ACT_PARAM(dtype, w_dtype, T, W, {
    rmsnorm_fwd_kernel<T, W>
        <<<row_blocks(rows), kThreads, 0, st(stream)>>>(in<T>(x), in<W>(w), out<T>(y), rstd, rows, h, eps);
  });
  CUDA_OPS_LAUNCHED();
}

void rmsnorm_backward(const void* dy, const void* x, const void* w, DType w_dtype, const float* rstd,
                      const void* dresidual, void* dx, DType dtype, float* dw, int64_t rows, int64_t h,
                      stream_t stream) {
  if (rows == 0 || h == 0) return;
  PARALLEL_CUDA_DISPATCH_ACT_PARAM(dtype, w_dtype, T, W, {
    rmsnorm_bwd_dx_kernel<T, W><<<row_blocks(rows), kThreads, 0, st(stream)>>>(
        in<T>(dy), in<T>(x), in<W>(w), rstd, in<T>(dresidual), out<T>(dx), rows, h);
    CUDA_OPS_LAUNCHED();
    param_grads<T>(in<T>(dy), in<T>(x), nullptr, rstd, dw, nullptr, rows, h, st(stream));
  });
}

}  // namespace parallel::kernels
