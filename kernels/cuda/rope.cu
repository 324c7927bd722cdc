// Rotary position embedding in place on x [s, b, heads, d] (GPT-NeoX / Llama pairs (i, i + d/2)).
//
// Two kernels: a [s, d/2] table of cos and sin computed in double from rope_inv_freq
// (parallel/rope.hpp, shared with kernels/cpu/rope.cpp)
// (at positions ~1e5 a float angle would be off by ~1e-2 rad), then the rotation, one thread per
// pair. The table makes the GPU's values those of the CPU up to libm's last-bit differences.
// x may be fp32, bf16 or fp16: rotated in fp32, rounded back to nearest even in place.
#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace parallel::kernels {
namespace {

using cuda::detail::blocks_for;
using cuda::detail::kThreads;
using cuda::detail::to_f32;
using cuda::detail::to_storage;

__global__ void rope_table_kernel(float* cos_t, float* sin_t, int64_t s, int64_t half, int64_t d,
                                  int64_t position_offset, Rope rope, float direction) {
  const int64_t n = s * half;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t p = t / half, i = t % half;
    const double inv_freq = rope_inv_freq(rope, i, d);
    const double angle = static_cast<double>(position_offset + p) * inv_freq;
    const double factor = rope_attention_factor(rope);  // yarn's cos/sin factor, 1 otherwise
    cos_t[t] = static_cast<float>(factor * cos(angle));
    sin_t[t] = direction * static_cast<float>(factor * sin(angle));
  }
}

// One thread per (position p, head row v, pair i): n = s * per_pos * half. T: the storage type
// (float, bf16, f16); the pair is loaded as float, rotated in fp32 and stored rounded to nearest even.
template <typename T>
__global__ void rope_apply_kernel(T* x, const float* cos_t, const float* sin_t, int64_t n, int64_t per_pos,
                                  int64_t half) {
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < n;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = t % half, row = t / half;  // row = p * per_pos + v
    const int64_t p = row / per_pos;
    T* head = x + row * 2 * half;
    const float c = cos_t[p * half + i], sn = sin_t[p * half + i];
    const float x1 = to_f32(head[i]), x2 = to_f32(head[i + half]);
    head[i] = to_storage<T>(x1 * c - x2 * sn);
    head[i + half] = to_storage<T>(x2 * c + x1 * sn);
  }
}

}  // namespace

void rope(void* x, DType dtype, int64_t s, int64_t per_pos, int64_t d, int64_t position_offset,
          const Rope& rope, float direction, stream_t stream) {
  const int64_t half = d / 2;
  if (s == 0 || per_pos == 0 || half == 0) return;
  const auto cs = static_cast<cudaStream_t>(stream);
  cuda::detail::Scratch table(static_cast<std::size_t>(2 * s * half) * sizeof(float), cs);
  float* cos_t = table.as<float>();
  float* sin_t = cos_t + s * half;
  rope_table_kernel<<<blocks_for(s * half), kThreads, 0, cs>>>(cos_t, sin_t, s, half, d, position_offset,
                                                               rope, direction);
  CUDA_OPS_LAUNCHED();
  const int64_t n = s * per_pos * half;
  PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, {
    rope_apply_kernel<T>
        <<<blocks_for(n), kThreads, 0, cs>>>(static_cast<T*>(x), cos_t, sin_t, n, per_pos, half);
  });
  CUDA_OPS_LAUNCHED();
}

}  // namespace parallel::kernels
