// The CUDA side of the seam in src/core/cuda_backend.hpp: device discovery, the per-device caching
// allocators, copies, conversion and fill.
#include "../core/cuda_backend.hpp"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "cuda/convert.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda_caching_allocator.hpp"
#include "parallel/device.hpp"

namespace parallel {

namespace cuda_backend {
namespace {

cudaStream_t to_cuda(Stream s) { return static_cast<cudaStream_t>(s.handle); }

void check_device(Device device, const char* what) {
  PARALLEL_CHECK(device.is_cuda(), "{} needs a CUDA device, got {}", what, device.str());
  PARALLEL_CHECK(device.index >= 0 && device.index < device_count(),
                 "{}: {} does not exist ({} CUDA devices)", what, device.str(), device_count());
}

// Raw bit pattern of `value` as one element of `type`, encoded exactly as the CPU path does.
uint64_t encode(double value, DType type) {
  uint64_t bits = 0;
  // +0 is all zero bits in every dtype, fp8 included, so zeros() works for every dtype.
  if (value == 0.0 && !std::signbit(value)) return 0;
  switch (type) {
    case DType::F32: {
      float f = static_cast<float>(value);
      std::memcpy(&bits, &f, sizeof f);
      return bits;
    }
    case DType::BF16:
      return float_to_bf16(static_cast<float>(value)).bits;
    case DType::F16:
      return float_to_f16(static_cast<float>(value)).bits;
    case DType::I32: {
      int32_t i = static_cast<int32_t>(value);
      std::memcpy(&bits, &i, sizeof i);
      return bits;
    }
    case DType::I64: {
      int64_t i = static_cast<int64_t>(value);
      std::memcpy(&bits, &i, sizeof i);
      return bits;
    }
    case DType::U8:
      return static_cast<uint8_t>(value);
    default:
      PARALLEL_FAIL("fill: dtype {} is not supported on CUDA", dtype_name(type));
  }
}

}  // namespace

int device_count() {
  // Counted once: the set of visible devices cannot change after the runtime initialises. With no
  // driver or no GPU the runtime reports an error, which here simply means "no devices".
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return count;
}

bool available() { return device_count() > 0; }

Allocator& allocator(int device) {
  PARALLEL_CHECK(device >= 0 && device < device_count(), "no CUDA device {} ({} visible)", device,
                 device_count());
  // Deliberately leaked: tensors with static lifetime may free into these after main returns, and
  // the driver reclaims device memory at exit anyway.
  static std::vector<cuda::CudaCachingAllocator*>* allocators = [] {
    auto* v = new std::vector<cuda::CudaCachingAllocator*>();
    for (int d = 0; d < device_count(); ++d) v->push_back(new cuda::CudaCachingAllocator(d));
    return v;
  }();
  return *(*allocators)[device];
}

void memcpy(void* dst, Device dst_device, const void* src, Device src_device, std::size_t bytes,
            Stream stream) {
  if (bytes == 0 || dst == src) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  // Unified addressing lets the runtime infer the direction; the stream belongs to the GPU side.
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  check_device(gpu, "memcpy");
  cuda::DeviceGuard guard(gpu.index);
  PARALLEL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, to_cuda(stream)));
  // The contract: host memory may be read or reused as soon as we return.
  if (dst_device.is_cpu() || src_device.is_cpu()) PARALLEL_CUDA_CHECK(cudaStreamSynchronize(to_cuda(stream)));
}

void memcpy_2d(void* dst, std::size_t dst_pitch, Device dst_device, const void* src, std::size_t src_pitch,
               Device src_device, std::size_t width, int64_t rows, Stream stream) {
  if (width == 0 || rows <= 0) return;
  if (rows == 1 || (dst_pitch == width && src_pitch == width))
    return memcpy(dst, dst_device, src, src_device, width * static_cast<std::size_t>(rows), stream);
  PARALLEL_CHECK(!(dst_device.is_cpu() && src_device.is_cpu()), "memcpy_2d: host to host is the caller's");
  const Device gpu = dst_device.is_cuda() ? dst_device : src_device;
  check_device(gpu, "memcpy_2d");
  cuda::DeviceGuard guard(gpu.index);
  PARALLEL_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, static_cast<std::size_t>(rows),
                                        cudaMemcpyDefault, to_cuda(stream)));
  if (dst_device.is_cpu() || src_device.is_cpu()) PARALLEL_CUDA_CHECK(cudaStreamSynchronize(to_cuda(stream)));
}

void convert(void* dst, DType dst_type, const void* src, DType src_type, int64_t n, Device device,
             Stream stream) {
  PARALLEL_CHECK(kernels::convert_supported(dst_type, src_type),
                 "CUDA conversion from {} to {} is not supported (fp32, bf16 and fp16 convert to each other)",
                 dtype_name(src_type), dtype_name(dst_type));
  if (n <= 0) return;
  check_device(device, "convert");
  cuda::DeviceGuard guard(device.index);
  PARALLEL_CUDA_CHECK(kernels::convert(dst, dst_type, src, src_type, n, to_cuda(stream)));
}

void fill(void* dst, DType type, double value, int64_t n, Device device, Stream stream) {
  const uint64_t bits = encode(value, type);
  if (n <= 0) return;
  check_device(device, "fill");
  cuda::DeviceGuard guard(device.index);
  PARALLEL_CUDA_CHECK(kernels::fill(dst, static_cast<int>(dtype_size(type)), bits, n, to_cuda(stream)));
}

void synchronize(Stream stream) { PARALLEL_CUDA_CHECK(cudaStreamSynchronize(to_cuda(stream))); }

void record_stream(void* ptr, Device device, Stream stream) {
  check_device(device, "record_stream");
  // allocator() hands out CudaCachingAllocators only.
  static_cast<cuda::CudaCachingAllocator&>(allocator(device.index)).record_stream(ptr, stream);
}

}  // namespace cuda_backend

bool cuda_available() { return cuda_backend::available(); }
int cuda_device_count() { return cuda_backend::device_count(); }

std::string device_name(Device device) {
  if (device.is_cpu()) return "cpu";
  cudaDeviceProp prop{};
  PARALLEL_CUDA_CHECK(cudaGetDeviceProperties(&prop, device.index));
  return prop.name;
}

DeviceMemoryInfo device_memory_info(Device device) {
  PARALLEL_CHECK(!device.is_cpu(), "device_memory_info: the CPU has no device memory");
  PARALLEL_CHECK(device.index >= 0 && device.index < cuda_backend::device_count(),
                 "device_memory_info: {} does not exist", device.str());
  cuda::DeviceGuard guard(device.index);
  DeviceMemoryInfo info;
  PARALLEL_CUDA_CHECK(cudaMemGetInfo(&info.free, &info.total));
  return info;
}

void set_current_device(Device device) {
  if (device.is_cpu()) return;
  const int count = cuda_backend::device_count();
  PARALLEL_CHECK(device.index >= 0 && device.index < count,
                 "set_current_device: {} does not exist ({} visible)", device.str(), count);
  PARALLEL_CUDA_CHECK(cudaSetDevice(device.index));
}

}  // namespace parallel
