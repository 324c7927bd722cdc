#pragma once
// Host-side launchers for the element-wise conversion and fill kernels (convert.cu). Plain C++ so
// that the host-compiled backend (src/cuda/) can call them; errors come back as cudaError_t and
// the caller turns them into parallel::Error.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "parallel/dtype.hpp"

namespace parallel::kernels {

// True for the pairs convert() handles: any two of F32, BF16, F16, or any type to itself.
bool convert_supported(DType dst, DType src);

// dst[i] = (dst_type) src[i] for n contiguous elements, round to nearest even. Both pointers are
// device memory on the current device; dst and src must not overlap unless they are equal and the
// types match.
cudaError_t convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n,
                    cudaStream_t stream);

// Writes the low `elem_size` bytes of `bits` into each of n elements (elem_size 1, 2, 4 or 8).
// The caller encodes the value (fp32 -> bf16 rounding etc.) on the host, once.
cudaError_t fill(void* dst, int elem_size, uint64_t bits, int64_t n, cudaStream_t stream);

}  // namespace parallel::kernels
