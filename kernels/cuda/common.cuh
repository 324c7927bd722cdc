#pragma once
// Helpers shared by the .cu files under kernels/: launch sizing, error propagation, scratch memory
// from the caching allocator, warp / block reductions. Internal to kernels/ (not installed).
//
// No fmt in CUDA translation units: nvcc cannot compile fmt 9's headers in C++20 mode (consteval
// format strings, is_constant_evaluated), so .cu files include neither parallel/error.hpp nor
// parallel/tensor.hpp. They expose raw-pointer launchers returning cudaError_t (as convert.cu
// does); the Tensor-level functions in cuda_ops.hpp, compiled as host C++, validate, make the
// device current and turn a failure into parallel::Error.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "parallel/allocator.hpp"
#include "parallel/device.hpp"
#include "parallel/dtype.hpp"

namespace parallel {
// Declared in parallel/error.hpp, which .cu files cannot include (fmt); defined in the library.
[[noreturn]] void throw_error(const char* file, int line, const std::string& message);
}  // namespace parallel

namespace parallel::cuda::detail {

[[noreturn]] inline void throw_cuda(const char* file, int line, const char* call, cudaError_t err) {
  (void)cudaGetLastError();  // clear a non-sticky error so that the next check does not see it again
  throw_error(file, line,
              std::string(call) + " failed: " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

constexpr int kThreads = 256;
// Grid-stride loops need no more blocks than fill an H100 (132 SMs x 8 blocks) a few times over.
constexpr int64_t kMaxBlocks = 4096;

inline int blocks_for(int64_t work_items, int threads = kThreads) {
  return static_cast<int>(std::clamp<int64_t>((work_items + threads - 1) / threads, 1, kMaxBlocks));
}

inline int current_device() {
  int d = 0;
  (void)cudaGetDevice(&d);
  return d;
}

// Scratch device memory from the current device's caching allocator, ordered on `stream`: freed
// (back to the cache) when the scope ends, reusable at once by later work on the same stream.
class Scratch {
 public:
  Scratch(std::size_t bytes, cudaStream_t stream)
      : alloc_(&allocator_for(Device::cuda(current_device()))), bytes_(bytes), stream_{stream} {
    ptr_ = bytes_ ? alloc_->allocate(bytes_, stream_) : nullptr;
  }
  ~Scratch() {
    if (ptr_) alloc_->deallocate(ptr_, bytes_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  Allocator* alloc_;
  std::size_t bytes_;
  Stream stream_;
  void* ptr_ = nullptr;
};

// ---- device-side reductions -------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

struct SumOp {
  template <typename T>
  __device__ T operator()(T v) const {
    return warp_sum(v);
  }
};
struct MaxOp {
  __device__ float operator()(float v) const { return warp_max(v); }
};

// Sum (or max) over the whole block, returned to every thread. blockDim.x a multiple of 32, at most
// 1024; `shared` holds 32 values. The order is fixed by the thread layout: deterministic.
template <typename T, typename Op>
__device__ __forceinline__ T block_reduce(T v, T* shared, Op op, T identity) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = op(v);
  __syncthreads();  // `shared` may still be read by a previous call
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : identity;
  return op(v);
}

// ---- 16-bit storage, fp32 arithmetic --------------------------------------------------------
// Kernels are templated on the storage type T of their activations (float, bf16, f16: the
// {uint16_t bits} structs of parallel/dtype.hpp): they load each element as float, compute in fp32
// and store with to_storage<T>. The narrowing is the CPU's (float_to_bf16 / float_to_f16 of
// src/core/dtype.cpp, used by kernels/cpu/widen.hpp): round to nearest even, fp16 overflow to inf,
// subnormals kept, NaN -> the CPU's quiet NaN. So a 16-bit output is bit-identical to the CPU's
// whenever the fp32 value before the narrowing is.

__device__ __forceinline__ float to_f32(float x) { return x; }
// bf16 is the top half of an fp32: widening is a shift, exact.
__device__ __forceinline__ float to_f32(bf16 x) {
  return __uint_as_float(static_cast<uint32_t>(x.bits) << 16);
}
__device__ __forceinline__ float to_f32(f16 x) { return __half2float(__ushort_as_half(x.bits)); }

template <typename T>
__device__ __forceinline__ T to_storage(float x);
template <>
__device__ __forceinline__ float to_storage<float>(float x) {
  return x;
}
// float_to_bf16: NaN keeps its top bits with the quiet bit set; else add 0x7fff plus the lowest kept
// bit (ties to even) and keep the top 16 bits (overflow carries into inf, as it must).
template <>
__device__ __forceinline__ bf16 to_storage<bf16>(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t r =
      (u & 0x7fffffffu) > 0x7f800000u ? (u >> 16) | 0x40u : (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return bf16{static_cast<uint16_t>(r)};
}
// float_to_f16: the hardware conversion rounds finite values (subnormals, overflow to inf) exactly
// as the CPU's integer code does; NaN becomes sign | 0x7e00 as there (the hardware's is 0x7fff).
template <>
__device__ __forceinline__ f16 to_storage<f16>(float x) {
  const uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f16{static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u)};
  return f16{__half_as_ushort(__float2half_rn(x))};
}

}  // namespace parallel::cuda::detail

// Runs the statement list with `T` bound to the storage type of `dtype` (F32 -> float, BF16 -> bf16,
// F16 -> f16); another dtype throws (src/ops/ops.cpp has rejected it before). Host code.
#define PARALLEL_CUDA_DISPATCH_FLOAT(dtype, T, ...)                                                   \
  do {                                                                                                \
    switch (dtype) {                                                                                  \
      case ::parallel::DType::F32: {                                                                  \
        using T = float;                                                                              \
        __VA_ARGS__;                                                                                  \
      } break;                                                                                        \
      case ::parallel::DType::BF16: {                                                                 \
        using T = ::parallel::bf16;                                                                   \
        __VA_ARGS__;                                                                                  \
      } break;                                                                                        \
      case ::parallel::DType::F16: {                                                                  \
        using T = ::parallel::f16;                                                                    \
        __VA_ARGS__;                                                                                  \
      } break;                                                                                        \
      default:                                                                                        \
        ::parallel::throw_error(__FILE__, __LINE__, "CUDA kernel: dtype must be fp32, bf16 or fp16"); \
    }                                                                                                 \
  } while (0)

// The same for an activation dtype `act` and a parameter dtype `param` that is fp32 or `act` (the
// ops.hpp contract for weights and biases): binds T to act's storage type and W to float or T.
#define PARALLEL_CUDA_DISPATCH_ACT_PARAM(act, param, T, W, ...)                                 \
  PARALLEL_CUDA_DISPATCH_FLOAT(act, T, {                                                        \
    if ((param) == ::parallel::DType::F32) {                                                    \
      using W = float;                                                                          \
      __VA_ARGS__;                                                                              \
    } else if ((param) == (act)) {                                                              \
      using W = T;                                                                              \
      __VA_ARGS__;                                                                              \
    } else {                                                                                    \
      ::parallel::throw_error(__FILE__, __LINE__,                                               \
                              "CUDA kernel: parameter dtype must be fp32 or the activations'"); \
    }                                                                                           \
  })

// Throws parallel::Error (through parallel::throw_error, declared here without its fmt-based header)
// when a CUDA call or a launch failed; used after every launch as CUDA_OPS_CHECK(cudaGetLastError()).
#define CUDA_OPS_CHECK(call)                                                          \
  do {                                                                                \
    const cudaError_t cuda_ops_err_ = (call);                                         \
    if (cuda_ops_err_ != cudaSuccess) [[unlikely]]                                    \
      ::parallel::cuda::detail::throw_cuda(__FILE__, __LINE__, #call, cuda_ops_err_); \
  } while (0)
#define CUDA_OPS_LAUNCHED() CUDA_OPS_CHECK(cudaGetLastError())
#define CUDA_OPS_REQUIRE(cond, message)                                                                  \
  do {                                                                                                   \
    if (!(cond)) [[unlikely]]                                                                            \
      ::parallel::throw_error(__FILE__, __LINE__, std::string("check failed: " #cond ": ") + (message)); \
  } while (0)
