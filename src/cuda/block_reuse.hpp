#pragma once
// When a freed block of the caching allocator (cuda_caching_allocator.hpp) may be handed out again,
// with PyTorch's record_stream semantics.
//
// A block belongs to the stream it was allocated on, and its pool serves only that stream: reuse on
// the same stream is ordered after the old user's work. A block that other streams used too (a
// gradient all-reduced on the communication stream) is not protected by that order: the other
// stream may still be reading or writing it when the owner stream's next allocation takes it. So
// such uses are recorded (record_stream), and at free the block is held back, with one event
// recorded on each of those streams, until every event has completed; only then does it go back
// to its pool. Blocks used on their own stream only go back at once, as before.
//
// Plain C++ over opaque handles (cudaStream_t and cudaEvent_t as void*), so that this bookkeeping
// is unit-tested on the CPU with fake events (tests/unit/test_block_reuse.cpp).
#include <cstddef>
#include <functional>
#include <set>
#include <utility>
#include <vector>

namespace parallel::cuda {

// What the bookkeeping needs from the runtime.
struct EventOps {
  std::function<void*(void* stream)> record;   // a new event, recorded now on `stream`
  std::function<bool(void* event)> completed;  // has it completed? never blocks
  std::function<void(void* event)> destroy;
};

// The streams a live block was used on besides its own (record_stream).
class StreamUses {
 public:
  void record(void* own_stream, void* stream) {
    if (stream != own_stream) streams_.insert(stream);
  }
  const std::set<void*>& streams() const { return streams_; }
  bool empty() const { return streams_.empty(); }
  void clear() { streams_.clear(); }

 private:
  std::set<void*> streams_;
};

// Freed blocks that other streams may still be using. Block is the allocator's block type.
template <typename Block>
class DeferredFrees {
 public:
  // At free: true when `block` may be reused at once (no use on another stream); false when it is
  // now held here, with an event recorded on each of `uses`' streams.
  bool free(Block* block, const StreamUses& uses, const EventOps& ops) {
    if (uses.empty()) return true;
    Held held{block, {}};
    try {
      for (void* stream : uses.streams()) held.events.push_back(ops.record(stream));
    } catch (...) {
      for (void* e : held.events) ops.destroy(e);
      throw;
    }
    held_.push_back(std::move(held));
    return false;
  }

  // The held blocks whose events have all completed, in the order they were freed; they and their
  // events leave the bookkeeping.
  std::vector<Block*> reclaim(const EventOps& ops) { return take(ops, false); }
  // Every held block, whatever its events say: for a caller that has just synchronised the device
  // (emptying the cache, or retrying after an out-of-memory).
  std::vector<Block*> reclaim_all(const EventOps& ops) { return take(ops, true); }

  std::size_t held() const { return held_.size(); }

 private:
  struct Held {
    Block* block;
    std::vector<void*> events;
  };

  std::vector<Block*> take(const EventOps& ops, bool all) {
    std::vector<Block*> ready;
    for (auto it = held_.begin(); it != held_.end();) {
      bool done = true;
      if (!all)
        for (void* e : it->events) done = done && ops.completed(e);
      if (!done) {
        ++it;
        continue;
      }
      for (void* e : it->events) ops.destroy(e);
      ready.push_back(it->block);
      it = held_.erase(it);
    }
    return ready;
  }

  std::vector<Held> held_;
};

}  // namespace parallel::cuda
