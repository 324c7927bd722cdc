#include "parallel/allocator.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "cuda_backend.hpp"
#include "parallel/error.hpp"

namespace parallel {
namespace {

constexpr std::size_t kAlignment = 256;

// Host memory: the C library's allocator already caches, so this one only aligns and counts. The
// counts are what memory tests measure (weights per rank, live activations, optimizer state).
class CpuAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Stream) override {
    if (bytes == 0) return nullptr;
    const std::size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
    void* p = std::aligned_alloc(kAlignment, rounded);
    PARALLEL_CHECK(p != nullptr, "out of host memory allocating {} bytes ({} already allocated)", bytes,
                   stats().allocated);
    std::lock_guard lock(mutex_);
    stats_.allocated += bytes;
    stats_.reserved += bytes;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    ++stats_.num_allocations;
    ++stats_.num_system_allocations;
    return p;
  }

  void deallocate(void* ptr, std::size_t bytes, Stream) override {
    if (ptr == nullptr) return;
    std::free(ptr);
    std::lock_guard lock(mutex_);
    stats_.allocated -= bytes;
    stats_.reserved -= bytes;
  }

  MemoryStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard lock(mutex_);
    stats_.peak_allocated = stats_.allocated;
  }

 private:
  mutable std::mutex mutex_;
  MemoryStats stats_;
};

}  // namespace

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    static CpuAllocator cpu;
    return cpu;
  }
  return cuda_backend::allocator(device.index);
}

MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }

}  // namespace parallel
