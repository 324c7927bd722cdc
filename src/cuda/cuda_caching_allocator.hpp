#pragma once
// A caching allocator for one GPU, in the manner of PyTorch's CUDACachingAllocator (simplified).
//
// cudaMalloc and cudaFree synchronise the device and cost tens of microseconds, so freed blocks
// are kept and handed out again. Blocks are cached per stream: a block freed on stream S may be
// reused by the next allocation on S at once, because S runs the old and the new user in order;
// another stream could still be reading it, so it never sees that block. After the first training
// step every allocation of the next one finds a cached block and no cudaMalloc happens.
//
// A block used on other streams than its own (a tensor all-reduced on the communication stream) is
// recorded with record_stream(); when freed it is held back until events recorded on those streams
// at the free have completed, and only then returns to its pool (block_reuse.hpp).
//
// Sizes: blocks are multiples of 512 B. Requests up to 1 MiB come out of 2 MiB segments shared by
// many small blocks; larger ones get a segment of their size rounded up to 2 MiB. A cached block
// larger than the request is split when the remainder can serve another request of its pool, and
// neighbours of one segment merge again when both are free, so a segment returns whole.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <mutex>
#include <set>
#include <unordered_map>

#include "block_reuse.hpp"
#include "parallel/allocator.hpp"

namespace parallel::cuda {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int device);
  ~CudaCachingAllocator() override;
  CudaCachingAllocator(const CudaCachingAllocator&) = delete;
  CudaCachingAllocator& operator=(const CudaCachingAllocator&) = delete;

  void* allocate(std::size_t bytes, Stream stream) override;
  void deallocate(void* ptr, std::size_t bytes, Stream stream) override;
  // Records that the live block starting at `ptr` is used on `stream` (PyTorch's record_stream):
  // when freed it is not reused before the work queued on `stream` by then has completed. A no-op
  // for the block's own stream and for pointers this allocator did not hand out.
  void record_stream(void* ptr, Stream stream);
  MemoryStats stats() const override;
  // Freed blocks held back for other streams' work (for tests).
  std::size_t held_blocks() const;
  void reset_peak() override;
  void empty_cache() override;

  int device() const { return device_; }

  static constexpr std::size_t kMinBlock = 512;           // every block is a multiple of this
  static constexpr std::size_t kSmallRequest = 1 << 20;   // requests up to this use the small pool
  static constexpr std::size_t kSmallSegment = 2 << 20;   // cudaMalloc size for the small pool
  static constexpr std::size_t kLargeRounding = 2 << 20;  // large segments are multiples of this

 private:
  struct Block {
    void* ptr = nullptr;
    std::size_t size = 0;       // bytes of the block (a multiple of kMinBlock)
    std::size_t requested = 0;  // bytes the caller asked for; what `allocated` counts
    cudaStream_t stream = nullptr;
    bool small = false;     // which pool it returns to
    bool in_use = false;    // handed out, or freed but held back for other streams
    StreamUses uses;        // streams other than `stream` it was used on (record_stream)
    Block* prev = nullptr;  // neighbours within the same cudaMalloc segment
    Block* next = nullptr;
  };
  // Best fit: ordered by stream, then size, then address, so lower_bound finds the smallest block
  // of this stream that is large enough.
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  using Pool = std::set<Block*, BlockLess>;

  Block* find_free(Pool& pool, cudaStream_t stream, std::size_t size);
  Block* new_segment(std::size_t segment_size, cudaStream_t stream, bool small, std::size_t request);
  void release_cached(Pool& pool);    // cudaFree of every free whole segment; mutex held
  void return_to_pool(Block* block);  // merges with free neighbours and caches it; mutex held
  void reclaim_held(bool all);        // returns held blocks whose events completed (all: every one)

  int device_;
  mutable std::mutex mutex_;
  Pool small_pool_;
  Pool large_pool_;
  std::unordered_map<void*, Block*> live_;  // handed-out blocks by address
  DeferredFrees<Block> held_;               // freed blocks waiting for other streams
  EventOps events_;                         // CUDA events behind held_
  MemoryStats stats_;
};

}  // namespace parallel::cuda
