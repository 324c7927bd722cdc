#pragma once
// One rank's meta run as a single timeline: its ops and its communication interleaved in issue
// order, with the point where the rank waits for each asynchronous call (a Work handle's wait()).
// This is what a simulator replays (plan/simulate.hpp): ops occupy the compute stream one after
// another, a synchronous collective blocks the stream until it completes, and an asynchronous one
// runs beside the ops until the wait that needs it - so the timeline says what may overlap what.
//
// MetaOpRecorder (meta.hpp) and CommLog (comm_log.hpp) keep their own lists unchanged; a live
// MetaTimeline receives the same OpEvents and CommEvents besides, plus the waits. Like
// MetaOpRecorder it is per thread and nests (the innermost live one of the thread records), so two
// threads run two meta ranks at once (the layout search plans candidates in parallel).
//
// Waits: MetaCommunicator hands out a handle for every asynchronous call (send and recv always
// are); its first wait() records a Wait entry naming the call. is_completed() records nothing and
// answers true - a meta call completes at once - so code that polls a send and frees its buffer
// (the pipeline executor) does so at once, as it did before; the simulator treats such a call as
// never waited on by this rank.
//
// Replays: a run whose micro-batches repeat the same work (the planner's MicroBatchReplay,
// step_cost.hpp) records one micro-batch's entries once and then a Replay entry per repetition:
// "entries [begin, end) happen again here". Its calls are numbered afresh (the k-th call of the
// range becomes `call + k`), so expanding every Replay in place (expand_timeline) gives exactly the
// timeline the repetitions would have recorded. A wait of the range for a call issued before it (a
// micro-batch waiting for the previous one's reduction) names, in the Replay entry, the call the
// repetition waits for instead (`replay_waits`: original call -> call).
#include <cstdint>
#include <utility>
#include <vector>

#include "parallel/comm_log.hpp"
#include "parallel/meta.hpp"

namespace parallel {

struct TimelineEntry {
  enum class Kind : uint8_t { Op, Comm, Wait, Replay };
  Kind kind = Kind::Op;
  OpEvent op;      // Kind::Op
  CommEvent comm;  // Kind::Comm
  // Kind::Comm: the call's number on this timeline (0, 1, ... in issue order of the calls);
  // Kind::Wait: the number of the call waited for; Kind::Replay: the number of the range's first call.
  int64_t call = -1;
  // Kind::Replay: the range of earlier entries (indices into this timeline) that happen again.
  int64_t replay_begin = -1, replay_end = -1;
  std::vector<std::pair<int64_t, int64_t>> replay_waits;
};

// `entries` with every Replay entry replaced by the range it names, calls renumbered.
std::vector<TimelineEntry> expand_timeline(const std::vector<TimelineEntry>& entries);
// The number that call `call` of a replayed range (whose first call is `first`, -1 before any) has
// in the replay `replay`.
int64_t replayed_call(const TimelineEntry& replay, int64_t first, int64_t call);

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
  // Records that entries [begin, end) (plain Op, Comm and Wait entries) happen again now; a wait
  // for a call issued before the range must be in `waits` (original call -> the call waited for
  // now). Throws otherwise. Returns the number of the replay's first call.
  int64_t replay(std::size_t begin, std::size_t end, std::vector<std::pair<int64_t, int64_t>> waits = {});
  std::size_t size() const { return entries_.size(); }
  // Makes Wait entry `index` wait for call `call` instead (a replay's caller: the run after
  // replays waited on a handle the replays could not renew).
  void retarget_wait(std::size_t index, int64_t call);

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
