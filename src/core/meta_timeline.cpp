// MetaTimeline (meta_timeline.hpp): the innermost live one receives a meta rank's ops, calls and waits.
#include "parallel/meta_timeline.hpp"

#include <algorithm>

#include "parallel/error.hpp"

namespace parallel {
namespace {
thread_local MetaTimeline* g_timeline = nullptr;  // the innermost live timeline (per thread)
}  // namespace

MetaTimeline::MetaTimeline() : outer_(g_timeline) { g_timeline = this; }
MetaTimeline::~MetaTimeline() { g_timeline = outer_; }

void MetaTimeline::add_op(const OpEvent& e) {
  TimelineEntry t;
  t.kind = TimelineEntry::Kind::Op;
  t.op = e;
  entries_.push_back(std::move(t));
}

int64_t MetaTimeline::add_comm(const CommEvent& e) {
  TimelineEntry t;
  t.kind = TimelineEntry::Kind::Comm;
  t.comm = e;
  t.call = calls_++;
  entries_.push_back(std::move(t));
  return entries_.back().call;
}

void MetaTimeline::add_wait(int64_t call) {
  TimelineEntry t;
  t.kind = TimelineEntry::Kind::Wait;
  t.call = call;
  entries_.push_back(std::move(t));
}

int64_t MetaTimeline::replay(std::size_t begin, std::size_t end,
                             std::vector<std::pair<int64_t, int64_t>> waits) {
  PARALLEL_CHECK(begin <= end && end <= entries_.size(), "MetaTimeline::replay: range [{}, {}) of {} entries",
                 begin, end, entries_.size());
  int64_t first = -1, calls = 0;
  for (std::size_t i = begin; i < end; ++i) {
    const TimelineEntry& e = entries_[i];
    PARALLEL_CHECK(e.kind != TimelineEntry::Kind::Replay, "MetaTimeline::replay: entry {} is a replay itself",
                   i);
    if (e.kind == TimelineEntry::Kind::Comm) {
      if (first < 0) first = e.call;
      ++calls;
    }
    if (e.kind == TimelineEntry::Kind::Wait && (first < 0 || e.call < first))
      PARALLEL_CHECK(
          std::any_of(waits.begin(), waits.end(), [&](const auto& w) { return w.first == e.call; }),
          "MetaTimeline::replay: entry {} waits for call {}, issued before the range [{}, {}), "
          "and the replay does not say which call it waits for instead",
          i, e.call, begin, end);
  }
  TimelineEntry t;
  t.kind = TimelineEntry::Kind::Replay;
  t.call = calls_;
  t.replay_begin = static_cast<int64_t>(begin);
  t.replay_end = static_cast<int64_t>(end);
  t.replay_waits = std::move(waits);
  calls_ += calls;
  entries_.push_back(std::move(t));
  return entries_.back().call;
}

void MetaTimeline::retarget_wait(std::size_t index, int64_t call) {
  PARALLEL_CHECK(index < entries_.size() && entries_[index].kind == TimelineEntry::Kind::Wait,
                 "MetaTimeline::retarget_wait: entry {} is not a wait", index);
  PARALLEL_CHECK(call >= 0 && call < calls_, "MetaTimeline::retarget_wait: no call {}", call);
  entries_[index].call = call;
}

int64_t replayed_call(const TimelineEntry& replay, int64_t first, int64_t call) {
  if (first >= 0 && call >= first) return replay.call + (call - first);
  for (const auto& [from, to] : replay.replay_waits)
    if (from == call) return to;
  PARALLEL_FAIL("replay of entries [{}, {}): call {} is outside the range and has no stand-in",
                replay.replay_begin, replay.replay_end, call);
}

std::vector<TimelineEntry> expand_timeline(const std::vector<TimelineEntry>& entries) {
  std::vector<TimelineEntry> out;
  out.reserve(entries.size());
  for (const TimelineEntry& e : entries) {
    if (e.kind != TimelineEntry::Kind::Replay) {
      out.push_back(e);
      continue;
    }
    int64_t first = -1;
    for (auto i = e.replay_begin; i < e.replay_end; ++i) {
      TimelineEntry r = entries[static_cast<std::size_t>(i)];
      if (r.kind == TimelineEntry::Kind::Comm && first < 0) first = r.call;
      if (r.kind != TimelineEntry::Kind::Op) r.call = replayed_call(e, first, r.call);
      out.push_back(std::move(r));
    }
  }
  return out;
}

namespace meta {
MetaTimeline* live_timeline() { return g_timeline; }
}  // namespace meta
}  // namespace parallel
