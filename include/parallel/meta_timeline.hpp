#pragma once
// One rank's meta run as a single timeline: its ops and its communication interleaved in issue
// order, with the point where the rank waits for each asynchronous call (a Work handle's wait()).
// This is what a simulator replays (plan/simulate.hpp): ops occupy the compute stream one after
// another, a synchronous collective blocks the stream until it completes, and an asynchronous one
// runs beside the ops until the wait that needs it - so the timeline says what may overlap what.
//
// MetaOpRecorder (meta.hpp) and CommLog (comm_log.hpp) keep their own lists unchanged; a live
// MetaTimeline receives the same OpEvents and CommEvents besides, plus the waits. Like
// MetaOpRecorder it is process-wide and nests (the innermost live one records), one thread at a time.
//
// Waits: MetaCommunicator hands out a handle for every asynchronous call (send and recv always
// are); its first wait() records a Wait entry naming the call. is_completed() records nothing and
// answers true - a meta call completes at once - so code that polls a send and frees its buffer
// (the pipeline executor) does so at once, as it did before; the simulator treats such a call as
// never waited on by this rank.
#include <cstdint>
#include <vector>

#include "parallel/comm_log.hpp"
#include "parallel/meta.hpp"

namespace parallel {

struct TimelineEntry {
  enum class Kind : uint8_t { Op, Comm, Wait };
  Kind kind = Kind::Op;
  OpEvent op;      // Kind::Op
  CommEvent comm;  // Kind::Comm
  // Kind::Comm: the call's number on this timeline (0, 1, ... in issue order of the calls);
  // Kind::Wait: the number of the call waited for.
  int64_t call = -1;
};

class MetaTimeline {
 public:
  MetaTimeline();
  ~MetaTimeline();
  MetaTimeline(const MetaTimeline&) = delete;
  MetaTimeline& operator=(const MetaTimeline&) = delete;

  const std::vector<TimelineEntry>& entries() const { return entries_; }
  // Recording, for meta.cpp and MetaCommunicator: appends and returns the new call's number.
  void add_op(const OpEvent& e);
  int64_t add_comm(const CommEvent& e);
  void add_wait(int64_t call);

 private:
  std::vector<TimelineEntry> entries_;
  int64_t calls_ = 0;
  MetaTimeline* outer_ = nullptr;
};

namespace meta {
// The innermost live timeline, or nullptr.
MetaTimeline* live_timeline();
}  // namespace meta

}  // namespace parallel
