#pragma once
// Helpers shared by the .cu files under kernels/: launch sizing, error propagation, scratch memory
// from the caching allocator, warp / block reductions. Internal to kernels/ (not installed).
//
// No fmt in CUDA translation units: nvcc cannot compile fmt 9's headers in C++20 mode (consteval
// format strings, is_constant_evaluated), so .cu files include neither parallel/error.hpp nor
// parallel/tensor.hpp. They expose raw-pointer launchers returning cudaError_t (as convert.cu
// does); the Tensor-level functions in cuda_ops.hpp, compiled as host C++, validate, make the
// device current and turn a failure into parallel::Error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "parallel/allocator.hpp"
#include "parallel/device.hpp"

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

}  // namespace parallel::cuda::detail

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
