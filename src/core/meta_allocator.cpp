// The meta allocator: the CPU allocator's accounting (`allocated` is the requested bytes, the peak
// its high-water mark) with no memory behind it, kept per thread (meta.hpp): a thread's statistics
// are the bytes its own meta tensors hold, so two threads that each run a meta rank (the layout
// search's parallel candidates) do not count each other's tensors.
//
// Each allocation gets a distinct, never dereferenced address (a token) so that Storage can tell an
// allocation from "nothing" (bytes == 0). The token also names the account it was charged to (its
// top bits), so a tensor freed on another thread than the one that made it is taken off the right
// account.
#include "meta_allocator.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>
#include <vector>

#include "parallel/error.hpp"

namespace parallel {
namespace {

// One thread's statistics. The mutex is uncontended but for a free from another thread.
struct Account {
  std::mutex mutex;
  MemoryStats stats;
};

// Accounts live in a fixed table, never freed, so a token's account outlives every tensor. A
// thread takes a free slot at its first meta allocation or statistics call and gives it back when
// it ends with nothing allocated (a thread that ends with live meta tensors keeps its slot: they
// may still be freed elsewhere).
constexpr int kAccounts = 4096;
constexpr int kTokenShift = 44;  // token = (slot + 1) << 44 | (a counter << 8): 2^36 tokens a slot
std::array<Account, kAccounts> g_accounts;
std::mutex g_slots_mutex;
std::vector<int> g_free_slots;
int g_next_slot = 0;

struct ThreadAccount {
  int slot = -1;
  std::uintptr_t next_token = 0;

  ThreadAccount() {
    std::lock_guard lock(g_slots_mutex);
    if (!g_free_slots.empty()) {
      slot = g_free_slots.back();
      g_free_slots.pop_back();
    } else {
      PARALLEL_CHECK(g_next_slot < kAccounts,
                     "meta allocator: more than {} threads have held meta tensors at once", kAccounts);
      slot = g_next_slot++;
    }
    std::lock_guard account_lock(g_accounts[slot].mutex);
    g_accounts[slot].stats = MemoryStats{};
  }
  ~ThreadAccount() {
    {
      std::lock_guard account_lock(g_accounts[slot].mutex);
      if (g_accounts[slot].stats.allocated != 0) return;
    }
    std::lock_guard lock(g_slots_mutex);
    g_free_slots.push_back(slot);
  }
  ThreadAccount(const ThreadAccount&) = delete;
  ThreadAccount& operator=(const ThreadAccount&) = delete;
  Account& account() { return g_accounts[slot]; }
};

ThreadAccount& this_thread() {
  thread_local ThreadAccount t;
  return t;
}

class MetaAllocator final : public Allocator {
 public:
  void* allocate(std::size_t bytes, Stream) override {
    if (bytes == 0) return nullptr;
    ThreadAccount& t = this_thread();
    Account& a = t.account();
    {
      std::lock_guard lock(a.mutex);
      a.stats.allocated += bytes;
      a.stats.peak_allocated = std::max(a.stats.peak_allocated, a.stats.allocated);
      a.stats.reserved = a.stats.allocated;
      ++a.stats.num_allocations;
    }
    t.next_token = (t.next_token + 1) & ((std::uintptr_t{1} << (kTokenShift - 8)) - 1);
    // A token, not memory.
    return reinterpret_cast<void*>((static_cast<std::uintptr_t>(t.slot + 1) << kTokenShift) |
                                   (t.next_token << 8));
  }

  void deallocate(void* ptr, std::size_t bytes, Stream) override {
    if (ptr == nullptr) return;
    const auto slot = static_cast<int>((reinterpret_cast<std::uintptr_t>(ptr) >> kTokenShift) - 1);
    Account& a = g_accounts[static_cast<std::size_t>(slot)];
    std::lock_guard lock(a.mutex);
    a.stats.allocated -= bytes;
    a.stats.reserved = a.stats.allocated;
  }

  MemoryStats stats() const override {
    Account& a = this_thread().account();
    std::lock_guard lock(a.mutex);
    return a.stats;
  }

  void reset_peak() override {
    Account& a = this_thread().account();
    std::lock_guard lock(a.mutex);
    a.stats.peak_allocated = a.stats.allocated;
  }
};

}  // namespace

Allocator& meta_allocator() {
  static MetaAllocator meta;
  return meta;
}

}  // namespace parallel
