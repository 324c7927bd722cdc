// Element-wise ops on the GPU: bias, add, scale, gelu, swiglu, dropout (see ops.hpp).
//
// All are bandwidth-bound grid-stride loops, one element per thread and iteration. The formulas are
// those of kernels/cpu/elementwise.cpp: GeLU as x * sigmoid(2u) (the tanh form, exactly), SwiGLU
// with the same derivative, and dropout with the same counter-based hash, so that a mask is
// bit-identical to the CPU's for the same (seed, offset + i).
//
// bias_backward is a column reduction made deterministic without atomics: blocks of 32 columns x
// a chunk of rows write partial sums [chunks, h], then one thread per column adds the chunks in
// order into dbias. The chunking depends only on the shape, so results are bit-identical run to run.
//
// Activations may be fp32, bf16 or fp16 (the kernels are templated on the storage type, dispatched
// from the dtype): loaded as float, computed in fp32, stored rounded to nearest even exactly as the
// CPU narrows (common.cuh), so that a 16-bit output equals the CPU's bit for bit wherever the fp32
// value does (add, scale, bias, dropout; GeLU / SwiGLU use expf where the CPU has a polynomial).
#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

using cuda::detail::blocks_for;
using cuda::detail::kThreads;
using cuda::detail::to_f32;
using cuda::detail::to_storage;

cudaStream_t st(stream_t s) { return static_cast<cudaStream_t>(s); }

#define GRID_STRIDE(i, n)                                                                \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

constexpr float kGeluC = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluA = 0.044715f;

// T: the activations' storage type (float, bf16, f16); W: the bias's (float or T). Every element
// is loaded as float, computed in fp32 and stored rounded to nearest even (common.cuh), the CPU
// kernels' widen / compute / narrow (kernels/cpu/widen.hpp) element for element.
template <typename T, typename W>
__global__ void add_bias_kernel(T* y, const W* bias, int64_t n, int64_t h) {
  GRID_STRIDE(i, n) y[i] = to_storage<T>(to_f32(y[i]) + to_f32(bias[i % h]));
}

template <typename T>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n) {
  GRID_STRIDE(i, n) out[i] = to_storage<T>(to_f32(a[i]) + to_f32(b[i]));
}

template <typename T>
__global__ void scale_kernel(T* a, float alpha, int64_t n) {
  GRID_STRIDE(i, n) a[i] = to_storage<T>(to_f32(a[i]) * alpha);
}

template <typename T>
__global__ void gelu_fwd_kernel(const T* x, T* y, int64_t n) {
  GRID_STRIDE(i, n) {
    const float v = to_f32(x[i]);
    const float u = kGeluC * (v + kGeluA * v * v * v);
    y[i] = to_storage<T>(v * sigmoid(2.0f * u));
  }
}

// d/dx [x s(2u)] = s + x * 2 s (1 - s) * du/dx, du/dx = c (1 + 3 a x^2).
template <typename T>
__global__ void gelu_bwd_kernel(const T* dy, const T* x, T* dx, int64_t n) {
  GRID_STRIDE(i, n) {
    const float v = to_f32(x[i]);
    const float u = kGeluC * (v + kGeluA * v * v * v);
    const float s = sigmoid(2.0f * u);
    const float du = kGeluC * (1.0f + 3.0f * kGeluA * v * v);
    dx[i] = to_storage<T>(to_f32(dy[i]) * (s + 2.0f * v * s * (1.0f - s) * du));
  }
}

// x [rows, 2f] = [gate | up], y [rows, f]; i indexes y.
template <typename T>
__global__ void swiglu_fwd_kernel(const T* x, T* y, int64_t n, int64_t f) {
  GRID_STRIDE(i, n) {
    const int64_t r = i / f, c = i % f;
    const float g = to_f32(x[r * 2 * f + c]), u = to_f32(x[r * 2 * f + f + c]);
    y[i] = to_storage<T>(g * sigmoid(g) * u);
  }
}

// y = g s(g) u: dy/dg = u s (1 + g (1 - s)), dy/du = g s.
template <typename T>
__global__ void swiglu_bwd_kernel(const T* dy, const T* x, T* dx, int64_t n, int64_t f) {
  GRID_STRIDE(i, n) {
    const int64_t r = i / f, c = i % f;
    const int64_t gi = r * 2 * f + c, ui = gi + f;
    const float g = to_f32(x[gi]), u = to_f32(x[ui]), s = sigmoid(g), d = to_f32(dy[i]);
    dx[gi] = to_storage<T>(d * u * s * (1.0f + g * (1.0f - s)));
    dx[ui] = to_storage<T>(d * g * s);
  }
}

// ---- dropout: splitmix64's output function, as kernels/cpu/elementwise.cpp ----
__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// Uniform in [0, 1) from the top 24 bits: exact in fp32, so the comparison with p is the CPU's.
__device__ __forceinline__ float uniform(uint64_t key, uint64_t index) {
  return static_cast<float>(mix64(key + (index + 1) * kGolden) >> 40) * (1.0f / 16777216.0f);
}

template <typename T>
__global__ void dropout_kernel(const T* x, T* y, int64_t n, float p, float scale, uint64_t key,
                               uint64_t offset) {
  GRID_STRIDE(i, n) {
    y[i] = to_storage<T>(uniform(key, offset + static_cast<uint64_t>(i)) >= p ? to_f32(x[i]) * scale : 0.0f);
  }
}

// ---- bias_backward: deterministic column sums ----
// Block (32, 8): threadIdx.x picks the column of a 32-column block (a warp reads 128 contiguous
// bytes of a row), threadIdx.y one of 8 row lanes; the block covers rows [chunk * rpc, ...).
constexpr int kColTile = 32, kRowLanes = 8;

template <typename T>
__global__ void column_partials_kernel(const T* dy, float* partial, int64_t rows, int64_t h,
                                       int64_t rows_per_chunk) {
  __shared__ float acc[kRowLanes][kColTile];
  const int64_t col = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * rows_per_chunk;
  const int64_t r1 = min(rows, r0 + rows_per_chunk);
  float s = 0.0f;
  if (col < h)
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) s += to_f32(dy[r * h + col]);
  acc[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && col < h) {
    float t = 0.0f;
#pragma unroll
    for (int l = 0; l < kRowLanes; l++) t += acc[l][threadIdx.x];
    partial[static_cast<int64_t>(blockIdx.y) * h + col] = t;
  }
}

// out[c] += sum over chunks (in order) of partial[chunk, c].
__global__ void sum_partials_kernel(const float* partial, float* out, int64_t chunks, int64_t h) {
  GRID_STRIDE(c, h) {
    float t = 0.0f;
    for (int64_t k = 0; k < chunks; k++) t += partial[k * h + c];
    out[c] += t;
  }
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

void add_bias(void* y, DType dtype, const void* bias, DType bias_dtype, int64_t rows, int64_t h,
              stream_t stream) {
  const int64_t n = rows * h;
  if (n == 0) return;
  PARALLEL_CUDA_DISPATCH_ACT_PARAM(dtype, bias_dtype, T, W, {
    add_bias_kernel<T, W><<<blocks_for(n), kThreads, 0, st(stream)>>>(out<T>(y), in<W>(bias), n, h);
  });
  CUDA_OPS_LAUNCHED();
}

// Chunks of at least 64 rows, at most 256 chunks: a function of the shape only (determinism).
void column_sums_accumulate(const void* x, DType dtype, float* sums, int64_t rows, int64_t h,
                            cudaStream_t stream) {
  if (rows == 0 || h == 0) return;
  const int64_t chunks = std::min<int64_t>(256, (rows + 63) / 64);
  const int64_t rpc = (rows + chunks - 1) / chunks;
  cuda::detail::Scratch partial(static_cast<std::size_t>(chunks * h) * sizeof(float), stream);
  const dim3 grid(static_cast<unsigned>((h + kColTile - 1) / kColTile), static_cast<unsigned>(chunks));
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    column_partials_kernel<T>
        <<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(in<T>(x), partial.as<float>(), rows, h, rpc);
  });
  CUDA_OPS_LAUNCHED();
  sum_partials_kernel<<<blocks_for(h), kThreads, 0, stream>>>(partial.as<float>(), sums, chunks, h);
  CUDA_OPS_LAUNCHED();
}

void bias_backward(const void* dy, DType dtype, float* dbias, int64_t rows, int64_t h, stream_t stream) {
  column_sums_accumulate(dy, dtype, dbias, rows, h, st(stream));
}

void add(const void* a, const void* b, void* result, DType dtype, int64_t n, stream_t stream) {
  if (n == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    add_kernel<T><<<blocks_for(n), kThreads, 0, st(stream)>>>(in<T>(a), in<T>(b), out<T>(result), n);
  });
  CUDA_OPS_LAUNCHED();
}

void scale(void* a, DType dtype, float alpha, int64_t n, stream_t stream) {
  if (n == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(
      dtype, T, { scale_kernel<T><<<blocks_for(n), kThreads, 0, st(stream)>>>(out<T>(a), alpha, n); });
  CUDA_OPS_LAUNCHED();
}

void gelu_forward(const void* x, void* y, DType dtype, int64_t n, stream_t stream) {
  if (n == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(
      dtype, T, { gelu_fwd_kernel<T><<<blocks_for(n), kThreads, 0, st(stream)>>>(in<T>(x), out<T>(y), n); });
  CUDA_OPS_LAUNCHED();
}

void gelu_backward(const void* dy, const void* x, void* dx, DType dtype, int64_t n, stream_t stream) {
  if (n == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    gelu_bwd_kernel<T><<<blocks_for(n), kThreads, 0, st(stream)>>>(in<T>(dy), in<T>(x), out<T>(dx), n);
  });
  CUDA_OPS_LAUNCHED();
}

void swiglu_forward(const void* x, void* y, DType dtype, int64_t rows, int64_t f, stream_t stream) {
  const int64_t n = rows * f;
  if (n == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    swiglu_fwd_kernel<T><<<blocks_for(n), kThreads, 0, st(stream)>>>(in<T>(x), out<T>(y), n, f);
  });
  CUDA_OPS_LAUNCHED();
}

void swiglu_backward(const void* dy, const void* x, void* dx, DType dtype, int64_t rows, int64_t f,
                     stream_t stream) {
  const int64_t n = rows * f;
  if (n == 0) return;
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    swiglu_bwd_kernel<T><<<blocks_for(n), kThreads, 0, st(stream)>>>(in<T>(dy), in<T>(x), out<T>(dx), n, f);
  });
  CUDA_OPS_LAUNCHED();
}

void dropout(const void* x, void* y, DType dtype, int64_t n, float p, uint64_t seed, uint64_t offset,
             stream_t stream) {
  if (n == 0) return;
  if (p == 0.0f) {  // a copy, as the CPU's memcpy (bits unchanged, NaN payloads included)
    if (x != y)
      CUDA_OPS_CHECK(cudaMemcpyAsync(y, x, n * dtype_size(dtype), cudaMemcpyDeviceToDevice, st(stream)));
    return;
  }
  const float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;  // p == 1 drops everything (no inf * 0)
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    dropout_kernel<T>
        <<<blocks_for(n), kThreads, 0, st(stream)>>>(in<T>(x), out<T>(y), n, p, scale, mix64(seed), offset);
  });
  CUDA_OPS_LAUNCHED();
}

}  // namespace parallel::kernels
