#pragma once
// Per-device memory allocators with statistics.
//
// Every tensor byte comes from here, so the memory tests of the later layers (a TP=2 rank holds half
// the weights, 1F1B keeps at most p - r micro-batches alive, optimizer state is 8 + 8/d bytes per
// parameter) measure real allocations rather than estimates. On CUDA the allocator caches freed
// blocks per stream, so a training step does no cudaMalloc after the first one.
#include <cstddef>
#include <cstdint>

#include "parallel/device.hpp"

namespace parallel {

struct MemoryStats {
  std::size_t allocated = 0;       // bytes handed out and not yet returned
  std::size_t peak_allocated = 0;  // high-water mark of `allocated` since the last reset_peak()
  std::size_t reserved = 0;        // bytes held from the system (>= allocated on a caching allocator)
  std::uint64_t num_allocations = 0;
  std::uint64_t num_system_allocations = 0;  // malloc / cudaMalloc calls actually made
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Returns at least `bytes` bytes aligned to 256, usable in stream order on `stream`.
  // bytes == 0 returns nullptr.
  virtual void* allocate(std::size_t bytes, Stream stream) = 0;
  // `bytes` and `stream` must be those given to allocate().
  virtual void deallocate(void* ptr, std::size_t bytes, Stream stream) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak() = 0;
  // Returns cached, unused blocks to the system (no-op where nothing is cached).
  virtual void empty_cache() {}
};

// The process-wide allocator of a device (like the CUDA context itself, there is one per device
// per process; everything that is parallel state is passed explicitly, this is not). The meta
// device's statistics are the calling thread's (meta.hpp), so that two threads plan at once.
Allocator& allocator_for(Device device);
MemoryStats memory_stats(Device device);

}  // namespace parallel
