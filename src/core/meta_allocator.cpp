// The meta allocator: the CPU allocator's accounting (`allocated` is the requested bytes, the peak
// its high-water mark) with no memory behind it. Each allocation gets a distinct, never
// dereferenced address so that Storage can tell an allocation from "nothing" (bytes == 0).
#include "meta_allocator.hpp"

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace parallel {
namespace {

class MetaAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Stream) override {
    if (bytes == 0) return nullptr;
    std::lock_guard lock(mutex_);
    stats_.allocated += bytes;
    stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
    stats_.reserved = stats_.allocated;
    ++stats_.num_allocations;
    next_ += 256;  // a token, not memory
    return reinterpret_cast<void*>(next_);
  }

  void deallocate(void* ptr, std::size_t bytes, Stream) override {
    if (ptr == nullptr) return;
    std::lock_guard lock(mutex_);
    stats_.allocated -= bytes;
    stats_.reserved = stats_.allocated;
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
  std::uintptr_t next_ = 0;
};

}  // namespace

Allocator& meta_allocator() {
  static MetaAllocator meta;
  return meta;
}

}  // namespace parallel
