#pragma once
// Checks for NCCL return codes, the counterpart of kernels/cuda/cuda_check.hpp for the NCCL
// communicator. A failure throws parallel::Error with the call's text, NCCL's message and its last
// error detail, and file:line [rank on host].
#include <nccl.h>

#include "parallel/error.hpp"

namespace parallel::detail {

[[noreturn]] inline void throw_nccl_error(const char* file, int line, const char* call, ncclResult_t rc) {
  // ncclGetLastError carries the detail (which peer, which transport) that the code alone lacks.
  const char* last = ncclGetLastError(nullptr);
  throw_error(file, line,
              fmt::format("{} failed: {} (code {}){}{}", call, ncclGetErrorString(rc), static_cast<int>(rc),
                          last && *last ? ": " : "", last ? last : ""));
}

}  // namespace parallel::detail

#define PARALLEL_NCCL_CHECK(call)                                                         \
  do {                                                                                    \
    ncclResult_t parallel_nccl_rc_ = (call);                                              \
    if (parallel_nccl_rc_ != ncclSuccess) [[unlikely]]                                    \
      ::parallel::detail::throw_nccl_error(__FILE__, __LINE__, #call, parallel_nccl_rc_); \
  } while (0)
