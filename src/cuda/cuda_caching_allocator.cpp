#include "cuda_caching_allocator.hpp"

#include <functional>

#include "cuda/cuda_check.hpp"

namespace parallel::cuda {
namespace {

std::size_t round_up(std::size_t n, std::size_t m) { return (n + m - 1) / m * m; }

}  // namespace

bool CudaCachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return std::less<cudaStream_t>()(a->stream, b->stream);
  if (a->size != b->size) return a->size < b->size;
  return std::less<void*>()(a->ptr, b->ptr);
}

CudaCachingAllocator::CudaCachingAllocator(int device) : device_(device) {
  // Called with the mutex held and this device current.
  events_.record = [](void* stream) -> void* {
    cudaEvent_t e = nullptr;
    PARALLEL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    const cudaError_t err = cudaEventRecord(e, static_cast<cudaStream_t>(stream));
    if (err != cudaSuccess) {
      (void)cudaEventDestroy(e);
      detail::throw_cuda_error(__FILE__, __LINE__, "cudaEventRecord(e, stream)", err);
    }
    return e;
  };
  events_.completed = [](void* event) {
    const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (err == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    PARALLEL_CUDA_CHECK(err);
    return true;
  };
  events_.destroy = [](void* event) { (void)cudaEventDestroy(static_cast<cudaEvent_t>(event)); };
}

CudaCachingAllocator::~CudaCachingAllocator() {
  // The process-wide allocators are never destroyed (the driver reclaims everything at exit, and
  // tensors in static storage may outlive us); this runs only for privately owned instances.
  try {
    std::lock_guard lock(mutex_);
    DeviceGuard guard(device_);
    if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
    reclaim_held(/*all=*/true);
    release_cached(small_pool_);
    release_cached(large_pool_);
  } catch (...) {
  }
}

CudaCachingAllocator::Block* CudaCachingAllocator::find_free(Pool& pool, cudaStream_t stream,
                                                             std::size_t size) {
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

CudaCachingAllocator::Block* CudaCachingAllocator::new_segment(std::size_t segment_size, cudaStream_t stream,
                                                               bool small, std::size_t request) {
  void* ptr = nullptr;
  cudaError_t err = cudaMalloc(&ptr, segment_size);
  if (err == cudaErrorMemoryAllocation) {
    // Cached but unused segments may be what fills the device: give them back and try once more.
    (void)cudaGetLastError();
    if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
    reclaim_held(/*all=*/true);  // the device is idle: every held block is free
    release_cached(small_pool_);
    release_cached(large_pool_);
    err = cudaMalloc(&ptr, segment_size);
    if (err == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      std::size_t free_bytes = 0, total_bytes = 0;
      if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) (void)cudaGetLastError();
      PARALLEL_FAIL(
          "CUDA out of memory on cuda:{}: requested {} bytes (a {} byte segment); this allocator has {} "
          "bytes "
          "allocated and {} reserved (peak allocated {}); the device has {} of {} bytes free",
          device_, request, segment_size, stats_.allocated, stats_.reserved, stats_.peak_allocated,
          free_bytes, total_bytes);
    }
  }
  if (err != cudaSuccess) detail::throw_cuda_error(__FILE__, __LINE__, "cudaMalloc(&ptr, segment_size)", err);
  stats_.reserved += segment_size;
  ++stats_.num_system_allocations;
  auto* block = new Block;
  block->ptr = ptr;
  block->size = segment_size;
  block->stream = stream;
  block->small = small;
  return block;
}

void* CudaCachingAllocator::allocate(std::size_t bytes, Stream stream) {
  if (bytes == 0) return nullptr;
  PARALLEL_CHECK(bytes <= (std::size_t{1} << 62), "cuda:{} allocator: {} bytes is not a size", device_,
                 bytes);
  const auto s = static_cast<cudaStream_t>(stream.handle);
  const std::size_t size = round_up(bytes, kMinBlock);
  const bool small = bytes <= kSmallRequest;
  Pool& pool = small ? small_pool_ : large_pool_;

  std::lock_guard lock(mutex_);
  if (held_.held() > 0) {
    DeviceGuard guard(device_);
    reclaim_held(/*all=*/false);
  }
  Block* block = find_free(pool, s, size);
  if (!block) {
    DeviceGuard guard(device_);
    block = new_segment(small ? kSmallSegment : round_up(size, kLargeRounding), s, small, bytes);
  }

  // Keep the tail for the next request when it is big enough to serve one from the same pool;
  // a large-pool sliver under 1 MiB could never be used and would only fragment the segment.
  const std::size_t remainder = block->size - size;
  if (small ? remainder >= kMinBlock : remainder > kSmallRequest) {
    auto* rest = new Block;
    rest->ptr = static_cast<char*>(block->ptr) + size;
    rest->size = remainder;
    rest->stream = s;
    rest->small = small;
    rest->prev = block;
    rest->next = block->next;
    if (rest->next) rest->next->prev = rest;
    block->next = rest;
    block->size = size;
    pool.insert(rest);
  }

  block->in_use = true;
  block->requested = bytes;
  live_.emplace(block->ptr, block);
  stats_.allocated += bytes;
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  ++stats_.num_allocations;
  return block->ptr;
}

void CudaCachingAllocator::deallocate(void* ptr, std::size_t bytes, Stream stream) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  PARALLEL_CHECK(it != live_.end(), "cuda:{} allocator: freeing {} ({} bytes), which it did not hand out",
                 device_, ptr, bytes);
  Block* block = it->second;
  live_.erase(it);
  stats_.allocated -= block->requested;
  // Used on other streams too: held (still in_use, so no neighbour merges with it) until the work
  // those streams have queued by now has completed.
  if (!block->uses.empty()) {
    try {
      DeviceGuard guard(device_);
      if (!held_.free(block, block->uses, events_)) return;
    } catch (const Error&) {
      // No event could be recorded (typically the runtime shutting down at exit, with a tensor
      // freed from static storage): wait for the whole device instead, and the block is free.
      if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
    }
  }
  return_to_pool(block);
}

void CudaCachingAllocator::return_to_pool(Block* block) {
  block->in_use = false;
  block->uses.clear();
  // The block goes back to the stream it was allocated on, whatever the caller says: that is the
  // stream whose order makes reuse safe.
  Pool& pool = block->small ? small_pool_ : large_pool_;

  if (Block* next = block->next; next && !next->in_use) {
    pool.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (block->next) block->next->prev = block;
    delete next;
  }
  if (Block* prev = block->prev; prev && !prev->in_use) {
    pool.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (prev->next) prev->next->prev = prev;
    delete block;
    block = prev;
  }
  pool.insert(block);
}

void CudaCachingAllocator::release_cached(Pool& pool) {
  bool any = false;
  for (const Block* b : pool) any = any || (!b->prev && !b->next);
  if (!any) return;
  // A cached block is free only in its stream's order: kernels queued before the free may still be
  // using it, so wait for the device before returning memory to the driver.
  if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
  for (auto it = pool.begin(); it != pool.end();) {
    Block* b = *it;
    if (b->prev || b->next) {
      ++it;
      continue;
    }
    if (cudaFree(b->ptr) != cudaSuccess) (void)cudaGetLastError();
    stats_.reserved -= b->size;
    it = pool.erase(it);
    delete b;
  }
}

void CudaCachingAllocator::reclaim_held(bool all) {
  for (Block* block : all ? held_.reclaim_all(events_) : held_.reclaim(events_)) return_to_pool(block);
}

void CudaCachingAllocator::record_stream(void* ptr, Stream stream) {
  if (!ptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // not ours (borrowed memory): nothing to hold back
  it->second->uses.record(it->second->stream, stream.handle);
}

std::size_t CudaCachingAllocator::held_blocks() const {
  std::lock_guard lock(mutex_);
  return held_.held();
}

void CudaCachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  DeviceGuard guard(device_);
  // Held blocks wait for other streams: after a device synchronisation every one is free.
  if (held_.held() > 0) {
    if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
    reclaim_held(/*all=*/true);
  }
  release_cached(small_pool_);
  release_cached(large_pool_);
}

MemoryStats CudaCachingAllocator::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void CudaCachingAllocator::reset_peak() {
  std::lock_guard lock(mutex_);
  stats_.peak_allocated = stats_.allocated;
}

}  // namespace parallel::cuda
