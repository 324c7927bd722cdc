// The caching allocator's record_stream bookkeeping (src/cuda/block_reuse.hpp) on the CPU, with fake
// streams and events: a freed block used on other streams is held until the events recorded on
// those streams at the free have completed, and every event is destroyed exactly once.
#include <gtest/gtest.h>

#include <cstdint>
#include <stdexcept>
#include <vector>

#include "../../src/cuda/block_reuse.hpp"

namespace parallel::cuda {
namespace {

struct FakeBlock {
  int id;
};

// Streams are small integers cast to handles; an event remembers its stream and completes when
// the test says so.
void* stream(int i) { return reinterpret_cast<void*>(static_cast<std::uintptr_t>(i)); }

struct FakeEvents {
  struct Event {
    void* stream;
    bool done = false;
    bool destroyed = false;
  };
  std::vector<Event> events;   // event handle = index + 1
  int fail_record_after = -1;  // record throws once this many events exist

  EventOps ops() {
    EventOps o;
    o.record = [this](void* s) -> void* {
      if (fail_record_after >= 0 && static_cast<int>(events.size()) >= fail_record_after)
        throw std::runtime_error("record failed");
      events.push_back({s});
      return reinterpret_cast<void*>(events.size());
    };
    o.completed = [this](void* e) { return at(e).done; };
    o.destroy = [this](void* e) {
      EXPECT_FALSE(at(e).destroyed) << "event destroyed twice";
      at(e).destroyed = true;
    };
    return o;
  }
  Event& at(void* e) { return events.at(reinterpret_cast<std::uintptr_t>(e) - 1); }
  void complete_on(void* s) {
    for (Event& e : events)
      if (e.stream == s) e.done = true;
  }
  int live() const {
    int n = 0;
    for (const Event& e : events) n += e.destroyed ? 0 : 1;
    return n;
  }
};

TEST(StreamUses, OwnStreamIsNotRecorded) {
  StreamUses uses;
  uses.record(stream(1), stream(1));
  EXPECT_TRUE(uses.empty());
  uses.record(stream(1), stream(2));
  uses.record(stream(1), stream(2));
  uses.record(stream(1), stream(3));
  EXPECT_EQ(uses.streams().size(), 2u);
  uses.clear();
  EXPECT_TRUE(uses.empty());
}

TEST(DeferredFrees, UnusedElsewhereIsReusableAtOnce) {
  FakeEvents fake;
  const EventOps ops = fake.ops();
  DeferredFrees<FakeBlock> held;
  FakeBlock b{1};
  EXPECT_TRUE(held.free(&b, StreamUses{}, ops));
  EXPECT_EQ(held.held(), 0u);
  EXPECT_TRUE(fake.events.empty());  // no event needed
}

TEST(DeferredFrees, HeldUntilEveryOtherStreamIsDone) {
  FakeEvents fake;
  const EventOps ops = fake.ops();
  DeferredFrees<FakeBlock> held;
  FakeBlock a{1}, b{2};
  StreamUses ua, ub;
  ua.record(stream(1), stream(2));  // allocated on 1, used by the communication stream 2
  ua.record(stream(1), stream(3));  // and by 3
  ub.record(stream(1), stream(2));
  EXPECT_FALSE(held.free(&a, ua, ops));
  EXPECT_FALSE(held.free(&b, ub, ops));
  EXPECT_EQ(held.held(), 2u);
  EXPECT_EQ(fake.events.size(), 3u);  // one per (block, other stream)

  EXPECT_TRUE(held.reclaim(ops).empty());  // nothing has completed
  fake.complete_on(stream(2));
  // b needed only stream 2; a still waits for stream 3.
  EXPECT_EQ(held.reclaim(ops), std::vector<FakeBlock*>{&b});
  EXPECT_EQ(held.held(), 1u);
  EXPECT_EQ(fake.live(), 2);  // b's event destroyed; a keeps both of its own until it is reclaimed
  fake.complete_on(stream(3));
  EXPECT_EQ(held.reclaim(ops), std::vector<FakeBlock*>{&a});
  EXPECT_EQ(held.held(), 0u);
  EXPECT_EQ(fake.live(), 0);  // every event destroyed, once
}

// Work queued on a stream after the free does not hold the block: the events are recorded at the
// free, so only what was queued by then counts.
TEST(DeferredFrees, EventsAreRecordedAtTheFree) {
  FakeEvents fake;
  const EventOps ops = fake.ops();
  DeferredFrees<FakeBlock> held;
  FakeBlock a{1};
  StreamUses u;
  u.record(stream(1), stream(2));
  EXPECT_FALSE(held.free(&a, u, ops));
  fake.complete_on(stream(2));
  fake.events.push_back({stream(2)});  // later work on stream 2, not complete
  EXPECT_EQ(held.reclaim(ops), std::vector<FakeBlock*>{&a});
}

TEST(DeferredFrees, ReclaimAllAfterASynchronisation) {
  FakeEvents fake;
  const EventOps ops = fake.ops();
  DeferredFrees<FakeBlock> held;
  FakeBlock a{1}, b{2};
  StreamUses u;
  u.record(stream(1), stream(2));
  held.free(&a, u, ops);
  held.free(&b, u, ops);
  EXPECT_EQ(held.reclaim_all(ops), (std::vector<FakeBlock*>{&a, &b}));  // in free order
  EXPECT_EQ(held.held(), 0u);
  EXPECT_EQ(fake.live(), 0);
}

TEST(DeferredFrees, FailedRecordLeaksNoEvent) {
  FakeEvents fake;
  fake.fail_record_after = 1;
  const EventOps ops = fake.ops();
  DeferredFrees<FakeBlock> held;
  FakeBlock a{1};
  StreamUses u;
  u.record(stream(1), stream(2));
  u.record(stream(1), stream(3));
  EXPECT_THROW(held.free(&a, u, ops), std::runtime_error);
  EXPECT_EQ(held.held(), 0u);
  EXPECT_EQ(fake.live(), 0);
}

}  // namespace
}  // namespace parallel::cuda
