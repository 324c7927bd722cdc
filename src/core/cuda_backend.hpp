#pragma once
// Internal seam between the device-neutral core (tensor, allocator) and the CUDA backend.
// Implemented in src/cuda/ when PARALLEL_HAVE_CUDA, and by src/core/cuda_backend_none.cpp (which
// throws a clear error) otherwise. Not installed: users see only Tensor and Allocator.
#include <cstdint>

#include "parallel/allocator.hpp"
#include "parallel/dtype.hpp"

namespace parallel::cuda_backend {

bool available();
int device_count();
Allocator& allocator(int device);

// Copies `bytes` between any two of host / device memory, ordered on `stream` (the copy has
// finished when this returns if either side is host memory).
void memcpy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes,
            Stream stream);
// Copies `rows` runs of `width` bytes, run r at dst + r * dst_pitch from src + r * src_pitch
// (pitches >= width), between any two of host / device memory; otherwise as memcpy.
void memcpy_2d(void* dst, std::size_t dst_pitch, Device dst_device, const void* src, std::size_t src_pitch,
               Device src_device, std::size_t width, int64_t rows, Stream stream);
// Element-wise dtype conversion of n contiguous elements already on `device`.
void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n, Device device,
             Stream stream);
void fill(void* dst, DType type, double value, int64_t n, Device device, Stream stream);
void synchronize(Stream stream);
// The caching allocator's record_stream: the block at `ptr` (a storage's data) is used on `stream`,
// so once freed it is not reused before that stream's work queued by then has completed.
void record_stream(void* ptr, Device device, Stream stream);

}  // namespace parallel::cuda_backend
