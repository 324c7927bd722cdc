#pragma once
// Checks for CUDA runtime return codes. A failure throws parallel::Error with the call's text, the
// runtime's error name and message, and file:line [rank on host] (from error_location), so that the
// top level can log it once and end the job. It sits beside the kernels, which use it, and below
// src/cuda, which uses it too; NCCL's check is src/cuda/nccl_check.hpp (kernels know no NCCL).
#include <cuda_runtime_api.h>

#include <string>

#include "parallel/error.hpp"

namespace parallel::detail {

[[noreturn]] inline void throw_cuda_error(const char* file, int line, const char* call, cudaError_t err) {
  // Non-sticky errors stay latched in the runtime until read; clear it so the next, unrelated
  // check does not report this failure a second time.
  (void)cudaGetLastError();
  throw_error(file, line,
              fmt::format("{} failed: {} ({})", call, cudaGetErrorName(err), cudaGetErrorString(err)));
}

}  // namespace parallel::detail

namespace parallel::cuda {

// Makes `device` current for a scope and restores the caller's device afterwards, so the library
// never leaves a thread on a different GPU than the one it chose.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      cudaError_t err = cudaSetDevice(device);
      if (err != cudaSuccess) detail::throw_cuda_error(__FILE__, __LINE__, "cudaSetDevice(device)", err);
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    if (changed_ && previous_ >= 0) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool changed_ = false;
};

}  // namespace parallel::cuda

#define PARALLEL_CUDA_CHECK(call)                                                          \
  do {                                                                                     \
    cudaError_t parallel_cuda_err_ = (call);                                               \
    if (parallel_cuda_err_ != cudaSuccess) [[unlikely]]                                    \
      ::parallel::detail::throw_cuda_error(__FILE__, __LINE__, #call, parallel_cuda_err_); \
  } while (0)
