// The CUDA seam for builds without the CUDA backend: every entry point says so plainly.
#include "parallel/build_config.hpp"
#if !PARALLEL_HAVE_CUDA
#include "cuda_backend.hpp"
#include "parallel/error.hpp"

namespace parallel {
namespace {
[[noreturn]] void no_cuda() {
  PARALLEL_FAIL(
      "this build of libparallel has no CUDA backend (configure with PARALLEL_WITH_CUDA=ON on a "
      "machine with the CUDA toolkit)");
}
}  // namespace

bool cuda_available() { return false; }
int cuda_device_count() { return 0; }
std::string device_name(Device device) {
  if (!device.is_cpu()) no_cuda();
  return "cpu";
}
void set_current_device(Device device) {
  if (!device.is_cpu()) no_cuda();
}
DeviceMemoryInfo device_memory_info(Device device) {
  if (!device.is_cpu()) no_cuda();
  PARALLEL_FAIL("device_memory_info: the CPU has no device memory");
}

namespace cuda_backend {
bool available() { return false; }
int device_count() { return 0; }
Allocator& allocator(int) { no_cuda(); }
void memcpy(void*, Device, const void*, Device, std::size_t, Stream) { no_cuda(); }
void memcpy_2d(void*, std::size_t, Device, const void*, std::size_t, Device, std::size_t, int64_t, Stream) {
  no_cuda();
}
void convert(void*, DType, const void*, DType, int64_t, Device, Stream) { no_cuda(); }
void fill(void*, DType, double, int64_t, Device, Stream) { no_cuda(); }
void synchronize(Stream) {}
void record_stream(void*, Device, Stream) { no_cuda(); }
}  // namespace cuda_backend
}  // namespace parallel
#endif
