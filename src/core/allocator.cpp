#include "parallel/allocator.hpp"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cuda_backend.hpp"
#include "meta_allocator.hpp"
#include "parallel/error.hpp"

namespace parallel {
namespace {

constexpr std::size_t kAlignment = 256;

// Host memory, aligned and counted; the counts are what memory tests measure (weights per rank,
// live activations, optimizer state). Blocks of 4 KiB and more (rounded up to 256 B, 4 KiB from
// 64 KiB, 64 KiB from 1 MiB) are cached by size when freed and handed out again: a training step
// allocates the same sizes every micro-batch, and returning them to the system (glibc serves them
// with mmap) made the kernel zero fresh pages on every reuse - 13 % of an fp32 step in a profile.
// Blocks from 4 KiB (not only from 64 KiB): left to glibc, a small tensor freed and allocated again
// in another order could be carved from fresh heap pages in any later step (page faults inside the
// step; test_step_conversions). `allocated` counts live bytes only; `reserved` adds the cached ones.
class CpuAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Stream) override {
    if (bytes == 0) return nullptr;
    const std::size_t rounded = block_size(bytes);
    void* p = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto it = cache_.find(rounded);
      if (it != cache_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        cached_bytes_ -= rounded;
      }
    }
    const bool fresh = p == nullptr;
    if (fresh) p = std::aligned_alloc(kAlignment, rounded);
    PARALLEL_CHECK(p != nullptr, "out of host memory allocating {} bytes ({} already allocated)", bytes,
                   stats().allocated);
    std::lock_guard lock(mutex_);
    stats_.allocated += bytes;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    ++stats_.num_allocations;
    if (fresh) ++stats_.num_system_allocations;
    stats_.reserved = stats_.allocated + cached_bytes_;
    return p;
  }

  void deallocate(void* ptr, std::size_t bytes, Stream) override {
    if (ptr == nullptr) return;
    const std::size_t rounded = block_size(bytes);
    std::lock_guard lock(mutex_);
    stats_.allocated -= bytes;
    if (rounded >= kCacheFrom) {
      cache_[rounded].push_back(ptr);
      cached_bytes_ += rounded;
    } else {
      std::free(ptr);
    }
    stats_.reserved = stats_.allocated + cached_bytes_;
  }

  MemoryStats stats() const override {
    std::lock_guard lock(mutex_);
    return stats_;
  }

  void reset_peak() override {
    std::lock_guard lock(mutex_);
    stats_.peak_allocated = stats_.allocated;
  }

  ~CpuAllocator() override {
    for (auto& [size, blocks] : cache_)
      for (void* p : blocks) std::free(p);
  }

 private:
  static constexpr std::size_t kCacheFrom = std::size_t{4} << 10;
  static std::size_t block_size(std::size_t bytes) {
    // Coarser rounding for bigger blocks: more reuse across nearly equal sizes, waste <= 1/16.
    const std::size_t granule = bytes < kCacheFrom               ? kAlignment
                                : bytes < (std::size_t{1} << 20) ? 4096
                                                                 : 65536;
    return (bytes + granule - 1) / granule * granule;
  }

  mutable std::mutex mutex_;
  MemoryStats stats_;
  std::unordered_map<std::size_t, std::vector<void*>> cache_;
  std::size_t cached_bytes_ = 0;
};

}  // namespace

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) {
    static CpuAllocator cpu;
    return cpu;
  }
  if (device.is_meta()) return meta_allocator();
  return cuda_backend::allocator(device.index);
}

MemoryStats memory_stats(Device device) { return allocator_for(device).stats(); }

}  // namespace parallel
