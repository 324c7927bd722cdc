#pragma once
// Where a tensor's bytes live, and the stream its work is ordered on.
#include <cstddef>
#include <string>

namespace parallel {

// Meta: tensors with a shape and a dtype but no values (meta.hpp): ops check their contract and
// record what they would do, the meta allocator counts the bytes; reading a value is an error.
enum class DeviceType : uint8_t { CPU = 0, CUDA = 1, Meta = 2 };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // GPU ordinal; 0 for the CPU

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  static Device meta() { return {DeviceType::Meta, 0}; }
  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_meta() const { return type == DeviceType::Meta; }
  bool operator==(const Device&) const = default;
  std::string str() const;  // "cpu", "cuda:1", "meta"
};

// An opaque handle to a CUDA stream (cudaStream_t) so that public headers never include CUDA.
// nullptr is the CPU's "stream" and CUDA's legacy default stream.
struct Stream {
  void* handle = nullptr;
  bool operator==(const Stream&) const = default;
};

// True when this build has the CUDA backend and at least one GPU is visible.
bool cuda_available();
int cuda_device_count();  // 0 without CUDA or without a GPU

// Makes `device` the calling thread's current GPU (cudaSetDevice): kernels launched with the
// default stream and libraries that use the current device (NCCL, cuBLAS) go there. A rank that
// drives one GPU calls it once, first. No-op for the CPU; throws for a GPU that does not exist.
void set_current_device(Device device);
// The GPU's marketing name ("NVIDIA H100 80GB HBM3"), "cpu" for the CPU.
std::string device_name(Device device);

// Free and total bytes of a GPU's memory as the driver sees them (cudaMemGetInfo): what the memory
// plan checks a rank's device terms against. Throws for the CPU (see host_memory_limit).
struct DeviceMemoryInfo {
  std::size_t free = 0;
  std::size_t total = 0;
};
DeviceMemoryInfo device_memory_info(Device device);

}  // namespace parallel
